"""ZeroMQ sockets between learner and actors (asyncio, `zmq.asyncio`).

Learner side binds, actors connect, so actors can come and go:

    WorkServer        ROUTER bind    work requests, hellos, heartbeats in; assignments, acks, snapshots out
    RolloutReceiver   PULL   bind    rollout groups in
    ControlPublisher  PUB    bind    control messages out
    WorkClient        DEALER connect
    RolloutSender     PUSH   connect
    ControlSubscriber SUB    connect

Flow control is credit based: an actor asks for prompts only up to its free capacity (`WorkRequest.credits`)
and the learner never grants more, so at most `num_actors × max_inflight` prompts are outstanding. A
sender keeps every group until the learner acknowledges it (`GroupAck`), up to `max_unacked` groups;
beyond that `send` waits (backpressure), so an actor's memory is bounded by `max_unacked` groups. The
receiver holds at most the PULL high-water mark in libzmq plus what the caller queues.

Exactly once: ZeroMQ reconnects by itself but may lose what was in flight on a broken connection, so
the sender re-sends unacknowledged groups after `resend_after_s`, and the receiver drops (and counts)
any group id it has already seen. Ids are "<actor_id>:<incarnation>:<seq>" with seq increasing per actor
process (its incarnation), so a restarted actor never collides with its predecessor, and the seen-set is
kept compact per incarnation (highest contiguous seq + the few above it; `forget` drops a retired one).

Bad input: every receive path decodes with `wire.decode`; a frame sequence that fails is counted in
`stats["rejected"]`, logged (rate-limited), and dropped — the socket keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from transport import security, wire

log = logging.getLogger("brorl.transport")
MAX_SENDERS = 4096  # duplicate tables kept (one per actor process); the oldest unused one goes first


@dataclass
class Endpoints:
    host: str = "127.0.0.1"
    work_port: int = 5555
    rollout_port: int = 5556
    control_port: int = 5557

    def url(self, port: int) -> str:
        return f"tcp://{self.host}:{port}"

    @classmethod
    def from_address(cls, address: str) -> "Endpoints":
        """`tcp://HOST:PORT` names the learner's work port; the rollout and control ports follow it (+1, +2)."""
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a learner address looks like tcp://HOST:PORT, got {address!r}")
        p = int(port)
        return cls(host, p, p + 1, p + 2)


@dataclass
class Security:
    curve: bool = False
    keys_dir: str | Path = "runs/keys"
    client_name: str = ""


class _Rejects:
    def __init__(self, where: str):
        self.where = where
        self.count = 0
        self._last_log = 0.0

    def add(self, err: Exception) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last_log > 1.0:  # at most one line a second per socket
            self._last_log = now
            log.warning("%s: rejected malformed message (%d so far): %s", self.where, self.count, err)


def _bind(sock: zmq.asyncio.Socket, host: str, port: int) -> int:
    if port == 0:
        return sock.bind_to_random_port(f"tcp://{host}")
    sock.bind(f"tcp://{host}:{port}")
    return port


async def _recv_frames(sock: zmq.asyncio.Socket, timeout_s: float | None = None) -> list:
    """`recv_multipart(copy=False)` that tolerates spurious wake-ups: libzmq can report POLLIN and then
    answer EAGAIN (seen with CURVE right after the handshake, before multi-MB messages); that is retried,
    not raised. With `timeout_s`, raises asyncio.TimeoutError when nothing arrives in time."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not await sock.poll(left * 1000):
                raise asyncio.TimeoutError
        try:
            return await sock.recv_multipart(copy=False)
        except zmq.Again:
            await asyncio.sleep(0)


class LearnerSockets:
    """The learner's three bound sockets on one context (and the CURVE authenticator, if on)."""

    def __init__(self, ep: Endpoints, sec: Security = Security(), hwm: int = 64):
        self.ctx = zmq.asyncio.Context()
        self.auth = security.start_authenticator(self.ctx, sec.keys_dir) if sec.curve else None
        self.work = WorkServer(self.ctx, ep, sec, hwm)
        self.rollouts = RolloutReceiver(self.ctx, ep, sec, hwm)
        self.control = ControlPublisher(self.ctx, ep, sec, hwm)
        self.endpoints = Endpoints(ep.host, self.work.port, self.rollouts.port, self.control.port)

    async def answer_hello(self, identity: bytes, hello: wire.Hello) -> None:
        """Start-up barrier, learner half: the snapshot first, then the sync token on the control
        channel; the actor applies control messages with seq above the snapshot's."""
        await self.work.send(identity, self.control.snapshot())
        await self.control.publish("sync_ack", token=hello.sync_token)

    def close(self) -> None:
        for s in (self.work.sock, self.rollouts.sock, self.control.sock):
            s.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


class WorkServer:
    """ROUTER, bound. HWM `hwm` per peer; replies to a peer whose queue is full are dropped by libzmq
    (ROUTER semantics) — the actor re-asks after its timeout, so nothing is lost."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, hwm: int):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # a restarted actor reconnects under the same identity while its dead predecessor's connection may
        # still be registered: the new connection takes the identity over (the default would refuse it)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        if sec.curve:
            security.make_server(self.sock, sec.keys_dir)
        self.port = _bind(self.sock, ep.host, ep.work_port)
        self.rejects = _Rejects("work ROUTER")

    async def recv(self) -> tuple[bytes, Any]:
        while True:
            frames = await _recv_frames(self.sock)
            if len(frames) < 2:
                self.rejects.add(wire.WireError("ROUTER message without identity and body"))
                continue
            try:
                return bytes(frames[0].buffer), wire.decode(frames[1:])
            except wire.WireError as e:
                self.rejects.add(e)

    async def send(self, identity: bytes, msg: Any) -> None:
        await self.sock.send_multipart([identity, *wire.encode(msg)], copy=False)


class RolloutReceiver:
    """PULL, bound. RCVHWM `hwm` messages; when full, the actors' PUSH sockets block (backpressure)."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, hwm: int):
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        if sec.curve:
            security.make_server(self.sock, sec.keys_dir)
        self.port = _bind(self.sock, ep.host, ep.rollout_port)
        self.rejects = _Rejects("rollout PULL")
        self.duplicates = 0
        self.dup_ids: list[str] = []
        # per "<actor_id>:<incarnation>": (highest contiguous seq, seqs seen above it); least recently used
        # first, at most MAX_SENDERS (a retired incarnation is forgotten at once, see `forget`)
        self._seen: OrderedDict[str, tuple[int, set[int]]] = OrderedDict()

    def is_duplicate(self, group_id: str) -> bool:
        """Record `group_id`; True if it was seen before."""
        actor, _, seq_s = group_id.rpartition(":")
        try:
            seq = int(seq_s)
        except ValueError:
            seq = None
        if seq is None or not actor:
            raise wire.WireError(f"group_id {group_id!r} is not '<actor>:<incarnation>:<seq>'")
        floor, above = self._seen.pop(actor, (-1, set()))
        self._seen[actor] = (floor, above)  # most recently used last
        while len(self._seen) > MAX_SENDERS:
            self._seen.popitem(last=False)
        if seq <= floor or seq in above:
            return True
        above.add(seq)
        while floor + 1 in above:
            floor += 1
            above.discard(floor)
        self._seen[actor] = (floor, above)
        return False

    async def recv(self) -> wire.RolloutGroup:
        """Next new, valid group (duplicates are counted in `duplicates` and still acknowledged by the
        caller through `last_ids`)."""
        while True:
            frames = await _recv_frames(self.sock)
            try:
                group = wire.decode(frames)
                if not isinstance(group, wire.RolloutGroup):
                    raise wire.WireError(f"expected a group on the rollout socket, got {type(group).__name__}")
                dup = self.is_duplicate(group.group_id)
            except wire.WireError as e:
                self.rejects.add(e)
                continue
            if dup:
                self.duplicates += 1
                self.dup_ids.append(group.group_id)
                continue
            return group

    def forget(self, prefix: str) -> None:
        """Drop the duplicate table of one sender ("<actor_id>:<incarnation>", a retired incarnation)."""
        self._seen.pop(prefix, None)

    def take_duplicate_ids(self) -> list[str]:
        ids, self.dup_ids = self.dup_ids, []
        return ids


class ControlPublisher:
    """PUB, bound. SNDHWM `hwm` per subscriber; a subscriber that falls that far behind loses messages
    (PUB semantics), which is why control is state-based: every message carries a seq, and a joining or
    lagging actor resynchronises from a `Snapshot` (see `ControlSubscriber.sync`)."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, hwm: int):
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        if sec.curve:
            security.make_server(self.sock, sec.keys_dir)
        self.port = _bind(self.sock, ep.host, ep.control_port)
        self.seq = 0
        self.epoch = uuid.uuid4().hex[:12]  # this learner process; seq counts within it
        self.version = 0
        self.verifiers: dict[str, str] = {}
        self.paused = False
        self.weights: dict[str, Any] = {}

    def snapshot(self) -> wire.Snapshot:
        return wire.Snapshot(self.seq, self.version, dict(self.verifiers), self.paused, dict(self.weights), self.epoch)

    async def publish(self, kind: str, **payload: Any) -> wire.Control:
        self.seq += 1
        if kind == "version":
            self.version = int(payload["version"])
        elif kind == "swap":
            self.verifiers[payload["name"]] = payload["path"]
        elif kind in ("pause", "resume"):
            self.paused = kind == "pause"
        elif kind == "weights":
            self.weights = dict(payload)
        msg = wire.Control(self.seq, kind, payload, self.epoch)
        await self.sock.send_multipart(wire.encode(msg))
        return msg


# ----------------------------------------------------------------------------------------------- actor


class ActorSockets:
    def __init__(self, ep: Endpoints, actor_id: str, sec: Security = Security(), hwm: int = 64,
                 max_unacked: int = 64, resend_after_s: float = 10.0, incarnation: str | None = None):
        self.ctx = zmq.asyncio.Context()
        self.actor_id = actor_id
        self.incarnation = incarnation or uuid.uuid4().hex[:12]  # this process: in every hello and group id
        sec = Security(sec.curve, sec.keys_dir, sec.client_name or actor_id)
        self.work = WorkClient(self.ctx, ep, sec, hwm, actor_id)
        self.rollouts = RolloutSender(self.ctx, ep, sec, hwm, actor_id, max_unacked, resend_after_s, self.incarnation)
        self.control = ControlSubscriber(self.ctx, ep, sec, hwm)

    def close(self) -> None:
        for s in (self.work.sock, self.rollouts.sock, self.control.sock):
            s.close(linger=0)
        self.ctx.term()

    def hello(self, version: int, token: str = "") -> wire.Hello:
        return wire.Hello(self.actor_id, version, token or uuid.uuid4().hex, self.incarnation)

    async def sync(self, version: int, timeout_s: float = 30.0) -> wire.Snapshot:
        """Start-up barrier: returns once the SUB socket provably receives (our sync token came back on it)
        and with the control state as of that moment; later control messages all arrive on SUB."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            token = uuid.uuid4().hex
            await self.work.send(self.hello(version, token))
            snap: wire.Snapshot | None = None
            t_end = min(deadline, time.monotonic() + 0.5)
            while time.monotonic() < t_end:
                try:
                    if snap is None:
                        msg = await self.work.recv(timeout_s=max(0.01, t_end - time.monotonic()))
                        if isinstance(msg, wire.Snapshot):
                            snap = msg
                        else:
                            self.work.backlog.append(msg)
                        continue
                    ctl = await self.control.recv(timeout_s=max(0.01, t_end - time.monotonic()))
                except asyncio.TimeoutError:
                    break
                if ctl.kind == "sync_ack" and ctl.payload.get("token") == token:
                    self.control.adopt(snap)
                    return snap
        raise TimeoutError(f"actor {self.actor_id}: no control-channel barrier within {timeout_s} s")


class WorkClient:
    """DEALER, connected. SNDHWM `hwm`; when the learner is unreachable, sends queue up to the HWM and
    then `send` waits — requests are small and re-sent on timeout, so nothing accumulates."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, hwm: int, actor_id: str):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, actor_id.encode())
        if sec.curve:
            security.make_client(self.sock, sec.keys_dir, sec.client_name or actor_id)
        self.sock.connect(ep.url(ep.work_port))
        self.rejects = _Rejects("work DEALER")
        self.backlog: list[Any] = []

    async def send(self, msg: Any) -> None:
        await self.sock.send_multipart(wire.encode(msg))

    async def recv(self, timeout_s: float | None = None) -> Any:
        if self.backlog:
            return self.backlog.pop(0)
        while True:
            frames = await _recv_frames(self.sock, timeout_s)
            try:
                return wire.decode(frames)
            except wire.WireError as e:
                self.rejects.add(e)


class RolloutSender:
    """PUSH, connected. SNDHWM `hwm`; when the learner's queue and ours are full, sends wait."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, hwm: int, actor_id: str,
                 max_unacked: int, resend_after_s: float, incarnation: str = "0"):
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        if sec.curve:
            security.make_client(self.sock, sec.keys_dir, sec.client_name or actor_id)
        self.sock.connect(ep.url(ep.rollout_port))
        self.actor_id = actor_id
        self.prefix = f"{actor_id}:{incarnation}"
        self.max_unacked = max_unacked
        self.resend_after_s = resend_after_s
        self.seq = 0
        self.unacked: OrderedDict[str, tuple[float, wire.RolloutGroup]] = OrderedDict()
        self._room = asyncio.Event()
        self._room.set()
        self.resent = 0

    def next_group_id(self) -> str:
        gid = f"{self.prefix}:{self.seq}"
        self.seq += 1
        return gid

    async def send(self, group: wire.RolloutGroup) -> None:
        while len(self.unacked) >= self.max_unacked:
            self._room.clear()
            await self._room.wait()
        self.unacked[group.group_id] = (time.monotonic(), group)
        await self.sock.send_multipart(wire.encode(group), copy=False)

    def ack(self, group_ids: list[str]) -> None:
        for gid in group_ids:
            self.unacked.pop(gid, None)
        if len(self.unacked) < self.max_unacked:
            self._room.set()

    def forget_unacked(self) -> None:
        """Give up every unacknowledged group (they were for a learner process that is gone)."""
        self.unacked.clear()
        self._room.set()

    async def resend_stale(self) -> int:
        """Re-send groups unacknowledged for `resend_after_s` (the receiver drops any duplicate)."""
        now, n = time.monotonic(), 0
        for gid, (t, group) in list(self.unacked.items()):
            if now - t >= self.resend_after_s:
                self.unacked[gid] = (now, group)
                await self.sock.send_multipart(wire.encode(group), copy=False)
                n += 1
        self.resent += n
        return n


class ControlSubscriber:
    """SUB, connected, subscribed to everything. RCVHWM `hwm`. Messages with seq <= the last applied
    one (replays, or anything older than the start-up snapshot) are dropped — within one learner epoch. A
    message of another epoch (the learner restarted; seq starts again) is passed on and starts counting
    afresh; the caller sees the new `epoch` on it and resynchronises."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, hwm: int):
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, hwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        if sec.curve:
            security.make_client(self.sock, sec.keys_dir, sec.client_name)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(ep.url(ep.control_port))
        self.last_seq = 0
        self.epoch = ""  # the learner epoch of the last applied message (set by the start-up barrier)
        self.rejects = _Rejects("control SUB")

    def adopt(self, snap: wire.Snapshot) -> None:
        """A snapshot (through the work socket) is the control state up to its seq, of its epoch."""
        self.last_seq = max(self.last_seq, snap.control_seq) if snap.epoch == self.epoch else snap.control_seq
        self.epoch = snap.epoch

    async def recv(self, timeout_s: float | None = None) -> wire.Control:
        while True:
            frames = await _recv_frames(self.sock, timeout_s)
            try:
                msg = wire.decode(frames)
                if not isinstance(msg, wire.Control):
                    raise wire.WireError(f"expected control, got {type(msg).__name__}")
            except wire.WireError as e:
                self.rejects.add(e)
                continue
            if msg.kind == "sync_ack":
                return msg
            if msg.epoch != self.epoch:  # a new learner process: its seq starts again
                self.epoch, self.last_seq = msg.epoch, msg.seq
                return msg
            if msg.seq > self.last_seq:
                self.last_seq = msg.seq
                return msg
