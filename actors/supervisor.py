"""The actor's vLLM engine and its life: creation, dead-engine detection and the restart budget.

An engine is dead when a request or RPC fails with vLLM's `EngineDeadError` or the engine reports
`errored` (its EngineCore process crashed or was killed). `restart` rebuilds it in place (off the event
loop, so acks and heartbeats go on) up to `max_restarts` times; one death beyond that raises, and the
actor stops with the error for its own supervisor (`brorl run`, Ray, Docker) to restart the process.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any, Awaitable, Callable

import psutil

log = logging.getLogger("brorl.actor")
# how long the engine core may tear down at the actor's end before it is killed (vLLM's own wait is 5 s, and every
# job's end waited for it; the core has nothing to save, and `end_descendants` then ends what it leaves)
STOP_GRACE_S = 1.0


def end_descendants(timeout_s: float = 10.0, also: list[psutil.Process] = ()) -> None:
    """At the actor's end: SIGKILL what still runs under its process (an engine core's workers still in their
    own teardown, a scoring worker on a cancelled program) and `also` (seen under it before: the workers of an
    engine core killed meanwhile are re-parented away), and wait for it, so its device memory is free when the
    actor is gone. Multiprocessing's resource tracker is left alone (its lock too, which an exiting interpreter
    needs): it unlinks the shared memory the killed processes registered once the actor, its pipe's last writer,
    has exited, and the launcher's `kill_group` waits for it. Bounded by `timeout_s`."""
    procs = {p.pid: p for p in [*also, *psutil.Process().children(recursive=True)]}
    end_processes(list(procs.values()), timeout_s)


def end_processes(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """SIGKILL `procs` but multiprocessing's resource trackers among them, and wait for them (a zombie counts as
    gone, whoever reaps it); returns the trackers, spared: a tracker unlinks the shared memory its processes
    registered (vLLM's message queues) once its pipe's last writer is gone, so killing it with them would leave
    those segments in /dev/shm for good."""
    trackers = [p for p in procs if _is_tracker(p)]
    rest = [p for p in procs if p not in trackers]
    for p in rest:
        _kill(p)
    _wait_gone(rest, timeout_s)
    return trackers


def end_trackers(trackers: list[psutil.Process], timeout_s: float) -> None:
    """After `end_processes`: wait for its spared trackers to unlink and exit; SIGKILL those left after `timeout_s`
    (a process outside what was killed still holds a pipe)."""
    for p in _wait_gone(trackers, timeout_s):
        _kill(p)


def _is_tracker(p: psutil.Process) -> bool:
    try:
        return "resource_tracker import main" in " ".join(p.cmdline())  # multiprocessing's, and loky's (joblib)
    except psutil.Error:
        return False


def _kill(p: psutil.Process) -> None:
    try:
        p.kill()
    except psutil.Error:
        pass


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until none of `procs` runs (zombies count as gone) or `timeout_s` passed; returns those left."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in procs if _running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class EngineBudgetExceeded(RuntimeError):
    """The engine died more often than `actor.max_engine_restarts` allows."""


class EngineSupervisor:
    """`check(err)` after anything that failed (and now and then while idle): if the engine is dead, one
    rebuild starts in the background — `on_down(why)` (the owner stops using the engine), a new engine,
    `on_up(engine)` (the owner takes it up). `rebuilding` is True meanwhile."""

    def __init__(self, make_engine: Callable[[], Any], max_restarts: int, spawn: Callable | None = None,
                 on_down: Callable[[str], Awaitable[None]] | None = None,
                 on_up: Callable[[Any], Awaitable[None]] | None = None):
        self._make = make_engine
        self.max_restarts = max_restarts
        self.restarts = 0
        self.engine: Any = None
        self._spawn, self._on_down, self._on_up = spawn, on_down, on_up
        self._rebuild: asyncio.Task | None = None

    @property
    def rebuilding(self) -> bool:
        return self._rebuild is not None

    def check(self, err: BaseException | None = None) -> bool:
        """Is the engine dead? If so, and no rebuild is running, start one (it raises in its task once the
        budget is spent, which stops the owner)."""
        dead = self.is_dead(err)
        if dead and self._rebuild is None:
            why = f"{type(err).__name__}: {err}" if err is not None else "engine reported errored"
            self._rebuild = self._spawn(self._rebuild_engine(why[:300]), "engine-restart")
        return dead

    async def _rebuild_engine(self, why: str) -> None:
        msg = f"vLLM engine died ({why}); restarting it ({self.restarts + 1}/{self.max_restarts})"
        log.error(msg)
        await self._on_down(msg)
        engine = await self.restart(why)
        await self._on_up(engine)
        self._rebuild = None

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

    def end(self, first: tuple[Callable[[], Any], ...] = ()) -> None:
        """The actor's end: `first` in turn (one that fails is logged, and the end goes on), then the engine
        gets `STOP_GRACE_S` to tear down (it has nothing to save), then `end_descendants`, also of what ran
        under the actor before the teardown."""
        for f in first:
            try:
                f()
            except Exception:
                log.exception("the actor's end: %s failed", getattr(f, "__qualname__", f))
        under = psutil.Process().children(recursive=True)
        self.shutdown(grace_s=STOP_GRACE_S)
        end_descendants(also=under)

    def shutdown(self, grace_s: float | None = None) -> None:
        """End the engine. `grace_s`: how long its core may tear down before it is killed (None: vLLM's own
        wait, 5 s; a restart in place uses it, so the new engine finds the device memory free)."""
        if self.engine is None:
            return
        try:
            if grace_s is not None and "timeout" in inspect.signature(self.engine.shutdown).parameters:
                self.engine.shutdown(timeout=grace_s)
            else:
                self.engine.shutdown()
        except Exception as e:  # a dead engine may not shut down cleanly; its processes are gone anyway
            log.warning("shutting down the engine: %s", e)
