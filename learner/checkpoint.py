"""Checkpoints and exact resume.

A checkpoint is a folder `run_dir/checkpoints/step-<N>/` holding
    model/            the policy as a Hugging Face folder (config, tokenizer, model.safetensors) —
                      loadable by transformers and by vLLM
    optimizer.pt      optimizer state
    state.json        step, policy version, data cursor (next fresh prompt id + prompts granted but not
                      yet consumed), RNG states (python, numpy, torch, the trainer's shuffling generator)
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
from typing import Callable

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
    """Writes and reads checkpoint folders; what goes into one is the caller's (`LearnerService.state_dict`):
    `{"meta": JSON-able dict with "step", "optimizer": a torch state dict}` plus a function that writes
    the model folder."""

    def __init__(self, run_dir: str | Path, keep: int = 3):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, state: dict, write_model: Callable[[Path], None]) -> Path:
        step = int(state["meta"]["step"])
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:06d}"
        tmp = self.root / f".tmp-step-{step:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write_model(tmp / "model")
        torch.save(state["optimizer"], tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps(state["meta"]))
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

    def load(self, st: CheckpointState) -> dict:
        """The state saved in `st` (the model folder is `st.model_dir`, loaded by whoever builds the model)."""
        return {"meta": st.meta, "optimizer": torch.load(st.path / "optimizer.pt")}

    def _prune(self, newest: Path) -> None:
        olds = sorted(p for p in self.root.glob("step-*") if p != newest)
        for p in olds[: max(0, len(olds) - (self.keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)


def rng_state() -> dict:
    """The process-wide RNG states (python, numpy, torch) as JSON-able values."""
    return {"python": _jsonable(random.getstate()), "numpy": _jsonable(np.random.get_state()),
            "torch": torch.get_rng_state().tolist()}


def set_rng_state(rng: dict) -> None:
    random.setstate(_tupled(rng["python"]))
    np.random.set_state(_tupled(rng["numpy"]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))


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
