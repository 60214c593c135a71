"""Verifier scoring off the generation path: a process pool that survives bad verifiers.

Each completion is scored in a worker process (spawned, so no state from the vLLM process leaks in) by
the verifier at a dotted path (workers import and cache verifiers by path, so a hot swap reaches them
with the next task). A verifier that raises gives reward 0 with the error as reason; one that hangs past
`timeout_s` or kills its worker process gives reward 0 with reason "timeout" / "worker crashed", the
pool is rebuilt, and the remaining completions are scored again. A fresh pool's worker start and the
verifier's import happen before the budget starts (`STARTUP_S` at most). The event loop never waits on a
verifier except through `await`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
from dataclasses import dataclass

from config.data import DataConfig
from taskdata import answer_region
from verifiers.base import VerifierResult
from verifiers.batch import kill_workers, new_pool

_CACHE: dict[str, object] = {}
STARTUP_S = 120.0
"""The most a fresh pool may take to start a worker and import the verifier before scoring goes on anyway."""


def _verifier(path: str):
    """The verifier at `path`, imported once per worker."""
    from verifiers.registry import load

    if path not in _CACHE:
        _CACHE[path] = load(path)
    return _CACHE[path]


def _load_in_worker(path: str) -> None:
    """Start a worker and import the verifier in it, outside any completion's time budget (a failure to load
    is the scoring call's to report, as an error)."""
    try:
        _verifier(path)
    except Exception:
        pass


def _score_in_worker(path: str, completion: str, reference: str) -> tuple[float, bool, str, str]:
    v = _verifier(path)
    try:
        r = v.score(completion, reference)
        return float(r.reward), bool(r.correct), r.reason, v.version
    except Exception as e:
        return 0.0, False, f"error: {type(e).__name__}: {str(e)[:200]}", v.version


@dataclass
class Scored:
    result: VerifierResult
    version: str


def verifier_failed(scored: list[Scored]) -> bool:
    """Did the verifier itself fail on any completion (timeout, crashed worker, exception)?"""
    return any(s.result.reason in ("timeout", "worker crashed") or s.result.reason.startswith("error")
               for s in scored)


class ScoringPool:
    def __init__(self, workers: int = 1, timeout_s: float = 5.0):
        self.workers = workers
        self.timeout_s = timeout_s
        self.restarts = 0
        self._queued = 0  # completions submitted by every scoring round in progress (they share the workers)
        self._pool = self._new_pool()

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        return new_pool(self.workers)

    def _kill_workers(self) -> None:
        kill_workers(self._pool)

    def _restart(self) -> None:
        old = self._pool
        self._kill_workers()
        old.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()
        self.restarts += 1

    async def score(self, path: str, version: str, completions: list[str], reference: str) -> list[Scored]:
        """Score every completion; always returns len(completions) results, in order."""
        loop = asyncio.get_running_loop()
        out: list[Scored | None] = [None] * len(completions)
        attempts = [0] * len(completions)
        todo = list(range(len(completions)))
        while todo:
            pool = self._pool
            await self._start(pool, path)
            try:
                futs = {i: loop.run_in_executor(pool, _score_in_worker, path, completions[i], reference)
                        for i in todo}
            except RuntimeError:  # the pool was shut down by a concurrent restart between our steps
                await asyncio.sleep(0.05)
                continue
            # every worker busy the whole time, on this round's completions and on those other groups' rounds
            # queued before them (a completion's budget must not run out while it waits behind another's)
            budget = self.timeout_s * -(-(self._queued + len(todo)) // self.workers)
            self._queued += len(todo)
            try:
                done, pending = await asyncio.wait(futs.values(), timeout=budget)
            finally:
                self._queued -= len(todo)
            crashed = False
            for i, f in futs.items():
                if f in pending:  # still running past its time: a hung verifier
                    out[i] = Scored(VerifierResult(0.0, False, "timeout"), version)
                    continue
                if f.cancelled():  # another group's failure restarted the shared pool: just retry
                    attempts[i] += 1
                    if attempts[i] >= 5:
                        out[i] = Scored(VerifierResult(0.0, False, "worker crashed"), version)
                    continue
                exc = f.exception()
                if exc is None:
                    reward, correct, reason, ver = f.result()
                    out[i] = Scored(VerifierResult(reward, correct, reason), ver)
                elif isinstance(exc, cf.process.BrokenProcessPool):
                    crashed = True  # some task killed its worker; innocent ones get one more try
                    attempts[i] += 1
                    if attempts[i] >= 2:
                        out[i] = Scored(VerifierResult(0.0, False, "worker crashed"), version)
                else:
                    out[i] = Scored(VerifierResult(0.0, False, f"error: {type(exc).__name__}: {exc}"), version)
            if pending or crashed:
                for f in pending:
                    f.cancel()
                if pool is self._pool:  # not already replaced by a concurrent caller
                    self._restart()
            todo = [i for i in todo if out[i] is None]
        return [s for s in out if s is not None]

    async def _start(self, pool: cf.ProcessPoolExecutor, path: str) -> None:
        """A fresh pool spawns its workers at its first task, and a worker imports a verifier at its first use
        of it: neither may count against a completion's `timeout_s` (on a loaded machine a spawn alone can
        take longer, and every completion would time out, a crashing verifier's too)."""
        ready = pool.__dict__.setdefault("brorl_ready", set())  # verifier paths a worker of this pool has imported
        if path in ready:
            return
        try:
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(pool, _load_in_worker, path), STARTUP_S)
        except (asyncio.TimeoutError, cf.process.BrokenProcessPool, RuntimeError):
            return  # the scoring round reports it (a timeout, a crashed worker) and restarts the pool
        ready.add(path)

    async def score_answers(self, path: str, version: str, completions: list[str], reference: str,
                            data: DataConfig) -> list[Scored]:
        """`score` on each completion's answer part (`taskdata.answer_region`: after the reasoning block);
        a completion whose reasoning never closes gets the configured outcome without being scored."""
        answers = [answer_region(c, data.reasoning_end, data.unclosed_reasoning) for c in completions]
        todo = [i for i, a in enumerate(answers) if a is not None]
        out = [Scored(VerifierResult(0.0, False, "reasoning not closed"), version)] * len(completions)
        for i, s in zip(todo, await self.score(path, version, [answers[i] for i in todo], reference) if todo else []):
            out[i] = s
        return out

    def close(self) -> None:
        self._kill_workers()
        self._pool.shutdown(wait=False, cancel_futures=True)
