"""`brorl verifiers swap|status`: change or inspect the verifiers of a running job (an admin command sent
to the learner's work socket; the learner self-tests a new verifier before it publishes it)."""

from __future__ import annotations

import argparse
import sys

from cli.common import add_config_arg, endpoints, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("verifiers", help="change verifiers of a running job")
    p.add_argument("action", choices=["swap", "status"])
    p.add_argument("name", nargs="?", default="", help="verifier name to replace or add")
    p.add_argument("--to", default=None, help="dotted path of the new verifier (module or module:attr)")
    p.add_argument("--learner", dest="learner_addr", help="tcp://HOST:PORT of the learner's work port")
    p.add_argument("--timeout", type=float, default=30.0)
    add_config_arg(p)
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    import asyncio

    from transport import wire
    from transport.zmq_transport import ActorSockets, Security

    cfg = load(args, overrides)
    ep = endpoints(cfg, args.learner_addr)

    async def ask() -> wire.AdminReply:
        t = cfg.transport
        s = ActorSockets(ep, t.admin_key, Security(t.curve, t.keys_dir, t.admin_key))
        try:
            await s.work.send(wire.Admin(args.action, {"name": args.name, "path": args.to or ""}))
            while True:
                msg = await s.work.recv(timeout_s=args.timeout)
                if isinstance(msg, wire.AdminReply):
                    return msg
        finally:
            s.close()

    try:
        reply = asyncio.run(ask())
    except asyncio.TimeoutError:
        print(f"brorl verifiers: no answer from the learner at {ep.url(ep.work_port)}", file=sys.stderr)
        return 1
    print(reply.message, file=sys.stdout if reply.ok else sys.stderr)
    return 0 if reply.ok else 1
