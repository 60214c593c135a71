"""Faults in a running job with two actors, real processes (`brorl` roles, vLLM CPU engines, ZeroMQ, gloo),
signalled by pid: one actor stopped with SIGSTOP and continued, then killed with SIGKILL, while the other trains
on. Checks from the ledger that no prompt was trained twice and that every granted prompt is accounted for
(trained, dropped by dynamic sampling, or still pending). Restarts of a whole role: tests/e2e/test_restarts.py."""

import os
import signal
import time

import pytest

from learner.ledger import account, check
from learner.metrics import read
from tests.support.faults import HEARTBEAT_S, granted_to, job, nice, run_launcher, steps_done, working

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_one_of_two_actors_stopped_then_killed_while_the_other_trains_on(warm_model_dir, tmp_path):
    """One job, two faults of actor-1 while actor-0 keeps working. SIGSTOP: the learner evicts it as silent,
    the job trains on; SIGCONT: the same process (one incarnation) rejoins and takes work again, nothing
    restarted. Then SIGKILL: the survivor trains on with no stall beyond the heartbeat timeout and a few
    steps; the launcher restarts the dead one, whose new incarnation's groups are trained."""
    cfg = job(warm_model_dir, tmp_path, steps=100_000, actors=2)
    state = {}

    def during(la):
        pid, steps = la.procs["actor-1"].pid, steps_done(tmp_path)
        # on 2 shared cores a job training flat out starves an engine that is starting (on their own GPUs they
        # would not compete): while actor-1 (or its replacement) starts, the others yield the CPU
        if "stopped" not in state:
            if not working(tmp_path, "actor-1"):
                nice(la, ["learner", "actor-0"], 19)
            elif steps >= 3:
                nice(la, ["learner", "actor-0"], 0)
                os.kill(pid, signal.SIGSTOP)
                state["stopped"] = steps
        elif "cont" not in state:
            if steps >= state["stopped"] + 6:
                os.kill(pid, signal.SIGCONT)
                state["cont"], state["grants_before"] = steps, len(granted_to(tmp_path, "actor-1"))
        elif "back" not in state:
            if len(granted_to(tmp_path, "actor-1")) > state["grants_before"]:
                state["back"], state["restarts_when_back"] = steps, la.restarts
        elif "killed" not in state:
            if steps >= state["back"] + 3:
                state["incarnations_before_kill"] = {r["incarnation"] for r in granted_to(tmp_path, "actor-1")}
                os.kill(pid, signal.SIGKILL)
                state["killed"], state["t"] = steps, time.time()
        elif "yielded" not in state:
            if steps >= state["killed"] + 6:
                # the survivor trained on; the longest gap since the kill is what the kill cost
                t = [r["time"] for r in read(tmp_path / "metrics.jsonl") if r["time"] >= state["t"] - 5]
                state["gap"] = max(b - a for a, b in zip(t, t[1:]))
                nice(la, ["learner", "actor-0"], 19)
                state["yielded"] = True
        elif "restored" not in state and len({r["incarnation"] for r in granted_to(tmp_path, "actor-1")}) > 1:
            nice(la, ["learner", "actor-0"], 0)  # the replacement works: the learner must not starve now
            state["restored"] = True

    def done(la):  # the replacement's groups have been trained (asserted below from the ledger)
        grants = granted_to(tmp_path, "actor-1")
        if "yielded" not in state or len({r["incarnation"] for r in grants}) < 2:
            return False
        new = {pid for r in grants if r["incarnation"] != grants[0]["incarnation"] for pid in r["granted"]}
        return bool(new & set(account(tmp_path).trained))

    la = run_launcher(cfg, during, done)
    # SIGSTOP: evicted as silent, and the same process came back (nothing restarted)
    log = (tmp_path / "logs" / "learner.log").read_text()
    assert "actor-1 silent" in log and "evicted" in log
    assert state["restarts_when_back"] == 0 and len(state["incarnations_before_kill"]) == 1, state
    # SIGKILL: restarted once; the survivor kept training, no stall beyond the heartbeat timeout and a few steps
    assert la.restarts == 1
    assert state["gap"] < HEARTBEAT_S + 20, state["gap"]
    acc = account(tmp_path)
    check(acc, steps_done(tmp_path))
    grants = granted_to(tmp_path, "actor-1")
    first = grants[0]["incarnation"]
    new = {pid for r in grants if r["incarnation"] != first for pid in r["granted"]}
    assert new, "the replacement got no work under a new incarnation"
    assert new & set(acc.trained), "the replacement's groups were never trained"
