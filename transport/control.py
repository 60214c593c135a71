"""The control channel: the learner's ROUTER and each actor's DEALER, used as a publisher and its subscribers.
State-based (every message carries a seq within a learner epoch; a joining or lagging actor resynchronises from
a `Snapshot` over the work socket), and bounded per connection on the learner's side (`ControlPublisher`).

Why not PUB/SUB: libzmq's PUB and XPUB store every subscription a peer sends (in a trie, kept until the
connection closes, and in XPUB's manual mode queued for the application besides) as they arrive, before
the application can look at them: one authenticated actor sending thousands of distinct subscriptions grew the
learner by hundreds of MiB. A ROUTER stores nothing a peer sends beyond its receive queue (`SUBSCRIPTION_HWM`
messages of at most `SUBSCRIPTION_FRAME` bytes per connection), and the learner keeps one entry per route."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
from typing import Any

import zmq
import zmq.asyncio

from transport import security, wire
from transport.zmq_base import Endpoints, Limits, Peer, Security, _bind, _recv_frames, _Rejects, _tune

log = logging.getLogger("brorl.transport")
SUBSCRIBE = b"\x01"  # what a subscriber sends: "send me the control messages on this connection"
SUBSCRIPTION_FRAME = 1024  # the largest frame the control socket takes: a subscription needs 1 byte, CURVE's
# handshake commands a few hundred (they are frames to libzmq too)
SUBSCRIPTION_HWM = 8  # messages waiting per connection on the learner's side, at most
REFRESH_S = 2.0  # a subscriber says SUBSCRIBE this often (a reconnected one is heard again within it)
ROUTE_TTL_S = 30.0  # a route not refreshed for this long is dropped (its connection is gone)
ROUTES_PER_KEY = 4  # live routes per CURVE key (an actor has one; a reconnect leaves an old one to expire)
MAX_ROUTES = 4096  # live routes in all (without CURVE, peers are told apart by address only)
MAX_FRAMES = 600  # per peer and minute (an honest one sends ~30, more while it says hello at start-up)


class ControlPublisher:
    """ROUTER, bound, that publishes: each message goes to every live route (a connection that sent
    SUBSCRIBE in the last ROUTE_TTL_S). SNDHWM `hwm` per route; a subscriber that falls that far behind loses
    messages (PUB semantics), which is why control is state-based: every message carries a seq, and a
    joining or lagging actor resynchronises from a `Snapshot` (`ActorSockets.sync`, `ActorSockets.resync_if_lost`).

    Bounded per connection: frames above SUBSCRIPTION_FRAME bytes disconnect their sender; at most
    SUBSCRIPTION_HWM messages wait per connection (libzmq stops reading that connection meanwhile); `drain`
    reads them all (at `publish` and every second), keeps at most ROUTES_PER_KEY routes per key and MAX_ROUTES
    in all (the oldest go first), and a peer sending more than MAX_FRAMES a minute is refused from then on (its
    key, with CURVE) and its routes dropped."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits, auth=None):
        self.auth = auth
        self.sock = ctx.socket(zmq.ROUTER)
        _tune(self.sock, dataclasses.replace(lim, max_frame=SUBSCRIPTION_FRAME))
        self.sock.setsockopt(zmq.SNDHWM, lim.hwm)
        self.sock.setsockopt(zmq.RCVHWM, SUBSCRIPTION_HWM)
        if sec.curve:
            security.make_server(self.sock, sec.keys_dir)
        self._sync = zmq.Socket.shadow(self.sock.underlying)  # the same socket, used without the event loop
        self.port = _bind(self.sock, ep.host, ep.control_port, "transport.control_port")
        self.routes: dict[bytes, tuple[str, float]] = {}  # routing id -> (peer, time of its last SUBSCRIBE)
        self.frames: dict[str, list[float]] = {}  # peer -> times of its frames, last minute
        self.banned: list[str] = []
        self.seq = 0
        self.epoch = uuid.uuid4().hex[:12]  # this learner process; seq counts within it
        self.version = 0
        self.verifiers: dict[str, str] = {}
        self.paused = False
        self.weights: dict[str, Any] = {}
        self.computing = 0  # the step the learner is computing (kind "compute"), 0 while it waits

    def drain(self) -> None:
        """Read what subscribers sent (without waiting) and keep the routes: each connection that says
        SUBSCRIBE gets every message from then on, until it is silent for ROUTE_TTL_S."""
        now = time.monotonic()
        while True:
            try:
                rid, *frames = self._sync.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if not frames:
                continue
            peer = Peer.of(frames[0])
            who = peer.user or peer.address or "?"
            if who in self.banned:
                continue
            times = [t for t in self.frames.get(who, []) if now - t < 60.0] + [now]
            self.frames[who] = times
            if len(times) > MAX_FRAMES:
                self._refuse(who)
            elif len(frames) == 1 and frames[0].bytes == SUBSCRIBE:
                self.routes.pop(rid.bytes, None)
                self.routes[rid.bytes] = (who, now)  # newest last: eviction takes from the front
                mine = [r for r, (w, _) in self.routes.items() if w == who]
                for r in mine[:-ROUTES_PER_KEY] if peer.user else ():
                    del self.routes[r]
        stale = [r for r, (_, t) in self.routes.items() if now - t > ROUTE_TTL_S]
        for r in stale + list(self.routes)[:max(0, len(self.routes) - len(stale) - MAX_ROUTES)]:
            self.routes.pop(r, None)
        if len(self.frames) > MAX_ROUTES:
            self.frames = {w: t for w, t in self.frames.items() if now - t[-1] < 60.0}

    def _refuse(self, who: str) -> None:
        log.error("control socket: %s sent more than %d messages in a minute; refused%s", who, MAX_FRAMES,
                  " from now on (its key)" if self.auth is not None and who.startswith(("actor:", "admin:")) else "")
        if self.auth is not None:
            self.auth.ban(who)
        self.banned.append(who)
        self.frames.pop(who, None)
        for r in [r for r, (w, _) in self.routes.items() if w == who]:
            del self.routes[r]

    def snapshot(self, hello_needed: bool = False) -> wire.Snapshot:
        return wire.Snapshot(self.seq, self.version, dict(self.verifiers), self.paused, dict(self.weights), self.epoch,
                             hello_needed, self.computing)

    async def publish(self, kind: str, **payload: Any) -> wire.Control:
        self.drain()
        self.seq += 1
        if kind == "version":
            self.version = int(payload["version"])
        elif kind == "swap":
            self.verifiers[payload["name"]] = payload["path"]
        elif kind in ("pause", "resume"):
            self.paused = kind == "pause"
        elif kind == "weights":
            self.weights = dict(payload)
        elif kind == "compute":
            self.computing = int(payload["step"])
        msg = wire.Control(self.seq, kind, payload, self.epoch)
        frames = wire.encode(msg)
        for rid in list(self.routes):
            try:  # a full queue or a route gone: dropped by the ROUTER (PUB semantics); never waits
                self._sync.send_multipart([rid, *frames], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        return msg


class ControlSubscriber:
    """DEALER, connected; says SUBSCRIBE when it first waits for a message and every REFRESH_S while it
    waits (the learner drops a route silent for ROUTE_TTL_S; after a reconnect the new connection is heard
    within REFRESH_S, and what was published meanwhile shows as a gap). RCVHWM `hwm`. Messages with seq <= the last applied
    one (replays, or anything older than the start-up snapshot) are dropped — within one learner epoch. A
    message of another epoch (the learner restarted; seq starts again) is passed on and starts counting
    afresh; the caller sees the new `epoch` on it and resynchronises."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits):
        self.sock = ctx.socket(zmq.DEALER)
        _tune(self.sock, lim)
        self.sock.setsockopt(zmq.RCVHWM, lim.hwm)
        self.sock.setsockopt(zmq.SNDHWM, 2)  # SUBSCRIBEs waiting for a connection: one is enough
        if sec.curve:
            security.make_client(self.sock, sec.keys_dir, sec.client_name)
        self.sock.connect(ep.url(ep.control_port))
        self.subscribed = -math.inf  # when SUBSCRIBE was last sent
        self.last_seq = 0
        self.epoch = ""  # the learner epoch of the last applied message (set by the start-up barrier)
        self.rejects = _Rejects("control channel")
        self.backlog: list[wire.Control] = []
        self.gaps = 0  # times messages were found missing (see `_fresh`)

    def adopt(self, snap: wire.Snapshot) -> None:
        """A snapshot (through the work socket) is the control state up to its seq, of its epoch."""
        self.last_seq = max(self.last_seq, snap.control_seq) if snap.epoch == self.epoch else snap.control_seq
        self.epoch = snap.epoch

    def _fresh(self, msg: wire.Control | None) -> bool:
        """Is `msg` one to apply (and if so, count it as applied)? A seq beyond the next one means messages
        were lost (this subscriber fell `hwm` behind, or its connection was dropped and re-made): counted in
        `gaps`, for the caller to resynchronise from a snapshot."""
        if msg is None:
            return False
        if msg.epoch != self.epoch:  # a new learner process: its seq starts again
            if msg.kind == "sync_ack":
                return True  # an answer to a hello of ours or another actor's: the caller checks the token
            self.epoch, self.last_seq = msg.epoch, msg.seq
            return True
        if msg.seq <= self.last_seq:
            return msg.kind == "sync_ack"
        if self.last_seq and msg.seq > self.last_seq + 1:
            self.gaps += 1
            log.warning("control channel: messages %d..%d of learner epoch %s were lost", self.last_seq + 1,
                        msg.seq - 1, self.epoch)
        self.last_seq = msg.seq
        return True

    async def recv(self, timeout_s: float | None = None) -> wire.Control:
        while self.backlog:  # heard during the start-up barrier
            if self._fresh(msg := self.backlog.pop(0)):
                return msg
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while True:
            await self.refresh()
            wait = min(REFRESH_S, deadline - time.monotonic())
            try:
                frames = await _recv_frames(self.sock, max(0.0, wait))
            except asyncio.TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                continue
            if self._fresh(msg := self.rejects.decode(frames, wire.Control)):
                return msg

    async def refresh(self) -> None:
        """Say SUBSCRIBE if REFRESH_S has passed since the last time (never waits: with no connection yet,
        libzmq keeps it until there is one)."""
        if time.monotonic() - self.subscribed < REFRESH_S:
            return
        self.subscribed = time.monotonic()
        try:
            await self.sock.send(SUBSCRIBE, zmq.NOBLOCK)
        except zmq.Again:
            pass
