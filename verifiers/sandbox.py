"""Run an untrusted Python program with limits, for the `code` verifier.

What is contained (running as root, the default on our actor hosts and in CI):
  - its own session and process group, and its own user id (a fresh uid per run, no supplementary
    groups), so it cannot signal, ptrace or read the files of the host's processes — including the
    parent's /proc/<pid>/environ;
  - limits (setrlimit): CPU seconds, address space (memory), size of any file it writes, open files,
    and processes — RLIMIT_NPROC counts per uid, so a fork bomb hits it within its own uid;
  - a wall-clock kill: after `wall_s` every process of the run's uid is killed (SIGKILL), including
    children that left the process group;
  - no network: a new network namespace with no interface up (not even loopback);
  - a private mount namespace in which /tmp, /var/tmp, /dev/shm and /run/lock (the world-writable
    places) are fresh tmpfs mounts that vanish with the run; everything else it can see is owned by
    root and not writable by its uid, so it can write only inside its temporary working directory;
  - an empty environment (`env={}`) and an isolated interpreter (`python -I`: no user site, no
    PYTHON* variables); the interpreter is the system Python (/usr/bin/python3), since the project's
    virtual environment may sit under a directory other uids cannot read;
  - standard output goes to a file under the size limit, so flooding it cannot exhaust our memory.

What is NOT contained:
  - it can read world-readable files of the host (system libraries, /etc, the project's source if its
    folders are world-readable); keep secrets out of world-readable places;
  - CPU and memory are bounded per process, not as a cgroup total: up to `nproc` processes × `mem_mb`;
  - no seccomp filter: every system call is available (to an unprivileged uid, in its namespaces);
  - timing side channels, and the kernel's own attack surface.
Without root (no namespaces, no uid switch) only the session, rlimits, empty environment, wall-clock
kill (of the process group) and temporary directory apply: it can then reach the network, write wherever
the invoking user can, and read that user's files. `Sandbox.isolation` says which mode is in force.
"""

from __future__ import annotations

import ctypes
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
ROOT_BASE = Path("/var/lib/brorl-sandbox")


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    """CPU seconds per process (RLIMIT_CPU)."""
    wall_s: float = 10.0
    """Wall-clock seconds before every process of the run is killed."""
    mem_mb: int = 512
    """Address space per process, MiB (RLIMIT_AS)."""
    fsize_mb: int = 8
    """Largest file it may write, stdout included, MiB (RLIMIT_FSIZE)."""
    nproc: int = 32
    """Processes (threads count too) its uid may hold at once (RLIMIT_NPROC)."""
    nofile: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""


@dataclass(frozen=True)
class RunResult:
    returncode: int | None
    """Exit status; negative = killed by that signal; None if the wall-clock kill fired."""
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


class Sandbox:
    def __init__(self, limits: Limits = Limits(), python: str | None = None):
        self.limits = limits
        self.privileged = os.geteuid() == 0
        self.isolation = "root: uid+netns+mountns+rlimits" if self.privileged else "unprivileged: rlimits only"
        if python is None:
            python = "/usr/bin/python3" if self.privileged and os.path.exists("/usr/bin/python3") else sys.executable
        self.python = python

    def run(self, program: str, stdin: str = "") -> RunResult:
        uid = random.randint(1_000_000, 1_999_999) if self.privileged else os.getuid()
        work = Path(tempfile.mkdtemp(prefix="run-", dir=self._base()))
        try:
            (work / "main.py").write_text(program)
            out_f, err_f = work / ".stdout", work / ".stderr"
            if self.privileged:
                os.chown(work, uid, uid)
                os.chmod(work, 0o700)
            t0 = time.monotonic()
            with open(out_f, "wb") as out, open(err_f, "wb") as err:
                proc = subprocess.Popen(
                    [self.python, "-I", "main.py"], cwd=work, env={}, stdin=subprocess.PIPE, stdout=out,
                    stderr=err, preexec_fn=self._preexec(uid), close_fds=True,
                )
                timed_out = False
                try:
                    proc.communicate(stdin.encode(), timeout=self.limits.wall_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                except (BrokenPipeError, OSError):
                    pass  # it exited (or closed stdin) before reading all input
                finally:
                    self._kill_all(proc, uid)
            return RunResult(
                returncode=None if timed_out else proc.returncode,
                stdout=_read_capped(out_f),
                stderr=_read_capped(err_f),
                timed_out=timed_out,
                seconds=time.monotonic() - t0,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _base(self) -> str | None:
        if not self.privileged:
            return None
        ROOT_BASE.mkdir(parents=True, exist_ok=True)
        os.chmod(ROOT_BASE, 0o711)  # others may traverse to their own run folder, not list it
        return str(ROOT_BASE)

    def _preexec(self, uid: int):
        lim, privileged = self.limits, self.privileged

        def setup() -> None:  # runs in the child between fork and exec
            os.setsid()
            if privileged:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
                    os._exit(120)
                if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
                    os._exit(121)
                for d in PRIVATE_TMP:
                    if os.path.isdir(d):
                        if libc.mount(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=16m,mode=1777") != 0:
                            os._exit(122)
            mb = 1024 * 1024
            resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s + 1))
            resource.setrlimit(resource.RLIMIT_AS, (lim.mem_mb * mb, lim.mem_mb * mb))
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim.fsize_mb * mb, lim.fsize_mb * mb))
            resource.setrlimit(resource.RLIMIT_NOFILE, (lim.nofile, lim.nofile))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_NPROC, (lim.nproc, lim.nproc))
            if privileged:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        return setup

    def _kill_all(self, proc: subprocess.Popen, uid: int) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.privileged:
            # kill(-1) as the run's uid reaches every process of that uid, wherever it went
            pid = os.fork()
            if pid == 0:
                try:
                    os.setgid(uid)
                    os.setuid(uid)
                    # repeat: a fork bomb may fork between our scan and the signal's delivery;
                    # kill(-1) fails with ESRCH once no process of the uid is left
                    for _ in range(1000):
                        os.kill(-1, signal.SIGKILL)
                        time.sleep(0.001)
                except Exception:
                    pass
                os._exit(0)
            os.waitpid(pid, 0)
        proc.wait()


def _read_capped(path: Path, limit: int = 1 << 20) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")
