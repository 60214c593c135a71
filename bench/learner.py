"""Learner benchmark: peak memory and tokens/s of the log-prob path and of one training step.

    python -m bench.learner            # full sweep (~10 min on 2 CPU cores)
    python -m bench.learner --quick    # a smaller sweep
    python -m bench.learner --gpu      # the 1.5B-shaped learner on GPUs (bench/learner_gpu.py)

Part A (memory): forward+backward of response-token log-probs for growing vocabulary × batch, chunked
(a fixed logits budget) against unchunked (all float32 logits at once), on a 1-layer Qwen2 so that the
logits dominate. Part B (throughput): one `Trainer.step` at equal samples per step, N = 16 against
N = 512, for the tiny model, and for a Qwen2-0.5B shape with random weights (fewer samples on CPU).
Each case runs in a fresh process so that its peak RSS is its own.
Writes bench/results/learner.json and learner.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151_936)
TINY = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=160)


def _model(shape: dict, seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**shape, max_position_embeddings=2048, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float()


def case_logprob(vocab: int, tokens: int, chunk_mb: float | None) -> dict:
    import torch

    from bench.common import peak_rss_mb
    from learner.logprobs import pack, token_logprobs

    torch.manual_seed(0)
    model = _model(dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=vocab))
    S = tokens // 64
    prompts = [[1] * 16 for _ in range(S)]
    comps = torch.randint(0, vocab, (S, 64)).tolist()
    b = pack(prompts, comps)
    base = peak_rss_mb()
    t = time.perf_counter()
    lp, _ = token_logprobs(model, b, chunk_mb=chunk_mb)
    lp.sum().backward()
    dt = time.perf_counter() - t
    return {"vocab": vocab, "tokens": tokens, "chunked": chunk_mb is not None, "peak_extra_mb": peak_rss_mb() - base,
            "seconds": dt, "tokens_per_s": tokens / dt}


def case_step(shape_name: str, n: int, samples: int, prompt_len: int, comp_len: int) -> dict:
    import torch

    from bench.common import peak_rss_mb
    from config.schema import JobConfig, LearnerConfig
    from learner.planning import TrainGroup
    from learner.train_step import Trainer

    shape = {"tiny": TINY, "qwen2-0.5b": QWEN_05B}[shape_name]
    model = _model(shape)
    g = torch.Generator().manual_seed(0)
    groups = []
    for _ in range(samples // n):
        prompt = torch.randint(0, shape["vocab_size"], (prompt_len,), generator=g).tolist()
        comps = torch.randint(0, shape["vocab_size"], (n, comp_len), generator=g).tolist()
        correct = [i % 3 == 0 for i in range(n)]
        groups.append(TrainGroup(prompt, comps, [[-5.0] * comp_len] * n, [float(c) for c in correct], correct))
    cfg = LearnerConfig(num_minibatches=2, lr=1e-5, logprob_chunk_mb=256)
    tr = Trainer(model, cfg, JobConfig(n_samples=n, prompts_per_step=len(groups)))
    base = peak_rss_mb()
    t = time.perf_counter()
    m = tr.step(groups)
    dt = time.perf_counter() - t
    tokens = samples * comp_len
    return {"shape": shape_name, "N": n, "samples": samples, "groups": len(groups), "tokens": tokens,
            "seconds": dt, "tokens_per_s": tokens / dt, "peak_extra_mb": peak_rss_mb() - base,
            "loss": m["loss"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gpu", action="store_true", help="the GPU mode: a 1.5B-shaped model, the paper's presets")
    ap.add_argument("--only", default="", help="GPU mode: run only these cases (longest,mfu,shared,scale)")
    ap.add_argument("--mfu-add", default="", help="GPU mode: more MFU cases, a JSON list of learner settings "
                    "over the compiled 4k-token case (e.g. '[{\"backend\": \"torch\"}]'), run and merged into the "
                    "kept rows (a row with the same settings is replaced)")
    ap.add_argument("--kernels", default="", help="GPU mode: the log-prob and layer kernels compared, one set "
                    "(fixed, fixed-liger, fixed-memory, realistic, realistic-liger, packed, packed-compiled; bench/learner_gpu.py), merged into the MFU rows")
    ap.add_argument("--tag", default="", help="GPU mode: results file suffix (bench/results/learner_gpu_TAG.json)")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:  # child process
        kind, params = args.case.split(":", 1)
        p = json.loads(params)
        if kind.startswith("gpu-"):
            from bench import learner_gpu

            r = learner_gpu.case(kind[4:], p)
            if r:  # ranks > 0 report nothing
                print(json.dumps(r))
            return
        print(json.dumps(case_logprob(**p) if kind == "logprob" else case_step(**p)))
        return
    if args.gpu:
        from bench import learner_gpu

        return learner_gpu.main(quick=args.quick, only=args.only, mfu_add=args.mfu_add, tag=args.tag,
                                kernels=args.kernels)

    from bench.common import run_isolated, stamp, table, write_json

    vocabs = [32_000, 151_936] if args.quick else [32_000, 64_000, 151_936]
    token_counts = [1024, 4096] if args.quick else [1024, 4096, 8192]
    mem = []
    for v in vocabs:
        for n_tok in token_counts:
            for chunk in (64.0, None):
                p = json.dumps({"vocab": v, "tokens": n_tok, "chunk_mb": chunk})
                mem.append(run_isolated("bench.learner", ["--case", f"logprob:{p}"]))
                print(f"  logprob V={v} M={n_tok} chunked={chunk is not None}: "
                      f"{mem[-1]['peak_extra_mb']:.0f} MiB", file=sys.stderr)
    steps = []
    plan = [("tiny", 16, 512, 16, 16), ("tiny", 512, 512, 16, 16),
            ("qwen2-0.5b", 16, 32, 16, 16), ("qwen2-0.5b", 32, 32, 16, 16)]
    if not args.quick:
        plan[2:2] = [("tiny", 16, 2048, 16, 16), ("tiny", 512, 2048, 16, 16)]
    for shape, n, samples, pl, cl in plan:
        p = json.dumps({"shape_name": shape, "n": n, "samples": samples, "prompt_len": pl, "comp_len": cl})
        steps.append(run_isolated("bench.learner", ["--case", f"step:{p}"], timeout=3600))
        print(f"  step {shape} N={n} samples={samples}: {steps[-1]['seconds']:.1f} s", file=sys.stderr)

    print("\nLog-prob forward+backward, peak extra RSS (chunked: 64 MiB logits budget)")
    print(table(mem, ["vocab", "tokens", "chunked", "peak_extra_mb", "tokens_per_s"]))
    print("\nOne training step (2 PPO mini-batches, π_old recompute included)")
    print(table(steps, ["shape", "N", "samples", "groups", "tokens", "seconds", "tokens_per_s", "peak_extra_mb"]))
    path = write_json("learner", {"logprob_memory": mem, "train_step": steps})
    _plot(mem, path.with_suffix(".png"), stamp())
    print(f"\nwrote {path} and {path.with_suffix('.png')}")


def _plot(mem: list[dict], out, st: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for chunked, style in ((False, "o--"), (True, "s-")):
        rows = sorted((r for r in mem if r["chunked"] == chunked), key=lambda r: r["vocab"] * r["tokens"])
        ax.plot([r["vocab"] * r["tokens"] / 1e6 for r in rows], [r["peak_extra_mb"] for r in rows], style,
                label="chunked (64 MiB budget)" if chunked else "unchunked (all logits)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("vocabulary × response tokens (millions)")
    ax.set_ylabel("peak extra RSS during fwd+bwd (MiB)")
    ax.set_title(f"Log-prob memory, {st.get('device', 'cpu')} ({st.get('cpu', '')[:30]})", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
