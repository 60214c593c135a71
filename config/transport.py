"""The `[transport]` section: the learner's sockets, CURVE, heartbeats and the weight broadcast."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from config.section import Section


class TransportConfig(Section):
    host: str = "127.0.0.1"
    """Address the learner binds and actors connect to."""

    work_port: int = Field(5555, ge=0, le=65535)
    """ROUTER port for work requests and assignments. 0 (this port and the two below): `brorl run` picks a free
    port before the roles start and gives it to all of them (not with `--cluster`, where the learner's node is
    Ray's choice)."""

    rollout_port: int = Field(5556, ge=0, le=65535)
    """PULL port receiving rollout groups."""

    control_port: int = Field(5557, ge=0, le=65535)
    """PUB port for control messages (versions, verifier swaps, pause/stop)."""

    high_water_mark: int = Field(64, ge=1)
    """ZeroMQ send/receive high-water mark, messages per socket."""

    curve: bool = False
    """CURVE encryption and authentication of every socket."""

    allow_insecure_remote: bool = False
    """Permit `curve = false` on a non-loopback `host` (explicit waiver)."""

    keys_dir: str = "runs/keys"
    """Folder of CURVE keys written by `brorl keys`."""

    weight_backend: Literal["gloo", "nccl", "ipc"] = "gloo"
    """How new weights reach the actors' vLLM engines: "gloo" (any host, CPU or GPU, through host memory),
    "nccl" (GPUs, each on its own card), or "ipc" (learner and actors on one host, a GPU shared or not: the
    learner keeps a persistent buffer of the whole model in the serving dtype, on its device — CUDA IPC —
    or in POSIX shared memory on CPU, and each update is a copy into it and, per worker, out of it; an actor
    on another host is refused at start, and on GPUs every actor must share the learner's GPU)."""

    weight_bucket_mb: int = Field(256, ge=1)
    """Size of one broadcast bucket, MiB: bounds the extra memory of a weight update."""

    weight_timeout_s: float = Field(120.0, gt=0.0)
    """Seconds before a missing or dead weight receiver is reported as an error instead of a hang."""

    heartbeat_interval_s: float = Field(1.0, gt=0.0)
    """Seconds between an actor's heartbeats (they carry its weights' version and checksum and counters)."""

    heartbeat_timeout_s: float = Field(5.0, gt=0.0)
    """Seconds of silence (no heartbeat, request or hello) after which an actor is evicted: it leaves the
    weight group before the next broadcast, and the prompts it holds go back to the queue. After a weight
    sync fails, members silent for 1.5 heartbeat intervals are evicted at once (a dead one is found in
    seconds, not after the weight timeout)."""

    max_actors: int = Field(256, ge=1)
    """Most actor ids the learner keeps state for at once (members, incarnations, reminders). A hello from
    a new id while this many are tracked is refused (counted, logged) until silent ones are pruned: a flood
    of forged ids cannot grow the learner's tables."""

    admin_key: str = "admin"
    """With `curve = true`: the key name (`brorl keys generate --admin NAME`) that `brorl verifiers swap`
    signs in with. Only keys under `keys_dir/admins/` may send admin commands; without CURVE only a
    connection from loopback may."""
