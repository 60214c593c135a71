"""`brorl learner`: the learner service (binds the work, rollout and control sockets)."""

from __future__ import annotations

import argparse

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("learner", help="the learner service: admit groups, train, broadcast weights")
    add_config_arg(p)
    p.add_argument("--resume", action="store_true", help="continue from run.run_dir's latest checkpoint")
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from learner.service import main as serve

    return serve(load(args, overrides), resume=args.resume)
