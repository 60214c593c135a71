"""The tiny model of the default job and the tests: built locally (no model hub), then warm-started.

Lives here: `build.py` (a Qwen2-architecture model of ~1M parameters and a BPE tokenizer trained on the
synthetic task, deterministic for a seed) and `warm_start.py` (supervised training until held-out pass@1
lies in a band, so RL has signal to work with), and `ensure_model`, which `brorl run` calls.
Must not import: `learner`, `actors`, `transport` or `cli`.
"""

from __future__ import annotations

from pathlib import Path

from tinymodel.build import TinyModelSpec, build_tiny_model, is_model_dir

__all__ = ["TinyModelSpec", "build_tiny_model", "ensure_model", "is_model_dir"]


def ensure_model(cfg, force: bool = False, sft: bool = True, log=print) -> Path:
    """The model at `model.path`: built (and warm-started) there if the folder holds none and lies under
    `runs/`; any other empty path is an error, since brorl never downloads weights."""
    path = cfg.model.path
    if is_model_dir(path) and not force:
        return Path(path)
    if not path.startswith("runs/") and not force:
        raise SystemExit(f"brorl: model.path {path!r} holds no model (brorl never downloads weights)")
    log(f"building the tiny model at {path} ...")
    build_tiny_model(path, seed=cfg.model.tiny_seed)
    if sft:
        from tinymodel.warm_start import warm_start

        log("warm start (supervised) until held-out pass@1 is 15-60% ...")
        r = warm_start(cfg, path, seed=cfg.model.tiny_seed)
        log(f"warm start done after {r.updates} updates: held-out pass@1 ≈ {100 * r.pass_at_1:.1f}%")
    return Path(path)
