"""Processes a test started: stopped with everything they started (a failed test leaves nothing behind)."""

import subprocess

import psutil


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process that is still running and all its descendants (a learner's ranks, an actor's vLLM
    engine core and worker: killed alone, the parent would leave them running), then reap it."""
    if proc.poll() is None:
        for c in psutil.Process(proc.pid).children(recursive=True):
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
        proc.kill()
    proc.wait()
