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
