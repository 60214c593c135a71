"""`brorl make-tiny-model`: build the tiny Qwen2 model and its tokenizer locally, then warm-start it."""

from __future__ import annotations

import argparse

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("make-tiny-model", help="build the tiny Qwen2 model and tokenizer locally")
    add_config_arg(p)
    p.add_argument("--out", default=None, help="output folder (default: model.path of the config)")
    p.add_argument("--force", action="store_true", help="rebuild even if the folder holds a model")
    p.add_argument("--no-sft", action="store_true", help="skip the supervised warm start (random weights)")
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from tinymodel import ensure_model, is_model_dir

    cfg = load(args, overrides)
    if args.out:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": args.out})})
    if is_model_dir(cfg.model.path) and not args.force:
        print(f"tiny model already at {cfg.model.path} (use --force to rebuild)")
        return 0
    ensure_model(cfg, force=True, sft=not args.no_sft, log=lambda m: print(m, flush=True))
    print(f"tiny model written to {cfg.model.path}")
    return 0
