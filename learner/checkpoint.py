"""Checkpoints and exact resume, safe against crashes at any point.

A checkpoint is a folder `run_dir/checkpoints/step-<N>/` holding
    model/            the policy as a Hugging Face folder (config, tokenizer, model.safetensors) —
                      loadable by transformers and by vLLM
    optimizer.pt      optimizer state (with several learner ranks: rank 0's shard; rank r's is in
                      optimizer-rank<r>.pt, and state.json says how many ranks wrote it)
    state.json        step, policy version, data cursor (next fresh prompt id + prompts granted but not
                      yet consumed), RNG states (python, numpy, torch, the trainer's shuffling generator)
    manifest.json     every file's size, written last: a folder without it, or whose files differ from it,
                      is not a checkpoint
    KEEP              (optional, e.g. `touch`ed by an operator) never removed by rotation
Writing: a temporary folder, every file and folder fsynced, renamed into place (a previous copy of the same
step is first moved aside, then removed), the parent fsynced; then `checkpoints/latest` (a small text file)
is replaced atomically and fsynced. Reading (`latest`): if what `latest` names is missing or does not match
its manifest, the newest valid checkpoint is used instead, with a warning. Leftover temporary folders of a
crashed save are removed when the learner starts (`clean_leftovers`). Rotation keeps the newest `keep` plus any marked KEEP.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

log = logging.getLogger("brorl.learner")


@dataclass
class CheckpointState:
    path: Path
    meta: dict

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def step(self) -> int:
        return int(self.meta["step"])


class Checkpointer:
    """Writes and reads checkpoint folders; what goes into one is the caller's (`LearnerService.state_dict`):
    `{"meta": JSON-able dict with "step", "optimizer": a torch state dict}` plus a function that writes
    the model folder."""

    def __init__(self, run_dir: str | Path, keep: int = 3):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def clean_leftovers(self) -> None:
        """Finish or undo what a crashed save left (only the process that saves may call this)."""
        if not self.root.exists():
            return
        for p in self.root.glob(".aside-step-*"):  # a crash between the two renames of a re-save
            final = self.root / p.name.split("-", 1)[1].rsplit("-", 1)[0]
            if not final.exists():
                os.replace(p, final)
            else:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.root.glob(".tmp-step-*"):
            log.warning("removing %s, left by a save that did not finish", p)
            shutil.rmtree(p, ignore_errors=True)
        (self.root / ".latest.tmp").unlink(missing_ok=True)

    def save(self, state: dict, write_model: Callable[[Path], None],
             write_extra: Callable[[Path], None] | None = None) -> Path:
        """Write checkpoint `state["meta"]["step"]`: the model folder by `write_model(folder)`, `optimizer.pt`,
        anything `write_extra(checkpoint folder)` adds (other ranks' optimizer shards), state and manifest."""
        step = int(state["meta"]["step"])
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:06d}"
        tmp = self.root / f".tmp-step-{step:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            write_model(tmp / "model")
            if write_extra is not None:
                write_extra(tmp)
            torch.save(state["optimizer"], tmp / "optimizer.pt")
            (tmp / "state.json").write_text(json.dumps(state["meta"]))
            files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            (tmp / "manifest.json").write_text(json.dumps(files))
            _fsync_tree(tmp)
        except BaseException:  # (a disk full): give the space back; the previous checkpoints are untouched
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():  # the same step again (e.g. a stop right after a scheduled save)
            aside = self.root / f".aside-step-{step:06d}-{os.getpid()}"
            os.replace(final, aside)
            os.replace(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.root)
        pointer = self.root / ".latest.tmp"
        with open(pointer, "w") as f:
            f.write(final.name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer, self.root / "latest")
        _fsync_dir(self.root)
        self._prune(final)
        return final

    def latest(self) -> CheckpointState | None:
        """The checkpoint `latest` names, or the newest valid one if that one is missing or damaged."""
        ptr = self.root / "latest"
        named = self.root / ptr.read_text().strip() if ptr.exists() else None
        if named is not None:
            st = _read_valid(named)
            if st is not None:
                return st
        for path in sorted(self.root.glob("step-*"), reverse=True) if self.root.exists() else []:
            st = _read_valid(path)
            if st is not None:
                if named is not None:
                    log.warning("checkpoint %s is missing or damaged; resuming from %s instead", named.name, path.name)
                return st
        if named is not None:
            log.warning("checkpoint %s is missing or damaged and no other valid one exists", named.name)
        return None

    @staticmethod
    def read(path: str | Path) -> CheckpointState:
        """The checkpoint in folder `path` (another run's, for `learner.init_from`); ValueError saying why not."""
        st = _read_valid(Path(path))
        if st is None:
            raise ValueError(f"{path} is not a complete brorl checkpoint (a step-N folder whose manifest.json "
                             f"lists files that are all there)")
        return st

    def load(self, st: CheckpointState) -> dict:
        """The state saved in `st` (the model folder is `st.model_dir`, loaded by whoever builds the model)."""
        return {"meta": st.meta, "optimizer": self.load_optimizer(st.path, 0)}

    @staticmethod
    def load_optimizer(path: Path, rank: int) -> dict:
        """Rank `rank`'s optimizer state in checkpoint folder `path`. A DeepSpeed ZeRO shard holds DeepSpeed's
        own objects (loss scaler, partition maps), so it is unpickled in full: a checkpoint is this job's
        own output, as trusted as the model code loaded from it."""
        return torch.load(path / Checkpointer.optimizer_file(rank), weights_only=False)

    @staticmethod
    def optimizer_file(rank: int) -> str:
        """Rank `rank`'s optimizer state in a checkpoint folder (rank 0's keeps the one-rank name)."""
        return "optimizer.pt" if rank == 0 else f"optimizer-rank{rank}.pt"

    def _prune(self, newest: Path) -> None:
        olds = sorted(p for p in self.root.glob("step-*") if p != newest and not (p / "KEEP").exists())
        for p in olds[: max(0, len(olds) - (self.keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)


def _read_valid(path: Path) -> CheckpointState | None:
    """The checkpoint at `path` if every file its manifest lists is there with its size, else None."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        for name, size in manifest.items():
            if (path / name).stat().st_size != size:
                return None
        meta = json.loads((path / "state.json").read_text())
        int(meta["step"])
        return CheckpointState(path, meta)
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
    """fsync every file, then every folder (deepest first), so the data and the names are on disk."""
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _fsync_dir(d)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
