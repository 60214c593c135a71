"""The test suite's own safety net (tests/support/reaper.py): when a pytest process dies without cleaning up
(a fatal signal, SIGKILL), what it started is killed — and only that."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support.reaper import OWNER_TAG

ROOT = Path(__file__).resolve().parents[2]

# An "owner" standing in for a pytest worker: tags its environment, starts a grandchild-making child (as a role
# starts its engine), says the pids, then waits to be killed.
OWNER = """
import os, subprocess, sys, time
os.environ[sys.argv[1]] = str(os.getpid())
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; g = subprocess.Popen(['sleep', '300']); print(g.pid, flush=True); time.sleep(300)"],
    stdout=subprocess.PIPE, text=True, start_new_session=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
time.sleep(300)
"""


def test_what_a_dead_pytest_process_started_is_killed_and_nothing_else():
    env = {k: v for k, v in os.environ.items() if k != OWNER_TAG}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, OWNER_TAG], stdout=subprocess.PIPE, text=True, env=env)
    bystander = subprocess.Popen(["sleep", "300"], env=env)  # untagged: not the owner's
    reaper = None
    try:
        child, grandchild = map(int, owner.stdout.readline().split())
        reaper = subprocess.Popen([sys.executable, "-m", "tests.support.reaper", str(owner.pid),
                                   repr(psutil.Process(owner.pid).create_time())], cwd=ROOT, env=env,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert psutil.pid_exists(child) and psutil.pid_exists(grandchild)  # nothing killed while the owner lives
        owner.send_signal(signal.SIGKILL)  # dies as a crashed worker does: no clean-up of its own
        owner.wait()
        err = reaper.communicate(timeout=30)[1]
        assert reaper.returncode == 0, err
        time.sleep(0.5)
        for pid in (child, grandchild):  # a session of its own and a grandchild: found by the tag, not the tree
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
        assert f"pytest process {owner.pid} exited leaving 2 processes" in err, err
        assert bystander.poll() is None  # an untagged process is left alone
    finally:
        for p in (owner, bystander, reaper):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
