"""Blocking calls awaited from asyncio without ever holding the process at exit."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable


async def in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a daemon thread of its own, awaited. For calls that may block in a collective for
    ever (NCCL's communicator set-up waits for a peer that never comes, and nothing interrupts it): given up
    on by a timeout, such a call must not hold the process at exit, as a thread of asyncio's default
    executor would (`asyncio.run` waits for those, up to 300 s, and the interpreter joins them)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not fut.done():  # not given up on meanwhile
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as e:
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, daemon=True, name=f"brorl-{getattr(fn, '__name__', 'call')}").start()
    return await fut
