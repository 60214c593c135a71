"""Pausing the engine with its requests kept, for more than one reason at once (`EngineGate`).

Two holders: "update" (new weights loading with requests kept, `actor.in_flight_on_update = "keep"`) and
"learner" (`actor.share_gpu = "timeshare"`: the learner computes a step on the GPU the engine shares, and
generation waits so each runs at its standalone speed). The engine is paused (vLLM `pause_generation(mode="keep",
clear_cache=False)`: requests frozen, their KV kept) when the first holder holds it and resumed when the
last lets go, so a learner's hold can pass straight into the update it ends with, the engine paused throughout.

A learner hold is for one step: it ends when that step's weights are loaded (`release("learner", upto=version)`),
when the learner says it computes nothing (control "compute" with step 0), or when an update that cannot keep
requests frozen ("finish", "abort") needs the engine running.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from actors.stats import EngineLoad


class EngineGate:
    def __init__(self, engine: Callable[[], Any], load: EngineLoad):
        self.engine = engine  # the current engine (a rebuilt one replaces it)
        self.load = load
        self.held: dict[str, int] = {}  # holder -> the step it holds for (the learner's; 0 for "update")
        self._lock = asyncio.Lock()

    async def hold(self, who: str, step: int = 0) -> None:
        """`who` holds the engine paused (for the learner: while it computes step `step`)."""
        async with self._lock:
            if not self.held:
                await self.engine().pause_generation(mode="keep", clear_cache=False)
            self.held[who] = step
            if who == "learner":
                self.load.hold(True)

    async def release(self, who: str, upto: int | None = None) -> bool:
        """`who` lets go (with `upto`: only a hold for a step <= `upto`); the last one out resumes the engine.
        Whether a hold ended."""
        async with self._lock:
            if who not in self.held or (upto is not None and self.held[who] > upto):
                return False
            del self.held[who]
            if who == "learner":
                self.load.hold(False)
            if not self.held:
                await self.engine().resume_generation()
            return True

    def reset(self) -> None:
        """A new engine (the old one died): it is not paused; nobody holds it."""
        self.held.clear()
        self.load.hold(False)

