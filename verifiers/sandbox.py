"""Run an untrusted Python program contained, for the `code` verifier — or refuse to.

Containment is bubblewrap (`bwrap`, 0.8 or newer) in unprivileged user namespaces, the same for root and
non-root:
  - what it can see: only the interpreter's prefix, read-only, with `/usr/local` and the interpreter's own
    site-packages hidden; a read-only minimal `/dev`; its own `/proc`; size-limited tmpfs `/tmp`, `/work`
    and `/dev/shm` (`verifiers.sandbox_host.view_args`). No `/etc`, home folder, `/root`, `/var`, `/run`,
    `/srv`, `/opt`, `/mnt`, project, run folder, dataset or key exists inside, so neither the task's test
    cases nor a host Unix socket are on any path it can open. The test cases reach it only as its stdin,
    one at a time; the expected output never leaves the scoring process;
  - its own PID namespace: when the run ends, its wall clock fires or the process that started it dies,
    the kernel kills every process in it — nothing the program forked outlives the run: `Sandbox.run`
    returns once they are all gone, and raises `SandboxError` where one is still alive `KILL_WAIT_S`
    after the kill (a process the kernel cannot end, e.g. in uninterruptible sleep);
  - its own network namespace: only a loopback of its own (no route to the host's TCP, UDP or abstract
    Unix sockets);
  - its own IPC and UTS namespaces, no capabilities, no further user namespaces (`--disable-userns`), a
    new session (no terminal injection) and a fresh session keyring (the caller's keys stay behind);
  - a seccomp filter that fails memfd_create, memfd_secret and SysV shmget (memory no tmpfs size bounds)
    and every call of another ABI;
  - memory and processes: a cgroup of its own with a memory limit (counting tmpfs and shared memory) and a
    pids limit where the host delegates one (cgroup v2, or v1 as root on most container hosts), and always
    rlimits: CPU seconds, address space, largest file (stdout included), open files, processes;
  - as root, it first drops to a fresh unprivileged uid with no supplementary groups;
  - an empty environment, an isolated interpreter (`python3 -I`) and a wall-clock kill. The program arrives
    through a memfd and its output leaves through unlinked temporary files: a run writes nothing to the
    host's disk and leaves nothing behind, even when the process that started it is SIGKILLed.

Not contained:
  - the interpreter's prefix (`/usr`: system libraries and the distribution's Python packages) is readable;
  - without a delegated cgroup, memory is bounded per process (rlimits) and per tmpfs, not as one total;
  - timing side channels, and the kernel's own attack surface (the seccomp filter is not an allow-list).

Where bubblewrap cannot run — not installed, too old, user namespaces denied (Docker's default seccomp
profile, `user.max_user_namespaces = 0`) — `Sandbox()` raises `SandboxUnavailable` naming why, so the `code`
verifier fails its self-test and the actor refuses to start. Where only `/proc` cannot be mounted (a host
whose `/proc` is partly masked, as in a Docker container run with `seccomp=unconfined`), runs go without a
`/proc` and `Sandbox.isolation` says so. Only an explicit operator choice, `verifiers.sandbox_unsafe = true`
(the environment variable BRORL_SANDBOX_UNSAFE=1 in the scoring processes), runs programs uncontained:
rlimits, empty environment, wall-clock kill of the process group, a temporary folder — nothing else.
`Sandbox.isolation` says which mode is in force.
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

from verifiers.sandbox_host import Cgroup, join_fresh_session_keyring, seccomp_filter, view_args

log = logging.getLogger("brorl.sandbox")
UNSAFE_ENV = "BRORL_SANDBOX_UNSAFE"
BWRAP_ENV = "BRORL_BWRAP"  # path of the bwrap binary (default: found on PATH)
CONTAINED = "bubblewrap: own pid/net/mount/ipc/uts/user namespaces, minimal read-only view, tmpfs work folder"
UNSAFE = "UNSAFE (verifiers.sandbox_unsafe): rlimits and a wall-clock kill only"
MASKED_PROC = "no /proc (the host's /proc is partly masked)"
KILL_WAIT_S = 10.0
"""Seconds a run's processes may take to die once killed before `Sandbox.run` raises `SandboxError`."""


class SandboxUnavailable(RuntimeError):
    """Programs cannot be contained here, and running them uncontained was not explicitly allowed."""


class SandboxError(RuntimeError):
    """A run's processes are still alive `KILL_WAIT_S` after they were killed: the run could not be ended."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    """CPU seconds per process (RLIMIT_CPU)."""
    wall_s: float = 10.0
    """Wall-clock seconds before every process of the run is killed."""
    mem_mb: int = 512
    """Address space per process, MiB (RLIMIT_AS); also the run's cgroup memory limit, where it has one."""
    fsize_mb: int = 8
    """Largest file it may write, stdout included, MiB (RLIMIT_FSIZE); also each tmpfs's size."""
    nproc: int = 32
    """Processes (threads count too) the run may hold at once (RLIMIT_NPROC; the cgroup's pids.max)."""
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
    oom_killed: bool = False
    """The run's cgroup memory limit killed one of its processes."""
    uid: int | None = None
    """The fresh uid the run's processes ran under (as root); None where they ran under ours."""


def python_binary() -> str:
    """The interpreter programs run with: the system Python (any uid can read it), else ours."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def bwrap_command(lim: Limits, program_fd: int, info_fd: int, seccomp_fd: int, python: str,
                  proc: bool = True) -> list[str]:
    binary = os.environ.get(BWRAP_ENV) or shutil.which("bwrap") or "bwrap"
    return [binary, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--info-fd", str(info_fd), "--seccomp", str(seccomp_fd),
            *view_args(python, lim.fsize_mb * 2**20), *(["--proc", "/proc"] if proc else []), "--chdir", "/work",
            "--file", str(program_fd), "/work/main.py", "--clearenv", "--", python, "-I", "main.py"]


@dataclass(frozen=True)
class HostSupport:
    problem: str | None
    """Why programs cannot be contained here, or None."""
    proc: bool = True
    """Whether runs get a /proc of their own (not where the host's /proc is masked)."""


@functools.cache
def host_support() -> HostSupport:
    """Whether bubblewrap contains programs on this host, checked once per process by running one."""
    if seccomp_filter() is None:
        return HostSupport(f"no seccomp table for this architecture ({os.uname().machine})")
    for proc in (True, False):
        try:
            r = _run_contained(Limits(wall_s=30.0), "print(40 + 2)", "", proc=proc)
        except subprocess.SubprocessError as e:  # the preexec step: the keyring or the cgroup
            return HostSupport(f"a run cannot be given a fresh session keyring and its cgroup here ({e})")
        except FileNotFoundError:
            return HostSupport("bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
        except OSError as e:
            return HostSupport(f"bubblewrap could not start: {e}")
        if r.stdout.strip() == "42":
            return HostSupport(None, proc)
        why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        if "Unknown option" in why:
            return HostSupport(f"bubblewrap is too old ({why}); 0.8 or newer is needed (--disable-userns)")
        if not (proc and "Can't mount proc" in why):
            return HostSupport(f"bubblewrap cannot create its namespaces here ({why}); user namespaces are "
                               f"denied — e.g. Docker's default seccomp profile or user.max_user_namespaces = 0")
    return HostSupport(f"bubblewrap cannot run a program here, with or without /proc ({why})")


def containment_problem() -> str | None:
    """None if bubblewrap contains programs on this host, else why not."""
    return host_support().problem


class Sandbox:
    def __init__(self, limits: Limits = Limits(), unsafe: bool | None = None):
        self.limits = limits
        self.unsafe = os.environ.get(UNSAFE_ENV) == "1" if unsafe is None else unsafe
        support = host_support()
        problem = support.problem
        if problem is None:
            memory = Cgroup.mode()
            self.isolation = (CONTAINED + (", own uid" if os.geteuid() == 0 else "")
                              + ("" if support.proc else f", {MASKED_PROC}")
                              + (f"; memory and pids: {memory} limit per run" if memory else
                                 "; memory: rlimits per process and size-limited tmpfs (no delegated cgroup)"))
        elif self.unsafe:
            self.isolation = UNSAFE
            log.warning("code sandbox: %s. Running untrusted programs UNCONTAINED because "
                        "verifiers.sandbox_unsafe is set", problem)
        else:
            raise SandboxUnavailable(
                f"the code sandbox cannot contain programs on this host: {problem}. Fix that, or set "
                f"verifiers.sandbox_unsafe = true to run untrusted programs with rlimits only (unsafe)")
        self.contained = problem is None

    def run(self, program: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
        """Run `program` with `stdin`, under `limits` (default: the sandbox's own). Returns once nothing of
        the run is left; raises SandboxError where a process of it outlives `KILL_WAIT_S` after the kill."""
        lim = limits or self.limits
        if self.contained:
            return _run_contained(lim, program, stdin, proc=host_support().proc)
        with tempfile.TemporaryDirectory(prefix="brorl-unsafe-") as work:
            with open(os.path.join(work, "main.py"), "w") as f:
                f.write(program)
            os.chmod(work, 0o777)  # as root the program still runs under a fresh uid: let it work there
            return _run([python_binary(), "-I", "main.py"], lim, stdin, cwd=work)


def _run_contained(lim: Limits, program: str, stdin: str, proc: bool = True) -> RunResult:
    fd = os.memfd_create("brorl-program", 0)
    seccomp = os.memfd_create("brorl-seccomp", 0)
    info_r, info_w = os.pipe()  # bwrap writes {"child-pid": N}: its namespace's init, as the host sees it
    cgroup = Cgroup.open(lim.mem_mb * 2**20, lim.nproc)
    try:
        os.write(fd, program.encode())
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(seccomp, seccomp_filter() or b"")
        os.lseek(seccomp, 0, os.SEEK_SET)
        os.set_blocking(info_r, False)
        cmd = bwrap_command(lim, fd, info_w, seccomp, python_binary(), proc=proc)
        return _run(cmd, lim, stdin, pass_fds=(fd, info_w, seccomp), info_fd=info_r, cgroup=cgroup)
    finally:
        for f in (fd, seccomp, info_r, info_w):
            try:
                os.close(f)
            except OSError:
                pass
        if cgroup is not None:
            cgroup.close(KILL_WAIT_S)


def _run(cmd: list[str], lim: Limits, stdin: str, cwd: str | None = None, pass_fds: tuple = (),
         info_fd: int | None = None, cgroup: Cgroup | None = None) -> RunResult:
    t0 = time.monotonic()
    setup = _preexec(lim, cgroup, contained=info_fd is not None)
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
            _end_run(proc, info_fd, setup.uid)
        return RunResult(None if timed_out else proc.returncode, _read_capped(out), _read_capped(err),
                         timed_out, time.monotonic() - t0, cgroup is not None and cgroup.oom_killed(), setup.uid)


def _namespace_init(info_fd: int | None) -> int | None:
    import json

    try:
        return int(json.loads(os.read(info_fd, 4096))["child-pid"]) if info_fd is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # bwrap never got that far: there is no namespace


def _end_run(proc: subprocess.Popen, info_fd: int | None, uid: int | None) -> None:
    """SIGKILL the run and return once nothing of it is left, else raise SandboxError. Killed: its process
    group (bwrap, or the uncontained program), its PID namespace's init (whose death makes the kernel kill
    every process left in the namespace) and, uncontained as root, every process of its fresh uid. Watched:
    that init, which shows as exited only once the namespace is empty; without one (bwrap never got that
    far, or uncontained), the fresh uid's processes, where it has one."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"a sandboxed run could not be ended: its process {proc.pid} is still alive "
                           f"{KILL_WAIT_S:g} s after SIGKILL (a process the kernel cannot end, e.g. in "
                           f"uninterruptible sleep)") from None
    ns_init = _namespace_init(info_fd)  # read once bwrap is gone: all it will ever have written is there
    if ns_init is not None and not _init_of_another_namespace(ns_init):
        ns_init = None  # exited and reaped (its namespace is empty); the pid may name another process now
    if ns_init is not None:
        try:
            os.kill(ns_init, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    elif info_fd is None and uid is not None:
        _kill_uid(uid)
    deadline = time.monotonic() + KILL_WAIT_S
    while left := _left_of_run(ns_init, uid):
        if time.monotonic() > deadline:
            what = (f"its PID namespace (init pid {ns_init}) still holds processes" if ns_init is not None
                    else f"processes {left} of its uid {uid} are still alive")
            raise SandboxError(f"a sandboxed run could not be ended: {what} {KILL_WAIT_S:g} s after SIGKILL "
                               f"(a process the kernel cannot end, e.g. in uninterruptible sleep)")
        time.sleep(0.005)


def _left_of_run(ns_init: int | None, uid: int | None) -> list[int]:
    """What of the run is still alive: its namespace's init (exited only once the namespace is empty), else
    the processes of its fresh uid; nothing to watch where it had neither."""
    if ns_init is not None:
        return [ns_init] if _alive(ns_init) and _init_of_another_namespace(ns_init) else []
    return _processes_of(uid) if uid is not None else []


def _init_of_another_namespace(pid: int) -> bool:
    """Whether `pid` lives in a PID namespace other than ours (the run's init does; a process that reused
    its pid after it was reaped does not)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except PermissionError:
        return True  # not ours to inspect: assume it is the run's and keep watching it
    except OSError:
        return False  # gone


def _alive(pid: int) -> bool:
    """Whether `pid` has not exited yet (a zombie has); not our child, so read from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _processes_of(uid: int) -> list[int]:
    """Processes whose real uid is `uid` and that have not exited (a zombie leader whose other threads
    still run has not). Read from status: a process can make its /proc folder root's (PR_SET_DUMPABLE)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("State:", "Uid:", "Threads:")))
            ruid, state, threads = int(fields["Uid"].split()[0]), fields["State"].split()[0], int(fields["Threads"])
        except (OSError, ValueError, KeyError, IndexError):
            continue
        if ruid == uid and (state not in ("Z", "X") or threads > 1):
            out.append(int(pid))
    return out


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


def _preexec(lim: Limits, cgroup: Cgroup | None = None, contained: bool = True):
    root = os.geteuid() == 0
    uid = random.randint(1_000_000, 1_999_999) if root else None
    # a fresh uid starts at zero processes; our own uid already runs the actor's (many threads)
    nproc = lim.nproc if root else lim.nproc + _own_processes()

    def setup() -> None:  # in the child, between fork and exec
        os.setsid()
        try:
            join_fresh_session_keyring()
        except OSError:
            if contained:
                raise
        if cgroup is not None:
            cgroup.join()  # before dropping to the fresh uid, which may not write there
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
