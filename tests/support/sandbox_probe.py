"""Run hostile programs through `verifiers/sandbox.py` as whatever user/capabilities/seccomp this process
has, and print what happened as one JSON line.

    python sandbox_probe.py SANDBOX_PY HOST_DIR PORT

Self-contained (loads the sandbox module from its file path, standard library only) so it can run as an
unprivileged user that cannot read the project's virtual environment.
"""

import importlib.util
import json
import os
import sys
import time

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


def main() -> None:
    spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
    sb_mod = importlib.util.module_from_spec(spec)
    sys.modules["sandbox"] = sb_mod  # dataclasses look their module up
    spec.loader.exec_module(sb_mod)
    host_dir, port = sys.argv[2], int(sys.argv[3])
    with open("/proc/self/status") as f:
        cap_eff = int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)
    res = {"uid": os.getuid(), "cap_sys_admin": bool(cap_eff >> 21 & 1)}
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
    res["left_alive"] = sandbox_processes()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
