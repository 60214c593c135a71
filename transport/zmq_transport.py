"""ZeroMQ sockets between learner and actors (asyncio, `zmq.asyncio`).

Learner side binds (here), actors connect (`transport/actor_sockets.py`), so actors can come and go:

    WorkServer        ROUTER bind    work requests, hellos, heartbeats in; assignments, acks, snapshots out
    RolloutReceiver   PULL   bind    rollout groups in
    ControlPublisher  ROUTER bind    control messages out to every subscribed connection (transport/control.py)
    WorkClient        DEALER connect
    RolloutSender     PUSH   connect
    ControlSubscriber DEALER connect subscribes (a 1-byte message, repeated), then control messages in

Routing: actors set no ZMQ routing identity; the learner's ROUTER names each connection itself (no
ROUTER_HANDOVER), so no peer can take another's connection over by claiming its name. The learner
replies to an actor on the connection its last authenticated message came on (`learner.membership`).

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
`rejects`, logged (rate-limited), and dropped — the socket keeps serving (a group whose header still names
its id is NACKed: `RolloutReceiver.nacks`). A group that does not name its sender consistently (its id's
actor prefix is not its actor id, or with CURVE its actor id is not the connection key's actor) is refused
before the duplicate table is touched, and NACKed to the authenticated sender only. Frames larger than
any valid message of the job are refused by libzmq itself (ZMQ_MAXMSGSIZE: the peer is disconnected
before the frame is buffered), and TCP keepalives drop peers whose host vanished. Each received message leaves its connection's `Peer` (address, and the
ZAP User-Id with CURVE) in `last_peer`, for the learner's identity checks.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import zmq
import zmq.asyncio

from transport import security, wire
from transport.actor_sockets import ActorSockets  # the actor side, in a module of its own
from transport.control import ControlPublisher
from transport.zmq_base import (HEADER_FRAME, ZMTP_HEARTBEAT, Endpoints, Limits, Nack, Peer, Security, _bind, _recv_frames,
                                _Rejects, _tune)

__all__ = ["Endpoints", "Limits", "Peer", "Security", "LearnerSockets", "ActorSockets", "MAX_SENDERS"]

log = logging.getLogger("brorl.transport")
MAX_SENDERS = 4096  # duplicate tables kept (one per actor process); the oldest unused one goes first


class LearnerSockets:
    """The learner's three bound sockets on one context (and the CURVE authenticator, if on). `max_frame`
    bounds a rollout frame (`wire.max_frame_bytes` of the job; the work and control sockets carry headers
    only); `heartbeat` = (interval, timeout) seconds of ZMTP heartbeats (0: off)."""

    def __init__(self, ep: Endpoints, sec: Security = Security(), hwm: int = 64, max_frame: int = -1,
                 heartbeat: tuple[float, float] = ZMTP_HEARTBEAT):
        self.ctx = zmq.asyncio.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)  # every socket of it, the authenticator's too: term never waits
        self.auth = security.start_authenticator(self.ctx, sec.keys_dir) if sec.curve else None
        headers = Limits(hwm, HEADER_FRAME, *heartbeat)
        try:
            self.work = WorkServer(self.ctx, ep, sec, headers)
            self.rollouts = RolloutReceiver(self.ctx, ep, sec, Limits(hwm, max_frame, *heartbeat))
            self.control = ControlPublisher(self.ctx, ep, sec, headers, self.auth)
        except BaseException:  # e.g. a port in use: close what was opened (a context left to the garbage
            if self.auth is not None:  # collector can block a later test in term())
                self.auth.stop()
            self.ctx.destroy(linger=0)
            raise
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

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits):
        self.sock = ctx.socket(zmq.ROUTER)
        _tune(self.sock, lim)
        self.sock.setsockopt(zmq.SNDHWM, lim.hwm)
        self.sock.setsockopt(zmq.RCVHWM, lim.hwm)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # no ROUTER_HANDOVER: routing identities are the ROUTER's own names for connections (actors set
        # none), so no peer can take another's connection over by claiming its identity
        if sec.curve:
            security.make_server(self.sock, sec.keys_dir)
        self.port = _bind(self.sock, ep.host, ep.work_port, "transport.work_port")
        self.rejects = _Rejects("work ROUTER")
        self.last_peer = Peer()

    async def recv(self) -> tuple[bytes, Any]:
        """(routing identity, message); the connection it came on is in `last_peer`."""
        while True:
            frames = await _recv_frames(self.sock)
            if len(frames) < 2:
                self.rejects.add(wire.WireError("ROUTER message without identity and body"))
                continue
            if (msg := self.rejects.decode(frames[1:])) is None:
                continue
            self.last_peer = Peer.of(frames[1])
            return bytes(frames[0].buffer), msg

    async def send(self, identity: bytes, msg: Any) -> None:
        await self.sock.send_multipart([identity, *wire.encode(msg)], copy=False)


class RolloutReceiver:
    """PULL, bound. RCVHWM `hwm` messages; when full, the actors' PUSH sockets block (backpressure)."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits):
        self.sock = ctx.socket(zmq.PULL)
        _tune(self.sock, lim)
        self.sock.setsockopt(zmq.RCVHWM, lim.hwm)
        if sec.curve:
            security.make_server(self.sock, sec.keys_dir)
        self.port = _bind(self.sock, ep.host, ep.rollout_port, "transport.rollout_port")
        self.rejects = _Rejects("rollout PULL")
        self.curve = sec.curve
        self.duplicates = 0
        self.dup_ids: list[tuple[str, int, Peer]] = []  # (group id, prompt id, connection) of duplicates
        self.last_peer = Peer()
        self.nacks: list[tuple[str, str, str]] = []  # (actor id, group id, why) of undecodable groups
        # that still name themselves: the caller NACKs them (bounded: the oldest are dropped)
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
        """Next new, valid group. Before any table is touched, the group must name its sender consistently:
        its id's actor prefix is its `actor_id`, which (with CURVE) is the connection key's actor; one that
        does not is refused (`sender_problem`), NACKed to the authenticated sender, if any. Duplicates are
        counted in `duplicates` and acknowledged by the caller (`take_duplicate_ids`)."""
        while True:
            frames = await _recv_frames(self.sock)
            try:
                group = wire.decode(frames)
                if not isinstance(group, wire.RolloutGroup):
                    raise wire.WireError(f"expected a group on the rollout socket, got {type(group).__name__}")
            except wire.WireError as e:
                self.rejects.add(e)
                self._nack(frames[0], str(e))
                continue
            peer = Peer.of(frames[0])
            sender, why = self.sender_problem(group, peer)
            if why:
                self.rejects.add(wire.WireError(f"group {group.group_id[:200]!r}: {why}"))
                if sender:
                    self._add_nack(Nack(sender, group.group_id, f"identity: {why}"[:300], group.prompt_id, peer))
                continue
            try:
                dup = self.is_duplicate(group.group_id)
            except wire.WireError as e:
                self.rejects.add(e)
                self._add_nack(Nack(sender, group.group_id, f"malformed: {e}"[:300], group.prompt_id, peer))
                continue
            self.last_peer = peer
            if dup:
                self.duplicates += 1
                self.dup_ids = self.dup_ids[-1023:] + [(group.group_id, group.prompt_id, peer)]
                continue
            return group

    def sender_problem(self, group: wire.RolloutGroup, peer: Peer) -> tuple[str, str]:
        """(the authenticated sender — the CURVE key's actor, or without CURVE the claimed actor id —,
        why the group does not name it consistently, "" if it does)."""
        sender = group.actor_id
        if self.curve:
            sender = peer.user.removeprefix("actor:") if peer.user.startswith("actor:") else ""
            if group.actor_id != sender:
                return sender, f"claims actor {group.actor_id[:64]!r}, connection key is {peer.user or 'unknown'!r}"
        parts = group.group_id.rsplit(":", 2)  # "<actor>:<incarnation>:<seq>" ("<actor>:<seq>" in tests)
        prefix = parts[0] if len(parts) > 1 else ""
        if prefix != group.actor_id:
            return sender, f"group id names actor {prefix[:64]!r}, the group actor {group.actor_id[:64]!r}"
        return sender, ""

    def _nack(self, head, why: str) -> None:
        """An undecodable group whose header still names its sender and id: NACK it (so the sender drops
        it instead of re-sending it forever)."""
        import orjson

        try:
            h = orjson.loads(bytes(head.buffer)) if memoryview(head.buffer).nbytes <= wire.MAX_HEADER_BYTES else {}
        except (orjson.JSONDecodeError, AttributeError):
            return
        if isinstance(h, dict) and isinstance(h.get("actor_id"), str) and isinstance(h.get("group_id"), str):
            pid = readable_prompt_id(h.get("prompt_id"))
            self._add_nack(Nack(h["actor_id"], h["group_id"], f"malformed: {why}"[:300], pid, Peer.of(head)))

    def _add_nack(self, nack: Nack) -> None:
        """Queue a NACK for the caller (bounded: the oldest go first)."""
        self.nacks = self.nacks[-255:] + [nack]

    def take_nacks(self) -> list[Nack]:
        nacks, self.nacks = self.nacks, []
        return nacks

    def forget(self, prefix: str) -> None:
        """Drop the duplicate table of one sender ("<actor_id>:<incarnation>", a retired incarnation)."""
        self._seen.pop(prefix, None)

    def take_duplicate_ids(self) -> dict[str, list[tuple[str, int, Peer]]]:
        """(group id, prompt id, connection) of groups received again since the last call, by their
        (authenticated) actor."""
        out: dict[str, list[tuple[str, int, Peer]]] = {}
        for dup in self.dup_ids:
            out.setdefault(dup[0].rsplit(":", 2)[0], []).append(dup)
        self.dup_ids = []
        return out


def readable_prompt_id(value: Any) -> int | None:
    """The prompt id an undecodable group's header names, if it can be read: an int, or a string of at most
    18 decimal digits ("71"); else None (its lease then goes back at its deadline)."""
    if type(value) is int:
        return value
    if isinstance(value, str) and 0 < len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    return None
