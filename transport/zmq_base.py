"""What every brorl ZeroMQ socket shares: addresses, security, socket bounds, the peer of a message, and
receiving that tolerates libzmq's spurious wake-ups and counts malformed input."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from transport import wire

log = logging.getLogger("brorl.transport")
HEADER_FRAME = wire.MAX_HEADER_BYTES + 4096  # frames of header-only messages (all but groups)
# ZMTP heartbeats (seconds): off. libzmq 4.3.5 aborts the process when its heartbeat timer (or a PING) fires
# on a connection whose peer hung up while the receiving queue was full (zeromq/libzmq#4841): a busy learner
# whose actor is killed. TCP keepalives drop a vanished host instead (`TCP_KEEPALIVE`, below).
ZMTP_HEARTBEAT = (0.0, 0.0)
# TCP keepalive (seconds): probes after 30 s of silence, 3 unanswered 10 s apart drop the connection (a host
# that vanished without closing it, a partition), and libzmq frees what it held for it
TCP_KEEPALIVE = (30, 10, 3)


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


@dataclass(frozen=True)
class Limits:
    """Socket-level bounds: `max_frame` bytes per received frame (`wire.max_frame_bytes`); ZMTP heartbeat
    every `heartbeat_s`, a peer silent for `heartbeat_timeout_s` is disconnected (0: off, the default: see
    `ZMTP_HEARTBEAT`)."""

    hwm: int = 64
    max_frame: int = -1
    heartbeat_s: float = 0.0
    heartbeat_timeout_s: float = 0.0


@dataclass(frozen=True)
class Peer:
    """Who a message came from, as the connection (not the message) says."""

    address: str = ""
    """The remote IP address ("" if unknown)."""
    user: str = ""
    """ZAP User-Id with CURVE: "actor:<name>" or "admin:<name>"; "" without CURVE."""

    @property
    def loopback(self) -> bool:
        return self.address.startswith("127.") or self.address in ("::1", "localhost")

    @classmethod
    def of(cls, frame) -> "Peer":
        def prop(name: str) -> str:
            try:
                return frame.get(name) or ""
            except (zmq.ZMQError, AttributeError):
                return ""

        return cls(prop("Peer-Address"), prop("User-Id"))


@dataclass(frozen=True)
class Nack:
    """An undecodable group whose header still named its sender, id and prompt: the learner refuses it (a
    NACK, so the sender stops re-sending it) and takes its prompt back if that sender — as the connection
    (`peer`) authenticates it — holds the prompt."""

    actor_id: str
    group_id: str
    why: str
    prompt_id: int | None
    peer: Peer


def _tune(sock: zmq.Socket, lim: Limits) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, lim.max_frame)
    idle, interval, count = TCP_KEEPALIVE
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, idle)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, interval)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, count)
    if lim.heartbeat_s > 0:
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(lim.heartbeat_s * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(lim.heartbeat_timeout_s * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TTL, int(lim.heartbeat_timeout_s * 1000))


class _Rejects:
    def __init__(self, where: str):
        self.where = where
        self.count = 0
        self._last_log = 0.0

    def decode(self, frames: list, expect: type | None = None) -> Any:
        """`wire.decode(frames)` (of type `expect`, if given), or None with the failure counted."""
        try:
            msg = wire.decode(frames)
            if expect is not None and not isinstance(msg, expect):
                raise wire.WireError(f"expected {expect.__name__}, got {type(msg).__name__}")
        except wire.WireError as e:
            self.add(e)
            return None
        return msg

    def add(self, err: Exception) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last_log > 1.0:  # at most one line a second per socket
            self._last_log = now
            log.warning("%s: rejected malformed message (%d so far): %s", self.where, self.count, err)


def _bind(sock: zmq.asyncio.Socket, host: str, port: int, key: str = "") -> int:
    """Bind to host:port (0: a free one); a port in use fails naming the setting that chose it (`key`)."""
    if port == 0:
        return sock.bind_to_random_port(f"tcp://{host}")
    try:
        sock.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as e:
        if e.errno != zmq.EADDRINUSE:
            raise
        raise OSError(e.errno, f"port {port} on {host} is in use (another brorl job on this machine?): set "
                               f"{key or 'the port'} to a free one") from e
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
