"""`brorl run`: the whole job (`cli/job.py`) — every role on this machine as processes (`cli/launcher.py`), or
placed by Ray with `--cluster` (`cli/cluster.py`)."""

from __future__ import annotations

import argparse

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="all roles on this machine: the default job")
    add_config_arg(p)
    p.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation before and after")
    p.add_argument("--cluster", metavar="ADDRESS", help="place the roles with Ray: an existing cluster's address "
                   "(host:port, or auto), or local (a Ray instance of this process's own)")
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from cli.job import run
    from tinymodel import ensure_model

    cfg = load(args, overrides)
    ensure_model(cfg, log=lambda m: print(m, flush=True))
    return run(cfg, resume=args.resume, evaluate=not args.no_eval, cluster=args.cluster)
