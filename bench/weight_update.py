"""One weight update into a real vLLM engine, end to end: the learner's packing, the engine's workers loading it
by vLLM's layerwise reload, and their (version, checksum) report — on one GPU shared by both.

    python -m bench.weight_update --shape qwen2-1.5b --backend ipc --tag h200      # the one-GPU fast path
    python -m bench.weight_update --shape qwen2-1.5b --backend gloo --tag h200     # what it replaces
    python -m bench.weight_update --shape small --backend ipc                      # CPU: a small shaped model

The engine is built as an actor's (`actors.engine.engine_kwargs`, the `--preset`'s actor settings, a small KV
cache beside the learner's copy); the learner's side is the real `WeightBroadcaster` over a copy of the model
in float32 on the same device, sending in the model's dtype. One rendezvous (the ipc handle goes out once),
then `--updates` updates per reload route, each changing the weights: per update the time from the learner's
start to the workers' reported checksum (`total_s`), the learner's packing and its wait for the
acknowledgements (ipc) or the wire (gloo), and the worker's own split (`brorl_weight_timings`: start, wait for
the learner's word, `load_weights`, finish). `--reload auto,layerwise` (the default) measures the route the
actor takes (in place where `transport.vllm_ext.direct_reload` allows it), then vLLM's layerwise reload on the
same engine. Writes bench/results/weight_update_<backend>[_<tag>].json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time


def measure(shape: str, backend: str, updates: int, preset: str, kv_gib: float,
            reloads: tuple[str, ...] = ("auto", "layerwise")) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    from actors.engine import engine_kwargs, offline_env
    from bench.e2e import model_dir
    from config.loader import load_config
    from transport.ports import free_port
    from transport.weights import WeightBroadcaster, WeightReceiver

    offline_env()
    gpu = torch.cuda.is_available()
    path = model_dir(shape)
    cfg = load_config(preset if gpu else "tiny-cpu", {"model.path": path, "transport.weight_backend": backend,
                                                      "verifiers.task": "throughput:0.5:128",
                                                      **({"actor.kv_cache_gib": kv_gib,
                                                          "actor.gpu_memory_utilization": 0.45} if gpu else {})})
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(cfg.model, cfg.actor, weight_backend=backend))
    start_s = time.perf_counter() - t0
    dev = torch.device("cuda:0" if gpu else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev)
    serving = getattr(torch, cfg.model.dtype) if cfg.model.dtype in ("bfloat16", "float16", "float32") else None
    params = list(model.parameters())
    bc = WeightBroadcaster(lambda: model.state_dict().items(), bucket_mb=cfg.transport.weight_bucket_mb,
                           timeout_s=300, backend=backend, dtype=serving, device=dev)
    rx = WeightReceiver(llm, is_async=False)

    async def run() -> list[dict]:
        info, offs = bc.rendezvous_info(free_port(), [1], names=["engine"])
        t = time.perf_counter()
        await asyncio.gather(bc.open(info), rx.join(info, offs[0], bc.plan.to_dict()))
        rows = [{"join_s": time.perf_counter() - t}]
        v = 0
        for mode in reloads:
            llm.collective_rpc("brorl_set_reload", kwargs={"mode": mode})
            for _ in range(updates):
                v += 1
                with torch.no_grad():
                    params[v % len(params)].add_(1e-3)  # a new version: some weights change
                t = time.perf_counter()
                sent, got = await asyncio.gather(bc.broadcast(v), rx.receive(v))
                total = time.perf_counter() - t
                worker = llm.collective_rpc("brorl_weight_timings")[0]
                rows.append({"version": v, "reload": mode, "total_s": total, **bc.last_split,
                             "worker": worker, "checksum_ok": got == (v, sent)})
        return rows

    rows = asyncio.run(run())
    ups = rows[1:]
    gb = sum(n for *_, n in bc.plan.buckets) / 1e9
    routes = by_route(ups, reloads)
    first = routes[reloads[0]]
    out = {"shape": shape, "backend": backend, "device": torch.cuda.get_device_name(0) if gpu else "cpu",
           "GB": gb, "buckets": len(bc.plan.buckets), "engine_start_s": start_s, "join_s": rows[0]["join_s"],
           "updates": ups, "routes": routes, **{k: first[k] for k in ("median_s", "min_s", "max_s", "pack_s", "wait_s")},
           "checksums_match": all(r["checksum_ok"] for r in ups),
           "buffer_GB": gb if backend == "ipc" else 0.0}
    llm.llm_engine.engine_core.shutdown()
    return out


def by_route(ups: list[dict], reloads) -> dict[str, dict]:
    """Per reload route, over its updates after the first (the first may pay one-time costs): the update's
    median, min and max, the learner's packing and wait, and the worker's split, medians all."""
    routes = {}
    for mode in reloads:
        mine = [r for r in ups if r["reload"] == mode]
        mine = mine[1:] or mine

        def med(key: str, worker: bool = False) -> float:
            return statistics.median((r["worker"] if worker else r).get(key, 0.0) for r in mine)

        routes[mode] = {"route": mine[-1]["worker"].get("route"), "why": mine[-1]["worker"].get("why"),
                        "median_s": med("total_s"), "min_s": min(r["total_s"] for r in mine),
                        "max_s": max(r["total_s"] for r in mine), "pack_s": med("pack_s"), "wait_s": med("wait_s"),
                        **{k: med(k, worker=True) for k in ("start_s", "await_s", "load_s", "receive_s", "finish_s")}}
    return routes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2-1.5b", help="tinymodel.shaped shape (bench.e2e's models)")
    ap.add_argument("--backend", choices=["ipc", "gloo", "nccl"], default="ipc")
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--preset", default="brorl-1.5b", help="the actor settings of the engine (GPU)")
    ap.add_argument("--kv-gib", type=float, default=4.0, help="the engine's KV cache, GiB (GPU)")
    ap.add_argument("--reload", default="auto,layerwise",
                    help="the workers' reload routes, in order: auto (the actor's), layerwise (vLLM's, always)")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    from bench.common import table, write_json

    r = measure(a.shape, a.backend, a.updates, a.preset, a.kv_gib, tuple(a.reload.split(",")))
    print(f"{a.backend}, {r['shape']} ({r['GB']:.2f} GB in {r['buckets']} buckets) on {r['device']}: learner "
          f"packing {r['pack_s']:.3f} s; join {r['join_s']:.2f} s; checksums match: {r['checksums_match']}",
          file=sys.stderr)
    print(table([{"reload": m, "route": x["route"], "update s (median)": x["median_s"], "min s": x["min_s"],
                  "max s": x["max_s"], "worker start s": x["start_s"], "wait s": x["await_s"],
                  "load_weights s": x["load_s"], "finish s": x["finish_s"], "why layerwise": x["why"] or "-"}
                 for m, x in r["routes"].items()],
                ["reload", "route", "update s (median)", "min s", "max s", "worker start s", "wait s",
                 "load_weights s", "finish s", "why layerwise"]))
    path = write_json(f"weight_update_{a.backend}" + (f"_{a.tag}" if a.tag else ""), r)
    _plot(r, path.with_suffix(".png"))
    print(f"wrote {path}")


def _plot(r: dict, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ups = r["updates"]
    for mode in dict.fromkeys(u.get("reload", "auto") for u in ups):
        mine = [u for u in ups if u.get("reload", "auto") == mode]
        ax.bar([u["version"] for u in mine], [u["total_s"] for u in mine],
               label=f"end to end, {mode} ({mine[-1].get('worker', {}).get('route', '?')})")
    ax.bar([u["version"] for u in ups], [u["pack_s"] for u in ups], label="learner packing")
    ax.set_xlabel("update (version)")
    ax.set_ylabel("seconds")
    ax.set_title(f"weight update, {r['backend']}, {r['shape']} ({r['GB']:.2f} GB), {r['device']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
