"""`brorl eval`: pass@1 and pass@k of a checkpoint on held-out prompts, with a vLLM engine configured as
an actor's (the arithmetic, tasks and sampling settings are `evaluation`'s)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="pass@1 / pass@k of a checkpoint on held-out prompts")
    add_config_arg(p)
    p.add_argument("--checkpoint", default=None, help="Hugging Face model folder (default: model.path)")
    p.add_argument("--out", default=None, help="write the result as JSON (and a .md table) here")
    p.add_argument("--k", type=int, default=None, help="samples per prompt (default run.eval_samples = 16)")
    return p


def evaluate_checkpoint(cfg, model_path: str, k: int | None = None) -> dict:
    from actors.engine import engine_kwargs, offline_env
    from evaluation import heldout_tasks, settings
    from evaluation.vllm import evaluate

    offline_env()
    from vllm import LLM

    model = cfg.model.model_copy(update={"path": str(model_path)})
    llm = LLM(**{**engine_kwargs(model, cfg.actor, seed=cfg.run.seed), "tokenizer": cfg.model.path})
    return {"model": str(model_path), **evaluate(llm, heldout_tasks(cfg), settings(cfg, k))}


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load(args, overrides)
    res = evaluate_checkpoint(cfg, args.checkpoint or cfg.model.path, args.k)
    kk = res["k"]
    table = (f"| model | prompts | k | pass@1 | pass@{kk} |\n|---|---|---|---|---|\n"
             f"| {res['model']} | {res['prompts']} | {kk} | {100 * res['pass_at_1']:.1f}% | "
             f"{100 * res[f'pass_at_{kk}']:.1f}% |")
    print(table)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".md").write_text(table + "\n")
    return 0
