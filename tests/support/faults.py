"""What the fault tests of tests/e2e (test_faults.py, test_restarts.py) share: a small CPU job with a short
heartbeat timeout, polling of its metrics and ledger, the launcher driven from a poll loop, process trees."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from cli.launcher import Launcher
from config.loader import load_config, to_toml
from learner.metrics import read
from transport.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 3.0


def job(model_dir: str, run_dir: Path, steps: int, actors: int = 1, **over):
    port = free_ports(3)
    return load_config("tiny-cpu", {
        "model.path": model_dir, "run.run_dir": str(run_dir), "learner.steps": steps, "run.eval_interval": 0,
        "learner.checkpoint_interval": 2, "job.prompts_per_step": 4, "job.n_samples": 8,
        "actor.num_actors": actors, "transport.work_port": port, "transport.rollout_port": port + 1,
        "transport.control_port": port + 2, "transport.heartbeat_timeout_s": HEARTBEAT_S,
        "transport.weight_timeout_s": 30.0, "learner.no_progress_s": 10.0, **over})


def wait_for(cond, timeout_s: float, what, poll_s: float = 0.2):
    """`cond()` once true (polled), else a TimeoutError saying `what` (or what `what()` says at the timeout)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(poll_s)
    raise TimeoutError(what() if callable(what) else what)


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


def described(pids) -> str:
    """Each live pid of `pids` with its state, parent and command line (a failure message that says what ran on)."""
    out = []
    for pid in alive(pids):
        try:
            p = psutil.Process(pid)
            out.append(f"{pid} ({p.status()}, parent {p.ppid()}): {' '.join(p.cmdline())[:160] or p.name()}")
        except psutil.Error:
            pass
    return "; ".join(out) or "none"


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


def ended(proc: subprocess.Popen, folder: Path) -> bool:
    """False while `proc` (from `brorl_run_process`) runs; once it has ended, an AssertionError with its exit
    code and console (a `wait_for` condition: a job that failed is named at once, not after the wait)."""
    if proc.poll() is None:
        return False
    raise AssertionError(f"brorl run ended (exit {proc.returncode}):\n{(folder / 'run.log').read_text()[-3000:]}")


def brorl_run_process(cfg, folder: Path) -> subprocess.Popen:
    """`brorl run --no-eval` of `cfg` as a process of its own (config in folder/job.toml, output in run.log)."""
    cfg_path = folder / "job.toml"
    cfg_path.write_text(to_toml(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "cli", "run", "--config", str(cfg_path), "--no-eval"],
                            cwd=ROOT, env=env, stdout=open(folder / "run.log", "wb"), stderr=subprocess.STDOUT)
