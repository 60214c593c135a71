"""`brorl run`'s console on a role's failure: the job (`cli.job.run`) with fake roles — real processes started by
the real launcher, each a few lines of Python that write an event as a role does (`transport/events.py`).
A fatal error of the learner ends the job within seconds with that one line, and every role's process group is
killed by pid; an actor's refusal is one line and stops the job."""

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from config.loader import load_config

ROOT = Path(__file__).resolve().parents[2]

FATAL_LEARNER = """
import signal, time
from transport import events
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to SIGTERM: only a kill by pid ends it
time.sleep(0.3)
events.emit("fatal", "DataError: bad.parquet: not a readable Parquet file", "correct data.train")
time.sleep(120)
"""
BUSY_ACTOR = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an actor in its engine start does not answer SIGTERM
child = subprocess.Popen(["sleep", "120"])  # its engine: in its process group
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(120)
"""
REFUSING_ACTOR = """
from transport import events
events.emit("fatal", "refused to start: verifier 'code' failed its start-up self-test", "install bubblewrap")
raise SystemExit(78)
"""
SLEEPER = "import time; time.sleep(120)"


def _job(tmp_path, monkeypatch, learner: str, actor: str):
    """Run the job with these fake roles; (exit status, seconds, console lines, the fake actor's child pid)."""
    import cli.launcher
    from cli.job import run

    pidfile = tmp_path / "engine.pid"
    scripts = {"learner": learner, "actor": actor}
    monkeypatch.setattr(cli.launcher, "brorl_command",
                        lambda role, *a: [sys.executable, "-c", scripts[role], str(pidfile)])
    monkeypatch.setattr(cli.launcher, "FAILED_STOP_S", (1.0, 1.0))  # the failed job's waits before the kill
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cfg = load_config("tiny-cpu", {"run.run_dir": str(tmp_path / "run"), "actor.num_actors": 1})
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    t0 = time.monotonic()
    try:
        rc = run(cfg, evaluate=False)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return rc, time.monotonic() - t0, pidfile


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_fatal_error_of_the_learner_ends_the_job_at_once_with_one_line(tmp_path, monkeypatch, capsys):
    rc, took, pidfile = _job(tmp_path, monkeypatch, FATAL_LEARNER, BUSY_ACTOR)
    out = capsys.readouterr().out
    assert rc == 1, out
    assert took < 12, (took, out)  # the poll (0.5 s), then 1 s for each role: not 90 s for the actor
    fatal = [ln for ln in out.splitlines() if "FATAL" in ln]
    assert fatal == [f"[brorl run] learner FATAL: DataError: bad.parquet: not a readable Parquet file — fix: correct "
                     f"data.train (details: {tmp_path / 'run' / 'logs' / 'learner.log'})"], out
    assert "did not stop within" not in out and "waiting for the first step" in out
    engine = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(engine), "the actor's process group outlived the job"


@pytest.mark.parametrize("learner, actor, rc, said", [
    (SLEEPER, REFUSING_ACTOR, 78, "[brorl run] actor-0 FATAL: refused to start: verifier 'code' failed its start-up "
                                  "self-test — fix: install bubblewrap"),
    ("raise SystemExit(3)", SLEEPER, 3, "[brorl run] learner died (exit status 3); not restarted"),
], ids=["actor-refuses", "learner-dies-silently"])
def test_a_refusal_or_a_silent_death_is_one_line_and_stops_the_job(tmp_path, monkeypatch, capsys, learner, actor,
                                                                   rc, said):
    got, took, _ = _job(tmp_path, monkeypatch, learner, actor)
    out = capsys.readouterr().out
    assert got == rc and took < 12, (got, took, out)
    assert sum(said in ln for ln in out.splitlines()) == 1, out
    assert "refused to start: actor" not in out and "restarting it" not in out
    if rc == 78:
        assert "[brorl run] actor-0 refused to start; stopping the job" in out


def test_a_corrupt_data_file_reaches_the_console_of_brorl_run_and_ends_it(tiny_model_dir, tmp_path):
    """Real roles: a training file whose first rows are good (what the pre-flight reads) and whose row 1,201 is
    bad, under `data.on_bad_row = "fatal"`: the reason is one console line naming the file and row, and
    `brorl run` exits with it in seconds."""
    import json
    import subprocess

    from transport.ports import free_ports

    bad = tmp_path / "math.jsonl"  # the source is named by the file: math, scored by the math verifier
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(1200)] + [{"problem": "", "answer": "1"}]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    port = free_ports(3)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "cli", "run", "--no-eval", "--model.path", tiny_model_dir,
                        "--run.run_dir", str(tmp_path / "run"), "--data.train", str(bad), "--data.on_bad_row", "fatal",
                        "--transport.work_port", str(port), "--transport.rollout_port", str(port + 1),
                        "--transport.control_port", str(port + 2)],
                       capture_output=True, text=True, cwd=ROOT, timeout=240,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    # the actor's start-up check of the data or the learner's loading of it says it first; the job ends with it
    assert r.returncode in (1, 78), out[-3000:]
    fatal = [ln for ln in out.splitlines() if " FATAL: " in ln]
    assert 1 <= len(fatal) <= 2 and all(ln.startswith(("[brorl run] learner FATAL", "[brorl run] actor-0 FATAL"))
                                        for ln in fatal), out[-3000:]
    for ln in fatal:  # one line each: the role, the cause (the file, what is wrong), the fix, the log
        assert str(bad) in ln and "1201" in ln and ".log)" in ln, ln
    assert "did not stop within" not in out and "restarting it in" not in out
    assert took < 90, (took, out[-3000:])
