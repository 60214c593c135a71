"""Run an untrusted Python program contained, for the `code` verifier — or refuse to.

Containment is bubblewrap (`bwrap`) in unprivileged user namespaces, the same for root and non-root:
  - its own PID namespace: when the run ends, its wall clock fires or the process that started it dies,
    the kernel kills every process in it — nothing the program forked outlives the run;
  - its own network namespace: only a loopback of its own, no route to the host's or anyone's sockets;
  - its own mount namespace: the host's file system read-only; /tmp and the working folder /work are
    fresh size-limited tmpfs mounts that vanish with the run. The program arrives through a memfd and
    its output leaves through unlinked temporary files, so a run writes nothing to the host's disk and
    leaves no folder behind, even when the process that started it is SIGKILLed;
  - its own IPC and UTS namespaces, no capabilities, a new session (no terminal injection);
  - as root, it first drops to a fresh unprivileged uid with no supplementary groups, so it cannot read
    root's files nor signal anything of the host;
  - rlimits: CPU seconds, address space, largest file (stdout included), open files, processes; an empty
    environment and an isolated interpreter (`python3 -I`); a wall-clock kill.

Not contained:
  - reading world-readable host files (system libraries, /etc, world-readable project folders) — and,
    when the actor runs as a non-root user, that user's own files (read only);
  - CPU and memory are bounded per process (rlimits), not as a cgroup total;
  - no seccomp filter: every system call is available to an unprivileged uid in its namespaces;
  - timing side channels, and the kernel's own attack surface.

Where bubblewrap cannot run — not installed, or user namespaces denied (Docker's default seccomp profile,
`user.max_user_namespaces = 0`) — `Sandbox()` raises `SandboxUnavailable` naming why, so the `code`
verifier fails its self-test and the actor refuses to start. Only an explicit operator choice,
`verifiers.sandbox_unsafe = true` (the environment variable BRORL_SANDBOX_UNSAFE=1 in the scoring
processes), runs programs uncontained: rlimits, empty environment, wall-clock kill of the process group,
a temporary folder — nothing else. `Sandbox.isolation` says which mode is in force.
"""

from __future__ import annotations

import functools
import logging
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

log = logging.getLogger("brorl.sandbox")
UNSAFE_ENV = "BRORL_SANDBOX_UNSAFE"
BWRAP_ENV = "BRORL_BWRAP"  # path of the bwrap binary (default: found on PATH)
CONTAINED = "bubblewrap: own pid/net/mount/ipc/uts namespaces, read-only host, tmpfs work folder, rlimits"
UNSAFE = "UNSAFE (verifiers.sandbox_unsafe): rlimits and a wall-clock kill only"


class SandboxUnavailable(RuntimeError):
    """Programs cannot be contained here, and running them uncontained was not explicitly allowed."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    """CPU seconds per process (RLIMIT_CPU)."""
    wall_s: float = 10.0
    """Wall-clock seconds before every process of the run is killed."""
    mem_mb: int = 512
    """Address space per process, MiB (RLIMIT_AS)."""
    fsize_mb: int = 8
    """Largest file it may write, stdout included, MiB (RLIMIT_FSIZE); also each tmpfs's size."""
    nproc: int = 32
    """Processes (threads count too) the run may hold at once (RLIMIT_NPROC)."""
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


def python_binary() -> str:
    """The interpreter programs run with: the system Python (any uid can read it), else ours."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def bwrap_command(work_mb: int, program_fd: int, info_fd: int, python: str) -> list[str]:
    binary = os.environ.get(BWRAP_ENV) or shutil.which("bwrap") or "bwrap"
    size = str(work_mb * 2**20)
    return [binary, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--info-fd", str(info_fd),
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/work", "--chdir", "/work",
            "--file", str(program_fd), "/work/main.py", "--clearenv", "--", python, "-I", "main.py"]


@functools.cache
def containment_problem() -> str | None:
    """None if bubblewrap contains programs on this host (checked once per process by running one),
    else why not."""
    try:
        r = _run_contained(Limits(wall_s=30.0), "print(40 + 2)", "")
    except FileNotFoundError:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    except OSError as e:
        return f"bubblewrap could not start: {e}"
    if r.stdout.strip() == "42":
        return None
    why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    return (f"bubblewrap cannot create its namespaces here ({why}); user namespaces are denied — e.g. "
            f"Docker's default seccomp profile or user.max_user_namespaces = 0")


class Sandbox:
    def __init__(self, limits: Limits = Limits(), unsafe: bool | None = None):
        self.limits = limits
        self.unsafe = os.environ.get(UNSAFE_ENV) == "1" if unsafe is None else unsafe
        problem = containment_problem()
        if problem is None:
            self.isolation = CONTAINED + (", own uid" if os.geteuid() == 0 else "")
        elif self.unsafe:
            self.isolation = UNSAFE
            log.warning("code sandbox: %s. Running untrusted programs UNCONTAINED because "
                        "verifiers.sandbox_unsafe is set", problem)
        else:
            raise SandboxUnavailable(
                f"the code sandbox cannot contain programs on this host: {problem}. Fix that, or set "
                f"verifiers.sandbox_unsafe = true to run untrusted programs with rlimits only (unsafe)")
        self.contained = problem is None

    def run(self, program: str, stdin: str = "") -> RunResult:
        if self.contained:
            return _run_contained(self.limits, program, stdin)
        with tempfile.TemporaryDirectory(prefix="brorl-unsafe-") as work:
            with open(os.path.join(work, "main.py"), "w") as f:
                f.write(program)
            os.chmod(work, 0o777)  # as root the program still runs under a fresh uid: let it work there
            return _run([python_binary(), "-I", "main.py"], self.limits, stdin, cwd=work)


def _run_contained(lim: Limits, program: str, stdin: str) -> RunResult:
    fd = os.memfd_create("brorl-program", 0)
    info_r, info_w = os.pipe()  # bwrap writes {"child-pid": N}: its namespace's init, as the host sees it
    try:
        os.write(fd, program.encode())
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_blocking(info_r, False)
        return _run(bwrap_command(lim.fsize_mb, fd, info_w, python_binary()), lim, stdin, pass_fds=(fd, info_w),
                    info_fd=info_r)
    finally:
        for f in (fd, info_r, info_w):
            try:
                os.close(f)
            except OSError:
                pass


def _run(cmd: list[str], lim: Limits, stdin: str, cwd: str | None = None, pass_fds: tuple = (),
         info_fd: int | None = None) -> RunResult:
    t0 = time.monotonic()
    setup = _preexec(lim)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env={}, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                preexec_fn=setup, close_fds=True, pass_fds=pass_fds)
        timed_out = False
        try:
            proc.communicate(stdin.encode(), timeout=lim.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except (BrokenPipeError, OSError):
            pass  # it exited (or closed stdin) before reading all input
        finally:
            _kill_session(proc, _namespace_init(info_fd))
            if info_fd is None and setup.uid is not None:  # uncontained, but under a fresh uid: all of it
                _kill_uid(setup.uid)
        return RunResult(None if timed_out else proc.returncode, _read_capped(out), _read_capped(err),
                         timed_out, time.monotonic() - t0)


def _namespace_init(info_fd: int | None) -> int | None:
    import json

    try:
        return int(json.loads(os.read(info_fd, 4096))["child-pid"]) if info_fd is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # bwrap never got that far: there is no namespace


def _kill_session(proc: subprocess.Popen, ns_init: int | None, wait_s: float = 5.0) -> None:
    """SIGKILL the run: its process group (bwrap, or the uncontained program) and its PID namespace's init
    (whose death makes the kernel kill every process left in the namespace); return once that init is
    gone, i.e. once nothing of the run is left."""
    for kill, pid in ((os.killpg, proc.pid), (os.kill, ns_init)):
        try:
            if pid is not None:
                kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    deadline = time.monotonic() + wait_s
    while ns_init is not None and time.monotonic() < deadline:  # not our child: watch /proc
        try:
            with open(f"/proc/{ns_init}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.005)


def _own_processes() -> int:
    """Processes and threads of our uid (RLIMIT_NPROC counts them all, not only the run's)."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return n


def _preexec(lim: Limits):
    root = os.geteuid() == 0
    uid = random.randint(1_000_000, 1_999_999) if root else None
    # a fresh uid starts at zero processes; our own uid already runs the actor's (many threads)
    nproc = lim.nproc if root else lim.nproc + _own_processes()

    def setup() -> None:  # in the child, between fork and exec
        os.setsid()
        mb = 2**20
        resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_s, lim.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim.mem_mb * mb, lim.mem_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.fsize_mb * mb, lim.fsize_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim.nofile, lim.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    setup.uid = uid
    return setup


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (kill(-1) as that uid), repeatedly: a fork bomb may fork between a
    scan and the signal. Only for the uncontained mode, where no PID namespace does it."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            for _ in range(1000):
                os.kill(-1, signal.SIGKILL)
                time.sleep(0.001)
        except Exception:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _read_capped(f, limit: int = 1 << 20) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")
