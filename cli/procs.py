"""The processes `brorl` starts: the command line of a role (`brorl_command`), a child that dies with its
launcher (`die_with_parent`) and the kill of a whole process group (`kill_group`); used by the one-machine
launcher, the Ray launcher and the learner's ranks."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import psutil

from actors.supervisor import end_processes, end_trackers

PR_SET_PDEATHSIG = 1


def brorl_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies (however it dies)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the process group kill on the way out still applies
        return
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os._exit(1)


def kill_group(pgid: int, timeout_s: float = 3.0) -> None:
    """SIGKILL a process group, multiprocessing's resource trackers last (`end_processes`: else the shared memory
    of a dead actor's engine stays in /dev/shm for good, one set per restart); bounded by twice `timeout_s`."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                members.append(p)
        except OSError:  # gone meanwhile
            pass
    end_trackers(end_processes(members, timeout_s), timeout_s)
    try:  # the trackers left, and whatever was forked meanwhile
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
