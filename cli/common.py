"""What several sub-commands share: the `--config` argument, loading the config with dotted overrides,
and the learner's endpoints from `--learner` or the config. Standard library only at import time."""

from __future__ import annotations

import argparse
import sys


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help="TOML preset: a path or a shipped name (tiny-cpu, brorl-1.5b, prorl-1.5b); default tiny-cpu",
    )


def load(args: argparse.Namespace, overrides: list[str]):
    from config.loader import load_config

    return load_config(args.config, overrides)


def endpoints(cfg, learner_addr: str | None):
    """The learner's sockets: from `--learner tcp://HOST:PORT` (work port; rollout and control follow
    it) or, without it, from `[transport]`. A malformed address exits with status 2 and names the flag."""
    from transport.zmq_transport import Endpoints

    t = cfg.transport
    if not learner_addr:
        zero = [k for k in ("work_port", "rollout_port", "control_port") if getattr(t, k) == 0]
        if zero:  # 0 means "pick a free one" to `brorl run`, which passes the chosen ports to its roles
            print(f"brorl: transport.{zero[0]} = 0 names no learner port: give --learner tcp://HOST:PORT or the "
                  f"learner's ports", file=sys.stderr)
            raise SystemExit(2)
        return Endpoints(t.host, t.work_port, t.rollout_port, t.control_port)
    try:
        return Endpoints.from_address(learner_addr)
    except ValueError as e:
        print(f"brorl: --learner: {e}", file=sys.stderr)
        raise SystemExit(2) from None
