"""Real ZeroMQ sockets on loopback: barrier, credits, exactly-once with reconnect, CURVE, fuzzing."""

import asyncio
import contextlib
import sys
from pathlib import Path

import pytest

from tests.support.transport_helpers import make_group
from transport import security, wire
from transport.zmq_transport import ActorSockets, Endpoints, LearnerSockets, Security

ROOT = Path(__file__).resolve().parents[2]
EP = Endpoints("127.0.0.1", 0, 0, 0)


async def serve_work(ls: LearnerSockets, acks: bool = True, grants: list | None = None):
    """A minimal learner loop: answer hellos, grant work requests, acknowledge groups."""
    async def work():
        n = 0
        while True:
            ident, msg = await ls.work.recv()
            if isinstance(msg, wire.Hello):
                await ls.answer_hello(ident, msg)
            elif isinstance(msg, wire.WorkRequest):
                items = [wire.PromptItem(n + i, f"{n + i}+1=", str(n + i + 1), "synthetic") for i in range(msg.credits)]
                n += msg.credits
                if grants is not None:
                    grants.append((msg.actor_id, msg.credits))
                await ls.work.send(ident, wire.WorkAssignment(items))
    return asyncio.create_task(work(), name="test-work-server")


async def test_barrier_snapshot_and_control_order():
    ls = LearnerSockets(EP)
    server = await serve_work(ls)
    try:
        await ls.control.publish("version", version=3)  # before the actor exists: must come via snapshot
        await ls.control.publish("swap", name="math", path="verifiers.math")
        actor = ActorSockets(ls.endpoints, "a0")
        snap = await actor.sync(version=-1, timeout_s=10)
        assert snap.version == 3 and snap.verifiers == {"math": "verifiers.math"}
        for v in (4, 5, 6):
            await ls.control.publish("version", version=v)
        got = []
        while len(got) < 3:
            msg = await actor.control.recv(timeout_s=5)
            if msg.kind == "version":
                got.append(msg.payload["version"])
        assert got == [4, 5, 6]  # nothing after the barrier is missed, nothing before is replayed
        await actor.work.send(wire.WorkRequest("a0", 3, 3))
        assign = await actor.work.recv(timeout_s=5)
        assert isinstance(assign, wire.WorkAssignment) and len(assign.items) == 3  # credits respected
        actor.close()
    finally:
        server.cancel()
        ls.close()


async def test_barrier_holds_with_a_learner_slower_than_the_hello_repeat():
    """Every hello is answered 1 s late (longer than the actor waits before repeating it): the barrier
    still completes, on whichever of its tokens comes back, with the newest snapshot."""
    ls = LearnerSockets(EP)
    answered = []

    async def slow_learner():
        async def answer(ident, msg):
            await asyncio.sleep(1.0)
            await ls.answer_hello(ident, msg)
            answered.append(msg.sync_token)
        while True:
            ident, msg = await ls.work.recv()
            if isinstance(msg, wire.Hello):
                asyncio.create_task(answer(ident, msg))
    server = asyncio.create_task(slow_learner())
    try:
        await ls.control.publish("version", version=2)
        actor = ActorSockets(ls.endpoints, "a0")
        snap = await actor.sync(version=-1, timeout_s=10)
        assert snap.version == 2 and len(answered) >= 1
        assert snap.control_seq >= 1 and actor.control.last_seq == snap.control_seq
        actor.close()
    finally:
        server.cancel()
        ls.close()


async def test_control_heard_during_the_barrier_after_its_snapshot_is_delivered():
    """The learner's sync_ack and a version message reach the actor before the snapshot does (the
    snapshot names the state before both): the version message is not lost in the barrier — the actor's
    first control message after it is that version."""
    ls = LearnerSockets(EP)
    actor = ActorSockets(ls.endpoints, "a0")
    try:
        await asyncio.sleep(1.0)  # the SUB subscription has reached the PUB (no slow joiner)

        async def out_of_order_learner():
            ident, hello = await ls.work.recv()
            before = ls.control.snapshot()
            await ls.control.publish("sync_ack", token=hello.sync_token)
            await ls.control.publish("version", version=7)
            await asyncio.sleep(0.3)
            await ls.work.send(ident, before)
        server = asyncio.create_task(out_of_order_learner())
        snap = await actor.sync(version=-1, timeout_s=10)
        assert snap.version == 0
        while (msg := await actor.control.recv(timeout_s=2)).kind == "sync_ack":
            pass  # barrier acks are passed on too (the actor ignores them)
        assert (msg.kind, msg.payload) == ("version", {"version": 7}) and actor.control.gaps == 0
        await server
    finally:
        actor.close()
        ls.close()


async def test_groups_exactly_once_across_reconnect():
    ls = LearnerSockets(EP)
    received = []
    try:
        a = ActorSockets(ls.endpoints, "a1", resend_after_s=0.0)
        for _ in range(20):
            await a.rollouts.send(make_group(a.rollouts.next_group_id()))
        for _ in range(20):
            received.append((await asyncio.wait_for(ls.rollouts.recv(), 5)).group_id)
        # the learner got them, but its acks were lost: the actor (same process) reconnects with its
        # unacked buffer
        seq, unacked = a.rollouts.seq, a.rollouts.unacked
        a.close()
        b = ActorSockets(ls.endpoints, "a1", resend_after_s=0.0, incarnation=a.incarnation)
        b.rollouts.seq, b.rollouts.unacked = seq, unacked
        assert await b.rollouts.resend_stale() == 20
        for _ in range(5):
            await b.rollouts.send(make_group(b.rollouts.next_group_id()))
        for _ in range(5):
            received.append((await asyncio.wait_for(ls.rollouts.recv(), 5)).group_id)
        assert received == [f"a1:{a.incarnation}:{i}" for i in range(25)]  # each exactly once, in order
        assert ls.rollouts.duplicates == 20
        b.rollouts.ack(received)
        assert not b.rollouts.unacked
        b.close()
        # a restarted process under the same actor id numbers its groups from 0 again: nothing of it is
        # taken for a duplicate of its predecessor's
        c = ActorSockets(ls.endpoints, "a1", resend_after_s=0.0)
        assert c.incarnation != a.incarnation
        for _ in range(3):
            await c.rollouts.send(make_group(c.rollouts.next_group_id()))
        got = [(await asyncio.wait_for(ls.rollouts.recv(), 5)).group_id for _ in range(3)]
        assert got == [f"a1:{c.incarnation}:{i}" for i in range(3)] and ls.rollouts.duplicates == 20
        c.close()
    finally:
        ls.close()


async def test_sender_backpressure_bounds_unacked():
    ls = LearnerSockets(EP)
    try:
        a = ActorSockets(ls.endpoints, "a2", max_unacked=3)
        for _ in range(3):
            await a.rollouts.send(make_group(a.rollouts.next_group_id()))
        blocked = asyncio.create_task(a.rollouts.send(make_group(a.rollouts.next_group_id())))
        await asyncio.sleep(0.2)
        assert not blocked.done() and len(a.rollouts.unacked) == 3
        a.rollouts.ack([f"{a.rollouts.prefix}:0"])
        await asyncio.wait_for(blocked, 2)
        assert len(a.rollouts.unacked) == 3
        a.close()
    finally:
        ls.close()


async def test_curve_admits_listed_actor_and_rejects_others(tmp_path):
    keys = security.generate(tmp_path / "keys", ["good"])
    security.generate(tmp_path / "other", ["intruder"])  # a key pair the learner does not list
    ls = LearnerSockets(EP, Security(curve=True, keys_dir=keys))
    peers = []
    try:
        good = ActorSockets(ls.endpoints, "good", Security(True, keys))
        peers.append(good)
        await asyncio.wait_for(good.rollouts.send(make_group("good:0")), 10)
        assert (await asyncio.wait_for(ls.rollouts.recv(), 10)).group_id == "good:0"
        # an intruder with its own keys (but the learner's public key) and a plaintext peer
        (tmp_path / "other" / "learner.key").unlink()
        (tmp_path / "other" / "learner.key").write_bytes((keys / "learner.key").read_bytes())
        bad = ActorSockets(ls.endpoints, "intruder", Security(True, tmp_path / "other"))
        plain = ActorSockets(ls.endpoints, "plain")
        peers += [bad, plain]
        for s, gid in ((bad, "intruder:0"), (plain, "plain:0")):
            # their PUSH sockets may have no pipe at all while the handshake keeps failing: then the send
            # waits (a CI run hung here for 15 minutes); either way nothing may reach the learner
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(s.rollouts.send(make_group(gid)), 5.0)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ls.rollouts.recv(), 2.0)
        assert ls.rollouts.rejects.count == 0  # their frames never reached application code
        await asyncio.wait_for(good.rollouts.send(make_group("good:1")), 10)
        assert (await asyncio.wait_for(ls.rollouts.recv(), 10)).group_id == "good:1"
    finally:  # whatever failed: a context left to the garbage collector can block a later test in its term
        for p in peers:
            p.close()
        ls.close()


async def test_curve_multi_megabyte_groups_arrive_intact(tmp_path):
    """Regression: right after the CURVE handshake libzmq can report POLLIN and then answer EAGAIN; that
    used to escape `recv` and stall the stream of multi-MB groups."""
    keys = security.generate(tmp_path / "keys", ["big"])
    ls = LearnerSockets(EP, Security(curve=True, keys_dir=keys))
    try:
        a = ActorSockets(ls.endpoints, "big", Security(True, keys))
        sent = [make_group(f"big:{i}", n=512, length=1024, seed=i) for i in range(5)]  # 4 MiB each
        for g in sent:
            await a.rollouts.send(g)
        for g in sent:
            got = await asyncio.wait_for(ls.rollouts.recv(), 20)
            assert got.group_id == g.group_id
            assert (got.tokens == g.tokens).all() and (got.logprobs == g.logprobs).all()
        a.close()
    finally:
        ls.close()


@pytest.mark.slow
async def test_fuzzing_every_bound_socket_while_valid_traffic_flows():
    ls = LearnerSockets(EP, hwm=100_000)
    grants = []
    server = await serve_work(ls, grants=grants)
    count = 10_000
    try:
        fuzz = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.fuzz_peer", ls.endpoints.url(ls.endpoints.work_port),
            ls.endpoints.url(ls.endpoints.rollout_port), str(count), cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        actor = ActorSockets(ls.endpoints, "valid")
        valid_ids = []

        async def send_valid():
            for i in range(200):
                g = make_group(actor.rollouts.next_group_id(), seed=i)
                valid_ids.append(g.group_id)
                await actor.rollouts.send(g)
                actor.rollouts.ack([g.group_id])
                await actor.work.send(wire.WorkRequest("valid", 1, 0))
                await asyncio.sleep(0.005)

        sender = asyncio.create_task(send_valid())
        got = []

        async def drain():
            while True:
                g = await ls.rollouts.recv()
                if g.actor_id == "valid":
                    got.append(g.group_id)

        drainer = asyncio.create_task(drain())
        out, err = await asyncio.wait_for(fuzz.communicate(), 120)
        assert fuzz.returncode == 0, err.decode()[-2000:]
        await asyncio.wait_for(sender, 60)
        for _ in range(200):
            if len(got) == 200 and ls.rollouts.rejects.count + ls.work.rejects.count > 0:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # let the fuzzer's tail drain
        drainer.cancel()
        assert sorted(got, key=lambda s: int(s.rsplit(":", 1)[1])) == valid_ids  # each valid group exactly once
        assert len(set(got)) == len(got) == 200
        assert ls.rollouts.rejects.count > 0.5 * count  # mutated frames were counted, not accepted
        assert ls.work.rejects.count > 0.5 * count
        assert sum(c for a, c in grants if a == "valid") == 200  # valid requests all served
        actor.close()
    finally:
        server.cancel()
        ls.close()


async def test_zmtp_heartbeats_drop_a_peer_that_stopped_answering():
    """With ZMTP heartbeats configured (off by default: see the test above), a peer whose process is frozen
    (no FIN, no answer) is disconnected once its heartbeat timeout passes; one that answers stays connected."""
    import signal

    import zmq
    from zmq.utils.monitor import recv_monitor_message

    ls = LearnerSockets(EP, heartbeat=(0.2, 1.0))
    monitor = ls.work.sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    peer_code = ("import sys, time, zmq\nc = zmq.Context()\ns = c.socket(zmq.DEALER)\n"
                 "s.connect(sys.argv[1])\ns.send(b'x')\nprint('up', flush=True)\ntime.sleep(600)\n")
    peer = await asyncio.create_subprocess_exec(sys.executable, "-c", peer_code, ls.endpoints.url(ls.endpoints.work_port),
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert (await asyncio.wait_for(peer.stdout.readline(), 30)).strip() == b"up"

        async def next_event(timeout_s):
            return (await asyncio.wait_for(recv_monitor_message(monitor), timeout_s))["event"]

        assert await next_event(10) == zmq.EVENT_ACCEPTED
        with pytest.raises(asyncio.TimeoutError):  # answering PINGs: kept for longer than the timeout
            await next_event(2.5)
        peer.send_signal(signal.SIGSTOP)
        assert await next_event(5) == zmq.EVENT_DISCONNECTED
    finally:
        peer.kill()
        await peer.wait()
        ls.work.sock.disable_monitor()
        monitor.close(linger=0)
        ls.close()


_BUSY_LEARNER = """
import os, subprocess, sys, time
import zmq
from transport.zmq_transport import ActorSockets, Endpoints, LearnerSockets
ls = LearnerSockets(Endpoints("127.0.0.1", 0, 0, 0), hwm=2)
actor = ActorSockets(ls.endpoints, "a0")
socks = [ls.work.sock, ls.rollouts.sock, ls.control.sock, actor.work.sock, actor.rollouts.sock, actor.control.sock]
print([(s.getsockopt(zmq.HEARTBEAT_IVL), s.getsockopt(zmq.TCP_KEEPALIVE)) for s in socks], flush=True)
peer = ("import os, sys, time, zmq\\nc = zmq.Context()\\np = c.socket(zmq.PUSH)\\np.setsockopt(zmq.SNDHWM, 1000)\\n"
        "p.connect(sys.argv[1])\\n[p.send(b'x' * 100000) for _ in range(200)]\\ntime.sleep(1.0)\\n"
        "print('sent', flush=True)\\nos.kill(os.getpid(), 9)\\n")
rx = zmq.Socket.shadow(ls.rollouts.sock.underlying)
for _ in range(2):
    p = subprocess.Popen([sys.executable, "-c", peer, ls.endpoints.url(ls.endpoints.rollout_port)], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"sent"
    p.wait()
    time.sleep(1.0)  # the peer is gone while the learner's queue from it is full
    n = 0
    while rx.poll(200):
        rx.recv()
        n += 1
    print("drained", n, flush=True)
actor.close()
ls.close()
print("alive", flush=True)
"""


def test_a_learner_busy_when_its_actor_dies_is_not_aborted_by_libzmq():
    """An actor killed while the learner's queue from it is full (a learner busy training): with ZMTP heartbeats
    on, libzmq 4.3.5 aborts the learner's process at the next heartbeat ("Assertion failed: !_io_error",
    zeromq/libzmq#4841). The learner's and the actor's sockets run without them (TCP keepalives instead) and
    the learner outlives two such deaths, draining what each sent."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _BUSY_LEARNER], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    assert lines[0] == str([(0, 1)] * 6), lines[0]  # no heartbeat timer, keepalive on, every socket
    assert [ln.split()[0] for ln in lines[1:]] == ["drained"] * 2 + ["alive"], lines
    assert all(int(ln.split()[1]) > 2 for ln in lines[1:3]), lines  # more than the high-water mark: it was full


async def test_lost_control_messages_are_noticed_and_answered_by_a_new_snapshot():
    """Messages a subscriber never got (it fell a high-water mark behind, or its connection was re-made) show
    as a seq gap: counted, and `resync_if_lost` says hello, which brings the learner's current state. Other
    actors' barrier acks are no gap."""
    ls = LearnerSockets(EP)
    server = await serve_work(ls)
    a = ActorSockets(ls.endpoints, "a0")
    b = ActorSockets(ls.endpoints, "b0")
    try:
        await a.sync(version=-1, timeout_s=10)
        await b.sync(version=-1, timeout_s=10)  # its hellos' acks reach a0 too

        async def next_version():
            while (msg := await a.control.recv(timeout_s=5)).kind != "version":
                pass
            return msg.payload["version"]

        await ls.control.publish("version", version=1)
        assert await next_version() == 1 and a.control.gaps == 0
        assert await a.resync_if_lost(1) is False
        ls.control.seq += 3  # three messages a0 never receives
        await ls.control.publish("version", version=2)
        assert await next_version() == 2 and a.control.gaps == 1
        assert await a.resync_if_lost(2) is True
        snap = await a.work.recv(timeout_s=5)
        assert isinstance(snap, wire.Snapshot) and snap.version == 2 and snap.control_seq == ls.control.seq - 1
        assert await a.resync_if_lost(2) is False  # answered once
    finally:
        a.close()
        b.close()
        server.cancel()
        ls.close()


async def test_barrier_against_a_learner_that_never_answers_ends_at_its_deadline():
    """No learner: the hellos fill the send queue (HWM 1) and `send` would wait for ever; the barrier still
    ends at its deadline, with an error that says what is missing (a CI run once hung here for an hour)."""
    from transport.ports import free_ports

    port = free_ports(3)
    actor = ActorSockets(Endpoints("127.0.0.1", port, port + 1, port + 2), "a0", hwm=1)
    try:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError, match="no control-channel barrier within 2"):
            await asyncio.wait_for(actor.sync(0, timeout_s=2.0), 30)
        assert asyncio.get_running_loop().time() - t0 < 5
    finally:
        actor.close()


def test_picked_ports_are_outside_the_kernels_ephemeral_range_and_rays_workers_and_avoid_the_given_ones():
    """A port from the ephemeral range can be taken by an outgoing connection's source port before its owner
    binds it (even by a client reconnecting to that very port: TCP self-connect); one among Ray's worker ports,
    by a Ray worker on the same host (the learner's rendezvous store under the Ray launcher)."""
    from transport.ports import RAY_WORKER_PORTS, _ephemeral_range, free_port, free_ports

    lo, hi = _ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert not [p for p in ports if lo <= p <= hi or p in RAY_WORKER_PORTS]
    base = free_ports(3)
    assert not [p for p in range(base, base + 3) if lo <= p <= hi or p in RAY_WORKER_PORTS]
    assert ports[0] not in {free_port(avoid=[ports[0]]) for _ in range(200)}


def test_a_second_learner_on_taken_ports_fails_naming_the_setting():
    """Two jobs on one machine with the default ports: the second learner's bind names the key to change,
    not just libzmq's "Address already in use"."""
    from transport.ports import free_ports

    base = free_ports(3)
    ep = Endpoints("127.0.0.1", base, base + 1, base + 2)
    first = LearnerSockets(ep)
    try:
        with pytest.raises(OSError, match=f"port {base} on 127.0.0.1 is in use .*set transport.work_port"):
            LearnerSockets(ep)
    finally:
        first.close()
