"""The tiny model of the default job and the tests: built locally (no model hub), then warm-started.

Lives here: `build.py` (a Qwen2-architecture model of ~1M parameters and a BPE tokenizer trained on the
synthetic task, deterministic for a seed) and `warm_start.py` (supervised training until held-out pass@1
lies in a band, so RL has signal to work with), and `ensure_model`, which `brorl run` calls.
Must not import: `learner`, `actors`, `transport` or `cli`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tinymodel.build import BUILDER, TinyModelSpec, build_tiny_model, is_model_dir

__all__ = ["BUILDER", "TinyModelSpec", "build_tiny_model", "ensure_model", "is_model_dir"]
META = "brorl-tiny.json"


def ensure_model(cfg, force: bool = False, sft: bool = True, log=print) -> Path:
    """The model at `model.path`: built (and warm-started) there if the folder holds none and lies under
    `runs/`; any other empty path is an error, since brorl never downloads weights. A tiny model of ours
    under `runs/` is rebuilt when an older builder made it or its warm start never finished (a build
    interrupted after the weights were written): either would train quietly at a pass rate far from the
    one the default job is tuned for."""
    path = cfg.model.path
    if is_model_dir(path) and not force:
        why = _stale(path, sft) if path.startswith("runs/") else None
        if why is None:
            if sft and _info(path).get("warm_start") == "skipped":
                log(f"note: the tiny model at {path} was built without a warm start (make-tiny-model --no-sft)")
            return Path(path)
        log(f"rebuilding the tiny model at {path}: {why}")
        shutil.rmtree(path)
    if not path.startswith("runs/") and not force:
        raise SystemExit(f"brorl: model.path {path!r} holds no model (brorl never downloads weights)")
    if Path(path).is_dir() and any(Path(path).iterdir()) and not (Path(path) / META).exists():
        raise SystemExit(f"brorl: model.path {path!r} holds files but no complete model (config.json, weights, "
                         f"a tokenizer); brorl builds its tiny model only into an empty folder, so it leaves them")
    log(f"building the tiny model at {path} ...")
    build_tiny_model(path, seed=cfg.model.tiny_seed)
    _record(path, warm_start="pending" if sft else "skipped")
    if sft:
        from tinymodel.warm_start import warm_start

        log("warm start (supervised) until held-out pass@1 is 15-60% ...")
        r = warm_start(cfg, path, seed=cfg.model.tiny_seed)
        _record(path, warm_start={"updates": r.updates, "pass_at_1": r.pass_at_1})
        log(f"warm start done after {r.updates} updates: held-out pass@1 ≈ {100 * r.pass_at_1:.1f}%")
    return Path(path)


def _stale(path: str, sft: bool) -> str | None:
    """Why the folder's tiny model must be rebuilt, or None (also for a model that is not our tiny one)."""
    if not (Path(path) / META).exists():
        return None  # not built by brorl: the user's own model
    info = _info(path)
    if info.get("builder") != BUILDER:
        return f"it was built by an older brorl (builder {info.get('builder', 1)}, now {BUILDER})"
    if sft and info.get("warm_start") in (None, "pending"):
        return "its warm start never finished"
    return None


def _info(path: str) -> dict:
    meta = Path(path) / META
    return json.loads(meta.read_text()) if meta.exists() else {}


def _record(path: str, **fields) -> None:
    (Path(path) / META).write_text(json.dumps({**_info(path), **fields}, indent=2) + "\n")
