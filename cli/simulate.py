"""`brorl simulate`: the section 4.1 token-level simulator (theory/), CSV + PNG + a table."""

from __future__ import annotations

import argparse
from pathlib import Path

TAKES_OVERRIDES = False


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("simulate", help="token-level simulator of paper section 4.1")
    p.add_argument("--out", default="runs/simulate", help="folder for CSV and PNG")
    p.add_argument("--n", default=None, help="comma-separated rollout sizes (default 4,8,16,512,51200)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps T (default 1000)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size d (default 128000)")
    p.add_argument("--correct", type=int, default=None, help="correct tokens |P| (default 10000)")
    p.add_argument("--init", choices=["seeded", "uniform"], default="seeded", help="logit initialisation")
    p.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=0)
    return p


def sim_config(args: argparse.Namespace):
    from dataclasses import replace

    from theory.simulator import SimConfig

    over = {}
    if args.n:
        try:
            over["ns"] = tuple(int(x) for x in args.n.split(","))
        except ValueError:
            raise SystemExit(f"brorl simulate: --n must be comma-separated integers, got {args.n!r}")
    for name, attr in (("steps", "steps"), ("vocab", "vocab"), ("correct", "n_correct"), ("lr", "lr")):
        if getattr(args, name) is not None:
            over[attr] = getattr(args, name)
    return replace(SimConfig(init=args.init, seed=args.seed), **over)


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from theory.report import run

    run(sim_config(args), Path(args.out))
    return 0
