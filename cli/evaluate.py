"""`brorl eval`: pass@1 and pass@k of a checkpoint on held-out prompts, overall and per data source, with a
vLLM engine configured as an actor's (the arithmetic, tasks and sampling settings are `evaluation`'s).

`--checkpoint` takes a model folder, a run's checkpoint folder (`runs/x/checkpoints/step-000080`: its
`model/`) or a run folder (its newest checkpoint); a run's checkpoint is evaluated with the run's own
settings (its `config.toml`: context length, sampling length, prompt rendering) unless `--config` is given.
`--data FILE ...` evaluates on those files (as `data.eval`). A prompt that cannot be rendered for the model
(too long for `actor.max_model_len`, ...) is left out, counted and listed; a verifier that cannot score, or
data that cannot be used, is a one-line refusal (exit status 2)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="pass@1 / pass@k of a checkpoint on held-out prompts")
    add_config_arg(p)
    p.add_argument("--checkpoint", default=None, help="a model folder, a run's checkpoint folder or a run folder "
                   "(default: model.path)")
    p.add_argument("--data", nargs="+", default=None, metavar="FILE", help="held-out files (JSONL, Parquet, "
                   "datasets folders) instead of data.eval")
    p.add_argument("--out", default=None, help="write the result as JSON (and a .md table) here")
    p.add_argument("--k", type=int, default=None, help="samples per prompt (default run.eval_samples = 16)")
    return p


class CheckpointError(ValueError):
    """A --checkpoint path that holds no model."""


def model_folder(path: str | Path) -> Path:
    """The model folder of what a user holds: a model folder, a checkpoint folder (`model/` inside) or a run
    folder (its newest checkpoint's model)."""
    p = Path(path)
    if (p / "config.json").exists():
        return p
    if (p / "model" / "config.json").exists():
        return p / "model"
    ckpts = sorted((p / "checkpoints").glob("step-*")) if (p / "checkpoints").is_dir() else []
    done = [c for c in ckpts if (c / "model" / "config.json").exists()]
    if done:
        return done[-1] / "model"
    raise CheckpointError(f"--checkpoint {path}: neither a model folder (config.json), a checkpoint folder "
                          f"(model/config.json) nor a run folder with checkpoints")


def run_config(path: str | Path) -> Path | None:
    """The `config.toml` of the run that `path` (a run folder, one of its checkpoint folders or their model
    folder) belongs to, if there is one."""
    p = Path(path).resolve()
    for run in (p, p.parent.parent, p.parent.parent.parent):
        if (run / "config.toml").is_file() and (run / "checkpoints").is_dir():
            return run / "config.toml"
    return None


def renderer_for(cfg, tokenizer_dir: str | Path):
    """Prompts rendered as the actors' are, with the room `actor.max_model_len` leaves for a prompt."""
    from taskdata import PromptRenderer

    return PromptRenderer.for_model(str(tokenizer_dir), cfg.data, max_prompt_tokens=cfg.actor.max_model_len - 1)


def evaluate_checkpoint(cfg, model_path: str, k: int | None = None) -> dict:
    from actors.engine import engine_kwargs, offline_env
    from evaluation import heldout_tasks, render, settings
    from evaluation.vllm import evaluate
    from transport import events

    folder = model_folder(model_path)
    tokenizer_dir = folder if (folder / "tokenizer_config.json").exists() else cfg.model.path
    model = cfg.model.model_copy(update={"path": str(folder)})
    renderer = renderer_for(cfg, tokenizer_dir)
    tasks = heldout_tasks(cfg)
    render(renderer, tasks)  # every prompt left out: refused before an engine starts
    offline_env()
    from vllm import LLM

    events.emit("phase", f"starting a vLLM engine for {folder} (loads the model and compiles it)")
    t0 = time.monotonic()
    llm = LLM(**{**engine_kwargs(model, cfg.actor, seed=cfg.run.seed), "tokenizer": str(tokenizer_dir)})
    how = settings(cfg, k)
    events.emit("phase", f"engine ready in {time.monotonic() - t0:.0f} s; generating {how.k} samples for each of "
                         f"{len(tasks)} held-out prompts")
    try:
        return {"model": str(folder), **evaluate(llm, tasks, how, renderer)}
    finally:
        llm.llm_engine.engine_core.shutdown()


def table(res: dict) -> str:
    kk = res["k"]
    rows = [("all", res)] + (list(res["by_source"].items()) if len(res["by_source"]) > 1 else [])
    out = [f"| model | data source | prompts | k | pass@1 | pass@{kk} |", "|---|---|---|---|---|---|"]
    out += [f"| {res['model']} | {name} | {r['prompts']} | {kk} | {100 * r['pass_at_1']:.1f}% | "
            f"{100 * r[f'pass_at_{kk}']:.1f}% |" for name, r in rows]
    left = res.get("left_out_prompts") or []
    if left:
        out.append(f"\nleft out: {len(left)} prompts that cannot be rendered for this model, e.g. {left[0]['reason']}")
    if res.get("timeouts"):
        out.append(f"\n{res['timeouts']} completions scored wrong: their verifier timed out (verifiers.timeout_s)")
    return "\n".join(out)


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    import sys

    from evaluation import EvaluationError
    from taskdata import DataError

    if args.data:
        overrides = [*overrides, "--data.eval", json.dumps(args.data)]
    if args.config is None and args.checkpoint and (own := run_config(args.checkpoint)) is not None:
        args.config = str(own)
        print(f"brorl eval: the run's own settings, {own} (--config to use others)", file=sys.stderr)
    cfg = load(args, overrides)
    try:
        res = evaluate_checkpoint(cfg, args.checkpoint or cfg.model.path, args.k)
    except (CheckpointError, EvaluationError, DataError) as e:
        print(f"brorl eval: {e}", file=sys.stderr)
        return 2
    print(table(res))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".md").write_text(table(res) + "\n")
    return 0
