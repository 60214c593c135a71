"""The benchmark pages' tables, rendered from their data: `python -m bench.render` rewrites every table of
`docs/benchmarks/*.md` that sits between the markers

    <!-- rendered: NAME -->
    ...
    <!-- /rendered -->

from `bench/results/*.json` (NAME is a key of `TABLES`), with a line under it naming the results file and
the machine, card and date it was measured on. `python -m bench.render --check` changes nothing and fails,
naming each table, where a page differs from what its data renders (the unit tests run it). A figure in a
rendered table is never typed by hand: rerun the benchmark and this command.

Add a table: a function here that takes the results file's JSON and returns (header, alignments, rows), an
entry in `TABLES`, and the markers on the page.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGES = ROOT / "docs" / "benchmarks"
OTHER_PAGES = [ROOT / "docs" / "fleet-simulator.md", ROOT / "docs" / "models.md"]
"""Pages outside docs/benchmarks with rendered tables."""
BLOCK = re.compile(r"(<!-- rendered: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /rendered -->)", re.S)

Table = tuple[list[str], str, list[list[str]]]
"""(header, one alignment character per column: 'l' or 'r', rows of cells)."""


def n(x: float, digits: int = 0) -> str:
    """A number with thousands separators."""
    return f"{x:,.{digits}f}"


def pct(x: float, digits: int = 0) -> str:
    return f"{100 * x:.{digits}f} %"


def _transport(d: dict) -> Table:
    rows = sorted(d["rows"], key=lambda r: (r["paced"], r["completion_tokens"], r["curve"]))
    target = d["target_samples_per_s"]
    return (["completions", "CURVE", "sender", "samples/s", "MB/s", "p50 / p99 latency (ms)", "receiver cores"], "lllrrrr",
            [[f"{r['completion_tokens'] // 1024}k tokens", "on" if r["curve"] else "off",
              f"paced at {n(target)}/s" if r["paced"] else "flat out", n(r["samples_per_s"]), n(r["MB_per_s"]),
              f"{r['latency_p50_ms']:.0f} / {r['latency_p99_ms']:.0f}", f"{r['receiver_cores']:.2f}"] for r in rows])


def _pm_num(x: float, sd: float | None, fmt: Callable[[float], str]) -> str:
    return fmt(x) + (f" ± {fmt(sd)}" if sd else "")


def _staleness(d: dict) -> Table:
    rows = []
    for r in sorted(d["rows"], key=lambda r: r["max_staleness"]):
        rows.append([str(r["max_staleness"]), n(r["samples_per_s"]), pct(r["wait_share"]), pct(r["idle_share"]),
                     f"{_pm_num(r['steady_samples_per_s'], r.get('steady_samples_per_s_std'), n)}, "
                     f"{_pm_num(r['steady_wait_share'], r.get('steady_wait_share_std'), lambda v: pct(v, 1))}",
                     _pm_num(r["staleness_mean"], r.get("staleness_mean_std"), lambda v: f"{v:.2f}"),
                     f"{r['mismatch_kl']:.3f}" if r["mismatch_kl"] >= 1e-4 else "0",
                     pct(r["tis_clip_frac"], 1), pct(r["pass_at_1_end"], 1)])
    return (["max_staleness K", "samples/s", "learner waiting for data", "actor engine idle",
             "steady state: samples/s, learner waiting", "mean staleness (tokens)", "mismatch KL", "TIS clip",
             "held-out pass@1 after"], "rrrrrrrrr", rows)


def _params(p: int) -> str:
    return f"{p / 1e9:g} B" if p >= 1e9 else f"{p / 1e6:g} M"


def _sync_cell(r: dict | None) -> str:
    if r is None:
        return "—"
    t, w = r["total_s"], r["wire_s"]
    unit, k = ("s", 1) if t >= 0.1 else ("ms", 1e3)
    return f"{t * k:.{2 if unit == 's' else 1}f} {unit} (wire {w * k:.{2 if unit == 's' else 1}f} {unit}: {t / w:.2f} ×)"


def _weight_sync(d: dict) -> Table:
    params = sorted({r["params"] for r in d["rows"]})
    receivers = sorted({r["receivers"] for r in d["rows"]})
    at = {(r["params"], r["receivers"]): r for r in d["rows"]}
    return (["parameters"] + [f"{d['rows'][0]['backend']}, {k} receiver{'s' * (k > 1)}" for k in receivers],
            "r" * (1 + len(receivers)), [[_params(p)] + [_sync_cell(at.get((p, k))) for k in receivers] for p in params])


def _logprob_memory(d: dict) -> Table:
    at = {(r["vocab"], r["tokens"], r["chunked"]): r for r in d["logprob_memory"]}
    keys = sorted({(v, t) for v, t, _ in at})
    return (["vocab", "response tokens", "chunked peak extra (MiB)", "unchunked peak extra (MiB)"], "rrrr",
            [[n(v), n(t), n(at[v, t, True]["peak_extra_mb"]), n(at[v, t, False]["peak_extra_mb"])] for v, t in keys])


PADDING_CASES = {"one pass": "one pass, padded to the longest", "fixed rows (16)": "16 samples per pass, in shuffled order",
                 "greedy": "`micro_batch_tokens`, sorted by length, each pass filled to the budget (before 2026-11-30)",
                 "token budget": "`micro_batch_tokens`, sorted by length, cut where the passes compute the fewest "
                                 "positions (the presets)",
                 "shared prompt": "the same with `share_prompt` (one group per pass)"}


def _padding(d: dict, key: str = "rows") -> Table:
    return (["passes of each mini-batch", "passes", "padding", "positions computed"], "lrrr",
            [[PADDING_CASES.get(r["passes"], r["passes"]), str(r["count"]), pct(r["padding_frac"], 1),
              f"{r['positions'] / 1e6:.3g} M"] for r in d[key]])


def _e2e(d: dict) -> Table:
    raw = {r["n"]: r["samples_per_s"] for r in d["raw"]}
    rows = []
    for r in d["runs"]:
        busy = r.get("busy_of_raw", r["of_raw"] / max(1e-9, 1 - r["actor_idle_share"]))
        gpus = f"{r.get('learner_gpus') or 1} + {r['actors']}, " if d.get("shape") != "small" else ""
        rows.append([f"{gpus}N = {r['n']}, {'kept' if r['update'] == 'keep' else 'finished'}",
                     n(raw[r["n"]], 1), n(r["samples_per_s"], 1), pct(r["of_raw"]), pct(busy),
                     pct(r["actor_idle_share"]), pct(r["learner_wait_share"]), f"{r['train_s_per_step']:.1f} s"])
    for k in sorted(set(raw) - {r["n"] for r in d["runs"]}):  # a raw engine measured whose run did not come
        rows.append([f"N = {k}", n(raw[k], 1), "not run", "", "", "", "", ""])
    return (["learner + actor GPUs, N, updates" if d.get("shape") != "small" else "N, updates", "raw engine samples/s",
             "`brorl run` samples/s", "of raw", "of raw while the actor had work", "actor idle", "learner waiting",
             "learner training per step"], "lrrrrrrr", rows)


def _e2e_gauge(d: dict) -> Table:
    """A run with the engine gauge (2026-11-29 on): the rate while busy in samples and in tokens (completions
    differ in length between the raw run and the loop), engine steps a second, how full the engine was
    against the raw run, the learner's own MFU and the frames it compiled after its first step."""
    raw = {r["n"]: r for r in d["raw"]}
    rows = []
    for r in d["runs"]:
        w = raw[r["n"]]
        rows.append([f"{r.get('learner_gpus') or 1} + {r['actors']}, N = {r['n']}, "
                     f"{'kept' if r['update'] == 'keep' else 'finished'}",
                     n(w["samples_per_s"], 1), n(r["samples_per_s"], 1), pct(r["busy_of_raw"]),
                     pct(r["busy_tokens_of_raw"]), n(r["engine_steps_per_busy_s"], 1),
                     f"{r['mean_running_seqs']:.0f} / {w['mean_running_seqs']:.0f}", pct(r["actor_idle_share"]),
                     pct(r["learner_wait_share"]), f"{r['train_s_per_step']:.1f} s", pct(r["learner_mfu"], 1),
                     str(int(r["compiled_frames_after_step_1"]))])
    return (["learner + actor GPUs, N, updates", "raw engine samples/s", "`brorl run` samples/s",
             "of raw while busy (samples)", "of raw while busy (tokens)", "engine steps/s while busy",
             "running sequences, loop / raw", "actor idle", "learner waiting", "learner training per step",
             "learner MFU", "frames compiled after step 1"], "lrrrrrrrrrrr", rows)


def _e2e_full(d: dict) -> Table:
    """A run whose raw engine also reports its rate while full (2026-11-30 on): the gauge's table with P1c (the
    loop's samples/s against the raw engine's over the whole run) and P1a against the full engine's tokens/s."""
    head, align, rows = _e2e_gauge(d)
    raw = {r["n"]: r for r in d["raw"]}
    for row, r in zip(rows, d["runs"]):
        w = raw[r["n"]]
        row[3:3] = [pct(r["of_raw"])]
        row[6:6] = [pct(r["busy_tokens_of_full_raw"])]
        row[7] = f"{r['engine_steps_per_busy_s']:.1f} / {w['engine_steps_per_s']:.1f}"
    head[3:3] = ["of raw, whole run (samples)"]
    head[6:6] = ["of the full raw engine while busy (tokens)"]
    head[7] = "engine steps/s while busy, loop / raw"
    return head, align + "rr", rows


def _fleet_gpu(d: dict) -> Table:
    """`bench.fleet --only gpu`: each end-to-end GPU run against the simulator's prediction for it."""
    def pair(r: dict, key: str, fmt) -> str:
        m, p = r[f"{key}_measured"], r[f"{key}_predicted"]
        err = f" ({100 * (p - m) / m:+.0f} %)" if m > 0.05 else ""  # a ratio of a share near 0 means nothing
        return f"{fmt(m)} → {fmt(p)}{err}"

    rows = []
    for r in d["gpu_validation"]:
        card = r["card"].replace("NVIDIA ", "").split(" ")[0]
        rows.append([f"{card}, {r['gpus']}, N = {r['n']}, {'kept' if r['update'] == 'keep' else 'finished'} "
                     f"(`{r['run']}`)", pair(r, "samples_per_s", lambda x: n(x, 1)),
                     pair(r, "wait_share", lambda x: pct(x, 1)), pair(r, "actor_idle_share", lambda x: pct(x, 1)),
                     pair(r, "staleness_mean", lambda x: f"{x:.2f}")])
    return (["card, GPUs (learner + actor), N, updates (run)", "samples/s measured → predicted", "learner waiting",
             "actor idle", "mean staleness"], "lllll", rows)


def _mfu_label(r: dict) -> str:
    ckpt = "no recomputation" if r.get("activation_checkpointing") is False else \
        f"{r.get('activation_checkpointing_fraction', 1.0):g} of the layers recomputed"
    return (f"{'compiled' if r.get('compile') else 'eager'}, {ckpt}, {r.get('backend') or 'deepspeed'}, "
            f"{(r.get('micro_batch_tokens') or 65536) // 1024}k-token micro-batches"
            + (", LM-head logits kept for backward" if r.get("logprob_recompute") is False else ""))


def _learner_mfu(d: dict) -> Table:
    rows = [[_mfu_label(r)] + ([n(r["tokens_per_s"]), n(r["tflops"]), pct(r["mfu"], 1), f"{r['peak_gib']:.1f}",
                                f"{r['seconds']:.2f}"] if r.get("ok", True) and r.get("tokens_per_s") else
                               ["out of memory" if "memory" in str(r.get("error", "")) else "failed", "", "", "", ""])
            for r in sorted(d["mfu"], key=lambda r: -r.get("mfu", 0.0)) if "logprob_kernel" not in r]
    return (["case", "tokens/s", "TFLOP/s", "MFU", "peak GiB", "step s"], "lrrrrr", rows)


LOGPROB_KERNELS = {"kept": "head module, logits kept for backward", "off": "head module, checkpointed chunks", "chunked": "chunked (fused, torch)",
                   "liger": "Liger fused linear cross-entropy"}


def _learner_kernels(d: dict) -> Table:
    """The `--kernels` rows (bench/learner_gpu.py): the log-prob path and Liger's layer kernels, fixed 4,096-token
    responses and realistic lengths, best first within each; tokens/s and MFU of real tokens only."""
    header = (["lengths", "passes", "log-prob path (logits chunk)", "Liger layer kernels", "micro-batch tokens", "tokens/s", "MFU",
               "peak GiB", "padding"], "lllllrrrr")
    rows = []
    for r in sorted((r for r in d.get("mfu", []) if "logprob_kernel" in r),
                    key=lambda r: (r.get("lengths") == "realistic", -r.get("mfu", 0.0))):
        kernel = "kept" if r.get("logprob_recompute") is False else r["logprob_kernel"]
        cells = [("realistic (prompts 256–1k, completions log-normal ~3k, ≤ 16k)" if r.get("lengths") == "realistic"
                  else "fixed (256 + 4,096)"),
                 f"{'compiled' if r.get('compile', True) else 'uncompiled'}, {'packed' if r.get('packing') else 'padded'}",
                 LOGPROB_KERNELS.get(kernel, kernel)
                 + (f" ({n(r['logprob_chunk_mb'])} MiB)" if "logprob_chunk_mb" in r else ""),
                 "yes" if r.get("liger_kernels") else "no", n(r.get("micro_batch_tokens") or 65536)]
        if r.get("ok", True) and r.get("tokens_per_s"):
            cells += [n(r["tokens_per_s"]), pct(r["mfu"], 1), f"{r['peak_gib']:.1f}", pct(r.get("padding_frac", 0.0))]
        else:
            cells += ["out of memory" if "memory" in str(r.get("error", "")) else "failed", "", "", ""]
        rows.append(cells)
    if not rows:
        rows = [["not measured yet: `python -m bench.learner --gpu --tag h200 --kernels SET`", "", "", "", "", "", "",
                 "", ""]]
    return (*header, rows)


KERNEL_KINDS = (("matrix multiplications", ("nvjet", "gemm", "cutlass", "sm90_xmma")), ("attention", ("sdpa", "flash", "fmha")),
                ("log-probs over the vocabulary", ("logsumexp",)), ("casts to bf16", ("_to_copy",)),
                ("optimizer (AdamW)", ("Optimizer.step",)), ("gradient accumulation (float32 adds)", ("CUDAFunctor_add<float>",)))


def _learner_profile(d: dict) -> Table:
    """The profiled case's 20 costliest GPU kernels (of the best profiled case), summed by kind (the rest of the
    step: 'not in the 20')."""
    r = max((r for r in d["mfu"] if r.get("profile")), key=lambda r: r.get("mfu", 0.0))
    kinds: dict[str, list[float]] = {}
    for k in r["profile"]:
        kind = next((name for name, keys in KERNEL_KINDS if any(x in k["kernel"] for x in keys)), "other elementwise kernels")
        kinds.setdefault(kind, [0.0, 0.0, 0])
        kinds[kind][0] += k["ms"]
        kinds[kind][1] += k["share"]
        kinds[kind][2] += k["calls"]
    rows = [[kind, n(ms), pct(share, 1), n(calls)] for kind, (ms, share, calls) in sorted(kinds.items(), key=lambda x: -x[1][0])]
    rows.append([f"not in the 20 costliest kernels ({_mfu_label(r)})", "", pct(1 - sum(v[1] for v in kinds.values()), 1), ""])
    return (["GPU time of one step, by kernel kind", "ms", "share", "kernel calls"], "lrrr", rows)


def _learner_scale(d: dict) -> Table:
    return (["learner GPUs (ZeRO-2 ranks)", "tokens/s", "speed-up", "MFU", "peak GiB per GPU"], "rrrrr",
            [[str(r["ranks"]), n(r["tokens_per_s"]), f"{r['speedup']:.2f} ×", pct(r["mfu"], 1), f"{r['peak_gib']:.1f}"]
             for r in d["scale"]])


def _learner_longest(d: dict) -> Table:
    return (["longest completion (8 of them, 504 of 256 tokens, N = 512)", "trains", "peak GiB", "step s", "padding"],
            "rlrrr", [[n(r["L"]), "yes" if r.get("ok") else "no: " + str(r.get("error", ""))[:60],
                       f"{r.get('peak_gib', 0):.1f}", f"{r.get('seconds', 0):.1f}", pct(r.get("padding_frac", 0))]
                      for r in d["longest"]])


def _learner_shared(d: dict) -> Table:
    return (["N", "prompt tokens", "completion tokens", "shared prompt against unshared (tokens/s)"], "rrrr",
            [[str(r["n"]), n(r["prompt"]), n(r["completion"]), f"{r['speedup']:.2f} ×"] for r in d["shared"]])


ARM_NAMES = {"ProRL (N=16)": "ProRL (N = 16)", "BroRL (N=512)": "BroRL (N = 512), √-scaled lr",
             "BroRL (N=512, η0)": "BroRL (N = 512), ProRL's lr", "BroRL (N=128)": "N = 128, 16 prompts, √-scaled lr",
             "BroRL (N=64)": "N = 64, 16 prompts, √-scaled lr", "BroRL (N=128, η0)": "N = 128, 16 prompts, ProRL's lr"}


def _pm(text: str, scale: float = 1.0, digits: int = 1, sign: bool = False) -> str:
    """A results file's "mean ± std" text, rescaled and rounded."""
    mean, _, sd = text.partition("±")
    m = float(mean) * scale
    out = (f"{m:+,.{digits}f}" if sign else f"{m:,.{digits}f}").replace("-", "−")
    return out + (f" ± {float(sd) * scale:,.{digits}f}" if sd.strip() else "")


def _bro_vs_pro(d: dict) -> Table:
    return (["arm", "steps", "held-out pass@1 start → end (%)", "gain (points)", "generated samples",
             "dynamic-sampling pass rate", "samples/s"], "lrlrrrr",
            [[ARM_NAMES.get(r["arm"], r["arm"]), str(r["steps"]),
              f"{_pm(r['pass@1 start'], 100)} → {_pm(r['pass@1 end'], 100)}", _pm(r["gain"], 100, sign=True),
              _pm(r["generated"], digits=0), _pm(r["pass rate"], digits=2), _pm(r["samples/s"], digits=0)]
             for r in d["table"]])


def _saturation(d: dict) -> Table:
    """Phase 2's arms: pass@1 and pass@k (k = the held-out samples per prompt), each with its paired test
    (continued ProRL: its end against its start; the others: against continued ProRL's end), what they
    generated, and (from the second design on) how far each update moved the policy."""
    k = d.get("k")
    rows = []

    def test(arm: str, what: str) -> str:
        pro = arm.startswith("ProRL")  # (results before pass@k named the tests without "pass@1: ")
        t = (d["tests"].get(f"{what}: {arm}, end vs start") or d["tests"].get(f"{arm}: end vs start") if pro
             else d["tests"].get(f"{what}: {arm} vs ProRL (N=16)") or d["tests"].get(arm))
        return "—" if t is None else (f"{'end vs start: ' if pro else ''}{100 * t['mean_diff']:+.1f} points, "
                                      f"t = {t['t']:.2f}, p {'< 1e-15' if t['p'] < 1e-15 else f'= {t[chr(112)]:.2g}'}"
                                      ).replace("-", "−")

    stats = all("update KL" in r for r in d["table"])
    with_k = bool(k) and all(f"pass@{k} start %" in r for r in d["table"])  # (results before pass@k: none)
    for r in d["table"]:
        at_k = [f"{_pm(r[f'pass@{k} start %'])} → {_pm(r[f'pass@{k} end %'])}", test(r["arm"], f"pass@{k}")] \
            if with_k else []
        moves = [_pm(r["update KL"], digits=3), f"{_pm(r['entropy start'], digits=2)} → {_pm(r['entropy end'], digits=2)}"] \
            if stats else []
        rows.append([ARM_NAMES.get(r["arm"], r["arm"]), str(r["steps"]),
                     f"{_pm(r['pass@1 start %'])} → {_pm(r['pass@1 end %'])}", _pm(r["gain (points)"], sign=True),
                     test(r["arm"], "pass@1"), *at_k, _pm(r["generated"], digits=0), _pm(r["pass rate %"]),
                     _pm(r["train wall s"], digits=0), *moves])
    at_k = [f"held-out pass@{k} start → end (%)", f"pass@{k} paired test"] if with_k else []
    return (["phase 2 arm", "steps", "held-out pass@1 start → end (%)", "gain (points)",
             "paired test (ProRL: end vs start; BroRL: against continued ProRL)", *at_k, "generated samples",
             "dynamic-sampling pass rate (%)", "training wall time (s)",
             *(["KL per update", "entropy start → end"] if stats else [])],
            "lrlrl" + "ll" * bool(at_k) + "rrr" + "rl" * stats, rows)


def _adaptive(d: dict) -> Table:
    k, rows = d["k"], []
    for r in d["table"]:
        base = "fixed N=512, η0" if "η0" in r["arm"] else "fixed N=512"  # against fixed N = 512 at the same rate
        t = d["tests"].get(f"pass@1: {r['arm']} vs {base}")
        test = "—" if t is None else (f"{100 * t['mean_diff']:+.1f} points, t = {t['t']:.2f}, "
                                      f"p {'< 1e-15' if t['p'] < 1e-15 else f'= {t[chr(112)]:.2g}'}").replace("-", "−")
        rows.append([r["arm"], str(r["steps"]), f"{_pm(r['pass@1 start %'])} → {_pm(r['pass@1 end %'])}",
                     _pm(r["gain (points)"], sign=True), test,
                     f"{_pm(r[f'pass@{k} start %'])} → {_pm(r[f'pass@{k} end %'])}", _pm(r["generated"], digits=0),
                     _pm(r["pass rate %"])])
    return (["arm", "steps", "held-out pass@1 start → end (%)", "gain (points)", "pass@1 against fixed N = 512 at its rate",
             f"pass@{k} start → end (%)", "generated samples", "dynamic-sampling pass rate (%)"], "lrlrlrrr", rows)


ACTOR_RUNS = ("actor_h200_fp8", "actor_h200_bf16", "actor_h200_p2c", "actor_h200_p2", "actor_h100_p2b", "actor_h100_p2",
              "actor_h200", "actor_h200_dict_logprobs", "actor")
"""`bench.actor` runs on the actor page, one row each (their files under bench/results)."""


def _actor_runs(runs: list[dict]) -> Table:
    rows = []
    for d in sorted(runs, key=lambda d: d["stamp"]["time"], reverse=True):
        a, st = d["args"], d["stamp"]
        at = {(r["N"], r["logprobs"]): r["samples_per_s"] for r in d["rows"]}

        def cell(n_: int, on: bool) -> str:
            for key, note in (("on", ""), (True, " (per step)")) if on else (("off", ""), (False, "")):
                if (n_, key) in at:
                    return n(at[n_, key], 1) + note
            return "—"
        card = "CPU" if st.get("device") == "cpu" else st.get("device", "?").replace("NVIDIA ", "").split(" ")[0]
        quant = json.loads(a.get("engine_kw") or "{}").get("quantization")
        what = f"`{d['_file'].removesuffix('.json')}`"
        rows.append([st["time"][:10], card, f"{what}{', ' + quant if quant else ''}, {a['repeats']} repeat{'s' * (a['repeats'] > 1)}",
                     f"{a['prompt_len']} + {a['max_tokens']}", cell(16, True), cell(16, False), cell(512, True),
                     cell(512, False)])
    return (["date", "card", "run", "prompt + max tokens", "N = 16 with log-probs", "without", "N = 512 with log-probs",
             "without"], "lllrrrrr", rows)


def _agreement(d: dict) -> Table:
    def share(a: int, b: int) -> str:
        return f"{a} / {b} ({100 * a / b:.1f} %)" if b else ""

    rows = [[r["suite"], share(r["agree"], r["cases"]), share(r["default_agree"], r["default_cases"])] for r in d["suites"]]
    math = [r for r in d["suites"] if r["suite"] != "ifeval"]
    rows.append(["**math, all suites**", share(sum(r["agree"] for r in math), sum(r["cases"] for r in math)),
                 share(sum(r["default_agree"] for r in math), sum(r["default_cases"] for r in math))])
    return ["suite", "agree / cases", "default setting: agree / cases"], "lrr", rows


def _peers(d: dict) -> Table:
    """bench.peers: brorl and TRL's GRPO trainer (vLLM colocated) at one job on one GPU; a failed run says why."""
    rows = []
    for r in d["runs"]:
        ok = r.get("status") == "ok"
        peer = ("brorl (learner + actor on the GPU)" if r["peer"] == "brorl" else
                "TRL GRPOTrainer, vLLM colocated" if r.get("vllm", True) else "TRL GRPOTrainer, transformers generate")
        rows.append([peer, f"{r['n']} × {r['prompts_per_step']}", n(r["samples_per_step"]),
                     f"{r['s_per_step']:.1f}" if ok else "–", n(r["samples_per_s"], 1) if ok else "–",
                     pct(r["gen_share"]) if ok and r.get("gen_share") is not None else "–",
                     f"{r['peak_gpu_gib']:.0f}" if r.get("peak_gpu_gib") else "–",
                     "ok" if ok else str(r.get("error") or r.get("status", "failed")).splitlines()[0][:120]])
    return (["trainer", "N × prompts a step", "samples a step", "s a step", "samples/s", "generation share",
             "peak GPU GiB", "status"], "llrrrrrl", rows)


WARM = 2
"""bench.e2e's steps left out of a run's steady state (its per-step rows start at step 2)."""


def _one_gpu(runs: list[dict]) -> Table:
    """bench.e2e --share-gpu: per N, the raw engine, then the loop time-sharing and co-running the one GPU; the
    weight update's two sides a step (the learner's broadcast, which waits for the actor's acknowledgement, and
    the actor's whole update: pause, load, resume)."""
    rows = []
    for d in runs:
        raw = {int(r["n"]): r["samples_per_s"] for r in d["raw"]}
        for r in sorted(d["runs"], key=lambda r: r.get("share_gpu", "") != "corun"):
            # results before bench.e2e left it out: a co-run's own train time is no standalone learner
            alone = r.get("learner_alone_from") != "this run"
            bound = r.get("timeshare_bound_samples_per_s") if alone else None
            loads = [p["actor_update_s"] for p in r.get("per_step", []) if p["step"] > WARM]  # the steady steps
            rows.append([str(r["n"]), r.get("share_gpu", "corun"), n(raw[int(r["n"])], 1), n(r["samples_per_s"], 1),
                         pct(r["of_raw"]), pct(r["tokens_of_raw"]) if r.get("tokens_of_raw") is not None else "–",
                         f"{r['samples_per_s'] / bound:.2f} ×" if bound else "–",
                         f"{r['train_s_per_step']:.1f}", pct(r["learner_mfu"]), f"{r['broadcast_s_per_step']:.2f}",
                         f"{sum(loads) / len(loads):.2f}" if loads else "–",
                         pct(r["actor_idle_share"]), pct(r["learner_wait_share"]), f"{r['mismatch_kl']:.1e}",
                         f"{r['peak_gpu_gib']:.1f}" if r.get("peak_gpu_gib") else "–"])
    return (["N", "sharing", "raw engine samples/s", "loop samples/s", "of raw", "of raw tokens/s",
             "of time-share bound", "train s a step", "learner MFU", "broadcast s a step", "actor update s a step",
             "engine idle", "learner waiting", "mismatch KL", "card peak GiB"], "llrrrrrrrrrrrrr", rows)


def _weight_update(d: dict) -> Table:
    """bench.weight_update: one update into a real engine, per reload route (updates after the route's first)."""
    rows = []
    for mode, r in d["routes"].items():
        rows.append(["the actor's (in place where allowed)" if mode == "auto" else "vLLM's layerwise reload, always",
                     r["route"], f"{r['median_s']:.3f} ({r['min_s']:.3f}–{r['max_s']:.3f})", f"{r['await_s']:.3f}",
                     f"{r['load_s']:.3f}", f"{r['start_s'] + r['finish_s']:.3f}"])
    return ([f"reload ({d['shape']}, {d['GB']:.2f} GB in {d['buckets']} buckets)", "route taken",
             "update s, learner start to checksum (min–max)", "worker waits for the learner's packing s",
             "worker `load_weights` s", "worker start + finish s"], "llrrrr", rows)


FAMILY_NAMES = {"llama3": "Llama 3", "qwen2.5": "Qwen2.5", "qwen3": "Qwen3", "qwen3-moe": "Qwen3-MoE",
                "gemma3": "Gemma 3", "mistral": "Mistral", "phi3": "Phi-3"}


def _families_cycle(d: dict) -> Table:
    """bench.families --cycle: each family through brorl run, brorl eval on its checkpoint and the resume."""
    def steps(xs: list | None) -> str:
        run = len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1))
        return "–" if not xs else f"{xs[0]}–{xs[-1]}" if run else ", ".join(map(str, xs))

    def s(r: dict, key: str) -> str:
        return f"{r[key]:.0f}" if r.get(key) is not None else "–"

    rows = []
    for r in d["rows"]:
        rows.append([FAMILY_NAMES.get(r["family"], r["family"]), "yes" if r["passed"] else "**no**",
                     steps(r.get("first_steps")), steps(r.get("first_checkpoints")),
                     pct(r["eval_pass_at_1"], 1) if r.get("eval_pass_at_1") is not None else "–",
                     steps(r.get("steps")), steps(r.get("final_checkpoints")),
                     " / ".join(s(r, k) for k in ("run_s", "eval_s", "resume_s")), r.get("reason") or ""])
    for f in d.get("families_left", []):  # a run cut short: the families it did not reach
        rows.append([FAMILY_NAMES.get(f, f), "not run", *["–"] * 6, ""])
    return (["family", "passes", "`brorl run`: steps", "checkpoints", f"`brorl eval` pass@1 ({d['eval_prompts']} "
             f"prompts, k = {d['eval_k']})", "after `--resume`: steps", "checkpoints", "seconds: run / eval / resume",
             "why not"], "llllrllrl", rows)


TABLES: dict[str, tuple[str | tuple[str, ...], Callable]] = {
    "agreement": ("agreement.json", _agreement),
    "transport": ("transport.json", _transport),
    "staleness": ("staleness.json", _staleness),
    "weight-sync-cpu": ("weight_sync.json", _weight_sync),
    "weight-sync-nccl": ("weight_sync_nccl.json", _weight_sync),
    "learner-logprob-memory": ("learner.json", _logprob_memory),
    "padding": ("padding.json", _padding),
    "padding-n16": ("padding.json", lambda d: _padding(d, "rows_n16")),
    **{f"e2e-{tag}": (f"e2e_{tag}.json", _e2e_full) for tag in ("h200x2c_2048", "h200x2c_fp8")},
    **{f"e2e-{tag}": (f"e2e_{tag}.json", _e2e_gauge) for tag in ("h200x2b", "h200x2b_omp4", "h200x2")},
    **{f"e2e-{tag}": (f"e2e_{tag}.json", _e2e) for tag in ("h200_3l_p3", "h200_3l", "h100_2l", "h100_p3", "h100", "cpu")},
    "actor-runs": (tuple(f"{f}.json" for f in ACTOR_RUNS), _actor_runs),
    "bro-vs-pro": ("bro_vs_pro.json", _bro_vs_pro),
    "saturation": ("saturation.json", _saturation),
    "adaptive-saturated": ("adaptive_saturated.json", _adaptive),
    "adaptive-saturated-quick": ("adaptive_saturated_quick.json", _adaptive),
    "learner-gpu-mfu": ("learner_gpu.json", _learner_mfu),
    "learner-gpu-mfu-h200": ("learner_gpu_h200.json", _learner_mfu),
    "learner-gpu-kernels-h200": ("learner_gpu_h200.json", _learner_kernels),
    "learner-gpu-profile-h200": ("learner_gpu_h200.json", _learner_profile),
    "learner-gpu-scale": ("learner_gpu.json", _learner_scale),
    "learner-gpu-longest": ("learner_gpu.json", _learner_longest),
    "learner-gpu-shared": ("learner_gpu.json", _learner_shared),
    "fleet-gpu": ("fleet.json", _fleet_gpu),
    "peers-h200": ("peers_h200.json", _peers),
    "families-cycle": ("families_cycle.json", _families_cycle),
    "one-gpu-h200": (("e2e_h200share_16.json", "e2e_h200share_512.json"), _one_gpu),
    "one-gpu-h200-inplace": (("e2e_h200share_16d.json",),  # its time-shared row is the earlier run's, carried over
                             lambda runs: _one_gpu([{**d, "runs": [r for r in d["runs"] if r.get("share_gpu") == "corun"]}
                                                    for d in runs])),
    "one-gpu-h200-lora8b": (("e2e_h200lora8b.json",), _one_gpu),
    "one-gpu-h200-packed": (("e2e_h200co_16.json", "e2e_h200pack_512.json"), _one_gpu),
    "weight-update-ipc-h200": ("weight_update_ipc_h200.json", _weight_update),
}
"""Rendered table name -> (results file under bench/results, the function that renders it)."""


def _grid(table: Table) -> str:
    header, align, rows = table
    sep = ["---:" if a == "r" else "---" for a in align]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, sep, *rows])


def markdown(name: str) -> str:
    """The table `name` as Markdown, with its source and stamp line."""
    file, fn = TABLES[name]
    if isinstance(file, tuple):  # a table of several runs: one results file each, stamped row by row
        grid = _grid(fn([{**json.loads((RESULTS / f).read_text()), "_file": f} for f in file]))
        return grid + f"\n\n<small>`bench/results/`: {', '.join(f'`{f}`' for f in file)}</small>\n"
    d = json.loads((RESULTS / file).read_text())
    st = d.get("stamp", {})
    when = str(st.get("time", "?"))[:10]
    where = st.get("device", "?")
    where = f"{st.get('cpu_count', '?')}-core {st.get('cpu', 'CPU')}".strip() if where == "cpu" else where
    versions = ", ".join(f"{k} {st[k]}" for k in ("torch", "vllm", "deepspeed") if st.get(k))
    return _grid(fn(d)) + f"\n\n<small>`bench/results/{file}`: {where}, {when}; {versions}</small>\n"


def render_page(text: str, page: str) -> str:
    def one(m: re.Match) -> str:
        name = m["name"]
        if name not in TABLES:
            raise SystemExit(f"{page}: <!-- rendered: {name} --> names no table (bench/render.py has {sorted(TABLES)})")
        return m.group(1) + markdown(name) + m.group(4)
    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; fail where a page differs from its data")
    args = ap.parse_args(argv)
    stale = []
    for page in [*sorted(PAGES.glob("*.md")), *OTHER_PAGES]:
        text = page.read_text()
        new = render_page(text, page.name)
        if new == text:
            continue
        if args.check:
            stale.append(page.name)
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(page), "rendered"))
        else:
            page.write_text(new)
            print(f"rendered {page.relative_to(ROOT)}")
    if stale:
        print(f"\n{', '.join(stale)}: tables differ from bench/results (run `python -m bench.render`)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
