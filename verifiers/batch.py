"""Scoring a batch of completions in worker processes (evaluation: the learner's held-out estimate and
`brorl eval` score through here, so both score alike from any thread).

Each worker is a spawned process whose main thread runs the verifier, as an actor's scoring workers do:
a verifier's own signal-based time limit (math-verify's) works there, whatever thread the caller is on.
A verifier that raises gives reason "error: ..." (the caller must not take it for a wrong answer); work
still unfinished when the time budget ends gives reason "timeout" and its workers are killed.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import threading
import time

from verifiers.base import VerifierResult

STARTUP_S = 120.0
"""The most that starting the workers and importing the verifiers may add to the time budget."""

_CACHE: dict[str, object] = {}


def _score_many(path: str, completions: list[str], reference: str) -> list[tuple[float, bool, str]]:
    """In a worker: the verifier at `path` (imported once per worker) on each completion."""
    from verifiers.registry import load

    if path not in _CACHE:
        _CACHE[path] = load(path)
    v = _CACHE[path]
    out = []
    for c in completions:
        try:
            r = v.score(c, reference)
            out.append((float(r.reward), bool(r.correct), str(r.reason)))
        except Exception as e:
            out.append((0.0, False, f"error: {type(e).__name__}: {str(e)[:200]}"))
    return out


def is_error(r: VerifierResult) -> bool:
    """The verifier could not score it (it raised, failed to load, or its worker died): not an answer's fault."""
    return r.reason.startswith("error") or r.reason == "worker crashed"


def score_all(jobs: list[tuple[str, list[str], str]], workers: int = 1,
              timeout_s: float = 5.0) -> list[list[VerifierResult]]:
    """Score every job — (verifier path, completions, reference) — in `workers` spawned processes; one list
    of results per job, in order. The budget is `timeout_s` per completion per worker, plus start-up.
    `workers` = 0 scores in this thread instead (no time limit: for verifiers known to be quick)."""
    if not jobs:
        return []
    if workers == 0:
        return [[VerifierResult(*r) for r in _score_many(*job)] for job in jobs]
    n = sum(len(c) for _, c, _ in jobs)
    pool = new_pool(max(1, min(workers, len(jobs))))
    pending: set = set()
    try:
        futs = [pool.submit(_score_many, path, list(comps), ref) for path, comps, ref in jobs]
        _, pending = cf.wait(futs, timeout=STARTUP_S + timeout_s * -(-n // max(1, workers)))
        out = []
        for f, (_, comps, _) in zip(futs, jobs):
            if f in pending:
                out.append([VerifierResult(0.0, False, "timeout")] * len(comps))
            elif (exc := f.exception()) is not None:
                why = "worker crashed" if isinstance(exc, cf.process.BrokenProcessPool) else \
                    f"error: {type(exc).__name__}: {str(exc)[:200]}"
                out.append([VerifierResult(0.0, False, why)] * len(comps))
            else:
                out.append([VerifierResult(*r) for r in f.result()])
        return out
    finally:
        if pending:
            kill_workers(pool)
        pool.shutdown(wait=not pending, cancel_futures=True)


def new_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A pool of `workers` spawned scoring processes (no state of the caller's, e.g. a vLLM engine's, leaks in)
    that end with the process that started them."""
    return cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=exit_with_parent)


def exit_with_parent(poll_s: float = 1.0) -> None:
    """In a pool worker (its initializer): exit, with whatever it started, once the process that started it is gone
    (also when that happened while the worker was still starting). A parent killed with SIGKILL never shuts its
    pool down, and its workers, waiting on their call queue, would run on for good (with multiprocessing's
    resource tracker, which lasts as long as they do). A verifier stuck in C code that holds the GIL keeps the
    watch from running until it returns."""
    parent = mp.parent_process().pid  # recorded when the worker was spawned, whenever this runs

    def watch() -> None:
        while os.getppid() == parent:  # an orphan is re-parented (to init or a subreaper)
            time.sleep(poll_s)
        import psutil

        for child in psutil.Process().children(recursive=True):  # a program a verifier ran, a sandbox
            try:
                child.kill()
            except psutil.Error:
                pass
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="brorl-parent-watch").start()


def kill_workers(pool: cf.ProcessPoolExecutor) -> None:
    """SIGKILL every worker and everything it started (a hung verifier, a sandbox still being set up, a process
    a verifier spawned), the worker first so that it can start nothing more: nothing is left orphaned to init."""
    import psutil

    for pid in list(getattr(pool, "_processes", None) or {}):
        try:
            proc = psutil.Process(pid)
            tree = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
