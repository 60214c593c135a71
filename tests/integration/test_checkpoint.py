"""Checkpoints survive crashes: every window of a save (by an exception at each step of it, and by SIGKILL
of a saving process at random moments) leaves a valid checkpoint to resume from, no temporary folder after
the next start, and re-saving a step is safe. Rotation and torn JSONL lines too."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from learner.checkpoint import Checkpointer
from learner.metrics import MetricsWriter, open_append, read

ROOT = Path(__file__).resolve().parents[2]


def state(step: int, size: int = 1000) -> dict:
    return {"meta": {"step": step, "version": step}, "optimizer": {"m": torch.full((size,), float(step))}}


def writer(step: int, size: int = 1000):
    def write_model(d: Path) -> None:
        d.mkdir()
        torch.save({"w": torch.full((size,), float(step))}, d / "model.pt")
        (d / "config.json").write_text(json.dumps({"step": step}))

    return write_model


def model_step(st) -> int:
    return int(torch.load(st.model_dir / "model.pt")["w"][0].item())


def test_resave_same_step_and_rotation_with_keep(tmp_path):
    ck = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        ck.save(state(step), writer(step))
    ck.save(state(3), writer(30))  # the same step again: replaced whole
    st = ck.latest()
    assert st.step == 3 and model_step(st) == 30
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert names == ["step-000002", "step-000003"]
    (tmp_path / "checkpoints" / "step-000002" / "KEEP").touch()
    for step in (4, 5):
        ck.save(state(step), writer(step))
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert names == ["step-000002", "step-000004", "step-000005"]  # the newest 2 plus the marked one


@pytest.mark.parametrize("fail_at", ["write_model", "replace:1", "replace:2", "replace:3", "replace:4"])
@pytest.mark.parametrize("resave", [False, True])
def test_every_crash_window_leaves_a_valid_checkpoint(tmp_path, monkeypatch, fail_at, resave):
    """An exception at each step of a save stands for a crash there: the files are left as a crash would
    leave them. The next start cleans up and resumes from a valid checkpoint."""
    ck = Checkpointer(tmp_path)
    ck.save(state(1), writer(1))
    if resave:
        ck.save(state(2), writer(2))
    target = 2  # the crashing save writes step 2 (again, when resave), with model 20
    real_replace = os.replace
    calls = {"n": 0}

    def replace(a, b):
        calls["n"] += 1
        if fail_at == f"replace:{calls['n']}":
            raise RuntimeError("crash")
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace)
    write = writer(target * 10)
    if fail_at == "write_model":
        def write(d):  # noqa: F811 - a crash in the middle of writing the model
            d.mkdir()
            (d / "model.pt").write_bytes(b"partial")
            raise RuntimeError("crash")
    try:
        ck.save(state(target), write)
    except RuntimeError:
        pass
    monkeypatch.setattr(os, "replace", real_replace)
    again = Checkpointer(tmp_path)
    again.clean_leftovers()
    st = again.latest()
    assert st is not None and st.step in (1, 2)
    assert model_step(st) in ({1, 2, 20} if resave else {1, 20})
    assert not [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")], "leftovers"


def test_damaged_latest_falls_back_to_the_previous_one(tmp_path, caplog):
    ck = Checkpointer(tmp_path)
    ck.save(state(1), writer(1))
    ck.save(state(2), writer(2))
    model = tmp_path / "checkpoints" / "step-000002" / "model" / "model.pt"
    model.write_bytes(model.read_bytes()[:100])  # truncated on disk
    st = ck.latest()
    assert st.step == 1 and "damaged" in caplog.text
    (tmp_path / "checkpoints" / "step-000001" / "manifest.json").unlink()  # not a checkpoint any more
    assert ck.latest() is None


def test_sigkill_while_saving_never_breaks_resume(tmp_path):
    """A process saving 2 MB checkpoints in a loop is SIGKILLed at random moments; after each kill the
    folder resumes from a valid checkpoint whose model matches its step."""
    code = ("import sys; sys.path.insert(0, sys.argv[2])\n"
            "from tests.integration.test_checkpoint import state, writer\n"
            "from learner.checkpoint import Checkpointer\n"
            "ck = Checkpointer(sys.argv[1]); ck.clean_leftovers()\n"
            "st = ck.latest(); step = st.step if st else 0\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    step += 1; ck.save(state(step, 250_000), writer(step, 250_000))\n")
    rng = random.Random(0)
    last = 0
    for _ in range(6):
        p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(ROOT)], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.2, 1.0))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        st = Checkpointer(tmp_path).latest()
        assert st is not None and model_step(st) == st.step >= last
        last = st.step
    assert last >= 2


def test_a_resumed_learner_drops_the_rows_of_the_steps_it_trains_again(tmp_path):
    """A learner killed after step 5's row but before its checkpoint resumes from step 4: step 5 is trained
    again, so its first row goes (one row per step, the latest run's)."""
    w = MetricsWriter(tmp_path)
    for step in range(1, 6):
        w.write(step, {"loss": 1.0 / step})
    w.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # and a torn line after it
    w = MetricsWriter(tmp_path, resume_step=4)
    w.write(5, {"loss": 0.1})
    w.close()
    rows = read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["loss"] == 0.1
    w = MetricsWriter(tmp_path, resume_step=5)  # nothing past the checkpoint: the file stays as it is
    w.close()
    assert [r["step"] for r in read(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_torn_jsonl_lines_never_stop_a_run(tmp_path):
    w = MetricsWriter(tmp_path)
    w.write(1, {"loss": 0.5})
    w.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "lo')  # a crash in the middle of a write
    assert [r["step"] for r in read(tmp_path / "metrics.jsonl")] == [1]
    w = MetricsWriter(tmp_path)  # a resumed run appends after the torn line is cut off
    w.write(2, {"loss": 0.4})
    w.close()
    assert [r["step"] for r in read(tmp_path / "metrics.jsonl")] == [1, 2]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"granted": [1]}\n{"gra')
    with open_append(ledger) as f:
        f.write('{"granted": [2]}\n')
    assert read(ledger) == [{"granted": [1]}, {"granted": [2]}]
    ledger.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        read(ledger)  # damage in the middle is not a torn tail: it is reported, not skipped
