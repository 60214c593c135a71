"""Per-step metrics: JSONL (always), TensorBoard (always, offline), W&B when `run.wandb_project` is set
(`run.wandb_mode`: offline by default, its files under the run folder's `wandb/`). Every value must be a
finite number; non-finite values are written as null and counted."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path

log = logging.getLogger("brorl.learner")


class MetricsWriter:
    def __init__(self, run_dir: str | Path, wandb_project: str | None = None, wandb_mode: str = "offline",
                 resume_step: int | None = None):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        if resume_step is not None:  # rows past the checkpoint belong to steps that are trained again now
            cut_after(self.path, resume_step)
        self._f = open_append(self.path)
        self.non_finite = 0
        try:
            from torch.utils.tensorboard import SummaryWriter

            # on a resume TensorBoard hides the dead learner's points past the checkpoint (W&B keeps the first
            # value it got for a step: a retrained step's shows in metrics.jsonl and TensorBoard)
            self.tb = SummaryWriter(str(self.dir / "tensorboard"),
                                    purge_step=None if resume_step is None else resume_step + 1)
        except Exception:  # tensorboard missing: JSONL is the record
            self.tb = None
        self.wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise RuntimeError(f"run.wandb_project = {wandb_project!r} but wandb is not installed "
                                   f"(pip install wandb)") from None
            # a resumed job appends to the same W&B run: its id is the run folder's
            run_id = "brorl-" + hashlib.sha256(str(self.dir.resolve()).encode()).hexdigest()[:12]
            self.wandb = wandb.init(project=wandb_project, dir=str(self.dir), mode=wandb_mode, id=run_id,
                                    resume="allow", name=self.dir.name)

    def write(self, step: int, metrics: dict) -> dict:
        row = {"step": step, "time": time.time()}
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if math.isfinite(v):
                    row[k] = float(v)
                else:
                    row[k] = None
                    self.non_finite += 1
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        if self.tb is not None:
            for k, v in row.items():
                if k not in ("step", "time") and v is not None:
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if v is not None}, step=step)
        return row

    def sync(self) -> None:
        """The rows so far on the disk (before a checkpoint: a step it holds keeps its row after a host crash)."""
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def open_append(path: str | Path):
    """Open a JSONL file for appending, first cutting off a torn last line (a crash in the middle of a
    write), so every line after it stays whole."""
    p = Path(path)
    if p.exists() and p.stat().st_size:
        with open(p, "rb+") as f:
            data = f.read()
            if not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
    return p.open("a")


def cut_after(path: str | Path, step: int) -> int:
    """Drop the rows of steps after `step` and every line that is not a whole row (a torn last line; anywhere
    after a host crash, blocks of an unsynced file can read back as NULs: dropped with a warning, not a learner
    that cannot start), by an fsynced rewrite under a temporary name; the number of lines dropped."""
    p = Path(path)
    if not p.exists():
        return 0
    data = p.read_bytes()
    lines = [ln for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    keep, bad = [], 0
    for ln in lines:
        try:
            r = json.loads(ln)
        except json.JSONDecodeError:
            r = None
        if not (isinstance(r, dict) and isinstance(r.get("step"), int)):
            bad += 1
        elif r["step"] <= step:
            keep.append(r)
    if len(keep) == len(lines) and data.endswith(b"\n"):
        return 0
    if bad:
        log.warning("%s: %d line(s) that are not whole rows dropped (a crash mid-write)", p, bad)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in keep))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(p)
    fsync_path(p.parent)  # the rename too
    return len(lines) - len(keep)


def fsync_path(path: str | Path) -> None:
    """What was written to `path` (by this process or another) reaches the disk; nothing if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str | Path) -> list[dict]:
    """Every whole row; a torn last line (a crash mid-write) is skipped, a bad line elsewhere is an error."""
    p = Path(path)
    if not p.exists():
        return []
    lines = [line for line in p.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{p}: line {i + 1} is not JSON: {line[:80]!r}") from None
    return rows


ACTOR_COUNTERS = ("idle_s", "held_s", "update_s", "score_s", "aborted", "aborted_stale", "capped_waves", "engine_steps",
                  "running_seqs", "waiting_seqs", "kv_use", "prefill_steps", "gen_tokens")
"""The actors' heartbeat counters every metrics row carries (`actor_<name>`, summed over the actors, cumulative):
idle, held (paused for the learner's compute, `actor.share_gpu`), weight-update and scoring seconds, requests
aborted (by an update; as too stale for it), second waves capped by `job.step_sample_budget`, and the engines'
steps with the sums over them of running and waiting sequences, KV-cache use, generated tokens and prefill steps
(`actors.stats.EngineGauge`)."""


def loop_seconds(rows: list[dict]) -> float:
    """The learner's loop time over these metrics rows: waiting for data, training and broadcasting."""
    return sum(r["wait_s"] + r["train_s"] + r["broadcast_s"] for r in rows)
