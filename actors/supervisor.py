"""The actor's vLLM engine and its life: creation, dead-engine detection and the restart budget.

An engine is dead when a request or RPC fails with vLLM's `EngineDeadError` or the engine reports
`errored` (its EngineCore process crashed or was killed). `restart` rebuilds it in place (off the event
loop, so acks and heartbeats go on) up to `max_restarts` times; one death beyond that raises, and the
actor stops with the error for its own supervisor (`brorl run`, Ray, Docker) to restart the process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

log = logging.getLogger("brorl.actor")


class EngineBudgetExceeded(RuntimeError):
    """The engine died more often than `actor.max_engine_restarts` allows."""


class EngineSupervisor:
    def __init__(self, make_engine: Callable[[], Any], max_restarts: int):
        self._make = make_engine
        self.max_restarts = max_restarts
        self.restarts = 0
        self.engine: Any = None

    def start(self) -> Any:
        self.engine = self._make()
        return self.engine

    def is_dead(self, err: BaseException | None = None) -> bool:
        """Is the engine gone? `err`: an exception a request or RPC raised, if any."""
        if err is not None and "EngineDead" in type(err).__name__:
            return True
        return bool(getattr(self.engine, "errored", False))

    async def restart(self, why: str) -> Any:
        """Count the death (raising once the budget is spent), shut the dead engine down, build a new one."""
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise EngineBudgetExceeded(f"vLLM engine died {self.restarts} times (limit actor.max_engine_restarts"
                                       f" = {self.max_restarts}); last: {why}")
        self.shutdown()
        t0 = time.monotonic()
        self.engine = await asyncio.to_thread(self._make)
        log.info("vLLM engine restarted in %.1f s", time.monotonic() - t0)
        return self.engine

    def shutdown(self) -> None:
        if self.engine is None:
            return
        try:
            self.engine.shutdown()
        except Exception as e:  # a dead engine may not shut down cleanly; its processes are gone anyway
            log.warning("shutting down the engine: %s", e)
