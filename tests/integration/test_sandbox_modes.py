"""The code sandbox is contained or refuses — never silently uncontained — as root, as root without
CAP_SYS_ADMIN, as root under a Docker-like seccomp profile (no namespaces: refused unless the operator
says unsafe), in a mount namespace whose /proc is masked as Docker masks it, and as an unprivileged user;
and nothing of a run survives its scoring worker's SIGKILL.

Each mode runs `tests/support/sandbox_probe.py` (hostile programs, standard library only) in a real
process with that identity: `setpriv` for the uid and capabilities, `tests/support/no_userns.py` for the
seccomp filter, `unshare` for the masked /proc. Where the probe's uid could read them, the test plants the
task's data (input line and expected output) in /var/tmp, /opt, /srv and a 0700 home folder (with a 0600
"CURVE secret key" beside it), Unix sockets in /var/tmp, the home folder and the abstract namespace, and the
probe plants a key in its session keyring: a program that walks every path it can see finds none of it."""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from actors.scoring import ScoringPool
from tests.support.sandbox_probe import sandbox_processes
from verifiers.sandbox import CONTAINED, UNSAFE

ROOT = Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"
NO_CAP_SYS_ADMIN = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


@pytest.fixture
def world():
    """A folder anyone may read and write (so only the sandbox can stop a write), the probe and sandbox
    module copied into it, and a listening host port nobody should reach."""
    d = Path(tempfile.mkdtemp(prefix="brorl-probe-"))
    os.chmod(d, 0o777)
    for f in ("verifiers/sandbox.py", "verifiers/sandbox_host.py", "tests/support/sandbox_probe.py",
              "tests/support/no_userns.py"):
        shutil.copy(ROOT / f, d / Path(f).name)
        os.chmod(d / Path(f).name, 0o644)
    (d / "host").mkdir()
    os.chmod(d / "host", 0o777)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield d, srv.getsockname()[1]
    srv.close()
    shutil.rmtree(d, ignore_errors=True)
    if os.path.exists("/tmp/brorl-probe"):  # written on the host by the UNSAFE mode's run, as it may
        os.remove("/tmp/brorl-probe")


class Planted:
    """The task's data and sockets on the host, where a program looking for them would look; `uid` owns the
    home folder (0700) and what is in it (0600), as a user's own files are."""

    def __init__(self, uid: int):
        tag = f"brorl-probe-{os.getpid()}-{uid}"
        self.marker, self.expected = f"{tag} input 12345", f"{tag} the expected output"
        row = json.dumps({"prompt": "double it", "reference": {"tests": [{"input": self.marker, "output": self.expected}]}})
        task = f"{self.marker}\n{self.expected}\n{row}\n"
        self.dirs = [Path("/var/tmp") / tag, Path("/opt") / tag, Path("/srv") / tag, Path("/home") / tag]
        for d in self.dirs:
            d.mkdir(parents=True)
            (d / "train.jsonl").write_text(task)
        home = self.dirs[-1]
        (home / "actor.key_secret").write_text(f"secret-key = \"{self.marker}\"\n{self.expected}\n")
        for f in home.iterdir():
            os.chmod(f, 0o600)
            os.chown(f, uid, uid)
        os.chmod(home, 0o700)
        os.chown(home, uid, uid)
        self.servers = []
        for path, mode in ((self.dirs[0] / "bus.sock", 0o777), (home / "systemd.sock", 0o600), ("\0brorl-probe-abstract", None)):
            srv = socket.socket(socket.AF_UNIX)
            srv.bind(str(path))
            srv.listen(8)
            if mode is not None:
                os.chmod(path, mode)
                os.chown(path, uid, uid)
            self.servers.append(srv)
        self.sockets = [str(self.dirs[0] / "bus.sock"), str(home / "systemd.sock")]

    def arg(self) -> str:
        return json.dumps({"marker": self.marker, "expected": self.expected, "sockets": self.sockets})

    def close(self) -> None:
        for srv in self.servers:
            srv.close()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def probe(world, wrap: list[str], uid: int | None = None, **env) -> dict:
    d, port = world
    planted = Planted(uid) if uid is not None else None
    try:
        r = subprocess.run([*wrap, PY, str(d / "sandbox_probe.py"), str(d / "sandbox.py"), str(d / "host"), str(port),
                            *([planted.arg()] if planted else [])],
                           capture_output=True, text=True, timeout=300, env={"PATH": os.environ["PATH"], **env}, cwd=d)
    finally:
        if planted:
            planted.close()
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if planted:
        res["expected"] = planted.expected
    return res


VISIBLE = {"bin", "dev", "lib", "lib64", "proc", "sbin", "tmp", "usr", "work"}  # links as this host has them


def memory_mode_expected(uid: int) -> str | None:
    """What the host delegates to `uid`: cgroup v1's memory and pids hierarchies are writable by root here."""
    v1 = [Path("/sys/fs/cgroup") / c for c in ("memory", "pids")]
    if uid == 0 and all((p / "cgroup.procs").exists() for p in v1):
        return "cgroup v1"
    return None


def assert_sees_nothing_of_the_host(res: dict, uid: int) -> None:
    """Findings 1-5 of issue 32: the walker finds no task data and fakes no pass, sees only the minimal view;
    no host socket; no key of the caller's session keyring; memory bounded in every form."""
    walker = res["walker"]
    assert not walker["timed_out"], walker
    assert walker["found"] == [] and walker["answer"] == "nothing" and not walker["faked_pass"], walker
    assert set(walker["top"]) <= VISIBLE and "usr" in walker["top"], walker["top"]
    assert res["reached_sockets"] == [], res["reached_sockets"]
    assert res["planted_key"] and "brorl-probe-key-payload" not in res["keys_seen"], res["keys_seen"]
    mem = res["memory"]
    assert mem["shm"] <= 8 and not mem["userns"] and not mem["memfd"] and not mem["shmget"], mem
    mode = memory_mode_expected(uid)
    if mode:
        assert f"memory and pids: {mode}" in res["isolation"], res["isolation"]
        assert res["spread"]["oom_killed"], res["spread"]  # 4 x 200 MiB over a 256 MiB cgroup
    else:
        assert "no delegated cgroup" in res["isolation"], res["isolation"]


def assert_contained(res: dict) -> None:
    assert res["isolation"].startswith(CONTAINED), res
    assert res["sum"] == "6"
    assert not res["wrote_host_dir"] and not res["wrote_host_tmp"], res
    assert not res["reached_host_port"], res
    assert res["forked"] and res["left_alive"] == [], res  # the daemon it forked died with the run
    assert res["daemon_run_s"] < 3, res  # ... at once: the run did not wait for it


def test_root_is_contained_under_a_fresh_uid(world):
    res = probe(world, [], uid=0)
    assert res["uid"] == 0 and res["cap_sys_admin"]
    assert_contained(res)
    assert "own uid" in res["isolation"]
    assert_sees_nothing_of_the_host(res, 0)


def test_root_without_cap_sys_admin_is_still_contained(world):
    res = probe(world, NO_CAP_SYS_ADMIN, uid=0)
    assert res["uid"] == 0 and not res["cap_sys_admin"]
    assert_contained(res)
    assert_sees_nothing_of_the_host(res, 0)


def test_an_unprivileged_user_is_contained_too(world):
    res = probe(world, NOBODY, uid=65534)
    assert res["uid"] == 65534
    assert_contained(res)
    assert_sees_nothing_of_the_host(res, 65534)


def test_a_masked_proc_as_in_docker_unconfined_runs_contained_without_proc(world):
    """Docker run with seccomp=unconfined allows user namespaces but masks parts of /proc (/proc/keys
    among them): bubblewrap cannot mount a /proc of its own. The sandbox runs without one and says so (it
    used to refuse, blaming user namespaces)."""
    d, _ = world
    masked = ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c",
              'mount --bind /dev/null /proc/keys && exec "$@"', "masked", *NO_CAP_SYS_ADMIN]
    res = probe(world, masked)
    assert "refused" not in res, res
    assert_contained(res)
    assert "no /proc (the host's /proc is partly masked)" in res["isolation"], res["isolation"]


def test_without_namespaces_docker_default_it_refuses_unless_told_unsafe(world):
    d, _ = world
    docker_like = [*NO_CAP_SYS_ADMIN, PY, str(d / "no_userns.py")]
    res = probe(world, docker_like)
    assert "refused" in res and "user namespaces are denied" in res["refused"], res
    assert "verifiers.sandbox_unsafe" in res["refused"]
    unsafe = probe(world, docker_like, BRORL_SANDBOX_UNSAFE="1")
    assert unsafe["isolation"] == UNSAFE and unsafe["sum"] == "6"  # runs, and says it is uncontained
    assert unsafe["left_alive"] == []  # as root it still runs under a fresh uid, all of which is killed


def test_missing_bubblewrap_refuses_with_the_fix(world):
    res = probe(world, [], BRORL_BWRAP="/nonexistent/bwrap")
    assert "refused" in res and "apt-get install bubblewrap" in res["refused"], res


async def test_nothing_survives_a_sigkilled_scoring_worker(tmp_path, monkeypatch):
    # the scoring pool's temporary folder is this test's own (its workers inherit TMPDIR, a forked one
    # tempfile's cached choice): the host's /tmp also gets other tests' files, e.g. a vLLM engine's on the
    # other pytest worker, which are not this one's to judge
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    before = set(os.listdir(tmp))
    ref = json.dumps({"tests": [{"input": "", "output": "x"}]})
    prog = "```python\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\ntime.sleep(600)\n```"
    pool = ScoringPool(workers=1, timeout_s=60)
    task = asyncio.create_task(pool.score("verifiers.code", "1", [prog], ref))
    # sandboxed processes are found host-wide, and the other pytest worker may be scoring code too: this test
    # judges its own, those under this process (seen while their worker lives; each poll adds what it finds)
    ours: set[int] = set()

    def mine(programs_only: bool = False) -> set[int]:
        under = {p.pid for p in psutil.Process().children(recursive=True)}
        found = set(sandbox_processes(programs_only)) & under
        ours.update(found)
        return found

    try:
        deadline = time.monotonic() + 60
        while len(mine(programs_only=True)) < 2 and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.1)  # the program and its daemon
        running = mine()  # and the bubblewrap processes that hold them
        assert len(running) >= 2, (f"sandboxed processes {running}; scoring "
                                   f"{task.exception() or task.result() if task.done() else 'still running'}")
        for pid in list(pool._pool._processes):
            os.kill(pid, signal.SIGKILL)  # the scoring worker dies mid-run
        deadline = time.monotonic() + 15
        while running & set(sandbox_processes()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not running & set(sandbox_processes()), "the killed worker's sandbox outlived it"
        deadline = time.monotonic() + 60  # the crashed completion's one more try, in a new worker: close ends it
        while len(mine(programs_only=True) - running) < 2 and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.1)
        assert len(ours - running) >= 2, f"no retry ran: {task.exception() or task.result() if task.done() else ''}"
        mine()  # and the bubblewrap processes that hold the retry's
    finally:
        task.cancel()
        pool.close()
    deadline = time.monotonic() + 15
    while ours & set(sandbox_processes()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not ours & set(sandbox_processes()), ours & set(sandbox_processes())
    assert set(os.listdir(tmp)) - before == set()  # and no folder or file was left on the host


async def test_a_hung_verifiers_own_processes_die_with_its_worker():
    """A verifier that starts a process and hangs: the timeout restarts the pool, and the process it started
    goes with its worker (it is not left to init)."""
    import psutil

    from tests.support.verifier_mods._misbehave import CHILD_SLEEP_S

    def children():
        return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", CHILD_SLEEP_S]]

    pool = ScoringPool(workers=1, timeout_s=3)
    try:
        scored = await pool.score("tests.support.verifier_mods.hangs_with_a_child", "1", ["x"], "y")
        assert [s.result.reason for s in scored] == ["timeout"] and pool.restarts == 1
        deadline = time.monotonic() + 10
        while children() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert children() == [], "the hung verifier's process outlived its worker"
    finally:
        pool.close()
        for p in children():
            p.kill()
