"""An actor key in hostile hands, or an honest actor gone wrong, against the real learner with CURVE on and
an honest actor training beside it (issue 32, findings 8 and 10-14). Each test asserts what the attack did
not get and that the job still trains to its last step.

The attacker holds an ordinary actor key ("evil"): it may connect, say hello and send what it likes as
itself. It must not be able to act as another actor — take over its connection, return its prompts, NACK
it, poison its duplicate table, receive its acks —, hoard prompts by claiming weights the learner never
published, stall weight groups, or grow the learner's memory through the control socket."""

import asyncio
import json
import time

import numpy as np
import psutil
import zmq
import zmq.asyncio

from learner.metrics import read
from learner.service import LearnerService
from tests.integration.test_learner_service import B, N, job, until_alive
from tests.support.fake_actor import FakeActor
from transport import security, wire
from transport.security import generate
from transport.zmq_transport import ActorSockets, Security


def curve_job(model_dir, run_dir, steps=4, **over):
    keys = generate(run_dir / "keys", ["a0", "evil", "z0"])
    cfg = job(model_dir, run_dir, steps=steps, **{"transport.curve": True, "transport.keys_dir": str(keys), **over})
    return cfg, keys


async def run(cfg, svc, honest, attack, timeout_s=120.0):
    """The learner and the honest actors; `attack()` runs beside them; returns once the job finished."""
    service = asyncio.create_task(svc.run())
    attacker = None
    try:
        for a in honest:
            await a.start()
        attacker = asyncio.create_task(attack())
        assert await asyncio.wait_for(service, timeout_s) == 0  # the job trained to its last step
        if attacker.done() and attacker.exception() is not None:
            raise attacker.exception()
    finally:
        service.cancel()
        if attacker is not None:
            attacker.cancel()
            await asyncio.gather(attacker, return_exceptions=True)
        for a in honest:
            await a.kill()
        await asyncio.gather(service, return_exceptions=True)


def ledger(run_dir):
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]


def counted(svc, rows, reason):
    return sum(r.get(f"rejected_{reason}", 0) for r in rows) + svc.validator.counts[reason]


async def test_a_connection_claiming_an_actors_routing_identity_takes_nothing_over(tiny_model_dir, tmp_path):
    """Finding 10: a connection with the attacker's key and the ZMQ routing identity "a0" used to take a0's
    connection over (ROUTER_HANDOVER): it received a0's acks, a0 was evicted and training stopped."""
    cfg, keys = curve_job(tiny_model_dir, tmp_path, steps=6)
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    a0 = FakeActor(ep, "a0", n_samples=N, seed=3, sec=Security(True, keys, "a0"))
    got: list = []

    async def attack():
        ctx = zmq.asyncio.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IDENTITY, b"a0")  # a0's name, under evil's key
        security.make_client(s, keys, "evil")
        s.connect(ep.url(ep.work_port))
        try:
            await s.send_multipart(wire.encode(wire.Hello("evil", -1, "t", "x")))
            while True:
                await s.send_multipart(wire.encode(wire.Heartbeat("evil", 0, 0, 0)))
                await s.send_multipart(wire.encode(wire.Heartbeat("a0", 0, 0, 0)))  # as a0: refused
                while await s.poll(0):
                    got.append(wire.decode(await s.recv_multipart()))
                await asyncio.sleep(0.1)
        finally:
            s.close()
            ctx.term()

    await run(cfg, svc, [a0], attack)
    assert not any(isinstance(m, wire.GroupAck) for m in got), got  # none of a0's acks went to the attacker
    assert set(a0.acked) == {g.group_id for g in a0.sent[:len(a0.acked)]} and len(a0.acked) >= 6 * B
    assert "a0" in svc.members.alive()  # never evicted
    assert counted(svc, read(tmp_path / "metrics.jsonl"), "identity") > 0  # the heartbeats claiming a0


async def test_groups_naming_another_actor_touch_nothing_of_it(tiny_model_dir, tmp_path):
    """Finding 11: a group claiming a0 under evil's key used to return a0's lease and NACK a0; 400 groups
    of evil's own with ids "a0:<a0's incarnation>:<seq>" poisoned a0's duplicate table (a0's real groups
    were then dropped as duplicates); a replayed group's ack rode on the next ack, whoever sent it."""
    cfg, keys = curve_job(tiny_model_dir, tmp_path, steps=8)
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    a0 = FakeActor(ep, "a0", n_samples=N, seed=4, sec=Security(True, keys, "a0"))
    evil_acks: list[str] = []
    own_ids: list[str] = []

    async def attack():
        s = ActorSockets(ep, "evil", Security(True, keys, "evil"))

        async def acks():  # read as they come (read only after the flood, a busy machine's job could end first)
            while True:
                msg = await s.work.recv()
                if isinstance(msg, wire.GroupAck):
                    evil_acks.extend(msg.group_ids)
        reader = None
        try:
            await s.sync(-1)
            reader = asyncio.create_task(acks())
            while not a0.sent:
                await asyncio.sleep(0.01)
            real = a0.sent[0]
            inc = a0.sockets.incarnation
            # as a0 (its own id in the group, evil's key), answering the prompt a0 holds
            await s.rollouts.send(wire.RolloutGroup(**{**real.__dict__, "group_id": f"a0:{inc}:9999"}))
            # one of its own, twice: the second ack must come to it, not ride on a0's (sent before the flood
            # below, so that a busy machine's learner meets both before the job's last step)
            own = wire.RolloutGroup(**{**real.__dict__, "actor_id": "evil", "group_id": f"evil:{s.incarnation}:0"})
            own_ids.append(own.group_id)
            for _ in range(2):
                await s.rollouts.sock.send_multipart(wire.encode(own), copy=False)
            for _ in range(600):  # both acks before the flood (the replay's is sent when the next group arrives)
                if evil_acks.count(own.group_id) >= 2:
                    break
                await asyncio.sleep(0.05)
            # its own actor id, a0's group ids: seqs a0 is about to use
            for seq in range(400):
                await s.rollouts.sock.send_multipart(wire.encode(wire.RolloutGroup(
                    **{**real.__dict__, "actor_id": "evil", "group_id": f"a0:{inc}:{seq}"})), copy=False)
            await reader
        finally:
            if reader is not None:
                reader.cancel()
            s.close()

    await run(cfg, svc, [a0], attack)
    assert not any(gid.startswith("evil:") for gid in a0.acked), a0.acked  # no ack of evil's rode on a0's
    assert evil_acks.count(own_ids[0]) == 2, evil_acks  # its group, then its replay: both acked to it
    assert all(gid.startswith("evil:") for gid in evil_acks), evil_acks  # evil hears only of its own groups
    assert not [gid for gid in a0.nacked if gid.endswith(":9999")], a0.nacked  # the forgery NACKed nobody as a0
    invalid = [r for r in ledger(tmp_path) if r.get("reason") == "invalid" and r.get("actor") == "a0"]
    assert invalid == []  # a0's lease was never returned on the forgery's account
    assert svc.sockets.rollouts.duplicates <= 1  # a0's own groups were never taken for duplicates
    assert svc.sockets.rollouts.rejects.count >= 401  # each refused at the socket, before any table
    assert counted(svc, read(tmp_path / "metrics.jsonl"), "identity") >= 256  # counted (the last 256 NACKed)


async def test_work_requests_from_versions_never_published_are_refused(tiny_model_dir, tmp_path):
    """Finding 12: the weights version in a work request was never checked: a peer claiming +1e6 versions
    was granted 271 prompts and training fell from ~40 steps to 1 in 20 s."""
    cfg, keys = curve_job(tiny_model_dir, tmp_path, steps=6)
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    a0 = FakeActor(ep, "a0", n_samples=N, seed=5, sec=Security(True, keys, "a0"))
    granted: list[int] = []

    async def attack():
        s = ActorSockets(ep, "evil", Security(True, keys, "evil"))
        try:
            await s.sync(-1)
            while True:
                await s.work.send(wire.WorkRequest("evil", 1000, 10**6))
                reply = await s.work.recv(timeout_s=5)
                if isinstance(reply, wire.WorkAssignment):
                    granted.extend(i.prompt_id for i in reply.items)
                await asyncio.sleep(0.05)
        finally:
            s.close()

    await run(cfg, svc, [a0], attack)
    assert granted == []
    assert not [r for r in ledger(tmp_path) if r.get("actor") == "evil" and "granted" in r]
    assert counted(svc, read(tmp_path / "metrics.jsonl"), "version_from_future") > 0


async def test_a_member_that_never_joins_the_weight_group_is_left_out_of_the_next(tiny_model_dir, tmp_path):
    """Finding 13: an actor that says hello and heartbeats but never joins the weight group failed every
    rendezvous (each costing transport.weight_timeout_s): 0 steps. Now the first failed group leaves it out
    of the next one (its heartbeats never named the group) and the job trains. Issue 52: saying hello again
    (the same incarnation) whenever a group formed without it brought it back into every regroup (0 steps
    in 60 s); it now stays out for a back-off (transport.weight_timeout_s, doubling) whatever it says."""
    cfg, keys = curve_job(tiny_model_dir, tmp_path, steps=6, **{"transport.weight_timeout_s": 5.0})
    svc = LearnerService(cfg)
    svc.members.backoff_s = 60.0  # longer than the job: whenever z0 says hello, it is still out
    ep = LearnerService.endpoints_of(cfg)
    a0 = FakeActor(ep, "a0", n_samples=N, seed=6, sec=Security(True, keys, "a0"))
    z0 = FakeActor(ep, "z0", n_samples=N, seed=7, sec=Security(True, keys, "z0"), never_joins=True)
    z0.may_work.clear()  # it only says hello and heartbeats
    a0.may_work.clear()  # until z0 is a member: a0 alone trains the 6 steps in a second, before z0's first heartbeat
    hellos: list[str] = []
    called: list[list[str]] = []  # the members of each rendezvous published after z0's second hello
    seen: dict[str, object] = {}

    def spy(hello):
        def counted(actor, *args):
            hellos.append(actor)
            return hello(actor, *args)
        return counted

    async def attack():
        await z0.start()
        await until_alive(svc, {"a0", "z0"})
        a0.may_work.set()
        while svc.members.group != ["a0"]:  # the first rendezvous failed for z0; a group formed without it
            await asyncio.sleep(0.01)
        a0.may_work.clear()  # the job waits while z0 says hello again
        svc.members.hello = spy(svc.members.hello)
        await z0.sockets.work.send(z0.sockets.hello(z0.version))  # the same incarnation
        while "z0" not in hellos:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # heartbeats of z0 after its hello
        seen["alive"] = svc.members.alive()
        a0.may_work.set()
        while True:
            members = sorted(svc.sockets.control.weights.get("offsets", {}))
            if members and (not called or called[-1] != members):
                called.append(members)
            await asyncio.sleep(0.005)

    t0 = time.monotonic()
    try:
        await run(cfg, svc, [a0], attack, timeout_s=90)
    finally:
        await z0.kill()
    assert seen["alive"] == ["a0"]  # its hello did not bring it back
    assert not any("z0" in g for g in called), called  # nor into any rendezvous after it
    assert set(svc.members.shunned) == {"z0"} and svc.members.strikes == {"z0": 1}
    assert a0.received_versions[-1] == 6
    assert time.monotonic() - t0 < 60  # one failed rendezvous (5 s), not one per step


async def test_a_key_that_holds_prompts_and_answers_none_loses_them_to_the_honest_actor(tiny_model_dir, tmp_path):
    """Issue 52: a member that joins the weights and heartbeats, asks for 1000 prompts at its true version
    every 0.3 s and answers none was granted the whole freshness bound and held it for good (2 steps in
    20 s, not 45); a group it NACKed for the prompt id "71" (a string) kept its prompt leased too. Now it
    holds at most its share, its leases expire (learner.lease_timeout_s) and go to the honest actor, and
    the NACKed prompt is granted again at once."""
    cfg, keys = curve_job(tiny_model_dir, tmp_path, steps=6, **{"learner.lease_timeout_s": 1.0})
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    a0 = FakeActor(ep, "a0", n_samples=N, seed=11, sec=Security(True, keys, "a0"))
    a0.may_work.clear()  # until the hoarder holds what it is granted
    evil = Hoarder(ep, "evil", n_samples=N, seed=12, sec=Security(True, keys, "evil"))

    async def attack():
        await evil.start()
        await until_alive(svc, {"a0", "evil"})
        while not evil.granted:
            await asyncio.sleep(0.01)
        a0.may_work.set()
        await asyncio.Event().wait()

    try:
        await run(cfg, svc, [a0], attack, timeout_s=60)
    finally:
        await evil.kill()
    rows = ledger(tmp_path)
    nacked = evil.granted[0]
    returns = [(r["reason"], r["actor"]) for r in rows if nacked in r.get("returned", [])]
    assert returns[0] == ("invalid", "evil"), returns  # the NACK returned it at once
    at = rows.index({"returned": [nacked], "actor": "evil", "reason": "invalid"})
    assert [r for r in rows[at:] if nacked in r.get("granted", [])]  # and it was granted again
    expired = [r for r in rows if r.get("reason") == "expired"]
    assert expired and {r["actor"] for r in expired} == {"evil"}  # what it held expired,
    assert not [r for r in rows if r.get("reason") == "evicted"]  # without an eviction
    to_a0 = {p for r in rows[rows.index(expired[0]):] if r.get("actor") == "a0" and "granted" in r for p in r["granted"]}
    trained = {p for r in rows if "trained" in r for p in r["trained"]}
    assert {p for r in expired for p in r["returned"]} & to_a0 & trained  # went to the honest actor, which trained on it


class Hoarder(FakeActor):
    """A member (joins the weights, heartbeats) that asks for 1000 prompts at its true version every 0.3 s
    and answers none, but for its first prompt: a group whose prompt id is a string ("71"), NACKed."""

    granted: list[int] = []

    async def _work(self) -> None:
        self.granted = []
        while True:
            if self.version >= 0:
                await self.sockets.work.send(wire.WorkRequest(self.actor_id, 1000, self.version, []))
                assign = await self._assign.get()
                if assign.items and not self.granted:
                    g = self._group_for(assign.items[0])
                    bad = wire.RolloutGroup(**{**g.__dict__, "prompt_id": str(g.prompt_id)})
                    await self.sockets.rollouts.sock.send_multipart(wire.encode(bad), copy=False)
                self.granted += [i.prompt_id for i in assign.items]
            await asyncio.sleep(0.3)


SUBSCRIBER = """
import os, sys, time, zmq
from transport import security
url, keys = sys.argv[1], sys.argv[2]
ctx, socks = zmq.Context(), []
for i in range(80):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)  # nothing held back on this side: everything goes as fast as the learner takes it
    security.make_client(s, keys, "evil")
    s.connect(url)
    socks.append(s)
    if i < 8:  # 1 MB frames (over the limit: the connection is dropped)
        s.send(b"\\x01" + bytes([65 + i]) * 1_000_000)
    elif i < 16:  # many distinct frames of 900 bytes (they pass the frame limit, CURVE included)
        for k in range(1000):
            s.send(b"\\x01" + os.urandom(900))
    else:  # many connections, each subscribing: routes for one key
        s.send(b"\\x01")
print("sent", flush=True)
time.sleep(600)
"""


async def test_a_key_flooding_the_control_socket_grows_nothing_and_is_refused(tiny_model_dir, tmp_path):
    """Finding 14: sixteen 1 MB subscriptions on the control socket grew the learner by 704 MB (+842 MB
    after the connections closed); libzmq's PUB/XPUB keep every subscription a peer sends, and even after the
    first fix (frames of at most 1 KiB, a flooding key banned and the socket rebuilt) the first burst grew
    it by up to 334 MiB. The control socket is now a ROUTER that keeps nothing a peer sends beyond 8
    messages of 1 KiB per connection and one route entry per subscribed connection (4 per key): the flood
    (1 MB frames, 8,000 frames of 900 bytes, 64 subscribing connections) grows the learner by < 32 MiB from
    its first byte, the key is refused, and the honest actor trains on."""
    import subprocess
    import sys

    from transport.control import ROUTES_PER_KEY

    cfg, keys = curve_job(tiny_model_dir, tmp_path, steps=30)
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    a0 = FakeActor(ep, "a0", n_samples=N, seed=8, sec=Security(True, keys, "a0"))
    me = psutil.Process()
    seen: dict[str, float] = {}

    async def attack():
        while svc.version < 2:  # optimizer state exists: what follows is steady state
            await asyncio.sleep(0.01)
        a0.may_work.clear()  # the job waits while the learner is measured, then trains on
        await asyncio.sleep(0.5)
        rss0 = peak = me.memory_info().rss
        control = svc.sockets.control
        flood = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, ep.url(ep.control_port), str(keys)],
                                 stdout=subprocess.DEVNULL)
        try:
            deadline, banned_at = time.monotonic() + 60, None
            while time.monotonic() < deadline and (banned_at is None or time.monotonic() - banned_at < 3):
                peak = max(peak, me.memory_info().rss)
                routes = sum(1 for who, _ in control.routes.values() if who == "actor:evil")
                seen["routes"] = max(seen.get("routes", 0), routes)
                if control.banned and banned_at is None:
                    banned_at = time.monotonic()
                await asyncio.sleep(0.02)
            seen["grew"] = peak - rss0
        finally:
            flood.kill()
            flood.wait()
            a0.may_work.set()
        await asyncio.Event().wait()

    await run(cfg, svc, [a0], attack)
    print({"grew_mib": seen["grew"] / 2**20, "routes": seen["routes"]})
    assert svc.sockets.control.banned == ["actor:evil"]
    assert seen["routes"] <= ROUTES_PER_KEY, seen
    assert seen["grew"] < 32 * 2**20, f"the flood grew the learner by {seen['grew'] / 2**20:.0f} MiB"


async def test_groups_with_only_empty_completions_make_an_empty_step_not_a_crash(tiny_model_dir, tmp_path):
    """Finding 8: four groups whose completions were all empty (a real engine can produce them) were acked,
    and the step divided by a mini-batch of 0 tokens (ZeroDivisionError): the learner exited. Such a step
    is now skipped and counted (`step_empty`), and training goes on with the honest actor."""
    cfg, keys = curve_job(tiny_model_dir, tmp_path, steps=5)
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)

    def empty(g, k):
        return wire.RolloutGroup(**{**g.__dict__, "lengths": np.zeros(g.n, np.int32), "tokens": g.tokens[:0],
                                    "logprobs": g.logprobs[:0]})

    e0 = FakeActor(ep, "evil", n_samples=N, seed=9, sec=Security(True, keys, "evil"), corrupt=empty)
    a0 = FakeActor(ep, "a0", n_samples=N, seed=10, sec=Security(True, keys, "a0"))
    a0.may_work.clear()

    async def attack():
        while svc.version < 2:  # two steps of empty groups only
            await asyncio.sleep(0.01)
        await e0.kill()
        a0.may_work.set()  # then the honest actor trains on
        await asyncio.Event().wait()

    await run(cfg, svc, [e0, a0], attack)
    rows = read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert sum(r.get("step_empty", 0) for r in rows) >= 2, rows
    assert rows[-1].get("step_empty", 0) == 0 and rows[-1]["train_tokens"] > 0
