"""`brorl sft`: supervised warm start of the model at `model.path` until held-out pass@1 is in a band."""

from __future__ import annotations

import argparse

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sft", help="warm-start the model (supervised) until held-out pass@1 is in a band")
    add_config_arg(p)
    p.add_argument("--out", default=None, help="output folder (default: overwrite model.path)")
    p.add_argument("--min-pass", type=float, default=0.15)
    p.add_argument("--max-pass", type=float, default=0.6)
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from tinymodel.warm_start import warm_start

    cfg = load(args, overrides)
    r = warm_start(cfg, cfg.model.path, args.out, min_pass=args.min_pass, max_pass=args.max_pass)
    print(f"held-out pass@1 ≈ {100 * r.pass_at_1:.1f}% after {r.updates} updates; saved to {args.out or cfg.model.path}")
    return 0
