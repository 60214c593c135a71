"""What the code sandbox takes from the host, and what it bounds there: the filesystem view a program gets,
the system calls it is denied, a fresh session keyring, and a memory + pids cgroup where one is delegated.

Filesystem view (`view_args`): the interpreter's prefix read-only (`/usr`, and the prefix of an interpreter
installed elsewhere) with `/usr/local` and the interpreter's own `site-packages` hidden, the top-level
`/bin`, `/lib*` links, a minimal `/dev` (read-only, with a size-limited `/dev/shm`), `/proc` of the
program's own PID namespace, and size-limited tmpfs `/tmp` and `/work`. Nothing else of the host exists
inside: no `/etc`, `/home`, `/root`, `/var`, `/run`, `/srv`, `/opt`, `/mnt`, no project, run folder,
dataset or key, no host Unix socket.

Memory (`Cgroup.open`): a cgroup of its own per run, with a memory limit that counts tmpfs and shared
memory and a pids limit — cgroup v2 where the actor's cgroup delegates the memory and pids controllers to
its children, else cgroup v1's memory and pids hierarchies where they are writable (root on most
container hosts); otherwise per-process rlimits and the size-limited tmpfs mounts bound it, and the
system calls that make memory outside both (`memfd_create`, `memfd_secret`, SysV `shmget`) are denied by a
seccomp filter in every mode.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import platform
import signal
import struct
import time

# --- filesystem view -------------------------------------------------------------------------------------

TOP_LEVEL_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def interpreter_prefix(python: str) -> str:
    """/usr for /usr/bin/python3 (through its links), /opt/py for /opt/py/bin/python3.12."""
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))


def view_args(python: str, tmp_bytes: int) -> list[str]:
    """bubblewrap's arguments for the filesystem a program sees (see the module docstring)."""
    prefix = interpreter_prefix(python)
    args = ["--ro-bind", "/usr", "/usr"]
    if prefix != "/usr" and not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    if not (prefix + "/").startswith("/usr/local/"):
        args += ["--tmpfs", "/usr/local"]  # pip's installs: projects, their data, other tools
    for sp in sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages"))):
        args += ["--tmpfs", sp]  # the interpreter's own installs (a system python's are its distro's, kept)
    for top in TOP_LEVEL_LINKS:
        path = "/" + top
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    size = str(tmp_bytes)
    args += ["--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/work"]
    return args


# --- seccomp ---------------------------------------------------------------------------------------------

# audit arch, the x32 bit (x86_64 only), and the numbers of memfd_create, memfd_secret, shmget
_ARCHES = {"x86_64": (0xC000003E, 0x40000000, (319, 447, 29)),
           "aarch64": (0xC00000B7, None, (279, 447, 194))}
_EPERM = 1


@functools.cache
def seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program (bubblewrap's `--seccomp FD` format) that fails memfd_create,
    memfd_secret and shmget with EPERM, and every call of another ABI (x32, i386); None on an architecture
    it has no table for."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, x32_bit, denied = arch
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | _EPERM
    checks = ([(jge, x32_bit)] if x32_bit else []) + [(jeq, nr) for nr in denied]
    n = 3 + len(checks)  # index of `ret allow`; `ret deny` follows it
    prog = [(ld, 0, 0, 4), (jeq, 0, n - 1, audit_arch), (ld, 0, 0, 0)]  # arch, else deny; then the number
    for i, (op, k) in enumerate(checks):
        prog.append((op, n + 1 - (3 + i) - 1, 0, k))
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


# --- session keyring -------------------------------------------------------------------------------------

_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
KEYCTL_JOIN_SESSION_KEYRING = 1


def join_fresh_session_keyring() -> None:
    """Give the calling process a new anonymous session keyring (the caller's keys, e.g. a Kerberos
    KEYRING: cache or pam_keyinit's session, stay behind). Raises OSError when the kernel refuses."""
    nr = _SYS_KEYCTL.get(platform.machine())
    if nr is None:
        raise OSError(f"no keyctl system call number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(err)}")


# --- cgroups ---------------------------------------------------------------------------------------------


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _mounts() -> dict[str, str]:
    """Controller (or "" for cgroup v2) -> the mount point of its hierarchy (mounted at its root)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, (fstype, _, opts) = left.split(), right.split()[:3]
            if fields[3] != "/":
                continue
            if fstype == "cgroup2":
                out.setdefault("", fields[4])
            elif fstype == "cgroup":
                for c in opts.split(","):
                    out.setdefault(c, fields[4])
    return out


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


class Cgroup:
    """One run's cgroup(s): created with its limits, joined by the run's first process before it execs,
    killed and removed after the run. `Cgroup.open` returns None where no cgroup is delegated to us."""

    _counter = 0
    _stuck: list[str] = []
    """Folders of this process's ended runs that `close` could not remove yet: retried at each `open`."""

    def __init__(self, version: str, dirs: list[str]):
        self.version, self.dirs = version, dirs

    @classmethod
    def mode(cls) -> str | None:
        """'cgroup v2' or 'cgroup v1' where runs get a cgroup of their own, else None."""
        parents = cls._parents()
        return parents[0] if parents else None

    @staticmethod
    def _parents() -> tuple[str, list[str]] | None:
        try:
            own, mounts = _own_cgroups(), _mounts()
        except OSError:
            return None
        if "" in own and "" in mounts:
            base = os.path.join(mounts[""], own[""].lstrip("/"))
            try:
                with open(os.path.join(base, "cgroup.subtree_control")) as f:
                    enabled = f.read().split()
            except OSError:
                enabled = []
            if {"memory", "pids"} <= set(enabled) and _writable_dir(base):
                return "cgroup v2", [base]
        if all(c in own and c in mounts for c in ("memory", "pids")):
            bases = [os.path.join(mounts[c], own[c].lstrip("/")) for c in ("memory", "pids")]
            if all(_writable_dir(b) for b in bases):
                return "cgroup v1", bases
        return None

    @classmethod
    def open(cls, mem_bytes: int, pids: int) -> Cgroup | None:
        found = cls._parents()
        if found is None:
            return None
        version, bases = found
        if cls._counter == 0:
            cls._sweep(bases)
        for d in list(cls._stuck):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                continue  # a process of that run is still dying
            cls._stuck.remove(d)
        cls._counter += 1
        name = f"brorl-sandbox-{os.getpid()}-{cls._counter}"
        dirs = [os.path.join(b, name) for b in bases]
        for d in dirs:
            os.mkdir(d)
        cg = cls(version, dirs)
        try:
            if version == "cgroup v2":
                cg._write(dirs[0], "memory.max", mem_bytes)
                cg._write(dirs[0], "memory.swap.max", 0, optional=True)
                cg._write(dirs[0], "pids.max", pids)
            else:
                cg._write(dirs[0], "memory.limit_in_bytes", mem_bytes)
                cg._write(dirs[0], "memory.memsw.limit_in_bytes", mem_bytes, optional=True)
                cg._write(dirs[1], "pids.max", pids)
        except OSError:
            cg.close()
            raise
        return cg

    @staticmethod
    def _sweep(bases: list[str]) -> None:
        """Remove the (empty) cgroups of runs whose scoring process was SIGKILLed: their programs died with
        their PID namespace, their folders stayed."""
        for b in bases:
            for d in glob.glob(os.path.join(b, "brorl-sandbox-*-*")):
                pid = int(os.path.basename(d).split("-")[2])
                if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                    try:
                        os.rmdir(d)
                    except OSError:
                        pass

    @staticmethod
    def _write(d: str, name: str, value: int, optional: bool = False) -> None:
        try:
            with open(os.path.join(d, name), "w") as f:
                f.write(str(value))
        except FileNotFoundError:
            if not optional:
                raise

    def join(self) -> None:
        """Move the calling process into the run's cgroup(s) (between fork and exec)."""
        for d in self.dirs:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def oom_killed(self) -> bool:
        """Whether the memory limit killed a process of the run."""
        events = "memory.events" if self.version == "cgroup v2" else "memory.oom_control"
        try:
            with open(os.path.join(self.dirs[0], events)) as f:
                return any(ln.split()[:1] == ["oom_kill"] and int(ln.split()[1]) > 0 for ln in f)
        except (OSError, ValueError, IndexError):
            return False

    def close(self, wait_s: float = 5.0) -> None:
        """SIGKILL whatever is left in the cgroup(s) and remove them."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            while os.path.isdir(d):
                try:
                    with open(os.path.join(d, "cgroup.procs")) as f:
                        pids = [int(p) for p in f.read().split()]
                except OSError:
                    pids = []
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                try:
                    os.rmdir(d)
                except OSError:
                    if time.monotonic() > deadline:
                        self._stuck.append(d)  # a process outlived the run (`run` raised): retried later
                        break
                    time.sleep(0.005)
