"""The learner at the paper's scale, on GPUs: `python -m bench.learner --gpu` (one GPU; the scaling case
starts 1, 2 and 4 ranks, as many as there are GPUs).

A locally built Qwen2-1.5B-shaped model (random initialisation, float32 master weights) and synthetic
groups (random tokens; a third of each group correct), trained with the `brorl-1.5b` preset's learner
settings (DeepSpeed ZeRO-2, bf16 autocast, 65,536-token micro-batches, activation checkpointing, 4 PPO
mini-batches) unless a case says otherwise. Each case runs in a fresh process (its own peak memory).

Cases:
  longest   one group of N = 512 with 8 completions of L tokens and 504 of 256: the longest L that trains
  mfu       learner tokens/s and model FLOPs utilisation at 4,096-token responses (the second step timed),
            with activation checkpointing (the preset) and without (8,192-token micro-batches), each eager
            and compiled (`learner.compile`; the third step timed, after two that compile)
  shared    the shared prompt (`learner.share_prompt`) against the unshared step: N = 512 with 2,048-token
            prompts and 1,024-token completions, and the paper's shape (256-token prompts, 4,096-token
            completions, N = 64: the saving per sample does not depend on N once a pass holds a group)
  preset    (tests/gpu) one step with a preset's learner settings and N: the paper's presets train on a GPU
  scale     ZeRO-2 on 1, 2 and 4 ranks (as many as there are GPUs), the same step (8 groups × N = 64, 256 + 1,024 tokens), second step timed
  kernels   (`--kernels SET`, merged into the mfu rows) the log-prob paths (`learner.logprob_kernel`: off with the
            logits kept, chunked, liger) and Liger's layer kernels (`learner.liger_kernels`) over the best one-GPU
            settings (torch, no recomputation, 32k-token micro-batches, compiled; the second step timed), on the
            fixed 4,096-token case and on realistic lengths (`REALISTIC`: 8 groups × N = 8, prompts 256–1k,
            completions log-normal around 3k, cut at 16k); `packed` and `packed-compiled`: padded against packed
            passes (`learner.packing`) on realistic lengths, uncompiled both and compiled both. Tokens/s and MFU
            count real tokens only: padding is waste.

Model FLOPs of a step: the learner's own count (`learner/flops.py`: per sample, the training forward and
backward, π_old's forward outside the first mini-batch; recomputation does not count). MFU = those FLOPs /
step time / the card's dense bf16 peak (H100 and H200 SXM: 989 TFLOP/s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from learner.flops import peak_flops
from tinymodel.shaped import SHAPES

QWEN_15B = {k: SHAPES["qwen2-1.5b"][k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                 "num_attention_heads", "num_key_value_heads", "vocab_size")}


def model_15b(device: str, max_len: int = 40_960):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**QWEN_15B, max_position_embeddings=max_len, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    with torch.device(device):
        return Qwen2ForCausalLM(cfg).float()


def synthetic_groups(groups: int, n: int, prompt_len: int, comp_lens: list[int], vocab: int, seed: int = 0):
    """`groups` groups of n completions; completion i has comp_lens[i % len(comp_lens)] tokens."""
    import torch

    from learner.planning import TrainGroup

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(groups):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        comps = [torch.randint(0, vocab, (comp_lens[i % len(comp_lens)],), generator=g).tolist() for i in range(n)]
        correct = [i % 3 == 0 for i in range(n)]
        out.append(TrainGroup(prompt, comps, [[-3.0] * len(c) for c in comps], [float(c) for c in correct], correct))
    return out


REALISTIC = {"prompt": (256, 1024), "completion_median": 3000, "completion_sigma": 0.6, "completion_cap": 16_384}
"""The realistic case's lengths: prompts uniform in [256, 1024] tokens (one per group), completions log-normal
around a 3k median (σ = 0.6 in log space: half of them within 2–4.5k) and cut at 16k, as a reasoning model's are."""


def realistic_lengths(groups: int, n: int, seed: int = 0) -> list[tuple[int, list[int]]]:
    """(prompt length, n completion lengths) of each group, drawn from `REALISTIC` (seeded: the same every run)."""
    import math
    import random

    rng = random.Random(seed)
    lo, hi = REALISTIC["prompt"]
    mu = math.log(REALISTIC["completion_median"])
    return [(rng.randint(lo, hi), [max(16, min(REALISTIC["completion_cap"], round(rng.lognormvariate(
        mu, REALISTIC["completion_sigma"])))) for _ in range(n)]) for _ in range(groups)]


def realistic_groups(groups: int, n: int, vocab: int, seed: int = 0):
    """Synthetic groups with `realistic_lengths` (random tokens; a third of each group correct)."""
    out = []
    for i, (prompt, comps) in enumerate(realistic_lengths(groups, n, seed)):
        out += synthetic_groups(1, n, prompt, comps, vocab, seed=seed + i)
    return out


ONLY_LEARNER = {"verifiers.task": "synthetic"}
"""The learner alone is measured on synthetic groups: the presets' own data (`data.train`, which they require)
is not read, so a generator stands in for it."""


def preset_learner(preset: str = "brorl-1.5b", **over):
    from config.loader import load_config

    cfg = load_config(preset, {**ONLY_LEARNER, **{f"learner.{k}": v for k, v in over.items()}})
    return cfg.learner


def run_step(groups, learner_cfg, steps: int = 1, ranks=None, profile: bool = False) -> dict:
    """Build the model and the trainer as the learner does, run `steps` steps; time the last. `profile`: the
    last step under torch.profiler too (after a timed one), its 20 costliest GPU kernels in the result."""
    import torch

    from config.schema import JobConfig
    from learner.train_step import Trainer

    model = model_15b(learner_cfg.device)
    job = JobConfig(n_samples=len(groups[0].rewards), prompts_per_step=len(groups))  # the step is the groups given
    tr = Trainer(model, learner_cfg, job, compute_dtype=torch.bfloat16, ranks=ranks)
    if ranks is not None and ranks.rank > 0:
        ranks.follow(tr)
        return {}
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = tr.step(groups)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    top = _profiled(lambda: tr.step(groups)) if profile else None
    if ranks is not None:
        ranks.stop_followers()
    flops = m["model_tflops"] * 1e12 * m["train_s"]  # the step's own count (learner/flops.py)
    seq_tokens = sum(len(g.prompt_ids) + len(c) for g in groups for c in g.completion_ids)
    world = ranks.world if ranks is not None else 1
    return {"seconds": dt, "samples": sum(len(g.rewards) for g in groups), "seq_tokens": seq_tokens,
            "response_tokens": m["train_tokens"], "tokens_per_s": seq_tokens / dt, "tflops": flops / dt / 1e12,
            "mfu": flops / dt / (world * (peak_flops(learner_cfg.device) or float("nan"))),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "micro_batches": m["micro_batches"],
            "padding_frac": m["padding_frac"], "decoder_tokens": m["decoder_tokens"], "loss": m["loss"],
            "ok": True, **({"profile": top} if top else {})}


def _profiled(step) -> list[dict]:
    """One step under torch.profiler: the kernels by GPU time, the top 20 with their share of the step's."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in rows) or 1.0
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30), file=sys.stderr)
    return [{"kernel": e.key[:120], "ms": e.self_device_time_total / 1e3, "share": e.self_device_time_total / total,
             "calls": e.count} for e in rows[:20]]


def case(kind: str, p: dict) -> dict:
    import torch

    if kind == "longest":
        lc = preset_learner(p.get("preset", "brorl-1.5b"))
        groups = synthetic_groups(1, 512, 256, [p["L"]] * 8 + [256] * 504, QWEN_15B["vocab_size"])
        try:
            r = run_step(groups, lc)
        except torch.OutOfMemoryError as e:
            return {"L": p["L"], "ok": False, "error": str(e)[:200]}
        return {"L": p["L"], "preset": p.get("preset", "brorl-1.5b"), **r}
    if kind == "mfu":
        over = {k: v for k, v in p.items() if k in ("activation_checkpointing", "activation_checkpointing_fraction",
                                                     "micro_batch_tokens", "share_prompt", "compile", "backend",
                                                     "logprob_recompute", "logprob_kernel", "liger_kernels",
                                                     "logprob_chunk_mb", "packing")}
        lc = preset_learner(**over)
        if p.get("lengths") == "realistic":
            groups = realistic_groups(p["groups"], p["n"], QWEN_15B["vocab_size"])
        else:  # "completions": a list of lengths the group's completions cycle through (else all `completion` long)
            groups = synthetic_groups(p["groups"], p["n"], p["prompt"], p.get("completions") or [p["completion"]],
                                      QWEN_15B["vocab_size"])
        try:
            return {**p, **run_step(groups, lc, steps=p.get("steps", 1), profile=p.get("profile", False))}
        except torch.OutOfMemoryError as e:
            return {**p, "ok": False, "error": str(e)[:200], "tokens_per_s": 0.0, "mfu": 0.0}
    if kind == "preset":  # one step with a preset's own learner settings and its group size N
        from config.loader import load_config

        n = load_config(p["preset"], ONLY_LEARNER).job.n_samples
        lc = preset_learner(p["preset"])
        groups = synthetic_groups(p["groups"], n, p["prompt"], p["completions"], QWEN_15B["vocab_size"])
        return {**p, "n": n, **run_step(groups, lc)}
    if kind == "scale":
        from learner.ranks import join_ranks  # noqa: F401  (the env is set by `ranks`)
        from config.loader import load_config

        cfg = load_config("brorl-1.5b", {**ONLY_LEARNER, "job.prompts_per_step": p["groups"], "job.n_samples": p["n"],
                                         "learner.devices": int(os.environ.get("WORLD_SIZE", "1"))})
        cfg, ranks = join_ranks(cfg)
        groups = synthetic_groups(p["groups"], p["n"], p["prompt"], [p["completion"]], QWEN_15B["vocab_size"])
        return {**p, "ranks": ranks.world, **run_step(groups, cfg.learner, steps=2, ranks=ranks)}
    raise ValueError(kind)


def side_by_side(one, kind: str, cases: list[dict]) -> list[dict]:
    """Run the cases, each in its own process on a GPU of its own, as many at once as there are GPUs
    (one at a time on one GPU); results in the cases' order. A case uses one GPU only, so its time does
    not depend on what the others do."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from config.placement import visible_env

    gpus = queue.Queue()
    for g in range(max(1, torch.cuda.device_count())):
        gpus.put(g)

    def on_a_gpu(p: dict) -> dict:
        g = gpus.get()
        try:
            try:
                r = one(kind, p, {"CUDA_VISIBLE_DEVICES": visible_env([g], os.environ.get("CUDA_VISIBLE_DEVICES"))})
            except RuntimeError as e:  # the case's process failed: a row saying why, the others still run and are kept
                print(f"  {kind} {p}: FAILED\n{e}", file=sys.stderr)
                return {**p, "ok": False, "error": str(e)[-300:], "tokens_per_s": 0.0, "mfu": 0.0}
            print(f"  {kind} {p}: {r.get('tokens_per_s', 0):.0f} tokens/s, MFU {r.get('mfu', 0):.3f}", file=sys.stderr)
            return r
        finally:
            gpus.put(g)

    with ThreadPoolExecutor(gpus.qsize()) as ex:
        return list(ex.map(on_a_gpu, cases))


def ranks(world: int, args: list[str], timeout: float = 1200) -> dict:
    """`python -m bench.learner args` as `world` ranks (torch.distributed env); rank 0's JSON line."""
    from transport.ports import free_port

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    procs = [subprocess.Popen([sys.executable, "-m", "bench.learner", *args], cwd=root, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(world)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"bench.learner {args} rank failed:\n{e[-3000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


BEST_ONE_GPU = {"groups": 2, "n": 32, "prompt": 256, "completion": 4096, "steps": 2, "compile": True,
                "backend": "torch", "activation_checkpointing": False, "micro_batch_tokens": 32768}
KEPT = {"logprob_kernel": "off", "logprob_recompute": False}  # today's best: the LM head's logits kept for backward
REAL = {"lengths": "realistic", "groups": 8, "n": 8}
EAGER = {"compile": False, "micro_batch_tokens": 16384}  # uncompiled layers keep more activations: 16k-token passes
KERNEL_SETS = {
    "fixed": [KEPT, {"logprob_kernel": "chunked"}],
    # Liger's layer kernels run uncompiled (torch.compile cannot trace them): against uncompiled layers, 16k passes
    "fixed-liger": [{"logprob_kernel": "liger"}, {**EAGER, "logprob_kernel": "chunked"},
                    {**EAGER, "logprob_kernel": "chunked", "liger_kernels": True}],
    "fixed-memory": [{"logprob_kernel": "chunked", "micro_batch_tokens": 65536},
                     {"logprob_kernel": "chunked", "logprob_chunk_mb": 2048}],
    "realistic": [{**REAL, **KEPT}, {**REAL, "logprob_kernel": "chunked"}],
    "realistic-liger": [{**REAL, "logprob_kernel": "liger"}],
    # uncompiled all (the first packed runs were uncompiled; uncompiled layers keep more activations: 16k-token
    # passes): what padding's masked attention costs against varlen attention, then with Liger's layer kernels
    "packed": [{**REAL, **EAGER, "logprob_kernel": "chunked"}, {**REAL, **EAGER, "logprob_kernel": "chunked", "packing": True},
               {**REAL, **EAGER, "logprob_kernel": "chunked", "packing": True, "liger_kernels": True}],
    # compiled packed passes at 16k and 32k tokens (the compiled padded case at 32k is `realistic`'s chunked row),
    # without Liger's layer kernels (refused with compile)
    "packed-compiled": [{**REAL, "logprob_kernel": "chunked", "micro_batch_tokens": 16384, "liger_kernels": False,
                         "packing": True},
                        {**REAL, "logprob_kernel": "chunked", "micro_batch_tokens": 32768, "liger_kernels": False,
                         "packing": True}],
}
"""`--kernels SET`: the rows each set adds over `BEST_ONE_GPU` (one lease command each, under 4 minutes)."""


def main(quick: bool = False, only: str = "", mfu_add: str = "", tag: str = "", kernels: str = "") -> None:
    """Every case (or those named in `only`, comma-separated: longest, mfu, shared, scale; the others are
    kept from bench/results/learner_gpu[_TAG].json, so a sweep can be run in parts). `mfu_add`: a JSON list of
    settings over the compiled MFU case, run and merged into the kept MFU rows. `tag`: the results file's
    suffix (another card's rows in a file of their own)."""
    import torch

    from bench.common import RESULTS, run_isolated, stamp, table, write_json

    if kernels:
        if kernels not in KERNEL_SETS:
            raise SystemExit(f"--kernels {kernels!r}: expected one of {', '.join(KERNEL_SETS)}")
        if mfu_add:
            raise SystemExit("--kernels and --mfu-add: give one of them")
        mfu_add = json.dumps([{**BEST_ONE_GPU, **o} for o in KERNEL_SETS[kernels]])
    gpus = torch.cuda.device_count()
    want = set(only.split(",")) if only else ({"mfu"} if mfu_add else {"longest", "mfu", "shared", "scale"})
    keep = only or mfu_add
    name = "learner_gpu" + (f"_{tag}" if tag else "")
    old = json.loads((RESULTS / f"{name}.json").read_text()) if keep and (RESULTS / f"{name}.json").exists() else {}
    one = lambda kind, p, env=None: run_isolated("bench.learner", ["--case", f"gpu-{kind}:{json.dumps(p)}"],  # noqa: E731
                                                 timeout=1800, env=env)
    longest, mfu, shared, scale = (old.get(k, []) for k in ("longest", "mfu", "shared", "scale"))
    if "longest" in want:
        longest = [one("longest", {"L": L}) for L in ((16_384,) if quick else (8_192, 16_384, 32_768))]
    shape = {"groups": 2, "n": 32, "prompt": 256, "completion": 4096, "steps": 2}
    compiled = {**shape, "steps": 3, "compile": True}  # steps 1-2 compile the shapes
    if mfu_add:
        try:
            extra = [{**compiled, **o} for o in json.loads(mfu_add)]
        except (ValueError, TypeError) as e:
            raise SystemExit(f"--mfu-add {mfu_add!r}: expected a JSON list of objects ({e})")
        new = side_by_side(one, "mfu", extra)
        mfu = [r for r in mfu if mfu_label(r) not in {mfu_label(n) for n in new}] + new
    elif "mfu" in want:
        no_ckpt = {"activation_checkpointing": False, "micro_batch_tokens": 8192}
        mfu = side_by_side(one, "mfu", [
            {**shape, "compile": False}, {**shape, **no_ckpt, "compile": False}, compiled,
            {**compiled, **no_ckpt}, {**compiled, "backend": "torch"},
            *({**compiled, "activation_checkpointing_fraction": f} for f in (0.75, 0.5)),
            {**compiled, "activation_checkpointing_fraction": 0.5, "micro_batch_tokens": 32768}])
    for shape in ({"groups": 1, "n": 512, "prompt": 2048, "completion": 1024},
                  {"groups": 1, "n": 64, "prompt": 256, "completion": 4096}):
        if "shared" not in want:
            break
        if shape["n"] == 512:
            shared = []
        if quick and shape["n"] == 512:
            shape = {**shape, "n": 128}
        base = one("mfu", {**shape, "compile": False})  # eager both (the shared prompt is not compiled)
        mine = one("mfu", {**shape, "share_prompt": True, "compile": False})
        print(f"  shared {shape}: {base['tokens_per_s']:.0f} -> {mine['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
        shared.append({**shape, "unshared_tok_s": base["tokens_per_s"], "shared_tok_s": mine["tokens_per_s"],
                       "speedup": mine["tokens_per_s"] / base["tokens_per_s"],
                       "decoder_tokens_ratio": base["decoder_tokens"] / mine["decoder_tokens"],
                       "unshared_s": base["seconds"], "shared_s": mine["seconds"]})
    if "scale" in want and gpus >= 2:
        scale = []
        p = {"groups": 4 if quick else 8, "n": 64, "prompt": 256, "completion": 1024}
        for w in (w for w in (1, 2, 4) if w <= gpus):
            scale.append(ranks(w, ["--case", f"gpu-scale:{json.dumps(p)}"]))
            print(f"  scale {w} ranks: {scale[-1]['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
        for r in scale:
            r["speedup"] = r["tokens_per_s"] / scale[0]["tokens_per_s"]

    print("\nLongest response that trains, N = 512 (8 completions of L tokens, 504 of 256), brorl-1.5b settings")
    print(table(longest, ["L", "ok", "seconds", "peak_gib", "tokens_per_s", "micro_batches"]))
    print("\nThroughput and MFU at 4,096-token responses (64 samples, 256-token prompts)")
    print(table(mfu, ["activation_checkpointing", "activation_checkpointing_fraction", "micro_batch_tokens", "backend",
                      "compile", "packing", "seconds", "tokens_per_s", "tflops", "mfu", "padding_frac", "peak_gib"]))
    print("\nShared prompt: tokens/s of the whole step, unshared against shared")
    print(table(shared, ["n", "prompt", "completion", "unshared_tok_s", "shared_tok_s", "speedup",
                         "decoder_tokens_ratio"]))
    if scale:
        print("\nZeRO-2 scaling, the same step on 1, 2 and 4 ranks")
        print(table(scale, ["ranks", "seconds", "tokens_per_s", "speedup", "mfu", "peak_gib"]))
    path = write_json(name, {"longest": longest, "mfu": mfu, "shared": shared, "scale": scale,
                                      **({"parts": {**old.get("parts", {}), **({"mfu_add": {**stamp(), "cases": mfu_add}} if mfu_add else {k: stamp() for k in want})}})})
    _plot(longest, mfu, shared, scale, path.with_suffix(".png"), stamp())
    print(f"\nwrote {path} and {path.with_suffix('.png')}")


def mfu_label(r: dict) -> str:
    ckpt = "no ckpt" if r.get("activation_checkpointing") is False else \
        f"ckpt {r.get('activation_checkpointing_fraction', 1.0):g}"
    return (f"{'compiled' if r.get('compile') else 'eager'}, {ckpt}, {r.get('backend', 'deepspeed')}, "
            f"{r.get('micro_batch_tokens', 65536) // 1024}k" + (", head logits kept" if r.get("logprob_recompute") is False else "")
            + (f", log-prob {r['logprob_kernel']}" if "logprob_kernel" in r else "")
            + (f", {r['logprob_chunk_mb']:g} MiB chunks" if "logprob_chunk_mb" in r else "")
            + (", liger layers" if r.get("liger_kernels") else "") + (", realistic lengths" if r.get("lengths") == "realistic" else "")
            + (", packed" if r.get("packing") else "") + (", mixed lengths" if r.get("completions") else ""))


def _plot(longest, mfu, shared, scale, out, st: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    ok = [r for r in longest if r.get("ok")]
    axes[0].bar([str(r["L"]) for r in ok], [r["peak_gib"] for r in ok])
    axes[0].set_xlabel("longest completion (tokens), N = 512")
    axes[0].set_ylabel("peak GPU memory (GiB)")
    labels = [f"N={r['n']}\n{r['prompt']}+{r['completion']}" for r in shared]
    x = range(len(shared))
    axes[1].bar([i - 0.2 for i in x], [r["unshared_tok_s"] for r in shared], 0.4, label="unshared")
    axes[1].bar([i + 0.2 for i in x], [r["shared_tok_s"] for r in shared], 0.4, label="shared prompt")
    axes[1].set_xticks(list(x), labels)
    axes[1].set_ylabel("learner tokens/s")
    axes[1].legend()
    if scale:
        axes[2].plot([r["ranks"] for r in scale], [r["speedup"] for r in scale], "o-", label="measured")
        top = max(r["ranks"] for r in scale)
        axes[2].plot([1, top], [1, top], "k:", label="linear")
        axes[2].set_xlabel("GPUs (ZeRO-2)")
        axes[2].set_ylabel("speed-up")
        axes[2].legend()
    axes[3].barh(range(len(mfu)), [100 * r.get("mfu", 0) for r in mfu])
    axes[3].set_yticks(range(len(mfu)), [mfu_label(r) for r in mfu], fontsize=7)
    axes[3].set_xlabel("MFU (%), 4,096-token responses")
    fig.suptitle(f"Learner, Qwen2-1.5B shape, {st.get('device', '?')}, torch {st.get('torch', '?')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
