"""Versioned weight broadcast from the learner into every actor's vLLM workers.

Learner side: `WeightBroadcaster`. Actor side: `WeightReceiver`, which drives vLLM's weight-transfer API
(`init_weight_transfer_engine`, `start_weight_update`, `update_weights`, `finish_weight_update`, all
worker methods reached through `collective_rpc`, present in vLLM 0.26 and 0.32 alike) with the engine
we register, `brorl_gloo` on CPUs, `brorl_nccl` on GPUs, `brorl_ipc` on one host (`transport/vllm_ext.py`):
one protocol over every backend. (vLLM's own `nccl` engine speaks a different, packed protocol driven from a trainer that
holds the engine client; ours lets actors join and leave a running job, so we keep one engine for both.)

Protocol:
  1. Rendezvous (once per membership change — the first actor, a restarted or late actor): the learner
     picks a fresh group name and port, publishes `Control("weights", {"rendezvous": init, "plan": plan})`
     and opens rank 0 of a gloo group of world size 1 + Σ workers, while each actor calls
     `init_weight_transfer_engine` with its `rank_offset`. A joiner therefore always receives the
     current weights (the broadcast that follows the rendezvous) before it takes work. Re-forming the
     group per join is what lets actors come and go in a running job (a fixed NCCL/gloo world cannot
     grow).
  2. Update (every policy version): the learner publishes `Control("version", {"version": v})`, actors
     call start/update/finish; the learner broadcasts the parameters in buckets of at most `bucket_mb`
     MiB, in the plan's order, packing (and on a receiver loading) one bucket while the previous one is on the
     wire: the extra memory is two buckets on the learner and at most three on a receiver, whatever the
     model size.
  3. Check: each actor reports (version, checksum) of the bytes it loaded; the learner compares them
     with the checksum of the bytes it sent (`WeightBroadcaster`, bucket by bucket as they go).
A receiver that is missing or dead makes the broadcast fail within `timeout_s` (the gloo group's
timeout) with `WeightSyncError`, never a hang.
ipc (`transport/ipc.py`): the rendezvous also hands each worker a handle to the learner's persistent buffer
of every bucket; an update packs into it, tells the group "version v is in the buffer" and waits for every
worker's acknowledgement (loaded, or failed) before it may write the buffer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch

from transport.blocking import in_daemon_thread
from transport.ipc import SharedBuffer, send_shared
from transport.checksum import bucket_checksum_tensor, checksum_values, combine_checksums
from transport.groups import open_group, release_group  # noqa: F401  (where the weight group's users find them)

ALIGN = 16  # every tensor starts at a multiple of 16 bytes in its bucket, so views of any dtype work


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class WeightSyncError(RuntimeError):
    """A weight broadcast failed or timed out (a receiver is missing, dead or slow)."""


@dataclass
class WeightPlan:
    """What every update sends, in order; fixed for a model, sent once per rendezvous."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    buckets: list[list[int]]
    """[first, last_exclusive, nbytes] index ranges into `names`, one per broadcast."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _wire_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """What `t` travels as: `dtype` for floating-point tensors when given (the serving dtype), else its own."""
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def make_plan(named: Iterable[tuple[str, torch.Tensor]], bucket_mb: float,
              dtype: torch.dtype | None = None) -> WeightPlan:
    limit = max(1, int(bucket_mb * 2**20))
    names, dtypes, shapes, buckets = [], [], [], []
    start, size = 0, 0
    for i, (name, t) in enumerate(named):
        wire_dtype = _wire_dtype(t, dtype)
        nbytes = _align(t.numel() * torch.empty((), dtype=wire_dtype).element_size())
        if size and size + nbytes > limit:
            buckets.append([start, i, size])
            start, size = i, 0
        names.append(name)
        dtypes.append(str(wire_dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
        size += nbytes
    if size or start < len(names):
        buckets.append([start, len(names), size])
    return WeightPlan(names, dtypes, shapes, buckets)


def pack_bucket(tensors: list[torch.Tensor], nbytes: int, device: torch.device | str = "cpu",
                dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensors' bytes, each 16-byte aligned, floating-point ones cast to `dtype` (if given) as they are
    copied (no full-size cast copy). One multi-tensor copy into typed views of the bucket (a Python loop of
    a cast, a copy and a padding fill per tensor costs more host time than sending the bucket). `out`: a
    uint8 buffer of at least `nbytes` to pack into (its first `nbytes` are returned), else a new one."""
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device) if out is None else out[:nbytes]
    views, pads, off = [], [], 0
    for t in tensors:
        wire = _wire_dtype(t, dtype)
        n = t.numel() * wire.itemsize
        views.append(flat[off: off + n].view(wire))
        if _align(n) > n:
            pads.append((off + n, off + _align(n)))
        off += _align(n)
    if off < nbytes:
        pads.append((off, nbytes))
    torch._foreach_copy_(views, [t.detach().reshape(-1) for t in tensors])
    for a, b in pads:  # padding is part of the checksum: keep it defined
        flat[a:b].zero_()
    return flat


def unpack_bucket(flat: torch.Tensor, plan: WeightPlan, first: int, last: int) -> list[tuple[str, torch.Tensor]]:
    out, off = [], 0
    for i in range(first, last):
        dtype = getattr(torch, plan.dtype_names[i])
        numel = 1
        for d in plan.shapes[i]:
            numel *= d
        n = numel * torch.empty((), dtype=dtype).element_size()
        out.append((plan.names[i], flat[off: off + n].view(dtype).view(plan.shapes[i])))
        off += _align(n)
    return out




def start_bucket(pg, flat: torch.Tensor, skip: set[int] | frozenset = frozenset(),
                 timeout_s: float = 120.0) -> Callable[[], set[int]]:
    """Start moving one bucket from rank 0 to every other rank of `pg`; returns `finish`, which waits until it
    has arrived (or left, on rank 0) and gives rank 0 the ranks it could not reach. Between the two the
    caller prepares the next bucket: packing or loading overlaps the wire.

    NCCL (`flat` on a GPU): one collective broadcast — the fastest path, and a dead rank breaks an NCCL
    communicator whatever the pattern; `finish` waits on the host (within `timeout_s`), so that no more than
    two buckets are ever in flight. gloo: rank 0 sends the bucket to each receiver point to point, so a
    receiver that died fails only its own transfer and every other receiver still gets the whole update
    (in a tree broadcast the survivors would wait inside their receive, up to the timeout, for a forwarder
    that is gone). `skip`: ranks that failed an earlier bucket of this update (not sent to again)."""
    if flat.is_cuda:
        work = pg.broadcast([flat])

        def finish_nccl() -> set[int]:
            end = time.monotonic() + timeout_s
            while not work.is_completed():
                if time.monotonic() > end:
                    raise WeightSyncError(f"a {flat.numel()}-byte bucket did not arrive within {timeout_s:g} s")
                time.sleep(0.0002)
            work.wait()  # raises what the collective failed with
            return set()

        return finish_nccl
    if pg.rank() != 0:
        work = pg.recv([flat], 0, 0)
        return lambda: (work.wait(), set())[1]
    failed, works = set(), {}
    for dst in range(1, pg.size()):
        if dst not in skip:
            try:
                works[dst] = pg.send([flat], dst, 0)
            except Exception:
                failed.add(dst)

    def finish_gloo() -> set[int]:
        for dst, work in works.items():
            try:
                work.wait()
            except Exception:
                failed.add(dst)
        return failed

    return finish_gloo


def receive_buckets(pg, plan: WeightPlan, device: torch.device | str = "cpu",
                    load: Callable[[torch.Tensor, int, int], None] | None = None, timeout_s: float = 120.0) -> str:
    """A receiver's side of one update: every bucket of `plan`, each checksummed and handed to
    `load(flat, first, last)` while the next is already on the wire; returns the update's checksum. Each
    bucket gets a buffer of its own (a loader may keep views of it), at most three at a time."""
    buckets, sums = plan.buckets, []

    def post(i: int):
        flat = torch.empty(buckets[i][2], dtype=torch.uint8, device=device)
        return flat, start_bucket(pg, flat, timeout_s=timeout_s)

    nxt = post(0) if buckets else None
    for i, (first, last, _n) in enumerate(buckets):
        flat, finish = nxt
        finish()
        nxt = post(i + 1) if i + 1 < len(buckets) else None
        sums.append(bucket_checksum_tensor(flat))
        if load is not None:
            load(flat, first, last)
    return combine_checksums(checksum_values(sums))


class WeightBroadcaster:
    """Learner side: owns rank 0 of the weight group and the plan (and, for ipc, the shared buffer)."""

    def __init__(self, named_params, *, bucket_mb: float = 256, timeout_s: float = 120.0,
                 backend: str = "gloo", host: str = "127.0.0.1", dtype: torch.dtype | None = None,
                 bucket_tensors=None, device: torch.device | str | None = None):
        self.named_params = named_params  # callable -> iterable of (name, tensor), HF names
        self.dtype = dtype  # the serving dtype floating-point tensors are sent in (None: as they are)
        self.plan = make_plan(named_params(), bucket_mb, dtype)
        # (first, last) -> a context manager giving the tensors of plan entries [first, last) while it lasts:
        # the learner's hook for parameters that are whole only for a moment (ZeRO-3 gathers one bucket at a
        # time, so no rank ever holds two full copies); by default, slices of named_params()
        self.bucket_tensors = bucket_tensors or self._slice
        self.timeout_s = timeout_s
        self.backend = backend
        self.host = host
        self.pg = None
        self._store = None
        self.world_size = 1
        self.device = torch.device(device or "cpu")  # ipc: where the shared buffer lives (the learner's weights)
        self.buffer: SharedBuffer | None = None  # ipc: made at the first rendezvous, kept while updates succeed
        self.rank_names: dict[int, str] = {}  # rank -> the receiver it is, for errors
        self.last_split: dict[str, float] = {}
        """Host seconds of the last broadcast spent packing buckets, checksumming them and waiting for the wire
        (packing and checksumming overlap the transfer; on a GPU they are queued, not waited for)."""

    def rendezvous_info(self, port: int, workers: list[int],
                        names: list[str] | None = None) -> tuple[dict[str, Any], list[int]]:
        """Init info for a new group (world = 1 + Σ workers) and each actor's rank offset (`names`: the actors,
        for errors). ipc: the info carries one handle to the shared buffer per receiving rank."""
        offsets = [1 + sum(workers[:i]) for i in range(len(workers))]
        self.world_size = nxt = 1 + sum(workers)
        self.rank_names = {o + k: n if w == 1 else f"{n} (worker {k})" for o, w, n in
                           zip(offsets, workers, names or [f"rank {o}" for o in offsets]) for k in range(w)}
        info = {"master_address": self.host, "master_port": port, "world_size": nxt,
                "group_name": f"brorl-{uuid.uuid4().hex[:12]}", "timeout_s": self.timeout_s}
        if self.backend == "ipc":
            self.buffer = self.buffer or SharedBuffer(sum(n for *_, n in self.plan.buckets), self.device)
            info["buffers"] = [self.buffer.handle() for _ in range(nxt - 1)]
        return info, offsets

    def _who(self, ranks) -> str:
        return ", ".join(self.rank_names.get(r, f"rank {r}") for r in sorted(ranks))

    async def open(self, info: dict[str, Any]) -> None:
        """Rank 0 of the group; completes once every receiver has joined (or raises after timeout)."""
        self.close()
        try:
            self.pg, self._store = await asyncio.wait_for(in_daemon_thread(
                open_group, self.host, info["master_port"], 0, info["world_size"], info["group_name"],
                self.timeout_s, "gloo" if self.backend == "ipc" else self.backend), self.timeout_s + 5)
        except Exception as e:
            raise WeightSyncError(f"weight group rendezvous failed ({info['world_size'] - 1} receivers "
                                  f"expected): {type(e).__name__}: {e}") from e

    @contextlib.contextmanager
    def _slice(self, first: int, last: int):
        yield [t for _, t in self.named_params()][first:last]

    def _send_all(self) -> str:
        """Every bucket, pipelined: bucket i is packed and checksummed while bucket i - 1 is on the wire (on a
        GPU the packing kernels queue on the compute stream beside NCCL's), so at most two are alive; the
        checksums are read once, at the end."""
        sums: list[torch.Tensor] = []
        split = {"pack_s": 0.0, "checksum_s": 0.0, "wait_s": 0.0}
        failed: set[int] = set()
        finish = None
        device = torch.device("cpu")
        bufs: list[torch.Tensor] = []  # bucket i is packed into bufs[i % 2]: the one bucket i - 2 has left
        for i, (a, b, n) in enumerate(self.plan.buckets):
            t0 = time.perf_counter()
            with self.bucket_tensors(a, b) as tensors:
                device = tensors[0].device if self.backend == "nccl" else torch.device("cpu")
                if len(bufs) < 2:
                    bufs.append(torch.empty(max(m for *_, m in self.plan.buckets), dtype=torch.uint8, device=device))
                flat = pack_bucket(tensors, n, device, self.dtype, out=bufs[i % 2])
            t1 = time.perf_counter()
            sums.append(bucket_checksum_tensor(flat))
            t2 = time.perf_counter()
            if finish is not None:
                failed |= finish()
                finish = None
                if failed and len(failed) == self.world_size - 1:
                    break  # nobody left to send to
            t3 = time.perf_counter()
            finish = start_bucket(self.pg, flat, failed, self.timeout_s)
            split["pack_s"] += t1 - t0
            split["checksum_s"] += t2 - t1
            split["wait_s"] += t3 - t2
        t3 = time.perf_counter()
        if finish is not None:
            failed |= finish()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        split["wait_s"] += time.perf_counter() - t3
        self.last_split = split
        if failed:  # the others received all of it; these did not
            raise WeightSyncError(f"receivers at ranks {sorted(failed)} of {self.world_size - 1} failed; the others "
                                  f"received the whole update (failed: {self._who(failed)})")
        return combine_checksums(checksum_values(sums))

    def _send_shared(self, version: int) -> str:
        checksum, failed, self.last_split = send_shared(self.pg, self.buffer.tensor, self.plan, self.bucket_tensors,
                                                        self.dtype, version, self.world_size, self.timeout_s)
        if failed:
            raise WeightSyncError(f"receivers {self._who(failed)} ({len(failed)} of {self.world_size - 1}) did not "
                                  f"acknowledge version {version} within {self.timeout_s:g} s "
                                  f"(transport.weight_timeout_s) or failed to load it")
        return checksum

    async def broadcast(self, version: int = 0) -> str:
        """Send every bucket (ipc: publish `version` in the shared buffer); returns the checksum the receivers
        must report."""
        if self.pg is None:
            raise WeightSyncError("no weight group: call open() after a rendezvous first")
        send = (lambda: self._send_shared(version)) if self.backend == "ipc" else self._send_all
        try:
            return await asyncio.wait_for(in_daemon_thread(send), self.timeout_s + 5)
        except Exception as e:
            self.close()
            if self.buffer is not None:  # a receiver may still read it: never written again, the next
                self.buffer.close()      # rendezvous hands out a new one
                self.buffer = None
            raise WeightSyncError(f"weight broadcast failed: {type(e).__name__}: {str(e)[:300]}") from e

    def close(self) -> None:
        release_group(self.pg)
        self.pg, self._store = None, None


class WeightReceiver:
    """Actor side: drives the weight-transfer API of a vLLM engine (`AsyncLLM` or offline `LLM`)."""

    def __init__(self, engine, *, is_async: bool = True):
        self.engine = engine
        self.is_async = is_async
        self.plan: dict[str, Any] | None = None

    async def _rpc(self, method: str, **kwargs: Any) -> list[Any]:
        if self.is_async:
            return await self.engine.collective_rpc(method, kwargs=kwargs)
        return await asyncio.to_thread(self.engine.collective_rpc, method, kwargs=kwargs)

    async def join(self, info: dict[str, Any], rank_offset: int, plan: dict[str, Any]) -> None:
        self.plan = plan
        await self._rpc("init_weight_transfer_engine", init_info={**info, "rank_offset": rank_offset})

    async def track_requests(self) -> bool:
        """Make the workers count each request's generated tokens (for `output_counts`); False where the
        engine's model runner cannot."""
        return all(await self._rpc("brorl_track_requests"))

    async def output_counts(self) -> dict[str, int]:
        """Tokens generated so far by each request of the engine (its request ids), from the first worker
        (all of a tensor-parallel engine's workers hold the same requests)."""
        return (await self._rpc("brorl_output_counts"))[0]

    async def receive(self, version: int) -> tuple[int, str]:
        """Receive one update; returns (version, checksum) as loaded by the workers (all must agree)."""
        if self.plan is None:
            raise WeightSyncError("receive() before join(): no weight plan")
        await self._rpc("start_weight_update")
        await self._rpc("update_weights", update_info={**self.plan, "version": version})
        await self._rpc("finish_weight_update")
        states = await self._rpc("brorl_weight_state")
        if len({tuple(s) for s in states}) != 1:
            raise WeightSyncError(f"workers disagree after update {version}: {states}")
        v, checksum = states[0]
        return int(v), str(checksum)
