"""`brorl actor`: one vLLM actor; it can join or leave a running job."""

from __future__ import annotations

import argparse

from cli.common import add_config_arg, endpoints, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("actor", help="a vLLM actor: generate groups, score them, stream them to the learner")
    add_config_arg(p)
    p.add_argument("--learner", dest="learner_addr", help="tcp://HOST:PORT of the learner's work port")
    p.add_argument("--actor-id", default="actor-0", help="unique name of this actor")
    return p


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = load(args, overrides)
    ep = endpoints(cfg, args.learner_addr)
    from actors.actor import log, main as serve
    from actors.verifier_set import EXIT_REFUSED, ActorRefused

    from transport.ipc import remote_learner

    try:
        if why := remote_learner(cfg.transport.weight_backend, ep.host):  # refused before it loads a model
            raise ActorRefused(why)
        return serve(cfg, args.actor_id, ep)
    except ActorRefused as e:  # the launcher does not restart an actor that exits with EXIT_REFUSED
        from transport import events

        log.error("refuses to start: %s", e)
        events.emit("fatal", f"refused to start: {e}", events.describe(e)[1])
        return EXIT_REFUSED
