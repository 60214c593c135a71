"""The control channel: the learner's XPUB and each actor's SUB. State-based (every message carries a seq
within a learner epoch; a joining or lagging actor resynchronises from a `Snapshot` over the work socket),
and bounded per connection on the learner's side (`ControlPublisher`)."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any

import zmq
import zmq.asyncio

from transport import security, wire
from transport.zmq_base import Endpoints, Limits, Peer, Security, _bind, _recv_frames, _Rejects, _tune

log = logging.getLogger("brorl.transport")
SUBSCRIPTION_FRAME = 1024  # the largest frame the control socket takes: a subscription needs 1 byte, CURVE's
# handshake commands a few hundred (they are frames to libzmq too)
SUBSCRIPTION_HWM = 8  # subscription frames waiting per connection, at most
MAX_SUBSCRIPTIONS = 32  # per peer and minute; an actor sends one per connection (re-sent on a reconnect)


class ControlPublisher:
    """XPUB, bound. SNDHWM `hwm` per subscriber; a subscriber that falls that far behind loses messages
    (PUB semantics), which is why control is state-based: every message carries a seq, and a joining or
    lagging actor resynchronises from a `Snapshot` (`ActorSockets.sync`, `ActorSockets.resync_if_lost`).

    Bounded per connection: libzmq keeps every subscription a peer sends (in a trie, PUB or XPUB alike),
    so in manual mode `drain` reads them all, gives a connection that subscribes the one subscription
    actors need (everything) and counts them per peer (CURVE key, else address). Frames above
    SUBSCRIPTION_FRAME bytes disconnect their sender; at most SUBSCRIPTION_HWM of them wait per connection;
    a peer with more than MAX_SUBSCRIPTIONS in a minute (an actor sends one per connection) is refused
    from then on (its key, with CURVE) and the socket is rebuilt on the same port, which frees what libzmq
    held for it; the actors reconnect by themselves and resynchronise from a snapshot. Not bounded: the
    first burst — libzmq takes in (and stores) what streams in while the socket is serviced, before
    `drain` can count it."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits, auth=None):
        self.ctx, self.sec, self.lim, self.auth, self.host = ctx, sec, lim, auth, ep.host
        self.sock = self._open()
        self.port = _bind(self.sock, ep.host, ep.control_port)
        self.subscriptions: dict[str, list[float]] = {}  # peer -> times of its subscriptions, last minute
        self.rebuilds = 0
        self.banned: list[str] = []
        self.seq = 0
        self.epoch = uuid.uuid4().hex[:12]  # this learner process; seq counts within it
        self.version = 0
        self.verifiers: dict[str, str] = {}
        self.paused = False
        self.weights: dict[str, Any] = {}

    def _open(self) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(zmq.XPUB)
        _tune(sock, dataclasses.replace(self.lim, max_frame=SUBSCRIPTION_FRAME))
        sock.setsockopt(zmq.XPUB_MANUAL, 1)
        sock.setsockopt(zmq.SNDHWM, self.lim.hwm)
        sock.setsockopt(zmq.RCVHWM, SUBSCRIPTION_HWM)
        if self.sec.curve:
            security.make_server(sock, self.sec.keys_dir)
        self._sync = zmq.Socket.shadow(sock.underlying)  # the same socket, read without the event loop
        return sock

    def drain(self) -> None:
        """Read what subscribers sent (without waiting): each connection that subscribes gets everything,
        once; a peer over MAX_SUBSCRIPTIONS a minute is refused. `publish` calls it first (a new
        subscriber hears that message), and the learner every second."""
        while True:
            try:
                frame = self._sync.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if frame.bytes[:1] != b"\x01":
                continue  # an unsubscription: a connection's subscription goes with it
            peer = Peer.of(frame)
            who = peer.user or peer.address or "?"
            now = time.monotonic()
            times = [t for t in self.subscriptions.get(who, []) if now - t < 60.0] + [now]
            self.subscriptions[who] = times
            if len(times) > MAX_SUBSCRIPTIONS:
                self._refuse(who)
                return
            self._sync.setsockopt(zmq.SUBSCRIBE, b"")  # manual mode: for the connection it came from

    def _refuse(self, who: str) -> None:
        log.error("control socket: %s sent more than %d subscriptions in a minute; refused%s, socket rebuilt",
                  who, MAX_SUBSCRIPTIONS, " from now on (its key)" if self.auth is not None and who.startswith(("actor:", "admin:")) else "")
        if self.auth is not None:
            self.auth.ban(who)
        self.banned.append(who)
        self.sock.close(linger=0)
        deadline = time.monotonic() + 5.0
        while True:  # the old socket's port is freed by libzmq's I/O thread a moment later
            self.sock = self._open()
            try:
                _bind(self.sock, self.host, self.port)
                break
            except zmq.ZMQError:
                self.sock.close(linger=0)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.subscriptions = {}
        self.rebuilds += 1

    def snapshot(self, hello_needed: bool = False) -> wire.Snapshot:
        return wire.Snapshot(self.seq, self.version, dict(self.verifiers), self.paused, dict(self.weights), self.epoch,
                             hello_needed)

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
        msg = wire.Control(self.seq, kind, payload, self.epoch)
        await self.sock.send_multipart(wire.encode(msg))
        return msg


class ControlSubscriber:
    """SUB, connected, subscribed to everything. RCVHWM `hwm`. Messages with seq <= the last applied
    one (replays, or anything older than the start-up snapshot) are dropped — within one learner epoch. A
    message of another epoch (the learner restarted; seq starts again) is passed on and starts counting
    afresh; the caller sees the new `epoch` on it and resynchronises."""

    def __init__(self, ctx: zmq.asyncio.Context, ep: Endpoints, sec: Security, lim: Limits):
        self.sock = ctx.socket(zmq.SUB)
        _tune(self.sock, lim)
        self.sock.setsockopt(zmq.RCVHWM, lim.hwm)
        if sec.curve:
            security.make_client(self.sock, sec.keys_dir, sec.client_name)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(ep.url(ep.control_port))
        self.last_seq = 0
        self.epoch = ""  # the learner epoch of the last applied message (set by the start-up barrier)
        self.rejects = _Rejects("control SUB")
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
        while True:
            if self._fresh(msg := self.rejects.decode(await _recv_frames(self.sock, timeout_s), wire.Control)):
                return msg
