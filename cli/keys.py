"""`brorl keys generate`: CURVE key pairs for the learner, the named actors and the operator (admin)."""

from __future__ import annotations

import argparse

TAKES_OVERRIDES = False


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("keys", help="create CURVE key pairs for the learner and named actors")
    p.add_argument("action", choices=["generate"])
    p.add_argument("--dir", default="runs/keys", help="keys folder (transport.keys_dir)")
    p.add_argument("--actors", default="actor-0", help="comma-separated actor names")
    p.add_argument("--admins", default="admin", help="comma-separated operator key names (may send admin "
                                                      "commands: `brorl verifiers swap`)")
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from transport.security import generate

    actors = [a for a in args.actors.split(",") if a]
    admins = [a for a in args.admins.split(",") if a]
    d = generate(args.dir, actors, admins)
    print(f"CURVE keys in {d}: learner, actors {', '.join(actors)}, admins {', '.join(admins)}; copy "
          f"<name>.key_secret to that actor's or operator's host only")
    return 0
