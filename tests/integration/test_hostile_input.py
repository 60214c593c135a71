"""Hostile and broken input against the real learner service and its sockets: every malformed-but-decodable
group is rejected with its reason, counted and NACKed while a valid batch still trains; forged ids and
hellos cannot grow the learner's tables or start a rendezvous; a 1 GiB frame is refused by the socket;
admin commands need an admin credential, and a verifier that exits or hangs at import is rejected with
the learner alive."""

import asyncio
import dataclasses
import os
import subprocess
import sys
import time

import numpy as np
import psutil

from learner.ledger import account, check
from learner.metrics import read
from learner.service import LearnerService
from tests.integration.test_learner_service import B, N, job
from tests.support.fake_actor import FakeActor
from tests.support.waiting import until
from transport import wire
from transport.security import generate
from transport.zmq_transport import ActorSockets, Security


def _drop_last(g):
    keep = int(g.lengths[:-1].sum())
    return dataclasses.replace(g, lengths=g.lengths[:-1], tokens=g.tokens[:keep], logprobs=g.logprobs[:keep],
                               rewards=g.rewards[:-1], correct=g.correct[:-1], finish=g.finish[:-1])


def _longer_first(g, extra):
    lengths = g.lengths.copy()
    lengths[0] += extra
    return dataclasses.replace(g, lengths=lengths, tokens=np.concatenate([g.tokens, np.ones(extra, np.int32)]),
                               logprobs=np.concatenate([g.logprobs, np.full(extra, -1.0, np.float32)]))


def _set(g, name, i, value):
    a = getattr(g, name).copy()
    a[i] = value
    return dataclasses.replace(g, **{name: a})


# expected reason -> how the k-th group is spoiled (max_tokens 16, max_model_len 256 in tiny-cpu)
SPOIL = {
    "n_samples": _drop_last,
    "token_id": lambda g: _set(g, "tokens", 0, 10**6),
    "prompt": lambda g: _set(g, "prompt_ids", 0, (int(g.prompt_ids[0]) + 1) % 100),  # not the prompt granted
    "completion_too_long": lambda g: _longer_first(g, 40),
    "too_long": lambda g: dataclasses.replace(g, prompt_ids=np.ones(256, np.int32)),
    "reward_range": lambda g: _set(g, "rewards", 0, 3e38),
    "version_from_future": lambda g: dataclasses.replace(g, policy_version=10**6),
    "prompt_not_granted": lambda g: dataclasses.replace(g, prompt_id=10**9),
    "verifier": lambda g: dataclasses.replace(g, verifier="math"),
    "identity": lambda g: dataclasses.replace(g, group_id="mallory:" + g.group_id.split(":", 1)[1]),
    "malformed": lambda g: _set(g, "logprobs", 0, 5.0),  # fails decoding, still names itself: NACKed too
}


async def test_each_bad_group_is_rejected_counted_and_nacked_and_training_goes_on(tiny_model_dir, tmp_path):
    kinds = list(SPOIL)
    spoiled: dict[str, str] = {}  # group id -> expected reason
    prompts: dict[str, int] = {}  # reason -> the prompt the spoiled group answered

    def corrupt(g, k):
        if k < len(kinds):
            prompts[kinds[k]] = g.prompt_id
            g = SPOIL[kinds[k]](g)
            spoiled[g.group_id] = kinds[k]
        return g

    cfg = job(tiny_model_dir, tmp_path, steps=4)
    svc = LearnerService(cfg)
    actor = FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, seed=5, corrupt=corrupt)
    service = asyncio.create_task(svc.run())
    try:
        await actor.start()
        assert await asyncio.wait_for(service, 120) == 0  # the learner lived and finished its steps
        deadline = time.monotonic() + 5
        while len(actor.nacked) < len(kinds) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        service.cancel()
        await actor.kill()
    assert {gid: why.partition(":")[0] for gid, why in actor.nacked.items()} == spoiled
    rows = read(tmp_path / "metrics.jsonl")
    counted = {k: sum(r.get(f"rejected_{k}", 0) for r in rows) for k in kinds}
    assert counted == {k: 1 for k in kinds}, counted
    check(account(tmp_path), 4, B)  # nothing trained twice; every granted prompt accounted for
    # every rejected group's prompt went back to the queue (one that failed decoding too), none stranded
    back = {p for r in account(tmp_path).returned if r["reason"] == "invalid" for p in r["returned"]}
    assert {p for k, p in prompts.items() if k != "prompt_not_granted"} <= back, (prompts, back)


FLOOD = """
import sys, time, zmq
from transport import wire
url, ctx, socks = sys.argv[1], zmq.Context(), []
one = ctx.socket(zmq.DEALER); one.setsockopt(zmq.IDENTITY, b"forger"); one.connect(url); socks.append(one)
for i in range(10_000):  # forged ids over one connection: it speaks for the first one only
    one.send_multipart(wire.encode(wire.Hello(f"forged-{i}", -1, "t", "x")))
for i in range(300):  # connections that each claim an id of their own
    s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.IDENTITY, f"ghost-{i}".encode()); s.connect(url); socks.append(s)
    s.send_multipart(wire.encode(wire.Hello(f"ghost-{i}", -1, "t", "x")))
print("sent", flush=True)
time.sleep(600)
"""


async def test_forged_ids_and_hellos_stay_bounded_and_start_no_rendezvous(tiny_model_dir, tmp_path):
    """Another process sends 10,000 hellos with forged actor ids over one connection and opens 300
    connections that each claim an id: the tables stay within transport.max_actors, the learner's memory
    stays flat, no forged id becomes a member or is named by a rendezvous or granted a prompt, and the real
    actor's job finishes."""
    cfg = job(tiny_model_dir, tmp_path, steps=30, **{"transport.max_actors": 64})
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    actor = FakeActor(ep, "a0", n_samples=N, seed=1)
    service = asyncio.create_task(svc.run())
    me = psutil.Process()
    flood = None
    try:
        await actor.start()
        await until(lambda: svc.version >= 2 or service.done(), "the learner at version 2", 120,
                    lambda: f"version {svc.version}", poll_s=0.01)  # optimizer state exists: steady state follows
        rss0 = me.memory_info().rss
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, ep.url(ep.work_port)], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while not service.done():
            assert time.monotonic() < deadline, f"the job did not finish under the flood: version {svc.version} of 30"
            assert len(svc.members.incarnations) <= 64 and len(svc.members.addresses) <= 64
            named = svc.members.alive() + svc.members.group + list(svc.sockets.control.weights.get("offsets", {}))
            assert set(named) <= {"a0"}, named  # no forged id is ever a member or named by a rendezvous
            await asyncio.sleep(0.05)
        assert service.result() == 0
        grew = me.memory_info().rss - rss0
        import select

        assert select.select([flood.stdout], [], [], 0)[0], "the flood had not finished when the job did"
        assert flood.stdout.readline().strip() == "sent"
    finally:
        service.cancel()
        await actor.kill()
        if flood is not None:
            flood.kill()
            flood.wait()
    assert grew < 96 * 2**20, f"grew by {grew / 2**20:.0f} MiB"  # 28 training steps also move the heap a little
    rows = read(tmp_path / "metrics.jsonl")

    def counted(reason):  # in the metrics of the steps, plus what came after the last step
        return sum(r.get(f"rejected_{reason}", 0) for r in rows) + svc.validator.counts[reason]

    assert counted("identity") == 9_999  # every forged hello after the first, which bound the connection to its id
    assert counted("hello_refused") >= 100  # ghosts past the table's bound
    sent = [line for line in (tmp_path / "ledger.jsonl").read_text().splitlines() if "forged" in line or "ghost" in line]
    assert sent == []  # nothing was ever granted to them


async def test_a_1_gib_frame_is_refused_by_the_socket(tiny_model_dir, tmp_path):
    cfg = job(tiny_model_dir, tmp_path, steps=4)
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    actor = FakeActor(ep, "a0", n_samples=N, seed=2)
    service = asyncio.create_task(svc.run())
    me = psutil.Process()
    try:
        await actor.start()
        rss0 = me.memory_info().rss
        # another process pushes one 1 GiB frame at the rollout port (zero pages: cheap for it to send)
        code = ("import numpy, zmq, time; c = zmq.Context(); s = c.socket(zmq.PUSH); s.setsockopt(zmq.LINGER, 0); "
                f"s.connect('{ep.url(ep.rollout_port)}'); "
                "s.send_multipart([b'{}', memoryview(numpy.zeros(1 << 30, numpy.uint8))], copy=False); time.sleep(5)")
        p = subprocess.Popen([sys.executable, "-c", code])
        peak = rss0
        t0 = time.monotonic()
        while p.poll() is None and time.monotonic() - t0 < 30:
            peak = max(peak, me.memory_info().rss)
            await asyncio.sleep(0.05)
        p.kill()
        assert await asyncio.wait_for(service, 120) == 0  # and training went on
    finally:
        service.cancel()
        await actor.kill()
    assert peak - rss0 < 128 * 2**20, f"learner grew by {(peak - rss0) / 2**20:.0f} MiB"


async def _admin(ep, msg, sec=Security()):
    s = ActorSockets(ep, sec.client_name or "admin", sec)
    try:
        await s.work.send(msg)
        while True:
            reply = await s.work.recv(timeout_s=60)
            if isinstance(reply, wire.AdminReply):
                return reply
    finally:
        s.close()


async def test_admin_needs_an_admin_key_and_bad_verifiers_are_rejected_with_the_learner_alive(tiny_model_dir, tmp_path):
    keys = generate(tmp_path / "keys", ["a0"], ["admin"])
    assert oct(os.stat(keys).st_mode & 0o777) == "0o700" and oct(os.stat(keys / "a0.key_secret").st_mode & 0o777) == "0o600"
    cfg = job(tiny_model_dir, tmp_path, steps=3, **{
        "transport.curve": True, "transport.keys_dir": str(keys), "verifiers.check_timeout_s": 5.0,
        "verifiers.allowed_modules": ["verifiers.*", "tests.support.verifier_mods.*"]})
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    service = asyncio.create_task(svc.run())
    admin = Security(True, keys, "admin")
    try:
        swap = wire.Admin("swap", {"name": "synthetic", "path": "verifiers.math"})
        r = await _admin(ep, swap, Security(True, keys, "a0"))  # an actor's key is not an admin key
        assert not r.ok and "not an admin key" in r.message and "actor:a0" in r.message
        r = await _admin(ep, wire.Admin("swap", {"name": "synthetic", "path": "os"}), admin)
        assert not r.ok and "allowed_modules" in r.message
        for path, why in (("tests.support.verifier_mods.exits_at_import", "exit status 3"),
                          ("tests.support.verifier_mods.hangs_at_import", "did not finish within 5 s")):
            r = await _admin(ep, wire.Admin("swap", {"name": "synthetic", "path": path}), admin)
            assert not r.ok and why in r.message, r.message
        assert not service.done()  # the learner lived through all of it
        r = await _admin(ep, wire.Admin("status"), admin)
        assert r.ok and r.message.startswith("step 0")
        assert svc.sockets.control.verifiers == {}  # nothing was published
    finally:
        service.cancel()
        await asyncio.gather(service, return_exceptions=True)


async def test_without_curve_admin_commands_come_over_loopback_only(tiny_model_dir, tmp_path):
    import socket as so

    public = next((a for a in so.gethostbyname_ex(so.gethostname())[2] if not a.startswith("127.")), None)
    if public is None:  # the host must have an address besides loopback to show the refusal
        import subprocess as sp

        public = sp.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()[0]
    cfg = job(tiny_model_dir, tmp_path, steps=3, **{"transport.host": "0.0.0.0", "transport.allow_insecure_remote": True})
    svc = LearnerService(cfg)
    ep = LearnerService.endpoints_of(cfg)
    service = asyncio.create_task(svc.run())
    try:
        remote = type(ep)(public, ep.work_port, ep.rollout_port, ep.control_port)
        r = await _admin(remote, wire.Admin("status"))
        assert not r.ok and "loopback only" in r.message and public in r.message
        local = type(ep)("127.0.0.1", ep.work_port, ep.rollout_port, ep.control_port)
        assert (await _admin(local, wire.Admin("status"))).ok
    finally:
        service.cancel()
        await asyncio.gather(service, return_exceptions=True)
