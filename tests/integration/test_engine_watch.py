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
