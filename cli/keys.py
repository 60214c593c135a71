"""`brorl keys generate`: CURVE key pairs for the learner, the named actors and the operator (admin)."""

from __future__ import annotations

import argparse

TAKES_OVERRIDES = False


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("keys", help="create CURVE key pairs for the learner and named actors")
    p.add_argument("action", choices=["generate"])
    p.add_argument("--dir", default="runs/keys", help="keys folder (transport.keys_dir)")
    p.add_argument("--actors", default="actor-0", help="comma-separated actor names")
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from transport.security import generate

    actors = [a for a in args.actors.split(",") if a] + ["admin"]
    d = generate(args.dir, actors)
    print(f"CURVE keys in {d}: learner + {', '.join(actors)}; copy <name>.key_secret to each actor host only")
    return 0
