"""`brorl config show|explain`: the resolved configuration, as TOML or with every field's documentation."""

from __future__ import annotations

import argparse

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("config", help="print the resolved configuration")
    p.add_argument("action", choices=["show", "explain"], help="show: TOML; explain: with field docs")
    add_config_arg(p)
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    from config.loader import to_toml

    cfg = load(args, overrides)
    if args.action == "show":
        print(to_toml(cfg), end="")
        return 0
    for section, model in cfg:
        print(f"[{section}]")
        for name, field in type(model).model_fields.items():
            doc = " ".join((field.description or "").split())
            print(f"  {name} = {getattr(model, name)!r}\n      {doc}")
    return 0
