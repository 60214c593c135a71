"""The engine watch's decision at plugin load (actors/engine_watch.py), with real processes: an engine process whose
owner died before vLLM loaded the plugin ends at once; one whose owner lives elsewhere is left alone."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_LOAD = "from actors import engine_watch\nengine_watch.register()\nimport time\ntime.sleep(30)\n"


def _start(owner: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PLUGIN_LOAD], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "BRORL_ENGINE_OWNER": str(owner)})


def test_an_engine_process_orphaned_before_the_plugin_loaded_ends_and_one_with_a_live_owner_stays():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid: a process that has exited (an actor killed before its engine core loaded plugins)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    orphan, kept = _start(dead.pid), _start(live.pid)
    try:
        assert orphan.wait(timeout=20) == -signal.SIGTERM
        time.sleep(1.0)
        assert kept.poll() is None  # an owner alive elsewhere (this is an engine's worker): nothing to do
    finally:
        for p in (orphan, kept, live):
            p.kill()
            p.wait()


# An actor's end, in a process of its own: a spawned child (an engine core) that made a shared-memory segment and
# never unlinks it (an engine's message queue), with a grandchild of its own (the core's worker); then
# `EngineSupervisor.end`, whose engine teardown kills the child (vLLM's, after its grace), so the grandchild is
# re-parented away before `end_descendants` looks; one of the closes before it fails.
ACTOR_END = """
import json, multiprocessing as mp, os, signal, sys, time
from multiprocessing import shared_memory
import psutil
from actors.supervisor import EngineSupervisor

def grandchild():
    time.sleep(300)

def child(q):
    shm = shared_memory.SharedMemory(create=True, size=1 << 20)
    g = mp.get_context("spawn").Process(target=grandchild)
    g.start()
    q.put([shm.name, g.pid])
    time.sleep(300)

class Engine:
    def shutdown(self):
        os.kill(c.pid, signal.SIGKILL)
        c.join()

def broken_close():
    raise OSError("socket already closed")

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    c = ctx.Process(target=child, args=(q,))
    c.start()
    name, grand = q.get(timeout=60)
    sup = EngineSupervisor(lambda: None, 0)
    sup.engine = Engine()
    t0 = time.monotonic()
    sup.end(first=(broken_close,))
    end_s = time.monotonic() - t0
    left = [p for p in (c.pid, grand) if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({"shm": name, "pids": [c.pid, grand], "left": left, "end_s": end_s}), flush=True)
"""


def test_an_actors_end_kills_what_runs_under_it_and_unlinks_the_shared_memory_it_left(tmp_path):
    """What ran under the actor is gone when its end returns, also the worker of an engine core that its teardown
    killed; the segment the killed core left is unlinked by the resource tracker once the actor has exited (the
    end spares it), before `brorl run`'s kill of the group is over."""
    import json

    from cli.procs import kill_group

    script = tmp_path / "actor_end.py"  # a file: spawned children import their target from it
    script.write_text(ACTOR_END)
    p = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=120)
    finally:
        kill_group(p.pid)  # as `brorl run` does once an actor has exited
    assert p.returncode == 0, stderr[-2000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["left"] == [], f"left running under the ended actor: {out}"
    assert "the actor's end: broken_close failed" in stderr and "socket already closed" in stderr, stderr[-2000:]
    assert not os.path.exists(f"/dev/shm/{out['shm']}"), "the killed child's shared memory was left behind"
    assert out["end_s"] < 10.0, out


# An actor that dies without its own end (SIGKILL, the OOM killer): the same tree, the main process then sleeps
DYING_ACTOR = ACTOR_END[:ACTOR_END.index("    sup = EngineSupervisor")] + """    print(json.dumps({"shm": name, "pids": [c.pid, grand]}), flush=True)
    time.sleep(300)
"""


def test_a_dead_actors_group_is_killed_and_the_shared_memory_its_engine_left_is_unlinked(tmp_path):
    """`brorl run` kills a dead actor's process group (its engine still runs): multiprocessing's resource tracker,
    which unlinks the segments the killed processes registered, must outlive them, or /dev/shm fills over restarts."""
    import json

    import psutil

    from cli.procs import kill_group

    assert DYING_ACTOR != ACTOR_END
    script = tmp_path / "dying_actor.py"
    script.write_text(DYING_ACTOR)
    p = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out = json.loads(p.stdout.readline())
        assert os.path.exists(f"/dev/shm/{out['shm']}")
        group = [q for q in psutil.process_iter() if _pgid(q.pid) == p.pid]
        assert any("resource_tracker" in " ".join(_cmdline(q)) for q in group), [_cmdline(q) for q in group]
        p.kill()  # the actor dies; its engine and the tracker live on in its group
        p.wait()
        t0 = time.monotonic()
        kill_group(p.pid)
        took = time.monotonic() - t0
        left = [q.pid for q in group if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]
        assert left == [], f"left running in the dead actor's group: {left}"
        assert not os.path.exists(f"/dev/shm/{out['shm']}"), "the dead actor's engine's shared memory was left behind"
        assert took < 10.0
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _cmdline(q) -> list[str]:
    try:
        return q.cmdline()
    except Exception:
        return []
