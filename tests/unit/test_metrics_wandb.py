"""Metrics reach Weights & Biases (`run.wandb_project`), tested with the real wandb in offline mode: the run's
files land in the run folder, with the values written (the offline run file holds each history item's key and
JSON value as plain protobuf strings), and a resumed job appends to the same W&B run."""

import json
import time

from learner.metrics import MetricsWriter


def test_metrics_go_to_wandb_offline_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    w = MetricsWriter(tmp_path, "brorl-test", "offline")
    w.write(1, {"loss": 0.5, "pass_rate": 0.25})
    w.write(2, {"loss": 0.25, "pass_rate": 0.5, "skipped": float("nan")})
    run_id = w.wandb.id
    w.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    # W&B's service process writes the run file on its own: on a loaded machine the last records land a moment
    # after finish() returns (seen in CI), so the file is read until they are there
    deadline, data = time.monotonic() + 60, b""
    while time.monotonic() < deadline and not all(k in data for k in (b"loss", b"pass_rate", b"0.25", b"0.5")):
        time.sleep(0.5)
        data = next(runs[0].glob("run-*.wandb")).read_bytes()
    assert all(k in data for k in (b"loss", b"pass_rate", b"0.25", b"0.5")), len(data)
    assert b"skipped" not in data  # a non-finite value is left out (JSONL writes it as null)
    again = MetricsWriter(tmp_path, "brorl-test", "offline")  # a resume of the same run folder
    assert again.wandb.id == run_id
    again.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_resume_cuts_retrained_rows_and_drops_lines_a_host_crash_left_anywhere(tmp_path, caplog):
    """A resume at step 3: rows past it go; a block of NULs in the middle (an unsynced page after a power loss) and
    a torn last line are dropped with a warning, not a learner that cannot start; the rows kept are whole."""
    from learner.metrics import cut_after, read

    p = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss": s / 10}) for s in range(1, 6)]
    p.write_bytes(("\n".join(rows[:2]) + "\n").encode() + b"\x00" * 300 + b"\n"
                  + ("\n".join(rows[2:]) + "\n").encode() + b'{"step": 6, "lo')
    assert cut_after(p, 3) == 4  # steps 4 and 5, the NULs, the torn line
    assert [r["step"] for r in read(p)] == [1, 2, 3] and p.read_bytes().endswith(b"\n")
    assert "2 line(s) that are not whole rows dropped" in caplog.text
    assert cut_after(p, 3) == 0  # nothing more to cut: the file is left as it is


def test_rows_written_before_a_checkpoint_are_on_the_disk(tmp_path, monkeypatch):
    """`sync`: the checkpoint's steps keep their rows after a host crash (the row is written, then fsynced)."""
    import os

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real(fd))[1])
    w = MetricsWriter(tmp_path)
    w.write(1, {"loss": 0.5})
    assert synced == []  # a row alone is flushed, not synced (every step)
    w.sync()
    assert synced == [(tmp_path / "metrics.jsonl").stat().st_ino]
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] == 0.5
    w.close()
