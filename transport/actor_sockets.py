"""The actor's side of the ZeroMQ sockets (`transport/zmq_transport.py` says the design): its work DEALER,
rollout PUSH with acknowledgements and re-sends, and the control channel's subscriber, with the start-up
barrier (`ActorSockets.sync`)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import OrderedDict
from typing import Any

import zmq
import zmq.asyncio

from transport import security, wire
from transport.control import ControlSubscriber
from transport.zmq_base import HEADER_FRAME, ZMTP_HEARTBEAT, Endpoints, Limits, Security, _recv_frames, _Rejects, _tune

log = logging.getLogger("brorl.transport")


class ActorSockets:
    def __init__(self, ep: Endpoints, actor_id: str, sec: Security = Security(), hwm: int = 64,
                 max_unacked: int = 64, resend_after_s: float = 10.0, incarnation: str | None = None,
                 heartbeat: tuple[float, float] = ZMTP_HEARTBEAT):
        self.ctx = zmq.asyncio.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)  # every socket of it, the authenticator's too: term never waits
        self.actor_id = actor_id
        self.incarnation = incarnation or uuid.uuid4().hex[:12]  # this process: in every hello and group id
        sec = Security(sec.curve, sec.keys_dir, sec.client_name or actor_id)
        lim = Limits(hwm, HEADER_FRAME, *heartbeat)  # an actor receives header-only messages
        self.work = WorkClient(self.ctx, ep, sec, lim, actor_id)
        self.rollouts = RolloutSender(self.ctx, ep, sec, lim, actor_id, max_unacked, resend_after_s, self.incarnation)
        self.control = ControlSubscriber(self.ctx, ep, sec, lim)
        self._resynced = 0  # control.gaps already answered by a hello

    def close(self) -> None:
        for s in (self.work.sock, self.rollouts.sock, self.control.sock):
            s.close(linger=0)
        self.ctx.term()

    async def resync_if_lost(self, version: int) -> bool:
        """Control messages were lost since the last call (`ControlSubscriber.gaps`): say hello again, so the
        learner answers with a snapshot of its state (and regroups us if we were in its weight group)."""
        if self.control.gaps == self._resynced:
            return False
        self._resynced = self.control.gaps
        await self.work.send(self.hello(version))
        return True

    def hello(self, version: int, token: str = "") -> wire.Hello:
        return wire.Hello(self.actor_id, version, token or uuid.uuid4().hex, self.incarnation)

    async def sync(self, version: int, timeout_s: float = 30.0) -> wire.Snapshot:
        """Start-up barrier: returns once the control socket provably receives (a sync token of ours came back on
        it) and with the control state as of a snapshot no older than that token; control messages after
        the snapshot (those heard while waiting included) all come out of `control.recv`.

        The control socket misses what is published before its subscription reaches the learner (the slow
        joiner), so hellos are repeated — soon at first, then every 0.5 s. Any of our tokens counts and the
        newest snapshot is kept: a learner slower to answer than the repeat interval is still synced."""
        deadline = time.monotonic() + timeout_s
        tokens: set[str] = set()
        snap: wire.Snapshot | None = None
        acked: dict[str, int] = {}  # learner epoch -> lowest seq of a sync_ack carrying one of our tokens
        heard: list[wire.Control] = []
        poller = zmq.asyncio.Poller()
        poller.register(self.work.sock, zmq.POLLIN)
        poller.register(self.control.sock, zmq.POLLIN)
        next_hello, every = 0.0, 0.05
        snaps = 0
        while (now := time.monotonic()) < deadline:
            if now >= next_hello:
                await self.control.refresh()
                token = uuid.uuid4().hex
                tokens.add(token)
                try:  # a learner that never answers fills the send queue: then `send` waits, never past the deadline
                    await asyncio.wait_for(self.work.send(self.hello(version, token)), deadline - now)
                except TimeoutError:
                    break
                next_hello, every = now + every, min(0.5, every * 2)
            wait = max(0.0, min(next_hello, deadline) - time.monotonic())
            ready = dict(await poller.poll(wait * 1000))
            if self.work.sock in ready:
                msg = await _take(self.work.sock, self.work.rejects)
                if isinstance(msg, wire.Snapshot):
                    snaps += 1
                    if snap is None or msg.epoch != snap.epoch or msg.control_seq >= snap.control_seq:
                        snap = msg
                elif msg is not None:
                    self.work.backlog.append(msg)
            if self.control.sock in ready:
                ctl = await _take(self.control.sock, self.control.rejects, wire.Control)
                if ctl is not None and ctl.kind == "sync_ack" and ctl.payload.get("token") in tokens:
                    acked[ctl.epoch] = min(acked.get(ctl.epoch, ctl.seq), ctl.seq)
                if ctl is not None:  # all of it, our acks too: what comes after the snapshot is passed on,
                    heard.append(ctl)  # and its seqs count as received (no false gap)
            if snap is not None and acked.get(snap.epoch, math.inf) <= snap.control_seq + 1:
                self.control.adopt(snap)
                self.control.backlog = sorted((m for m in heard if m.epoch == snap.epoch), key=lambda m: m.seq)
                return snap
        ours = sum(1 for m in heard if m.kind == "sync_ack" and m.payload.get("token") in tokens)
        raise TimeoutError(
            f"actor {self.actor_id}: no control-channel barrier within {timeout_s} s: {len(tokens)} hellos sent, "
            f"{snaps} snapshots received (newest: epoch {snap.epoch if snap else '-'}, control seq "
            f"{snap.control_seq if snap else '-'}), {ours} of our sync acks heard (lowest seq per epoch {acked}) "
            f"among {len(heard)} control messages")


async def _take(sock: zmq.asyncio.Socket, rejects: _Rejects, expect: type | None = None) -> Any:
    """The message the poller said is there (None: it was not after all, or it was malformed)."""
    try:
        return rejects.decode(await _recv_frames(sock, 0.05), expect)
    except asyncio.TimeoutError:
        return None


class WorkClient:
    """DEALER, connected. SNDHWM `hwm`; when the learner is unreachable, sends queue up to the HWM and
    then `send` waits — requests are small and re-sent on timeout, so nothing accumulates."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits, actor_id: str):
        self.sock = ctx.socket(zmq.DEALER)
        _tune(self.sock, lim)
        self.sock.setsockopt(zmq.SNDHWM, lim.hwm)
        self.sock.setsockopt(zmq.RCVHWM, lim.hwm)
        # no routing identity of its own: the learner's ROUTER names each connection, and routes to an actor
        # by the connection its last authenticated message came on (a claimed identity could be taken over)
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
        while (msg := self.rejects.decode(await _recv_frames(self.sock, timeout_s))) is None:
            pass
        return msg


class RolloutSender:
    """PUSH, connected. SNDHWM `hwm`; when the learner's queue and ours are full, sends wait."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits, actor_id: str,
                 max_unacked: int, resend_after_s: float, incarnation: str = "0"):
        self.sock = ctx.socket(zmq.PUSH)
        _tune(self.sock, lim)
        self.sock.setsockopt(zmq.SNDHWM, lim.hwm)
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

    def reject(self, rejected: dict[str, str]) -> dict[str, str]:
        """The learner refused these groups (id -> why): drop them, never re-send; returns those we held."""
        mine = {gid: why for gid, why in rejected.items() if self.unacked.pop(gid, None) is not None}
        if len(self.unacked) < self.max_unacked:
            self._room.set()
        return mine

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
