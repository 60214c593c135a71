"""Per-step metrics: JSONL (always), TensorBoard (always, offline), W&B when configured (offline by
default). Every value must be a finite number; non-finite values are written as null and counted."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


class MetricsWriter:
    def __init__(self, run_dir: str | Path, wandb_project: str | None = None):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._f = self.path.open("a")
        self.non_finite = 0
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.dir / "tensorboard"))
        except Exception:  # tensorboard missing: JSONL is the record
            self.tb = None
        self.wandb = None
        if wandb_project:
            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")
            self.wandb = wandb.init(project=wandb_project, dir=str(self.dir))

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
            self.wandb.log(row, step=step)
        return row

    def close(self) -> None:
        self._f.close()
        if self.tb is not None:
            self.tb.close()


def read(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
