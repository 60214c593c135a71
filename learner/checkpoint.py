"""Checkpoints and exact resume.

A checkpoint is a folder `run_dir/checkpoints/step-<N>/` holding
    model/            the policy as a Hugging Face folder (config, tokenizer, model.safetensors) —
                      loadable by transformers and by vLLM
    optimizer.pt      optimizer state
    state.json        step, policy version, data cursor (next fresh prompt id + prompts granted but not
                      yet consumed), RNG states (python, numpy, torch)
It is written to a temporary folder and renamed into place, then `run_dir/checkpoints/latest` (a small
text file) is replaced atomically; a crash at any point leaves the previous checkpoint usable.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass
class CheckpointState:
    path: Path
    meta: dict

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


class Checkpointer:
    def __init__(self, run_dir: str | Path, keep: int = 3):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, svc) -> Path:
        step = svc.trainer.state.step
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:06d}"
        tmp = self.root / f".tmp-step-{step:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        svc.trainer.model.save_pretrained(tmp / "model", safe_serialization=True)
        svc.tokenizer.save_pretrained(tmp / "model")
        torch.save(svc.trainer.backend.optimizer.state_dict(), tmp / "optimizer.pt")
        meta = {
            "step": step, "version": svc.version, "dispatcher": svc.dispatcher.state(),
            "rng": {"python": _jsonable(random.getstate()), "numpy": _jsonable(np.random.get_state()),
                    "torch": torch.get_rng_state().tolist(), "trainer": svc.trainer._gen.get_state().tolist()},
        }
        (tmp / "state.json").write_text(json.dumps(meta))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = self.root / ".latest.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, self.root / "latest")
        self._prune(final)
        return final

    def latest(self) -> CheckpointState | None:
        ptr = self.root / "latest"
        if not ptr.exists():
            return None
        path = self.root / ptr.read_text().strip()
        meta = json.loads((path / "state.json").read_text())
        return CheckpointState(path, meta)

    def restore(self, st: CheckpointState, svc) -> None:
        meta = st.meta
        svc.trainer.backend.optimizer.load_state_dict(torch.load(st.path / "optimizer.pt"))
        svc.trainer.backend.set_lr(svc.trainer.lr)
        svc.trainer.state.step = int(meta["step"])
        svc.version = int(meta["version"])
        svc.dispatcher.load_state(meta["dispatcher"])
        rng = meta["rng"]
        random.setstate(_tupled(rng["python"]))
        np.random.set_state(_tupled(rng["numpy"]))
        torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
        svc.trainer._gen.set_state(torch.tensor(rng["trainer"], dtype=torch.uint8))

    def _prune(self, newest: Path) -> None:
        olds = sorted(p for p in self.root.glob("step-*") if p != newest)
        for p in olds[: max(0, len(olds) - (self.keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return {"__nd__": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, (tuple, list)):
        return [_jsonable(v) for v in x]
    return x


def _tupled(x):
    if isinstance(x, dict) and "__nd__" in x:
        return np.array(x["__nd__"], dtype=x["dtype"])
    if isinstance(x, list):
        return tuple(_tupled(v) for v in x)
    return x


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
