"""Restarts after SIGKILL, with real processes (`brorl` roles, vLLM CPU engines, ZeroMQ, gloo), killed by pid:
the only actor (the launcher starts a replacement); the learner (resumed while its actors keep running);
`brorl run` itself (its children go with it; SIGTERM to it: tests/e2e/test_run.py). Each checks from the ledger
that no prompt was trained twice and that every granted prompt is accounted for. One actor of two:
tests/e2e/test_faults.py (a file of its own so that the two run on different test workers)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from config.loader import to_toml
from learner.ledger import account, check
from learner.metrics import read
from tests.support.faults import ROOT, alive, brorl_run_process, job, run_launcher, steps_done, tree, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_sigkill_of_the_only_actor_training_resumes_with_the_replacement(warm_model_dir, tmp_path):
    cfg = job(warm_model_dir, tmp_path, steps=8)
    state = {}

    def during(la):
        if "killed" not in state and steps_done(tmp_path) >= 3:
            os.kill(la.procs["actor-0"].pid, signal.SIGKILL)
            state["killed"] = True

    la = run_launcher(cfg, during)
    assert la.restarts == 1
    acc = account(tmp_path)
    check(acc, 8, per_step=4)
    restarted = [r for r in acc.returned if r["reason"] in ("restarted", "evicted")]
    assert restarted, "the dead incarnation's prompts never went back to the queue"


def test_sigkill_of_the_learner_resumes_with_actors_left_running(warm_model_dir, tmp_path):
    cfg = job(warm_model_dir, tmp_path, steps=10)
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(to_toml(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}

    def start(role, *extra, log):
        return subprocess.Popen([sys.executable, "-m", "cli", role, "--config", str(cfg_path), *extra], cwd=ROOT,
                                env=env, stdout=open(tmp_path / log, "ab"), stderr=subprocess.STDOUT)

    learner = start("learner", log="learner.log")
    actor = start("actor", "--actor-id", "actor-0", log="actor.log")
    try:
        ckpt = tmp_path / "checkpoints" / "latest"
        wait_for(lambda: ckpt.exists() and int(ckpt.read_text().split("-")[1]) >= 4, 400, "no checkpoint at step 4")
        learner.send_signal(signal.SIGKILL)
        learner.wait()
        # the last step the killed learner completed: a step's checkpoint is written before its metrics row
        killed_at = max(steps_done(tmp_path), int(ckpt.read_text().split("-")[1]))
        resumed = start("learner", "--resume", log="learner-resumed.log")
        assert resumed.wait(timeout=400) == 0, (tmp_path / "learner-resumed.log").read_text()[-3000:]
        assert actor.poll() is None or actor.returncode == 0  # the same actor process served both learners
        assert actor.wait(timeout=120) == 0  # and stopped when the resumed learner finished
    finally:
        for p in (learner, actor, locals().get("resumed")):
            if p is not None and p.poll() is None:
                p.kill()
    acc = account(tmp_path)
    assert len(acc.starts) == 2 and acc.starts[1] >= 4 and acc.starts[1] <= killed_at
    check(acc, 10, per_step=4)
    assert "learner restarted" in (tmp_path / "actor.log").read_text()
    rows = read(tmp_path / "metrics.jsonl")
    assert rows[-1]["step"] == 10 and rows[-1]["version"] == 10


def test_an_actor_killed_by_pid_takes_its_engine_with_it(warm_model_dir, tmp_path):
    """SIGKILL of a `brorl actor` with no launcher around it (a supervisor that signals only its pid, or a user):
    its vLLM engine core and the core's worker end too (actors/engine_watch.py), where they used to run on
    holding their memory (with this tiny model 2.5 GiB of RSS; on a GPU, the memory its replacement needs)."""
    import psutil

    from actors.engine_watch import loadable

    assert loadable(), "brorl is not installed (pip install -e .): vLLM finds no engine watch to load"
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(to_toml(job(warm_model_dir, tmp_path, steps=8)))
    actor = subprocess.Popen([sys.executable, "-m", "cli", "actor", "--config", str(cfg_path), "--actor-id", "a0"],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=open(tmp_path / "actor.log", "wb"), stderr=subprocess.STDOUT)
    engine: list = []
    try:
        def core(pid: int) -> bool:
            try:
                p = psutil.Process(pid)
                return "EngineCore" in p.name() + " ".join(p.cmdline())
            except psutil.Error:  # a short-lived child (the verifier self-test) that has just exited
                return False

        def built():  # no learner: the actor builds its engine, then waits for one
            engine[:] = tree(actor.pid)[1:]
            return any(core(p) for p in engine)
        wait_for(built, 240, "no vLLM engine core under the actor")
        actor.kill()
        actor.wait()
        wait_for(lambda: not alive(engine), 40, f"the killed actor's engine processes run on: {alive(engine)}")
    finally:
        if actor.poll() is None:
            actor.kill()
        for pid in alive(engine):
            os.kill(pid, signal.SIGKILL)


def start_brorl_run(model_dir: str, tmp_path: Path) -> subprocess.Popen:
    """`brorl run --no-eval` as a process, on a long job that checkpoints only when stopped (and at 100)."""
    return brorl_run_process(job(model_dir, tmp_path, steps=200, **{"learner.checkpoint_interval": 100}), tmp_path)


def test_sigkill_of_brorl_run_takes_its_children_with_it(warm_model_dir, tmp_path):
    """The launcher itself killed with SIGKILL: the kernel sends each child SIGTERM (parent-death signal),
    so the learner still checkpoints and nothing of the job survives."""
    run = start_brorl_run(warm_model_dir, tmp_path)
    try:
        wait_for(lambda: steps_done(tmp_path) >= 2, 400, "no step 2")
        pids = tree(run.pid)[1:]
        run.send_signal(signal.SIGKILL)
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
    wait_for(lambda: not alive(pids), 150, f"processes outlived the killed launcher: {alive(pids)}", poll_s=0.5)
    assert (tmp_path / "checkpoints" / "latest").exists()  # the learner stopped in order and checkpointed
