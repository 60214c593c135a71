"""The `brorl` command: one entry point, one small module per sub-command.

This package is the composition root: it is the only place that wires roles together, and no role
imports it. `brorl --help` must answer fast, so every module here imports only the standard library at
import time; a sub-command imports what it needs when it runs.
Dependency order (import-linter contracts in pyproject.toml): cli → learner | actors | tinymodel →
evaluation → transport | verifiers | theory → config.
"""

from __future__ import annotations

import argparse
import sys

from cli import (actor, data, evaluate, keys, learner, make_tiny_model, run, sft, show_config, simulate,
                 simulate_fleet, verifiers)

# In the order `brorl --help` lists them.
COMMANDS = (run, actor, learner, evaluate, data, sft, keys, verifiers, simulate, simulate_fleet, make_tiny_model,
            show_config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brorl",
        description="Asynchronous large-N RL from verifiable rewards (BroRL). "
        "Any config field can be overridden with --section.key VALUE.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        p = cmd.add_parser(sub)
        p.set_defaults(func=cmd.main, takes_overrides=getattr(cmd, "TAKES_OVERRIDES", True))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not args.takes_overrides:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args, rest)
    except Exception as e:  # a config error is a user error: one clear line, no traceback
        from config.loader import ConfigError
        from transport import events

        events.fatal(e)  # a role of `brorl run`: the reason, as one line on its console
        if isinstance(e, ConfigError):
            head, *reasons = str(e).split("\n  ")
            one = head.rstrip(":\n") + ": " + reasons[0] if len(reasons) == 1 else str(e)  # one reason: one line
            print(f"brorl: {one}", file=sys.stderr)
            return 2
        raise
