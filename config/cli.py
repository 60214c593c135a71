"""The `brorl` command: one entry point, a sub-command per role.

`brorl --help` must answer fast, so this module imports only the standard library at import time;
each sub-command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

# Roles that exist in this release, and the issue that brings each missing one.
NOT_BUILT = {
    "actor": "the vLLM actor role (continuous generation, transport) is not built yet",
    "learner": "the asyncio learner service is not built yet",
    "eval": "`brorl eval` (pass@k on held-out prompts) is not built yet",
}


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help="TOML preset: a path or a shipped name (tiny-cpu, brorl-1.5b, prorl-1.5b); default tiny-cpu",
    )


def _load(args: argparse.Namespace, overrides: list[str]):
    from config.loader import load_config

    return load_config(args.config, overrides)


def cmd_config(args: argparse.Namespace, overrides: list[str]) -> int:
    from config.loader import to_toml

    cfg = _load(args, overrides)
    if args.action == "show":
        print(to_toml(cfg), end="")
    elif args.action == "explain":
        for section, model in cfg:
            print(f"[{section}]")
            for name, field in type(model).model_fields.items():
                doc = " ".join((field.description or "").split())
                print(f"  {name} = {getattr(model, name)!r}\n      {doc}")
    return 0


def cmd_make_tiny_model(args: argparse.Namespace, overrides: list[str]) -> int:
    from learner.tiny_model import build_tiny_model, is_model_dir

    cfg = _load(args, overrides)
    out = args.out or cfg.model.path
    if is_model_dir(out) and not args.force:
        print(f"tiny model already at {out} (use --force to rebuild)")
        return 0
    path = build_tiny_model(out, seed=cfg.model.tiny_seed)
    print(f"tiny model written to {path}")
    return 0


def cmd_simulate(args: argparse.Namespace, overrides: list[str]) -> int:
    from learner.simulator_cli import main as simulate_main

    return simulate_main(args, overrides)


def cmd_run(args: argparse.Namespace, overrides: list[str]) -> int:
    from learner.tiny_model import build_tiny_model, is_model_dir

    cfg = _load(args, overrides)
    if not is_model_dir(cfg.model.path):
        print(f"building the tiny model at {cfg.model.path} ...", flush=True)
        build_tiny_model(cfg.model.path, seed=cfg.model.tiny_seed)
    from learner.demo import run_demo

    return run_demo(cfg)


def _not_built(role: str) -> Callable[[argparse.Namespace, list[str]], int]:
    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        print(f"brorl {role}: {NOT_BUILT[role]}.", file=sys.stderr)
        return 2

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brorl",
        description="Asynchronous large-N RL from verifiable rewards (BroRL). "
        "Any config field can be overridden with --section.key VALUE.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="all roles on this machine: the default job")
    _config_args(p)
    p.set_defaults(func=cmd_run)

    for role, text in (
        ("actor", "a vLLM actor: generate groups, score them, stream them to the learner"),
        ("learner", "the learner service: admit groups, train, broadcast weights"),
        ("eval", "pass@1 / pass@k of a checkpoint on held-out prompts"),
    ):
        p = sub.add_parser(role, help=text)
        _config_args(p)
        if role == "actor":
            p.add_argument("--learner", dest="learner_addr", help="tcp://HOST:PORT of the learner")
        p.set_defaults(func=_not_built(role))

    p = sub.add_parser("simulate", help="token-level simulator of paper section 4.1")
    p.add_argument("--out", default="runs/simulate", help="folder for CSV and PNG")
    p.add_argument("--n", default=None, help="comma-separated rollout sizes (default 4,8,16,512,51200)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps T (default 1000)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size d (default 128000)")
    p.add_argument("--correct", type=int, default=None, help="correct tokens |P| (default 10000)")
    p.add_argument("--init", choices=["seeded", "uniform"], default="seeded", help="logit initialisation")
    p.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("make-tiny-model", help="build the tiny Qwen2 model and tokenizer locally")
    _config_args(p)
    p.add_argument("--out", default=None, help="output folder (default: model.path of the config)")
    p.add_argument("--force", action="store_true", help="rebuild even if the folder holds a model")
    p.set_defaults(func=cmd_make_tiny_model)

    p = sub.add_parser("config", help="print the resolved configuration")
    p.add_argument("action", choices=["show", "explain"], help="show: TOML; explain: with field docs")
    _config_args(p)
    p.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    takes_overrides = args.func not in (cmd_simulate,)
    if rest and not takes_overrides:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args, rest)
    except Exception as e:  # a config error is a user error: one clear line, no traceback
        from config.loader import ConfigError

        if isinstance(e, ConfigError):
            print(f"brorl: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
