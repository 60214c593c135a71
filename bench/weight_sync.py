"""Weight broadcast benchmark: time per policy update against parameter count.

    python -m bench.weight_sync [--quick]                    # CPU, gloo (this machine)
    python -m bench.weight_sync --backend nccl               # GPUs, NCCL (needs >= 2 GPUs)
    python -m bench.weight_sync --backend ipc [--sizes 1.5e9] # the learner's shared buffer: GPU 0 if any, else CPU

ipc: the learner packs into its persistent shared buffer (CUDA IPC on GPU 0, shared with each receiver on
the same GPU; POSIX shared memory on CPU) and waits for every receiver's acknowledgement; each receiver maps
the buffer once, then per update checksums every bucket in place (the engine would load from the same views).
There is no wire: `wire_s` is the receivers' side (word sent to last acknowledgement).

The learner side is the real `WeightBroadcaster` (bucket plan, packing, per-bucket checksum); each
receiver is a separate process that joins the same kind of process group the vLLM workers join
(`transport.weights.open_group`), receives every bucket and checksums it as our vLLM weight-transfer
engine does, then reports the checksum, which must equal the learner's. The receivers do not copy the
buckets into a model (that is vLLM's `load_weights`, a device-local copy the engine pays either way).
Parameters are bf16 tensors of at most 4 Mi elements (Qwen2-1.5B has 338 tensors; 1.5 B here gives 358).

Each update is sent twice: by `WeightBroadcaster.broadcast` (pack, checksum and send, pipelined so that a
bucket is packed while the previous one is on the wire), then as the same bytes packed beforehand, sent
bucket after bucket with nothing else to do: the wire time. Reports, per (parameters, receivers): the
median of `--updates` of each, their ratio (the issue's goal on GPUs: ≤ 1.5), the learner's host time
spent packing, checksumming and waiting, and GB/s on the wire. Writes bench/results/weight_sync[_nccl].json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 4 * 2**20


def make_params(n_params: int, device: str) -> list[tuple[str, torch.Tensor]]:
    out, left, i = [], int(n_params), 0
    g = torch.Generator(device=device).manual_seed(0)
    while left > 0:
        k = min(CHUNK, left)
        t = torch.randn(k, generator=g, dtype=torch.float32, device=device).to(torch.bfloat16)
        out.append((f"layer.{i}.weight", t))
        left -= k
        i += 1
    return out


def receiver(spec_path: str) -> None:
    from transport.weights import WeightPlan, open_group, receive_buckets

    spec = json.loads(Path(spec_path).read_text())
    rank, backend = spec["rank"], spec["backend"]
    if backend == "ipc":
        return ipc_receiver(spec)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    plan = WeightPlan(**spec["plan"])
    pg, _store = open_group(spec["host"], spec["port"], rank, spec["world"], spec["group"], 120.0, backend)
    for _ in range(2 * spec["updates"]):  # each update: the broadcast, then its wire-only copy
        print(json.dumps({"checksum": receive_buckets(pg, plan, device)}), flush=True)


def ipc_receiver(spec: dict) -> None:
    from transport.ipc import OpenedBuffer, acknowledge, await_shared, read_shared
    from transport.weights import WeightPlan, open_group

    plan = WeightPlan(**spec["plan"])
    pg, _store = open_group(spec["host"], spec["port"], spec["rank"], spec["world"], spec["group"], 120.0, "gloo")
    buf = OpenedBuffer(spec["buffer"])
    for v in range(1, spec["updates"] + 1):
        await_shared(pg, v)
        checksum = read_shared(buf.tensor, plan)
        if buf.tensor.is_cuda:
            torch.cuda.synchronize()
        acknowledge(pg, v, True)
        print(json.dumps({"checksum": checksum}), flush=True)


def wire_only(pg, flats: list, timeout_s: float) -> None:
    """The prepared buckets, each started as soon as the previous one has arrived: the wire's own time."""
    from transport.weights import start_bucket

    for flat in flats:
        start_bucket(pg, flat, timeout_s=timeout_s)()
    if flats and flats[0].is_cuda:
        torch.cuda.synchronize(flats[0].device)


def case(n_params: int, receivers: int, updates: int, backend: str, bucket_mb: float) -> dict:
    from transport.weights import WeightBroadcaster, pack_bucket
    from transport.ports import free_port

    device = "cuda:0" if backend == "nccl" or (backend == "ipc" and torch.cuda.is_available()) else "cpu"
    params = make_params(n_params, device)
    wb = WeightBroadcaster(lambda: params, bucket_mb=bucket_mb, timeout_s=300.0, backend=backend, device=device)
    info, offsets = wb.rendezvous_info(free_port(), [1] * receivers)
    tmp = Path(tempfile.mkdtemp(prefix="wsync-"))
    procs = []
    for off in offsets:
        spec = {"rank": off, "backend": backend, "plan": wb.plan.to_dict(), "host": info["master_address"],
                "port": info["master_port"], "world": info["world_size"], "group": info["group_name"],
                "updates": updates, **({"buffer": info["buffers"][off - 1]} if backend == "ipc" else {})}
        (tmp / f"{off}.json").write_text(json.dumps(spec))
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.weight_sync", "--receiver", str(tmp / f"{off}.json")],
                                      cwd=ROOT, stdout=subprocess.PIPE, text=True))

    tensors = [t for _, t in params]
    flats = [] if backend == "ipc" else [pack_bucket(tensors[a:b], n, device) for a, b, n in wb.plan.buckets]

    async def go():
        await wb.open(info)
        rows = []
        for v in range(1, updates + 1):
            if backend == "ipc":  # no wire: the receivers' side is the wait for their acknowledgements
                t0 = time.perf_counter()
                checksum = await wb.broadcast(v)
                rows.append({"total_s": time.perf_counter() - t0, "wire_s": wb.last_split["wait_s"],
                             **wb.last_split, "checksum": checksum})
                continue
            t0 = time.perf_counter()
            checksum = await wb.broadcast()
            total = time.perf_counter() - t0
            t0 = time.perf_counter()
            await asyncio.to_thread(wire_only, wb.pg, flats, 300.0)
            rows.append({"total_s": total, "wire_s": time.perf_counter() - t0, **wb.last_split, "checksum": checksum})
        return rows

    try:
        rows = asyncio.run(go())
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    got = [[json.loads(l)["checksum"] for l in o.splitlines() if l.startswith("{")] for o in outs]
    expected = [r["checksum"] for r in rows for _ in range(1 if backend == "ipc" else 2)]  # (the wire-only copy too)
    nbytes = sum(t.numel() * t.element_size() for _, t in params)
    med = {k: statistics.median(r[k] for r in rows) for k in ("total_s", "wire_s", "pack_s", "checksum_s", "wait_s")}
    return {"backend": backend, "params": n_params, "GB": nbytes / 1e9, "receivers": receivers,
            "buckets": len(wb.plan.buckets), "updates": updates, **med,
            "total_over_wire": med["total_s"] / med["wire_s"], "wire_GB_per_s": nbytes / 1e9 / med["wire_s"],
            "checksums_match": all(g == expected for g in got)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--backend", choices=["gloo", "nccl", "ipc"], default="gloo")
    ap.add_argument("--sizes", help="parameter counts, comma-separated (e.g. 1.5e9); default: the backend's sweep")
    ap.add_argument("--receivers", help="receiver counts, comma-separated; default: the backend's")
    ap.add_argument("--tag", default="", help="suffix of the results' file names")
    ap.add_argument("--bucket-mb", type=float, default=256.0, help="as learner.weight_bucket_mb")
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--receiver", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.receiver:
        receiver(args.receiver)
        return
    from bench.common import table, write_json

    if args.backend == "nccl":
        sizes = [10**7, 10**8, 5 * 10**8, 15 * 10**8, 7 * 10**9]
        max_recv = min(torch.cuda.device_count() - 1, 3)
        receivers = sorted({1, max_recv})
    elif args.backend == "ipc" and torch.cuda.is_available():
        sizes, receivers = [10**7, 10**8, 5 * 10**8, 15 * 10**8], [1]
    else:
        sizes = [10**6, 10**7, 10**8] + ([] if args.quick else [5 * 10**8, 15 * 10**8])
        receivers = [1, 2]
    if args.sizes:
        sizes = [int(float(x)) for x in args.sizes.split(",")]
    if args.receivers:
        receivers = [int(x) for x in args.receivers.split(",")]
    rows = []
    for n in sizes:
        for k in receivers:
            rows.append(case(n, k, args.updates, args.backend, args.bucket_mb))
            r = rows[-1]
            print(f"  {n:.0e} params, {k} receiver(s): {r['total_s']:.3f} s (wire {r['wire_s']:.3f} s)", file=sys.stderr)
    print(f"\nWeight broadcast, {args.backend}, bf16, buckets of {args.bucket_mb:g} MiB, median of {args.updates} updates")
    print(table(rows, ["params", "GB", "receivers", "buckets", "total_s", "wire_s", "total_over_wire", "pack_s",
                       "checksum_s", "wait_s", "wire_GB_per_s", "checksums_match"]))
    name = "weight_sync" + ("" if args.backend == "gloo" else f"_{args.backend}") + (f"_{args.tag}" if args.tag else "")
    path = write_json(name, {"bucket_mb": args.bucket_mb, "rows": rows})
    _plot(rows, path.with_suffix(".png"), args.backend)
    print(f"\nwrote {path}")


def _plot(rows, out, backend) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k in sorted({r["receivers"] for r in rows}):
        rs = [r for r in rows if r["receivers"] == k]
        ax.plot([r["params"] for r in rs], [r["total_s"] for r in rs], "o-", label=f"{k} receiver(s), total")
        ax.plot([r["params"] for r in rs], [r["wire_s"] for r in rs], "x--", label=f"{k} receiver(s), wire only")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters (bf16)")
    ax.set_ylabel("seconds per update (median)")
    ax.set_title(f"weight broadcast, {backend}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
