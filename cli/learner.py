"""`brorl learner`: the learner service (binds the work, rollout and control sockets).

With `learner.devices = K > 1` this process starts K learner ranks (`learner/ranks.py`: rank 0 serves,
the others follow it) and watches them: SIGTERM or SIGINT goes to rank 0, which finishes the step in hand,
writes a checkpoint and stops the others; a rank that dies takes the others down with it (exit status 1),
and the job resumes from its last checkpoint with `--resume` (`brorl run` does it: `run.max_learner_restarts`).
Exit status 78 (`EXIT_REFUSED`): the job cannot go on as configured (non-finite training past
`learner.max_nonfinite_steps`); `brorl run` does not restart it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from cli.common import add_config_arg, load


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("learner", help="the learner service: admit groups, train, broadcast weights")
    add_config_arg(p)
    p.add_argument("--resume", action="store_true", help="continue from run.run_dir's latest checkpoint")
    return p


ALLOCATOR = "expandable_segments:True"
"""The learner's CUDA allocator setting unless the user set `PYTORCH_CUDA_ALLOC_CONF`: a step's micro-batches
differ in shape from step to step, and with fixed-size segments the cache fragments until a large learner
runs out of memory with much of it reserved but unusable."""


def allocator_default(env: dict) -> None:
    """`ALLOCATOR` into `env` (before torch touches the GPU), unless the user chose their own."""
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOCATOR)


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    allocator_default(os.environ)  # the ranks started below inherit it
    cfg = load(args, overrides)
    if cfg.learner.devices > 1 and "RANK" not in os.environ:
        argv = ["learner", *(["--config", args.config] if args.config else []),
                *(["--resume"] if args.resume else []), *overrides]
        t = cfg.transport
        return start_ranks(cfg.learner.devices, argv, avoid=(t.work_port, t.rollout_port, t.control_port))
    from actors.verifier_set import EXIT_REFUSED
    from learner.service import NonFiniteTraining, main as serve

    try:
        return serve(cfg, resume=args.resume)
    except RuntimeError as e:
        if isinstance(e.__cause__, NonFiniteTraining):  # a restart would train the same numbers again
            print(f"brorl learner: {e.__cause__}", file=sys.stderr, flush=True)
            return EXIT_REFUSED
        raise


def start_ranks(world: int, argv: list[str], stop_grace_s: float = 60.0, avoid: tuple[int, ...] = ()) -> int:
    """Start `world` learner ranks of `brorl <argv>` and wait for them; returns rank 0's exit status (1 if
    another rank died first). The ranks' rendezvous port is none of `avoid` (the job's own ports)."""
    from cli.procs import brorl_command, die_with_parent
    from transport.ports import free_port

    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port(avoid=avoid)),
            "WORLD_SIZE": str(world)}
    procs = [subprocess.Popen(brorl_command(*argv), env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                              start_new_session=True, preexec_fn=die_with_parent)  # own session: no terminal ^C
             for r in range(world)]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: procs[0].poll() is None and procs[0].send_signal(signal.SIGTERM))
    try:
        while True:
            if procs[0].poll() is not None:  # rank 0 stopped: it told the others to stop, if it could
                deadline = time.monotonic() + stop_grace_s
                while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                    time.sleep(0.1)
                return procs[0].returncode
            # a follower ends with 0 only when rank 0 told it to stop (rank 0 is about to end too)
            dead = [(r, p.returncode) for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if dead:
                r, code = dead[0]
                print(f"brorl learner: rank {r} of {world} exited with status {code}; stopping the other ranks "
                      f"(resume from the last checkpoint with --resume)", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
