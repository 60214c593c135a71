"""Run hostile programs through `verifiers/sandbox.py` as whatever user/capabilities/seccomp this process
has, and print what happened as one JSON line.

    python sandbox_probe.py SANDBOX_PY HOST_DIR PORT [PLANTED_JSON]

PLANTED_JSON names what the test planted on the host for the program to find: {"marker": the task's
input line, "expected": its expected output, "sockets": [Unix socket paths]}. Before running anything the
probe also plants a key in a session keyring of its own. Self-contained (loads the sandbox modules from
their file paths, standard library only) so it can run as an unprivileged user that cannot read the
project's virtual environment.
"""

import ctypes
import importlib.util
import json
import os
import platform
import sys
import time
import types

MARK = "brorl-probe-daemon"


def sandbox_processes(programs_only: bool = False) -> list[int]:
    """Processes of sandboxed programs left alive (their command line is `python3 -I main.py`), and the
    bubblewrap processes that hold them (whose command lines end with it). `programs_only`: the programs
    alone (bubblewrap's processes come before a program starts, also for the sandbox's own check that it
    contains: `print(40 + 2)`, gone a moment later)."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if b"main.py" in args and b"-I" in args and state not in ("Z", "X"):
            if not (programs_only and os.path.basename(args[0]) == b"bwrap"):
                out.append(int(pid))
    return out


# The hostile program of finding 1: walk every path it can see for the task's data; where a file holds its
# own stdin, print the line after it (the expected output, in a JSONL or input/output file); list what it saw.
WALKER = r"""
import json, os, stat, sys
line = sys.stdin.readline().strip()
seen, found, answer = sorted(os.listdir("/")), [], None
for root, dirs, files in os.walk("/"):
    if root in ("/proc", "/sys"):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(root, name)
        if "brorl-probe" in path:
            found.append(path)
        if root.startswith("/usr/") and "brorl-probe" not in path:
            continue
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # devices and pipes: nothing stored, may block
                continue
            with open(path, errors="replace") as f:
                text = f.read(1 << 20)
        except OSError:
            continue
        if line and line in text:
            found.append(path)
            rest = text.split(line, 1)[1].splitlines()
            answer = next((r for r in rest if r.strip()), answer)
print(answer if answer is not None else "nothing")
print(json.dumps({"top": seen, "found": sorted(set(found))}), file=sys.stderr)
"""

KEYS = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
NR = {NR}
buf = ctypes.create_string_buffer(4096)
n = libc.syscall(NR, 11, ctypes.c_int(-3), buf, 4096)  # KEYCTL_READ of the session keyring: its key ids
out = []
for i in range(0, max(n, 0), 4):
    b = ctypes.create_string_buffer(4096)
    m = libc.syscall(NR, 11, ctypes.c_int(int.from_bytes(buf.raw[i:i + 4], "little", signed=True)), b, 4096)
    out.append(b.raw[:max(m, 0)].decode(errors="replace"))
try:
    out.append(open("/proc/keys").read())
except OSError:
    pass
print(repr(out))
"""

SOCKETS = """
import socket
for path in {paths!r}:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print("reached", path)
    except OSError:
        pass
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\\0brorl-probe-abstract")
    print("reached abstract")
except OSError:
    pass
"""

MEMORY = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
held = 0
try:
    with open("/dev/shm/hold", "wb") as f:
        for _ in range(600):
            f.write(b"x" * (1 << 20))
            f.flush()
            held += 1
except OSError:
    pass
print("shm", held)
print("userns", libc.unshare(0x10000000) == 0)
try:
    os.memfd_create("hold")
    print("memfd", True)
except OSError:
    print("memfd", False)
print("shmget", libc.shmget(0, 1 << 30, 0o1600) >= 0)
"""

# four processes of 200 MiB each: within each one's address-space limit, over a 256 MiB total
SPREAD = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        b = bytearray(200 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        time.sleep(1.5)
        os._exit(0)
    kids.append(pid)
print("statuses", [os.waitpid(k, 0)[1] for k in kids])
"""

SYS_KEYCTL, SYS_ADD_KEY = {"x86_64": (250, 248), "aarch64": (219, 217)}[platform.machine()]
KEY_PAYLOAD = "brorl-probe-key-payload"


def plant_key() -> bool:
    """A user key in a session keyring this process joins (what pam_keyinit or a Kerberos cache leaves)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_KEYCTL, 1, b"brorl-probe-session") < 0:
        return False
    return libc.syscall(SYS_ADD_KEY, b"user", b"brorl-probe-secret", KEY_PAYLOAD.encode(), len(KEY_PAYLOAD),
                        ctypes.c_int(-3)) > 0


def load_sandbox(path: str):
    """verifiers/sandbox.py and verifiers/sandbox_host.py from the folder they were copied to."""
    folder = os.path.dirname(path)
    pkg = types.ModuleType("verifiers")
    pkg.__path__ = [folder]
    sys.modules["verifiers"] = pkg
    mods = {}
    for name in ("sandbox_host", "sandbox"):
        spec = importlib.util.spec_from_file_location(f"verifiers.{name}", os.path.join(folder, f"{name}.py"))
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[f"verifiers.{name}"] = mods[name]  # dataclasses look their module up
        spec.loader.exec_module(mods[name])
    return mods["sandbox"]


def main() -> None:
    sb_mod = load_sandbox(sys.argv[1])
    host_dir, port = sys.argv[2], int(sys.argv[3])
    planted = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    with open("/proc/self/status") as f:
        cap_eff = int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)
    res = {"uid": os.getuid(), "cap_sys_admin": bool(cap_eff >> 21 & 1), "planted_key": plant_key()}
    try:
        sb = sb_mod.Sandbox(sb_mod.Limits(cpu_s=2, wall_s=3.0, mem_mb=256, nproc=16))
    except sb_mod.SandboxUnavailable as e:
        print(json.dumps({**res, "refused": str(e)}))
        return
    res["isolation"] = sb.isolation
    res["sum"] = sb.run("print(sum(map(int, input().split())))", "1 2 3\n").stdout.strip()
    escape = os.path.join(host_dir, "escaped")
    r = sb.run(f"open({escape!r}, 'w').write('x')\nopen('/tmp/brorl-probe', 'w').write('x')\nprint('wrote')")
    res["wrote_host_dir"] = os.path.exists(escape)
    res["wrote_host_tmp"] = os.path.exists("/tmp/brorl-probe")
    r = sb.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
    res["reached_host_port"] = "connected" in r.stdout
    t0 = time.monotonic()
    r = sb.run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint('forked')\n")
    res["daemon_run_s"] = round(time.monotonic() - t0, 2)
    res["forked"] = "forked" in r.stdout
    # killed ones leave within moments; a loaded host, or another test worker's sandboxed program ending, may
    # take a few seconds: a survivor is one still there after 10
    end = time.monotonic() + 10.0
    while (left := sandbox_processes()) and time.monotonic() < end:
        time.sleep(0.2)
    res["left_alive"] = left
    if planted:
        walk = sb_mod.Sandbox(sb_mod.Limits(cpu_s=60, wall_s=90.0, mem_mb=512, nproc=16)).run(
            WALKER, planted["marker"] + "\n")
        seen = json.loads((walk.stderr.strip().splitlines() or ["{}"])[-1])
        res["walker"] = {"answer": walk.stdout.strip(), "faked_pass": walk.stdout.strip() == planted["expected"],
                         "timed_out": walk.timed_out, **seen}
        res["reached_sockets"] = sb.run(SOCKETS.format(paths=planted["sockets"])).stdout.split("\n")[:-1]
        res["keys_seen"] = sb.run(KEYS.replace("{NR}", str(SYS_KEYCTL))).stdout.strip()
        mem = sb.run(MEMORY).stdout.split()
        res["memory"] = {k: json.loads(v.lower()) for k, v in zip(mem[::2], mem[1::2])}
        # its own time limits: on a loaded host four processes touching 200 MiB each outlast sb's 3 s
        spread = sb_mod.Sandbox(sb_mod.Limits(cpu_s=10, wall_s=30.0, mem_mb=256, nproc=16)).run(SPREAD)
        res["spread"] = {"oom_killed": getattr(spread, "oom_killed", None), "stdout": spread.stdout.strip(),
                         "returncode": spread.returncode}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
