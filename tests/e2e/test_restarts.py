"""Restarts after SIGKILL, with real processes (`brorl` roles, vLLM CPU engines, ZeroMQ, gloo), killed by pid:
the only actor (the launcher starts a replacement), then in the same job the learner (`brorl run` restarts it
from its checkpoint while its actor keeps running);
`brorl run` itself (its children go with it; SIGTERM to it: tests/e2e/test_run.py). Each checks from the ledger
that no prompt was trained twice and that every granted prompt is accounted for. One actor of two:
tests/e2e/test_faults.py (a file of its own so that the two run on different test workers)."""

import signal
import subprocess
from pathlib import Path

import pytest

from learner.ledger import account, check
from learner.metrics import read
from tests.support.faults import alive, brorl_run_process, granted_to, job, steps_done, tree, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_sigkill_of_the_only_actor_then_of_the_learner_the_job_finishes(warm_model_dir, tmp_path):
    """`kill -9` by pid under `brorl run`, one job: first of the only actor (the launcher starts a replacement;
    the dead incarnation's prompts go back to the queue), then, once the replacement works, of the learner (the
    launcher says so and restarts it from its last checkpoint, `brorl learner --resume`, while the replacement,
    left running, serves both learners); the job finishes its steps with no prompt trained twice."""
    import json

    import psutil

    # 10 steps: the learner is killed after a checkpoint past the actor's kill (every 2 steps), never its last
    cfg = job(warm_model_dir, tmp_path, steps=10, **{"run.learner_restart_backoff_s": 0.0})
    run = brorl_run_process(cfg, tmp_path)

    def child(name):  # the role's process under `brorl run` (its whole word on the command line), None meanwhile
        try:
            return next((c for c in psutil.Process(run.pid).children() if name in c.cmdline()), None)
        except psutil.Error:
            return None

    role = lambda name: wait_for(lambda: child(name), 30, f"no {name} under brorl run")  # noqa: E731
    try:
        wait_for(lambda: steps_done(tmp_path) >= 3, 600, "no step 3")  # engines start slowly on a loaded host
        actor = role("actor")
        shm = mapped_shm([actor, *actor.children(recursive=True)])  # its engine's message queues, among others
        actor.send_signal(signal.SIGKILL)
        actor.wait(30)
        killed = steps_done(tmp_path)
        assert killed <= 6, f"the actor's kill came at step {killed}: no checkpoint left before the job's end"
        ckpt = tmp_path / "checkpoints" / "latest"
        incarnations = lambda: {r["incarnation"] for r in granted_to(tmp_path, "actor-0")}  # noqa: E731
        wait_for(lambda: len(incarnations()) > 1 and steps_done(tmp_path) >= killed + 1
                 and int(ckpt.read_text().split("-")[1]) > killed, 600, "the replacement actor never trained")
        # the launcher killed the dead actor's group with its resource tracker last, which unlinked these
        assert shm and not [n for n in shm if Path("/dev/shm", n).exists()], shm
        learner = role("learner")
        learner.send_signal(signal.SIGKILL)
        learner.wait(30)
        # the last step the killed learner completed: a step's metrics row is written before its checkpoint
        killed_at = max(steps_done(tmp_path), int(ckpt.read_text().split("-")[1]))
        assert run.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
    out = (tmp_path / "run.log").read_text()
    assert "learner died (signal 9); restarting from checkpoint step" in out and "(restart 1 of 3)" in out, out[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["learner_restarts"] == 1 and summary["actor_restarts"] == 1 and summary["steps"] == 10, summary
    assert "learner restarted" in (tmp_path / "logs" / "actor-0.log").read_text()  # the replacement re-synced
    acc = account(tmp_path)
    assert len(acc.starts) == 2 and 2 <= acc.starts[1] <= killed_at
    check(acc, 10, per_step=4)
    restarted = [r for r in acc.returned if r["reason"] in ("restarted", "evicted")]
    assert restarted, "the dead incarnation's prompts never went back to the queue"
    rows = read(tmp_path / "metrics.jsonl")
    assert rows[-1]["step"] == 10 and rows[-1]["version"] == 10
    # one row a step: the restarted learner cut the rows of the steps it trained again
    assert [r["step"] for r in rows] == list(range(1, 11)), [r["step"] for r in rows]


def mapped_shm(procs) -> set[str]:
    """The segments of multiprocessing's SharedMemory (/dev/shm/psm_*) that any of `procs` maps."""
    names = set()
    for p in procs:
        try:
            maps = Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            continue
        names |= {line.split("/dev/shm/", 1)[1].split()[0] for line in maps.splitlines() if "/dev/shm/psm_" in line}
    return names


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
