"""A vLLM engine brorl builds ends when the process that built it does, however that process died.

vLLM runs an engine's core in a process of its own (its workers watch the core through a pipe, but the core does
not watch its parent): an actor killed with SIGKILL would leave its engine core and worker running, holding their
memory (on a GPU host, the GPU memory the actor's replacement needs). `brorl run` and the Ray launcher kill a dead
role's process group, but that does not cover a process killed by pid under another supervisor, or by hand.

The owner marks its environment (`mark_owner`, from `actors.engine.offline_env`, before any engine is built);
vLLM loads `register` in every process it starts as a general plugin (the `vllm.general_plugins` entry point in
pyproject.toml); in the engine core — the owner's direct child — it starts a thread that, once the owner is gone,
sends the core SIGTERM (vLLM's own shutdown, which ends its workers) and SIGKILL after `GRACE_S`; an engine process
whose owner died before vLLM loaded the plugin (an orphan from its start) ends at once. Anywhere else it
does nothing: the owner itself, an engine's workers (children of the core), any program not started by brorl.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

OWNER = "BRORL_ENGINE_OWNER"
GRACE_S = 10.0


def mark_owner() -> None:
    """The engines this process builds from now on die with it; a warning where vLLM cannot load the watch."""
    os.environ[OWNER] = str(os.getpid())
    if not loadable():
        logging.getLogger("brorl.actor").warning(
            "brorl is not installed as a package (pip install -e .): vLLM cannot load its engine watch, so this "
            "process's vLLM engine would outlive it if it were killed with SIGKILL")


def loadable() -> bool:
    """Can vLLM find the watch (brorl installed, its entry point registered)?"""
    from importlib.metadata import entry_points

    return any(e.value == f"{__name__}:register" for e in entry_points(group="vllm.general_plugins"))


def register() -> None:
    """vLLM's general-plugin hook."""
    owner = os.environ.get(OWNER, "")
    if not owner.isdigit() or int(owner) == os.getpid():
        return
    if os.getppid() != int(owner):
        if _gone(int(owner)):  # an engine process whose owner died before vLLM loaded this: it is an orphan
            threading.Thread(target=_end, daemon=True, name="brorl-engine-watch").start()
        return  # an engine's worker (its parent, the core, watches), or the owner is alive elsewhere
    threading.Thread(target=_watch, args=(int(owner),), daemon=True, name="brorl-engine-watch").start()


def _gone(pid: int) -> bool:
    """The process has exited (no such process, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _watch(owner: int, poll_s: float = 1.0) -> None:
    while os.getppid() == owner:  # an orphan is re-parented (to init or a subreaper): the owner is gone
        time.sleep(poll_s)
    _end()


def _end() -> None:
    """vLLM's own shutdown (SIGTERM ends the core's workers too), then SIGKILL after `GRACE_S`."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)
