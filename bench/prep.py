"""The learner's host-side work of a step, alone (CPU, no model): `python -m bench.prep`.

A BroRL step of the paper's size: 65,536 samples (128 groups × N = 512), prompts of 256–1,024 tokens, completion
lengths log-normal (median 3,000 tokens, σ = 0.5, capped at 16,384), as the actors' groups arrive (wire arrays,
`transport/messages.py`). Everything the learner does on the host between a batch and the model, on 2 ranks
(rank 0 plans and hands rank 1 its share):

  now     wire arrays kept (`FlatGroup.from_wire`) -> `plan_step` (each rank's samples as flat arrays, its
          micro-batches as rows) -> rank 1's share as one byte buffer (`encode_share`; the gloo send itself
          not timed) and decoded -> every pass's tensors built (`learner.batch.build`; π_old's passes and the
          update passes, padded and packed layouts)
  before  the code before the tensors path (`_before_*`, kept here as it was): token lists
          (`.tolist()`) -> per-sample lists -> the shares pickled as `scatter_object_list` pickles them ->
          every pass's `pack` and log μ matrix, all before the first update

Each (path, size) runs in a fresh process: its time and its peak memory above the step's own data (the wire
arrays). The before path needs ~70 bytes of Python objects per token, so it runs at smaller sizes only and is
extrapolated linearly (its cost is per token). The GPU time of such a step is an ESTIMATE: its tokens (prompts
+ completions) at the learner bench's 35,900 tokens/s (`bench.learner --gpu`, 1.5B shape, one H200, 46.7 % MFU).
Writes bench/results/prep[_TAG].json and .png.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time

import numpy as np

H200_TOKENS_PER_S = 35_900.0
"""Learner tokens/s of a whole step (π_old and updates) on one H200, 1.5B shape (docs/benchmarks/learner.md)."""


def wire_groups(samples: int, n: int = 512, seed: int = 0) -> list:
    """`samples // n` groups as the learner receives them (`transport.wire.RolloutGroup`)."""
    from transport.wire import FINISH_REASONS, RolloutGroup

    rng = np.random.default_rng(seed)
    out = []
    for g in range(samples // n):
        lens = np.minimum(16_384, np.maximum(1, rng.lognormal(np.log(3000), 0.5, n))).astype(np.int32)
        total = int(lens.sum())
        correct = (np.arange(n) % 2).astype(np.uint8)
        out.append(RolloutGroup(
            group_id=f"a:0:{g}", prompt_id=g, actor_id="a", policy_version=0, verifier="v", verifier_version="1",
            prompt_ids=rng.integers(0, 151_936, int(rng.integers(256, 1025)), dtype=np.int32),
            lengths=lens, tokens=rng.integers(0, 151_936, total, dtype=np.int32),
            logprobs=-rng.random(total, dtype=np.float32), rewards=correct.astype(np.float32), correct=correct,
            finish=np.where(lens >= 16_384, FINISH_REASONS.index("length"), 0).astype(np.uint8)))
    return out


def _cfg(packing: bool):
    from config.schema import LearnerConfig

    return LearnerConfig(num_minibatches=4, micro_batch_tokens=32_768, packing=packing, lr=1e-6)


def _plan_args(world: int):
    import torch

    from learner.flops import ModelShape

    shape = ModelShape(params=1_310_000_000, layers=28, hidden=1536, vocab=151_936)  # Qwen2-1.5B
    return dict(world=world, generator=torch.Generator().manual_seed(0), max_tokens=16_384, lr=1e-6, shape=shape,
                reuse_old=True, reference=False)


def now_path(groups: list, world: int, packing: bool) -> dict:
    from learner.batch import build
    from learner.planning import FlatGroup, plan_step
    from learner.ranks import decode_share, encode_share

    t = {}
    t0 = time.perf_counter()
    flat = [FlatGroup.from_wire(g) for g in groups]
    t["wire_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, shares = plan_step(flat, _cfg(packing), **_plan_args(world))
    t["plan_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sent = [decode_share(*encode_share(s)) for s in shares[1:]]
    t["send_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    passes = 0
    for share in [shares[0], *sent]:  # every rank's passes: π_old's (mini-batches after the first), then the updates
        for j, mb in enumerate(share.minibatches):
            for m in mb * (1 if j == 0 else 2):
                build(share.table, m.rows, layout="packed" if packing else "padded")
                passes += 1
    t["build_s"] = time.perf_counter() - t0
    t["passes"] = passes
    return t


def _before_plan(groups: list, cfg, world: int, generator, shape) -> list:
    """The plan before the tensors path (learner/planning.py as it was), shares of list-holding passes."""
    import torch

    from learner.algorithm import reinforce_pp_advantages
    from learner.microbatch import even_out, micro_batches
    from learner.planning import rank_slice

    lists = [(g.prompt_ids.tolist(), [c.tolist() for c in g.completions()],
              [c.tolist() for c in g.completion_logprobs()], g.rewards.tolist()) for g in groups]
    rewards = torch.tensor([r for _, _, _, r in lists])
    adv = reinforce_pp_advantages(rewards, torch.ones(len(lists), dtype=torch.bool))
    prompts, comps, behav, sample_adv = [], [], [], []
    for gi, (p, cs, bs, _) in enumerate(lists):
        for i in range(len(cs)):
            prompts.append(p)
            comps.append(cs[i])
            behav.append(bs[i])
            sample_adv.append(adv[gi, i].item())
    S = len(prompts)
    order = torch.randperm(S, generator=generator)
    mbs = [order[i::cfg.num_minibatches].sort().values for i in range(cfg.num_minibatches)]
    seq_len = [len(p) + len(c) for p, c in zip(prompts, comps)]
    shares = [[] for _ in range(world)]
    for mb in mbs:
        idx = mb.tolist()
        total = sum(len(comps[i]) for i in idx)
        parts = [idx[slice(*rank_slice(len(idx), r, world))] for r in range(world)]
        micro = [micro_batches(p, seq_len, cfg.micro_batch_tokens) for p in parts]
        count = max(len(m) for m in micro)
        for r in range(world):
            passes = []
            for mi in even_out(micro[r], count):
                mine = sum(len(comps[i]) for i in mi) if mi is not None else 0
                mi = mi if mi is not None else micro[r][0][:1]
                passes.append(([prompts[i] for i in mi], [comps[i] for i in mi], [behav[i] for i in mi],
                               [sample_adv[i] for i in mi], world * mine / total))
            shares[r].append(passes)
    return shares


def before_path(groups: list, world: int) -> dict:
    import torch

    from learner.logprobs import pack

    a = _plan_args(world)
    t = {}
    t0 = time.perf_counter()
    shares = _before_plan(groups, _cfg(False), world, a["generator"], a["shape"])
    t["plan_s"] = time.perf_counter() - t0  # the lists (from_wire) included
    t0 = time.perf_counter()
    sent = [pickle.loads(pickle.dumps(("step", s))) [1] for s in shares[1:]]  # as scatter_object_list does
    t["send_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    passes = 0
    for share in [shares[0], *sent]:  # every pass built before the first update (π_old's too), kept
        kept = []
        for mb in share:
            for prompts, comps, behav, adv, _ in mb:
                packed = pack(prompts, comps)
                b = torch.zeros(packed.mask.shape, dtype=torch.float32)
                for r, lp in enumerate(behav):
                    b[r, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
                kept.append((packed, b, torch.tensor(adv)))
                passes += 1
        del kept
    t["build_s"] = time.perf_counter() - t0
    t["passes"] = passes
    return t


def case(path: str, samples: int, world: int, packing: bool, n: int = 512) -> dict:
    from bench.common import peak_rss_mb
    import learner.batch, learner.logprobs, learner.planning, learner.ranks  # noqa: F401,E401  (not timed)

    groups = wire_groups(samples, n)
    tokens = sum(int(g.lengths.sum()) + g.n * len(g.prompt_ids) for g in groups)
    data_mb = sum(g.tokens.nbytes + g.logprobs.nbytes for g in groups) / 2**20
    base = peak_rss_mb()
    t0 = time.perf_counter()
    r = now_path(groups, world, packing) if path == "now" else before_path(groups, world)
    total = time.perf_counter() - t0
    gpu_s = tokens / H200_TOKENS_PER_S
    return {"path": path, "layout": "packed" if packing else "padded", "samples": samples, "world": world,
            "seq_tokens": tokens, "host_s": total, **r, "extra_mb": peak_rss_mb() - base, "data_mb": data_mb,
            "extra_bytes_per_token": (peak_rss_mb() - base) * 2**20 / tokens, "gpu_s_estimate": gpu_s,
            "host_share_of_gpu": total / gpu_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="8192,65536", help="step sizes of the tensors path (comma-separated)")
    ap.add_argument("--before", default="2048,8192", help="step sizes of the before path (it holds ~70 bytes "
                    "of Python objects a token: keep them small)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(case(**json.loads(args.case))))
        return
    from bench.common import run_isolated, stamp, table, write_json

    rows = []
    plan = [("before", int(s), False) for s in args.before.split(",") if s]
    plan += [("now", int(s), p) for s in args.samples.split(",") if s for p in (False, True)]
    for path, samples, packing in plan:
        rows.append(run_isolated("bench.prep", ["--case", json.dumps({"path": path, "samples": samples, "world": 2,
                                                                      "packing": packing})], timeout=3600))
        r = rows[-1]
        print(f"  {path} {r['layout']} {samples}: {r['host_s']:.1f} s host, {r['extra_mb']:.0f} MiB extra",
              file=sys.stderr)
    big = max(int(s) for s in args.samples.split(","))
    before = [r for r in rows if r["path"] == "before"]
    if before:  # linear in tokens: the largest measured size's per-token cost
        b = max(before, key=lambda r: r["samples"])
        now_big = next(r for r in rows if r["path"] == "now" and r["samples"] == big)
        scale = now_big["seq_tokens"] / b["seq_tokens"]
        rows.append({**{k: b[k] for k in ("path", "layout", "world")}, "samples": big, "extrapolated": True,
                     "seq_tokens": now_big["seq_tokens"], "host_s": b["host_s"] * scale,
                     **{k: b[k] * scale for k in ("plan_s", "send_s", "build_s", "extra_mb")},
                     "extra_bytes_per_token": b["extra_bytes_per_token"], "gpu_s_estimate": now_big["gpu_s_estimate"],
                     "host_share_of_gpu": b["host_s"] * scale / now_big["gpu_s_estimate"]})
    cols = ["path", "layout", "samples", "extrapolated", "seq_tokens", "host_s", "plan_s", "send_s", "build_s",
            "extra_mb", "extra_bytes_per_token", "gpu_s_estimate", "host_share_of_gpu"]
    print("\nHost-side work of a step on 2 ranks (CPU), against the step's estimated GPU time on one H200 "
          f"({H200_TOKENS_PER_S:,.0f} tokens/s, the learner bench's 1.5B figure: an estimate)")
    print(table(rows, cols))
    path = write_json("prep" + (f"_{args.tag}" if args.tag else ""), {"rows": rows,
                                                                        "gpu_tokens_per_s": H200_TOKENS_PER_S})
    _plot(rows, path.with_suffix(".png"), stamp())
    print(f"\nwrote {path} and {path.with_suffix('.png')}")


def _plot(rows: list[dict], out, st: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (path, layout), style in ((("before", "padded"), "o--"), (("now", "padded"), "s-"), (("now", "packed"), "^-")):
        rs = sorted((r for r in rows if r["path"] == path and r["layout"] == layout), key=lambda r: r["samples"])
        if not rs:
            continue
        label = f"{path} ({layout})"
        axes[0].plot([r["samples"] for r in rs], [100 * r["host_share_of_gpu"] for r in rs], style, label=label)
        axes[1].plot([r["samples"] for r in rs], [r["extra_bytes_per_token"] for r in rs], style, label=label)
    axes[0].axhline(3, color="k", ls=":", label="3 % goal")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("samples per step (N = 512)")
        ax.legend()
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("host time / estimated H200 GPU time (%)")
    axes[1].set_ylabel("peak memory above the data (bytes per token)")
    fig.suptitle(f"Learner host-side step work, {st.get('cpu', 'cpu')[:40]}; before at 65,536 extrapolated",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
