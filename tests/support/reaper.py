"""`python -m tests.support.reaper OWNER_PID CREATE_TIME`: wait until the test process OWNER_PID has exited (however:
a fatal signal ends an xdist worker without any fixture's teardown), then SIGKILL every
process still carrying its tag in the environment (`OWNER_TAG`, which every process it started inherits: roles,
their vLLM engine cores, Ray's daemons). A stuck test then costs its own timeout, not the rest of the run's CPU and
memory to the engines and learners it left behind. Started by tests/conftest.py, one per pytest process."""

from __future__ import annotations

import os
import sys
import time

import psutil

OWNER_TAG = "BRORL_TEST_OWNER"


def tagged(owner: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(OWNER_TAG) == owner:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def main(owner: int, created: float) -> None:
    while True:
        try:
            if psutil.Process(owner).create_time() != created:
                break  # the pid was reused: the owner is gone
        except psutil.NoSuchProcess:
            break
        time.sleep(0.5)
    left = tagged(str(owner))
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if left:
        print(f"[reaper] pytest process {owner} exited leaving {len(left)} processes: killed "
              f"{sorted({p.pid for p in left})}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
