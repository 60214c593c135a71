"""The `brorl` command: one entry point, a sub-command per role.

`brorl --help` must answer fast, so this module imports only the standard library at import time;
each sub-command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

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


def _ensure_model(cfg, force: bool = False, sft: bool = True) -> None:
    """Build the tiny model (and its warm start) at model.path unless a model is already there."""
    from learner.tiny_model import build_tiny_model, is_model_dir

    path = cfg.model.path
    if is_model_dir(path) and not force:
        return
    if not path.startswith("runs/") and not force and not is_model_dir(path):
        raise SystemExit(f"brorl: model.path {path!r} holds no model (brorl never downloads weights)")
    print(f"building the tiny model at {path} ...", flush=True)
    build_tiny_model(path, seed=cfg.model.tiny_seed)
    if sft:
        from learner.sft import warm_start

        print("warm start (supervised) until held-out pass@1 is 15-60% ...", flush=True)
        r = warm_start(cfg, path, seed=cfg.model.tiny_seed)
        print(f"warm start done after {r.updates} updates: held-out pass@1 ≈ {100 * r.pass_at_1:.1f}%", flush=True)


def cmd_make_tiny_model(args: argparse.Namespace, overrides: list[str]) -> int:
    from dataclasses import replace

    from learner.tiny_model import is_model_dir

    cfg = _load(args, overrides)
    if args.out:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": args.out})})
    if is_model_dir(cfg.model.path) and not args.force:
        print(f"tiny model already at {cfg.model.path} (use --force to rebuild)")
        return 0
    _ensure_model(cfg, force=True, sft=not args.no_sft)
    print(f"tiny model written to {cfg.model.path}")
    return 0


def cmd_sft(args: argparse.Namespace, overrides: list[str]) -> int:
    from learner.sft import warm_start

    cfg = _load(args, overrides)
    r = warm_start(cfg, cfg.model.path, args.out, min_pass=args.min_pass, max_pass=args.max_pass)
    print(f"held-out pass@1 ≈ {100 * r.pass_at_1:.1f}% after {r.updates} updates; saved to {args.out or cfg.model.path}")
    return 0


def cmd_simulate(args: argparse.Namespace, overrides: list[str]) -> int:
    from learner.simulator_cli import main as simulate_main

    return simulate_main(args, overrides)


def cmd_run(args: argparse.Namespace, overrides: list[str]) -> int:
    cfg = _load(args, overrides)
    _ensure_model(cfg)
    from learner.launcher import run

    return run(cfg, resume=args.resume, evaluate=not args.no_eval)


def cmd_learner(args: argparse.Namespace, overrides: list[str]) -> int:
    from learner.service import main

    return main(_load(args, overrides), resume=args.resume)


def cmd_actor(args: argparse.Namespace, overrides: list[str]) -> int:
    from actors.actor import endpoints_from, main

    cfg = _load(args, overrides)
    try:
        endpoints_from(cfg, args.learner_addr)
    except ValueError as e:
        print(f"brorl actor: {e}", file=sys.stderr)
        return 2
    return main(cfg, args.actor_id, args.learner_addr)


def cmd_eval(args: argparse.Namespace, overrides: list[str]) -> int:
    from actors.evaluate import main

    return main(_load(args, overrides), args.checkpoint, args.out, args.k)


def cmd_keys(args: argparse.Namespace, overrides: list[str]) -> int:
    from transport.security import generate

    actors = [a for a in args.actors.split(",") if a] + ["admin"]
    d = generate(args.dir, actors)
    print(f"CURVE keys in {d}: learner + {', '.join(actors)}; copy <name>.key_secret to each actor host only")
    return 0


def cmd_verifiers(args: argparse.Namespace, overrides: list[str]) -> int:
    import asyncio

    from actors.actor import endpoints_from
    from transport import wire
    from transport.zmq_transport import ActorSockets, Security

    cfg = _load(args, overrides)
    ep = endpoints_from(cfg, args.learner_addr)

    async def ask() -> wire.AdminReply:
        t = cfg.transport
        s = ActorSockets(ep, "admin", Security(t.curve, t.keys_dir, "admin"))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brorl",
        description="Asynchronous large-N RL from verifiable rewards (BroRL). "
        "Any config field can be overridden with --section.key VALUE.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("run", help="all roles on this machine: the default job")
    _config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the run folder's latest checkpoint")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation before and after")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("actor", help="a vLLM actor: generate groups, score them, stream them to the learner")
    _config_args(p)
    p.add_argument("--learner", dest="learner_addr", help="tcp://HOST:PORT of the learner's work port")
    p.add_argument("--actor-id", default="actor-0", help="unique name of this actor")
    p.set_defaults(func=cmd_actor)

    p = sub.add_parser("learner", help="the learner service: admit groups, train, broadcast weights")
    _config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from run.run_dir's latest checkpoint")
    p.set_defaults(func=cmd_learner)

    p = sub.add_parser("eval", help="pass@1 / pass@k of a checkpoint on held-out prompts")
    _config_args(p)
    p.add_argument("--checkpoint", default=None, help="Hugging Face model folder (default: model.path)")
    p.add_argument("--out", default=None, help="write the result as JSON (and a .md table) here")
    p.add_argument("--k", type=int, default=None, help="samples per prompt (default run.eval_samples = 16)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("sft", help="warm-start the model (supervised) until held-out pass@1 is in a band")
    _config_args(p)
    p.add_argument("--out", default=None, help="output folder (default: overwrite model.path)")
    p.add_argument("--min-pass", type=float, default=0.15)
    p.add_argument("--max-pass", type=float, default=0.6)
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("keys", help="create CURVE key pairs for the learner and named actors")
    p.add_argument("action", choices=["generate"])
    p.add_argument("--dir", default="runs/keys", help="keys folder (transport.keys_dir)")
    p.add_argument("--actors", default="actor-0", help="comma-separated actor names")
    p.set_defaults(func=cmd_keys)

    p = sub.add_parser("verifiers", help="change verifiers of a running job")
    p.add_argument("action", choices=["swap", "status"])
    p.add_argument("name", nargs="?", default="", help="verifier name to replace or add")
    p.add_argument("--to", default=None, help="dotted path of the new verifier (module or module:attr)")
    p.add_argument("--learner", dest="learner_addr", help="tcp://HOST:PORT of the learner's work port")
    p.add_argument("--timeout", type=float, default=30.0)
    _config_args(p)
    p.set_defaults(func=cmd_verifiers)

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
    p.add_argument("--no-sft", action="store_true", help="skip the supervised warm start (random weights)")
    p.set_defaults(func=cmd_make_tiny_model)

    p = sub.add_parser("config", help="print the resolved configuration")
    p.add_argument("action", choices=["show", "explain"], help="show: TOML; explain: with field docs")
    _config_args(p)
    p.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    takes_overrides = args.func not in (cmd_simulate, cmd_keys)
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
