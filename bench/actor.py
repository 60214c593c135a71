"""Actor generation benchmark: samples/s and tokens/s for the same total samples at N = 16 and N = 512.

    python -m bench.actor [--quick]                      # CPU: the tiny model (built locally)
    python -m bench.actor --dummy-1p5b --preset brorl-1.5b   # GPU: Qwen2-1.5B shapes, dummy weights

One `AsyncLLM` engine, configured exactly as an actor's (`actors.engine.engine_kwargs`: prefix caching,
`logprobs_mode="processed_logprobs"`), generates `--total` samples per case: total/N prompts submitted
at once, each with `n = N` and `output_kind = FINAL_ONLY`, as the actor does, and each finished group is
turned into the wire arrays (`actors.engine.completion_arrays`: tokens + behaviour log-probs) — the
actor's own per-group work is inside the timing. Prompts are random token ids of `--prompt-len`;
completions run to `--max-tokens` (`ignore_eos`) so every case does the same work. Cases: N in {16, 512}
× behaviour log-probs "on" (sent once per completion, at its end, as the actor gets them:
`actors/vllm_scheduler.py`), "step" (vLLM's own delivery: every running request's new log-probs at every
step) or "off" (what the log-probs cost).
Reports the median over `--repeats` runs after a warm-up (repeats interleaved: case A, B, ..., A, B, ...). Writes bench/results/actor[_<tag>].json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tinymodel.shaped import SHAPES

ROOT = Path(__file__).resolve().parents[1]
QWEN2_1P5B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **SHAPES["qwen2-1.5b"],
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
              "bos_token_id": 151643, "eos_token_id": 151643}  # config.json of the shape tinymodel.shaped builds


def model_dir(args) -> tuple[str, dict]:
    """(model path, extra engine kwargs)."""
    if args.dummy_1p5b:  # shapes only: weights are vLLM's dummy init, no tokenizer needed
        d = Path(tempfile.mkdtemp(prefix="qwen2-1p5b-"))
        (d / "config.json").write_text(json.dumps(QWEN2_1P5B))
        return str(d), {"load_format": "dummy", "skip_tokenizer_init": True}
    if args.model:
        return args.model, {}
    from tinymodel import build_tiny_model, is_model_dir

    d = ROOT / "runs" / "bench-tiny-model"
    if not is_model_dir(d):
        build_tiny_model(d, seed=0)
    return str(d), {}


async def run_case(engine, cfg, n: int, total: int, prompt_len: int, vocab: int, logprobs: str, seed: int) -> dict:
    from actors.engine import completion_arrays, sampling_params
    from actors.vllm_scheduler import PER_STEP
    from vllm.sampling_params import RequestOutputKind

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(10, vocab, prompt_len).tolist() for _ in range(total // n)]
    sp = sampling_params(cfg.actor, n=n, ignore_eos=True, detokenize=False,
                         logprobs=None if logprobs == "off" else 0, output_kind=RequestOutputKind.FINAL_ONLY,
                         seed=None, extra_args={PER_STEP: True} if logprobs == "step" else None)
    tokens = 0

    async def one(i: int, p: list[int]) -> None:
        nonlocal tokens
        final = None
        async for out in engine.generate({"prompt_token_ids": p}, sp, f"bench-{seed}-{n}-{i}"):
            final = out
        assert final is not None and len(final.outputs) == n
        if logprobs != "off":
            lengths, _tok, lps = completion_arrays(final.outputs)
            assert np.isfinite(lps).all()
            tokens += int(lengths.sum())
        else:
            tokens += sum(len(o.token_ids) for o in final.outputs)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "samples_per_s": total / wall, "tokens_per_s": tokens / wall}


async def bench(args) -> list[dict]:
    from actors.engine import engine_kwargs, offline_env
    from config.loader import load_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    offline_env()
    path, extra = model_dir(args)
    over = {"model.path": path, "actor.max_tokens": args.max_tokens,
            "actor.max_model_len": args.prompt_len + args.max_tokens + 8}
    if args.max_num_seqs:
        over["actor.max_num_seqs"] = args.max_num_seqs
    cfg = load_config(args.preset, {"verifiers.task": "synthetic", **over})  # the engine alone: no task data read
    kw = {**engine_kwargs(cfg.model, cfg.actor, seed=0, weight_backend=cfg.transport.weight_backend), **extra,
          **json.loads(args.engine_kw)}
    vocab = QWEN2_1P5B["vocab_size"] if args.dummy_1p5b else json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    print(f"engine up in {time.perf_counter() - t0:.1f} s (max_num_seqs {cfg.actor.max_num_seqs})", file=sys.stderr)
    rows = []
    try:
        await run_case(engine, cfg, 16, min(args.total, 64), args.prompt_len, vocab, "on", 999)  # warm-up
        runs: dict[tuple[int, str], list[dict]] = {case: [] for case in args.case_list}
        for r in range(args.repeats):  # repeats interleaved: a slow spell of a shared host hits every case
            for n, logprobs in args.case_list:
                await engine.reset_prefix_cache()  # every repeat starts cold, like fresh prompts
                runs[(n, logprobs)].append(await run_case(engine, cfg, n, args.total, args.prompt_len, vocab,
                                                          logprobs, r))
        for (n, logprobs), each in runs.items():
            med = {k: statistics.median(x[k] for x in each) for k in each[0]}
            rows.append({"N": n, "prompts": args.total // n, "samples": args.total, "logprobs": logprobs,
                         "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
                         "max_num_seqs": cfg.actor.max_num_seqs, "repeats": args.repeats, **med,
                         "samples_per_s_each": [round(x["samples_per_s"], 2) for x in each]})
            print(f"  N={n} logprobs={logprobs}: {med['samples_per_s']:.1f} samples/s "
                  f"(each: {', '.join(f'{x:.1f}' for x in rows[-1]['samples_per_s_each'])}), "
                  f"{med['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    finally:
        engine.shutdown()
        engine.shutdown = lambda *a, **k: None  # AsyncLLM.__del__ would shut down again at exit
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples, one repeat")
    ap.add_argument("--preset", default="tiny-cpu")
    ap.add_argument("--model", help="a Hugging Face model folder (default: the tiny model)")
    ap.add_argument("--dummy-1p5b", action="store_true", help="Qwen2-1.5B shapes with dummy weights (GPU)")
    ap.add_argument("--total", type=int, default=2048, help="samples per case (a multiple of 512)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=0, help="override actor.max_num_seqs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="", help="suffix of the results file (e.g. h100)")
    ap.add_argument("--engine-kw", default="{}", help="extra vLLM engine arguments, JSON (experiments)")
    ap.add_argument("--cases", default="16:on,16:step,16:off,512:on,512:step,512:off",
                    help="N:on|step|off (behaviour log-probs at each completion's end, at every step, none), "
                         "comma-separated (e.g. 16:on alone, to profile it)")
    args = ap.parse_args()
    try:
        args.case_list = [(int(n), lp) for n, lp in (c.split(":") for c in args.cases.split(","))]
        assert all(lp in ("on", "step", "off") for _, lp in args.case_list)
    except (ValueError, AssertionError):
        ap.error(f"--cases {args.cases!r}: expected N:on, N:step or N:off, comma-separated")
    if args.quick:
        args.total, args.repeats = 512, 1
    if args.total % 512:
        ap.error("--total must be a multiple of 512 (so N = 512 gets whole prompts)")
    from bench.common import table, write_json

    rows = asyncio.run(bench(args))
    print(f"\nActor generation, {args.total} samples per case, {args.prompt_len}-token prompts, "
          f"{args.max_tokens} new tokens each, median of {args.repeats}")
    print(table(rows, ["N", "prompts", "logprobs", "max_num_seqs", "wall_s", "samples_per_s", "tokens_per_s"]))
    path = write_json("actor" + (f"_{args.tag}" if args.tag else ""), {"args": vars(args), "rows": rows})
    _plot(rows, path.with_suffix(".png"))
    print(f"\nwrote {path}")


def _mode(row: dict) -> str:
    """A row's log-prob mode; rows written before "step" existed say True (per step, then) or False."""
    lp = row["logprobs"]
    return lp if isinstance(lp, str) else ("step" if lp else "off")


def _plot(rows, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    names = {"on": "log-probs\nat the end", "step": "log-probs\nevery step", "off": "no log-probs"}
    labels = [f"N={r['N']}\n{names[_mode(r)]}" for r in rows]
    ax.bar(labels, [r["samples_per_s"] for r in rows],
           color=[{"on": "C0", "step": "C1", "off": "C7"}[_mode(r)] for r in rows])
    ax.set_ylabel("samples / s (median)")
    ax.set_title("actor generation, same total samples")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
