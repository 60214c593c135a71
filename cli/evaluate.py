"""`brorl eval`: pass@1 and pass@k of a checkpoint on held-out prompts, overall and per data source, with a
vLLM engine configured as an actor's (the arithmetic, tasks and sampling settings are `evaluation`'s).

`--checkpoint` takes a model folder, a run's checkpoint folder (`runs/x/checkpoints/step-000080`: its
`model/`) or a run folder (its newest checkpoint); `--data FILE ...` evaluates on those files (as
`data.eval`)."""

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


def evaluate_checkpoint(cfg, model_path: str, k: int | None = None) -> dict:
    from actors.engine import engine_kwargs, offline_env
    from evaluation import heldout_tasks, settings
    from evaluation.vllm import evaluate
    from taskdata import PromptRenderer
    from transport import events

    offline_env()
    from vllm import LLM

    folder = model_folder(model_path)
    tokenizer_dir = folder if (folder / "tokenizer_config.json").exists() else cfg.model.path
    model = cfg.model.model_copy(update={"path": str(folder)})
    renderer = PromptRenderer.for_model(str(tokenizer_dir), cfg.data)
    tasks = heldout_tasks(cfg)
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
    return "\n".join(out)


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    import sys

    if args.data:
        overrides = [*overrides, "--data.eval", json.dumps(args.data)]
    cfg = load(args, overrides)
    try:
        res = evaluate_checkpoint(cfg, args.checkpoint or cfg.model.path, args.k)
    except CheckpointError as e:
        print(f"brorl eval: {e}", file=sys.stderr)
        return 2
    print(table(res))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".md").write_text(table(res) + "\n")
    return 0
