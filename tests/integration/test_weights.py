import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transport.blocking import in_daemon_thread
from transport.checksum import bucket_checksum, bucket_checksum_tensor
from transport.ports import free_port
from transport.weights import (
    open_group,
    WeightBroadcaster,
    WeightSyncError,
    WeightPlan,
    make_plan,
    pack_bucket,
    receive_buckets,
    release_group,
    unpack_bucket,
)
from tests.support.weights_check import weights_checksum

ROOT = Path(__file__).resolve().parents[2]



def toy_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(300, 200, generator=g), "a.bias": torch.randn(200, generator=g),
            "b.weight": torch.randn(50, 7, generator=g).to(torch.bfloat16), "c": torch.randint(0, 9, (33,), generator=g)}


def test_plan_buckets_are_bounded_and_round_trip():
    params = toy_params()
    plan = make_plan(params.items(), bucket_mb=0.1)  # ~100 KiB buckets
    assert plan.names == list(params)
    assert len(plan.buckets) >= 2
    assert all(n <= 0.1 * 2**20 or b - a == 1 for a, b, n in plan.buckets)  # only a lone big tensor exceeds
    tensors = list(params.values())
    for a, b, n in plan.buckets:
        flat = pack_bucket(tensors[a:b], n)
        for (name, got), want in zip(unpack_bucket(flat, plan, a, b), tensors[a:b]):
            assert torch.equal(got, want), name


def test_checksum_detects_any_change():
    params = toy_params()
    plan = make_plan(params.items(), bucket_mb=1)
    c0 = weights_checksum(params.items(), plan)
    assert c0 == weights_checksum(toy_params().items(), plan)
    params["a.bias"][17] += 1e-3
    assert weights_checksum(params.items(), plan) != c0
    flat = torch.arange(64, dtype=torch.uint8)
    swapped = flat.clone()
    swapped[[3, 40]] = swapped[[40, 3]]
    assert bucket_checksum(flat) != bucket_checksum(swapped)


def test_consecutive_free_ports_never_run_past_the_last_port(monkeypatch):
    import transport.ports as w

    picks = iter([65534, 65535])  # what free_port may hand out at the top of the range: 3 ports do not fit
    real = w.free_port
    monkeypatch.setattr(w, "free_port", lambda host="127.0.0.1", avoid=(): next(picks, None) or real(host))
    base = w.free_ports(3)
    assert base + 2 <= 65535 and base not in (65534, 65535)


def test_consecutive_free_ports_keep_out_of_a_range_to_avoid(monkeypatch):
    """A range to avoid (a service's own ports): a run whose first port is outside but the next ones are inside
    is not taken either."""
    import transport.ports as w

    picks = iter([29999])  # 29999 is free to avoid, 30000 and 30001 are not
    real = w.free_port
    monkeypatch.setattr(w, "free_port", lambda host="127.0.0.1", avoid=(): next(picks, None) or real(host, avoid))
    avoid = range(30000, 31000)
    base = w.free_ports(3, avoid=avoid)
    assert base != 29999 and not set(range(base, base + 3)) & set(avoid)


def test_the_checksum_is_its_definition_on_any_length():
    """(S2 + K·S1) mod 2^64 over 64-bit little-endian words w_p (S1 = Σ w_p, S2 = Σ (p+1)·w_p; trailing bytes
    are words of their own), computed here with Python integers; the device-side tensor form agrees."""
    g = torch.Generator().manual_seed(1)
    for n in (0, 1, 7, 8, 9, 8191, 8192, 8200, 3 * 8192 + 13):
        flat = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        raw = bytes(flat.tolist())
        words = [int.from_bytes(raw[i:i + 8], "little", signed=True) for i in range(0, n - n % 8, 8)]
        words += list(raw[n - n % 8:])
        s1, s2 = sum(words), sum((p + 1) * w for p, w in enumerate(words))
        want = (s2 + s1 * 0x9E3779B97F4A7C15) % 2**64
        assert bucket_checksum(flat) == want == int(bucket_checksum_tensor(flat)) % 2**64, n


class _Work:
    def __init__(self, log, what):
        self.log, self.what = log, what

    def wait(self):
        self.log.append(("arrived", self.what))


class _Pg:
    """Records the order of a transfer's steps (the real groups are exercised by the tests below)."""

    def __init__(self, rank, size=2):
        self._rank, self._size, self.log, self.n = rank, size, [], 0

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def recv(self, tensors, src, tag):
        self.n += 1
        self.log.append(("posted", self.n))
        tensors[0].fill_(self.n)
        return _Work(self.log, self.n)

    def send(self, tensors, dst, tag):
        self.n += 1
        self.log.append(("posted", self.n))
        return _Work(self.log, self.n)


def test_a_receiver_has_the_next_bucket_on_the_wire_while_it_loads_this_one():
    plan = WeightPlan(["a", "b", "c"], ["uint8"] * 3, [[16]] * 3, [[0, 1, 16], [1, 2, 16], [2, 3, 16]])
    pg = _Pg(rank=1)
    loaded = []
    receive_buckets(pg, plan, load=lambda flat, a, b: (pg.log.append(("loaded", a + 1)), loaded.append(flat)))
    assert pg.log == [("posted", 1), ("arrived", 1), ("posted", 2), ("loaded", 1), ("arrived", 2), ("posted", 3),
                      ("loaded", 2), ("arrived", 3), ("loaded", 3)]
    assert [int(f[0]) for f in loaded] == [1, 2, 3]  # each bucket in a buffer of its own


def test_the_learner_packs_the_next_bucket_while_the_previous_one_is_on_the_wire():
    params = {f"p{i}": torch.full((4,), float(i)) for i in range(3)}
    wb = WeightBroadcaster(lambda: params.items(), bucket_mb=16 / 2**20)  # one tensor per bucket
    wb.pg, wb.world_size = _Pg(rank=0), 2
    plan_entries = wb.bucket_tensors

    @contextlib.contextmanager
    def packing(a, b):
        wb.pg.log.append(("packing", a + 1))
        with plan_entries(a, b) as ts:
            yield ts

    wb.bucket_tensors = packing
    assert wb._send_all() == weights_checksum(params.items(), wb.plan)
    assert wb.pg.log == [("packing", 1), ("posted", 1), ("packing", 2), ("arrived", 1), ("posted", 2),
                         ("packing", 3), ("arrived", 2), ("posted", 3), ("arrived", 3)]


def test_closing_aborts_an_nccl_group_and_leaves_gloo_alone():
    """A broadcast stuck on a dead receiver never ends: an NCCL group is aborted when let go, not left to a
    destructor that would wait for it at exit (the real group is exercised by the gpu tests)."""
    calls = []

    class ProcessGroupNCCL:
        def abort(self):
            calls.append("abort")

    wb = WeightBroadcaster(lambda: toy_params().items())
    wb.pg = ProcessGroupNCCL()
    wb.close()
    assert calls == ["abort"] and wb.pg is None
    release_group(open_group("127.0.0.1", free_port(), 0, 1, "alone", 5.0)[0])  # gloo: nothing to abort


def _peer(port, rank, world, group, plan, updates, *extra):
    return subprocess.Popen([sys.executable, "-m", "tests.support.weight_peer", "127.0.0.1", str(port), str(rank),
                             str(world), group, json.dumps(plan.to_dict()), str(updates), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_late_joiner_gets_current_weights_through_new_rendezvous():
    params = toy_params()
    bc = WeightBroadcaster(lambda: params.items(), bucket_mb=0.1, timeout_s=20)
    info, offs = bc.rendezvous_info(free_port(), [1])
    p1 = _peer(info["master_port"], offs[0], info["world_size"], info["group_name"], bc.plan, 1)
    await bc.open(info)
    c1 = await bc.broadcast()
    out1 = p1.communicate(timeout=30)[0]
    assert f"checksum {c1}" in out1
    # a second actor joins: a new rendezvous with both, and the current weights go to everyone
    params["a.weight"].mul_(2)
    info2, offs2 = bc.rendezvous_info(free_port(), [1, 1])
    assert info2["group_name"] != info["group_name"] and info2["world_size"] == 3
    peers = [_peer(info2["master_port"], o, 3, info2["group_name"], bc.plan, 1) for o in offs2]
    await bc.open(info2)
    c2 = await bc.broadcast()
    assert c2 != c1
    for p in peers:
        assert f"checksum {c2}" in p.communicate(timeout=30)[0]


async def test_missing_receiver_is_an_error_not_a_hang():
    params = toy_params()
    bc = WeightBroadcaster(lambda: params.items(), bucket_mb=1, timeout_s=3)
    info, _ = bc.rendezvous_info(free_port(), [1])
    t = time.monotonic()
    with pytest.raises(WeightSyncError, match="rendezvous failed"):
        await bc.open(info)
    assert time.monotonic() - t < 15


async def test_dead_receiver_is_an_error_not_a_hang():
    params = toy_params()
    # the timeout covers the peer's start (a python importing torch: over 3 s on a GPU host) and the failure
    bc = WeightBroadcaster(lambda: params.items(), bucket_mb=0.1, timeout_s=10)
    info, offs = bc.rendezvous_info(free_port(), [1])
    p = _peer(info["master_port"], offs[0], info["world_size"], info["group_name"], bc.plan, 1, "exit")
    await bc.open(info)
    p.wait(timeout=30)  # joined, then died
    t = time.monotonic()
    with pytest.raises(WeightSyncError, match="broadcast failed"):
        await bc.broadcast()
    assert time.monotonic() - t < 20
    with pytest.raises(WeightSyncError, match="no weight group"):
        await bc.broadcast()


async def test_a_receiver_killed_mid_update_costs_only_itself():
    """gloo sends each receiver its own copy: one dying after the first bucket fails only its transfer — the
    broadcaster names it at once, and the other receiver still gets the whole update (in a tree broadcast it
    could wait for the dead forwarder until the timeout)."""
    params = toy_params()
    bc = WeightBroadcaster(lambda: params.items(), bucket_mb=0.001, timeout_s=60)
    assert len(bc.plan.buckets) >= 3
    info, offs = bc.rendezvous_info(free_port(), [1, 1])
    good = _peer(info["master_port"], offs[0], 3, info["group_name"], bc.plan, 1)
    dying = _peer(info["master_port"], offs[1], 3, info["group_name"], bc.plan, 1, "die_mid_update")
    await bc.open(info)
    t = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"ranks \[2\] of 2 failed; the others received the whole update"):
        await bc.broadcast()
    assert time.monotonic() - t < 20  # not the 60 s timeout
    out = good.communicate(timeout=30)[0]
    bc2 = WeightBroadcaster(lambda: params.items(), bucket_mb=0.001)
    expected = weights_checksum(params.items(), bc2.plan)
    assert f"checksum {expected}" in out
    assert dying.wait(timeout=30) == -9


async def test_a_call_in_a_daemon_thread_returns_its_result_or_its_error():
    assert await in_daemon_thread(sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        await in_daemon_thread(lambda: 1 / 0)


def test_a_call_blocked_for_ever_and_given_up_on_does_not_hold_the_process_at_exit():
    """A collective stuck for ever (NCCL's set-up waiting for a peer that never came) is given up on by a
    timeout; the process must still exit at once. In a thread of asyncio's default executor (what
    `asyncio.to_thread` uses) it would not: `asyncio.run` waits up to 300 s for those, then the
    interpreter joins them."""
    code = ("import asyncio, threading, time\n"
            "from transport.blocking import in_daemon_thread\n"
            "async def main():\n"
            "    try:\n"
            "        await asyncio.wait_for(in_daemon_thread(threading.Event().wait), 0.3)\n"
            "    except TimeoutError:\n"
            "        print('given up')\n"
            "asyncio.run(main())\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "given up", out.stderr[-2000:]
    assert time.monotonic() - t0 < 30  # the import of torch included


def test_the_rendezvous_store_listens_on_the_configured_host_only():
    """TCPStore on its own listens on every interface; the learner's store listens on `transport.host`."""
    import psutil

    port = free_port()
    pg, store = open_group("127.0.0.1", port, 0, 1, "listen-check", 5)
    try:
        listening = [c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port]
        assert listening == ["127.0.0.1"], listening
    finally:
        del pg, store


def test_weights_travel_in_the_serving_dtype_packed_one_tensor_at_a_time():
    """fp32 master weights, bf16 actors: the plan names bf16 for floating-point tensors (integer ones keep
    their dtype), buckets are half the bytes, and what unpacks is exactly the master cast to bf16."""
    from transport.weights import make_plan, pack_bucket, unpack_bucket

    params = toy_params()
    plan = make_plan(params.items(), bucket_mb=0.1, dtype=torch.bfloat16)
    full = make_plan(params.items(), bucket_mb=0.1)
    assert plan.dtype_names == ["bfloat16" if t.is_floating_point() else "int64" for t in params.values()]
    assert sum(n for *_, n in plan.buckets) < 0.6 * sum(n for *_, n in full.buckets)
    tensors = list(params.values())
    for a, b, n in plan.buckets:
        for name, t in unpack_bucket(pack_bucket(tensors[a:b], n, "cpu", torch.bfloat16), plan, a, b):
            src = params[name]
            assert torch.equal(t, src.to(torch.bfloat16) if src.is_floating_point() else src), name


async def test_ipc_update_is_acknowledged_and_a_receiver_that_never_acknowledges_is_named():
    """transport.weight_backend = "ipc" on CPU: the learner's buffer in POSIX shared memory, handed out once at
    the rendezvous; the receiver checksums what it reads there and acknowledges. One that never acknowledges
    makes the update an error naming it, within the timeout, and the buffer is never written again."""
    from pathlib import Path as P

    params = toy_params()
    bc = WeightBroadcaster(lambda: params.items(), bucket_mb=0.1, timeout_s=30, backend="ipc")
    info, offs = bc.rendezvous_info(free_port(), [1], names=["actor-b"])
    (handle,) = info["buffers"]
    assert handle["kind"] == "shm" and handle["nbytes"] == sum(n for *_, n in bc.plan.buckets)
    peer = _peer(info["master_port"], offs[0], 2, info["group_name"], bc.plan, 2, "ipc_hold", json.dumps(handle))
    try:
        await bc.open(info)
        c1 = await bc.broadcast(1)
        assert c1 == weights_checksum(params.items(), bc.plan)
        params["a.weight"].mul_(2)
        bc.timeout_s = 2.0
        t = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"receivers actor-b \(1 of 1\) did not acknowledge version 2 within 2 s"):
            await bc.broadcast(2)
        assert time.monotonic() - t < 10
        assert not (P("/dev/shm") / handle["name"]).exists() and bc.buffer is None  # the next rendezvous: a new one
    finally:
        peer.kill()
    out = peer.communicate(timeout=30)[0]
    assert f"checksum {c1}" in out and f"checksum {weights_checksum(params.items(), bc.plan)}" in out
