"""Waiting in a test for something another task or process does: never without a deadline. A condition that
never comes fails the test within its own timeout, naming what did not happen and the state it was in, instead
of holding it until pytest-timeout's 900 s, with nothing said of what it waited for."""

from __future__ import annotations

import asyncio
import time


async def until(cond, what: str, timeout_s: float = 60.0, state=lambda: "", poll_s: float = 0.02) -> None:
    """Poll `cond()` in the event loop until it holds; TimeoutError naming `what` and `state()` after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s; {state()}")
        await asyncio.sleep(poll_s)
