"""TCP ports and addresses: free ports for a job's sockets and rendezvous stores (outside the kernel's range for
outgoing connections and Ray's worker ports), and this machine's address on the route to another."""

from __future__ import annotations

from typing import Iterable

RAY_WORKER_PORTS = range(10002, 20000)
"""Where Ray's workers listen by default (`ray start --min-worker-port/--max-worker-port`): a port picked there
while a Ray node runs on the host can be taken by a worker before its owner binds it."""


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the source ports of outgoing connections (Linux; the IANA range elsewhere)."""
    try:
        lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return lo, hi
    except (OSError, ValueError):
        return 49152, 65535


def free_port(host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> int:
    """A TCP port free on `host` right now (for a rendezvous store or a test's sockets), outside the
    kernel's ephemeral range, Ray's default worker ports and `avoid`.

    Outside the ephemeral range because a port from it can be taken, before its owner binds it, by any
    outgoing connection's source port, including a client that retries connecting to that very port
    (a ZeroMQ socket reconnecting to a learner that is not up yet connects to itself, TCP's self-connect)
    and the learner's bind then fails with "Address already in use"."""
    import random
    import socket

    lo, hi = _ephemeral_range()
    first = RAY_WORKER_PORTS[-1] + 1
    spans = [(a, b) for a, b in ((first, lo - 1), (hi + 1, 65535)) if b - a >= 100] or [(1024, 65535)]
    avoid = set(avoid)
    for _ in range(200):
        a, b = random.choice(spans)
        port = random.randint(a, b)
        if port in avoid or port in RAY_WORKER_PORTS:  # (the last span takes in Ray's ports on a wide range)
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port on {host} outside the ephemeral range {lo}-{hi} and Ray's worker ports "
                  f"{RAY_WORKER_PORTS[0]}-{RAY_WORKER_PORTS[-1]}")


def free_ports(count: int, host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> int:
    """The first of `count` consecutive TCP ports all free on `host` right now (a job's work, rollout and
    control ports: the last two are the first + 1 and + 2 by default, and any of them may be taken), none
    of them in `avoid`."""
    import socket

    avoid = set(avoid)
    for _ in range(100):
        base, held = free_port(host, avoid), []
        if base + count - 1 >= _ephemeral_range()[0] > base or base + count - 1 > 65535:
            continue  # the run would cross into the kernel's range for outgoing ports, or past the last port
        if avoid & set(range(base, base + count)):
            continue
        try:
            for p in range(base, base + count):
                held.append(s := socket.socket())
                s.bind((host, p))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise OSError(f"no {count} consecutive free ports on {host}")


def route_to(host: str, port: int) -> str:
    """This machine's own address on the route to `host` (no packet is sent)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]
