"""The code sandbox contains hostile programs within a time bound and leaves the host unharmed."""

import ctypes
import glob
import json
import os
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from verifiers import code as code_v
from verifiers import sandbox
from verifiers.sandbox import Limits, Sandbox
from verifiers.sandbox_host import Cgroup

LIM = Limits(cpu_s=2, wall_s=4.0, mem_mb=256, nproc=16)
BOUND_S = LIM.wall_s + 3  # each hostile run must end within this


@pytest.fixture(scope="module")
def sb():
    return Sandbox(LIM)


def _run(sb, program, stdin=""):
    t = time.monotonic()
    r = sb.run(program, stdin)
    assert time.monotonic() - t < BOUND_S
    return r


def _uid_processes(uid):
    """Live (non-zombie) processes of `uid`, a run's own fresh uid: other tests' sandboxed programs (on other
    pytest workers, at the same moment) run under fresh uids of their own."""
    out = subprocess.run(["ps", "-eo", "pid=,uid=,stat="], capture_output=True, text=True).stdout.splitlines()
    return [int(p) for p, u, st in (line.split() for line in out) if int(u) == uid and not st.startswith("Z")]


def test_runs_a_normal_program(sb):
    r = _run(sb, "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", "1 2 3\n")
    assert r.returncode == 0 and r.stdout.strip() == "6"


def test_infinite_loop_is_stopped(sb):
    r = _run(sb, "while True:\n    pass\n")
    assert r.returncode != 0 or r.timed_out


def test_fork_bomb_is_contained(sb):
    r = _run(sb, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert r.returncode != 0 or r.timed_out
    assert (r.uid is not None) == (os.geteuid() == 0)  # as root, it ran under a fresh uid of its own
    assert r.uid is None or _uid_processes(r.uid) == []  # nothing it forked survives
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


PTRACE_SEIZE, PTRACE_DETACH, PTRACE_O_TRACEEXIT = 0x4206, 17, 0x40


def test_a_run_whose_process_cannot_die_raises_instead_of_returning(sb, monkeypatch):
    """`run` returns once nothing of the run is left, or raises: a process of the run that does not die
    when killed (held at its exit by a ptrace tracer outside the sandbox, as uninterruptible sleep would
    hold it) makes `run` raise SandboxError, never return while the process lives."""
    monkeypatch.setattr(sandbox, "KILL_WAIT_S", 0.5, raising=False)
    tag = f"3600.{os.getpid()}{time.monotonic_ns() % 10**6}"  # sleep's argument marks the process to hold
    held, release = [], threading.Event()

    def tracer() -> None:  # one thread from seize to detach: a tracer's exit would let the process go
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long] * 4
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f.read().split(b"\0")[:2] == [b"sleep", tag.encode()]:
                            if libc.ptrace(PTRACE_SEIZE, int(pid), 0, PTRACE_O_TRACEEXIT) == 0:
                                held.append(int(pid))
                except OSError:
                    pass
            time.sleep(0.01)
        release.wait(60)
        for pid in held:
            libc.ptrace(PTRACE_DETACH, pid, 0, 0)

    thread = threading.Thread(target=tracer)
    thread.start()
    raised = r = None
    try:
        r = sb.run(f"import os\nos.execv('/usr/bin/sleep', ['sleep', '{tag}'])", limits=replace(LIM, wall_s=2.0))
    except sandbox.SandboxError as e:
        raised = e
    finally:
        release.set()
        thread.join()
    assert held, "the tracer never caught the program"
    assert raised is not None and "could not be ended" in str(raised), f"it returned while the process lived: {r}"
    deadline = time.monotonic() + 10  # let go, it dies: nothing of the run is left behind by the test
    while os.path.exists(f"/proc/{held[0]}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{held[0]}")
    assert sb.run("print(1)").stdout == "1\n"  # and the next run removes the cgroup the failed one kept
    bases = (Cgroup._parents() or ("", []))[1]
    assert [d for b in bases for d in glob.glob(os.path.join(b, f"brorl-sandbox-{os.getpid()}-*"))] == []


def test_memory_bomb_is_contained(sb):
    r = _run(sb, "x = bytearray(8 * 1024**3)\nprint('allocated')")
    assert "allocated" not in r.stdout and r.returncode != 0


def test_cannot_write_outside_its_directory(sb, tmp_path):
    target = tmp_path.parent / "escape"
    for path in (str(target), "/etc/brorl-escape", "/tmp/brorl-escape"):
        r = _run(sb, f"open({path!r}, 'w').write('x')\nprint('wrote')")
        assert not os.path.exists(path), path
    r = _run(sb, "open('inside.txt', 'w').write('x'); print(open('inside.txt').read())")
    assert r.stdout.strip() == "x"


def test_huge_output_is_capped(sb):
    r = _run(sb, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert len(r.stdout) <= 1 << 20


def test_network_is_unreachable(sb):
    """The run has its own network namespace: the host's loopback listeners are out of reach."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = _run(sb, f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
        assert "connected" not in r.stdout and r.returncode != 0
    finally:
        srv.close()


def test_parent_environment_is_not_readable(sb, monkeypatch):
    monkeypatch.setenv("BRORL_SECRET_TOKEN", "hunter2")
    r = _run(sb, "import os\nprint(sorted(os.environ))\ntry:\n    print(open(f'/proc/{os.getppid()}/environ').read())\n"
                 "except Exception as e:\n    print('denied', type(e).__name__)")
    assert "hunter2" not in r.stdout and "BRORL_SECRET_TOKEN" not in r.stdout


def test_code_verifier_partial_credit():
    ref = json.dumps({"tests": [{"input": "3\n", "output": "9"}, {"input": "4\n", "output": "16"},
                                {"input": "-1\n", "output": "1"}]})
    good = code_v.score("```python\nn = int(input())\nprint(n * n)\n```", ref)
    assert good.correct and good.reward == 1.0
    partial = code_v.score("```python\nn = int(input())\nprint(n * n if n > 3 else 0)\n```", ref)
    assert not partial.correct and partial.reward == pytest.approx(1 / 3) and "1/3" in partial.reason
    crash = code_v.score("```python\nraise SystemExit(3)\n```", ref)
    assert crash.reward == 0 and "exit 3" in crash.reason


def test_a_program_that_searches_the_host_for_its_test_cases_scores_zero():
    """Issue 32, finding 1: the task file sits where a user keeps data (here /var/tmp, outside the /tmp
    the sandbox always hid); a program that walks every path it can see for its own stdin and prints the
    line after it used to score 1.0, "all tests passed". It finds nothing now: the code verifier scores 0."""
    from tests.support.sandbox_probe import WALKER

    data = os.path.join("/var/tmp", f"brorl-walker-{os.getpid()}")
    os.makedirs(data)
    try:
        tests = [{"input": f"brorl-walker-{os.getpid()}-{i}", "output": f"answer-{i}-{os.getpid()}"} for i in range(2)]
        with open(os.path.join(data, "train.jsonl"), "w") as f:
            for t in tests:  # the layout a dataset file has: input line, then expected output
                f.write(f"{t['input']}\n{t['output']}\n")
        res = code_v.score(f"```python\n{WALKER}\n```", json.dumps({"tests": tests}),
                           sandbox=Sandbox(Limits(cpu_s=60, wall_s=90.0, mem_mb=512)))
        assert res.reward == 0.0 and not res.correct and "wrong output" in res.reason, res
    finally:
        import shutil

        shutil.rmtree(data, ignore_errors=True)
