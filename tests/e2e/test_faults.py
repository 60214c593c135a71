"""Faults in a running job, with real processes (`brorl` roles, vLLM CPU engines, ZeroMQ, gloo), killed by
pid: one of two actors stopped with SIGSTOP and continued, then killed with SIGKILL; the only actor killed;
the learner killed with SIGKILL and resumed while its actors keep running; SIGKILL to `brorl run` itself
(SIGTERM to it: tests/e2e/test_run.py). Each checks from the ledger that no prompt was trained twice and
that every granted prompt is accounted for (trained, dropped by dynamic sampling, or still pending)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cli.launcher import Launcher
from config.loader import load_config, to_toml
from learner.metrics import read
from learner.ledger import account, check
from transport.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
HEARTBEAT_S = 3.0


def job(model_dir: str, run_dir: Path, steps: int, actors: int = 1, **over):
    port = free_ports(3)
    return load_config("tiny-cpu", {
        "model.path": model_dir, "run.run_dir": str(run_dir), "learner.steps": steps, "run.eval_interval": 0,
        "learner.checkpoint_interval": 2, "job.prompts_per_step": 4, "job.n_samples": 8,
        "actor.num_actors": actors, "transport.work_port": port, "transport.rollout_port": port + 1,
        "transport.control_port": port + 2, "transport.heartbeat_timeout_s": HEARTBEAT_S,
        "transport.weight_timeout_s": 30.0, "learner.no_progress_s": 10.0, **over})


def wait_for(cond, timeout_s: float, what: str, poll_s: float = 0.2):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(poll_s)
    raise TimeoutError(what)


def steps_done(run_dir: Path) -> int:
    rows = read(run_dir / "metrics.jsonl")
    return rows[-1]["step"] if rows else 0


def working(run_dir: Path, actor: str) -> bool:
    """Has `actor` been granted work yet (its engine is up and it takes part)?"""
    return any(r.get("actor") == actor and r.get("granted") for r in read(run_dir / "ledger.jsonl"))


def nice(la: Launcher, roles: list[str], value: int) -> None:
    """Set the scheduling priority of these roles' processes (and their engines). Each role runs in a
    session of its own, and where the kernel groups sessions for scheduling (autogroup), a process's nice
    value only ranks it within its session: the session's own nice value (/proc/PID/autogroup) is what
    ranks it against the other roles, so both are set."""
    for pid in (p for r in roles for p in tree(la.procs[r].pid)):
        try:
            os.setpriority(os.PRIO_PROCESS, pid, value)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(value))
        except OSError:  # no autogroup in this kernel, or not allowed to lower it: the process nice stands
            pass


def tree(pid: int) -> list[int]:
    """The process and all its descendants."""
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def run_launcher(cfg, during, done=lambda la: False, timeout_s=600) -> Launcher:
    """`brorl run`'s launcher without its evaluations: start, call `during(la)` from a poll loop (it must
    return quickly) until the learner finishes or `done(la)`, then stop the job in order (SIGTERM)."""
    la = Launcher(cfg, quiet=True)
    la.start()
    try:
        end = time.monotonic() + timeout_s
        while la.procs["learner"].poll() is None and not done(la):
            assert time.monotonic() < end, "the job did not finish"
            la._supervise_actors()
            during(la)
            time.sleep(0.2)
    finally:
        la.stop()
    assert la.procs["learner"].returncode == 0, (Path(cfg.run.run_dir) / "logs" / "learner.log").read_text()[-3000:]
    return la


def granted_to(run_dir: Path, actor: str) -> list[dict]:
    return [r for r in read(run_dir / "ledger.jsonl") if r.get("actor") == actor and r.get("granted")]


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


def brorl_run_process(cfg, folder: Path) -> subprocess.Popen:
    """`brorl run --no-eval` of `cfg` as a process of its own (config in folder/job.toml, output in run.log)."""
    cfg_path = folder / "job.toml"
    cfg_path.write_text(to_toml(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "cli", "run", "--config", str(cfg_path), "--no-eval"],
                            cwd=ROOT, env=env, stdout=open(folder / "run.log", "wb"), stderr=subprocess.STDOUT)


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
