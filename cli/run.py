"""`brorl run`: the whole job (`cli/job.py`) — every role on this machine as processes (`cli/launcher.py`), or
placed by Ray with `--cluster` (`cli/cluster.py`)."""

from __future__ import annotations

import argparse
import json
import sys

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="all roles on this machine: the default job",
                       epilog="Any config field can be overridden: --section.key VALUE (e.g. --job.n_samples 64 "
                       "--data.train train.parquet --model.path ~/models/m); `brorl config explain` lists them. "
                       "Before any role starts, a pre-flight checks the config, the data files (the first rows "
                       "rendered with the model's tokenizer), the model folder, the ports and the run folder, "
                       "and refuses in one line naming the fix.")
    add_config_arg(p)
    p.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation before and after")
    p.add_argument("--cluster", metavar="ADDRESS", help="place the roles with Ray: an existing cluster's address "
                   "(host:port, or auto), or local (a Ray instance of this process's own)")
    p.add_argument("--one-gpu", action="store_true", help="the learner and one actor share GPU 0 with the settings "
                   "measured fastest on one card (weights over CUDA IPC, generation beside training, a plain-torch "
                   "learner); each is printed, and any given on the command line wins")
    return p


def one_gpu(overrides: list[str]) -> dict:
    """`--one-gpu`: config/placement.py's ONE_GPU under the command line's own overrides (printed)."""
    from config.loader import parse_overrides
    from config.placement import ONE_GPU

    given = parse_overrides(overrides)
    kept = {k: v for k, v in ONE_GPU.items() if k not in given}
    print("[brorl run] --one-gpu: " + " ".join(f"{k}={json.dumps(v)}" for k, v in kept.items()), flush=True)
    return {**kept, **given}


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from cli.job import run
    from cli.preflight import preflight
    from tinymodel import ensure_model

    if args.one_gpu:
        if args.cluster:
            print("brorl: --one-gpu shares this machine's GPU 0 between the learner and an actor; with --cluster Ray "
                  "places them apart: give one of the two", file=sys.stderr)
            return 2
        overrides = one_gpu(overrides)
    cfg = preflight(load(args, overrides), cluster=args.cluster)  # before any role starts
    ensure_model(cfg, log=lambda m: print(m, flush=True))
    return run(cfg, resume=args.resume, evaluate=not args.no_eval, cluster=args.cluster)
