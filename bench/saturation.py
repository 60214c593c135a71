"""The paper's experiment on CPU: saturate the model with ProRL, then broaden (BroRL) or keep scaling steps.

    python -m bench.saturation [--quick] [--seeds 5] [--ablations]

The tiny model after its warm start (the default job's), the synthetic arithmetic task. Every run is
`run.reproducible` (one actor, K = 0): a run is a pure function of its command, so two arms of one seed
differ by their settings only, and a figure can be rerun exactly.

Phase 1, ProRL (N = 16, 16 prompts per step, lr 3e-4) for up to `--pro-steps` steps, a held-out estimate
and a checkpoint every `EVAL` steps. **Saturation criterion:** held-out pass@1 averaged over a window of
`WINDOW` evaluations has set no new best, by more than twice its sampling noise, for `PATIENCE`
evaluations. The same prompts are used at every evaluation, so the noise of one estimate is that of k
samples per prompt, sqrt(Σ p_i(1 - p_i) / k) / n over the n prompts. Phase 2 starts from the checkpoint
of the step where the criterion holds (the last one if it never does, which is then said).

Phase 2 continues the job from that checkpoint (`learner.init_from`: the weights *and* phase 1's AdamW
state, as a continuing job would; the √ rule changes only the rate), the same trained samples per arm:
    ProRL (N = 16):       16 prompts/step,    256 samples/step, lr 3e-4 (continue as before)
    BroRL (N = 512):       4 prompts/step,  2,048 samples/step, lr 3e-4 · sqrt(2048 / 256) ≈ 8.5e-4
    BroRL (N = 512, η0):  the same at lr 3e-4 (separates N from the rate)
    with --ablations:
    BroRL (N = 128):      16 prompts/step,  2,048 samples/step, lr ≈ 8.5e-4 (N alone: ProRL's prompts per update)
    BroRL (N = 64):       16 prompts/step,  1,024 samples/step, lr 3e-4 · sqrt(4) = 6e-4
BroRL takes a quarter of ProRL's prompts per step, the paper's ratio (128 against 512). The default budget,
61,440 trained samples, gives BroRL 30 updates (a fresh-rate arm needs that many to move at all) and ProRL
240. Two PPO mini-batches per step in every arm. Seeds vary the data order, the sampling and the
held-out prompts (`--eval-prompts` per seed, k samples each, T = 0.6); all arms of a seed share them, so
the end points are compared prompt by prompt: a paired test over (seed, prompt) instances of the
per-prompt pass rate (the paper's table 5), for pass@1 and for pass@k (k = `run.eval_samples`).

Reports held-out pass@1 and pass@k against generated samples and against training wall time, the
dynamic-sampling pass rate per N, and the paired tests. Writes bench/results/saturation.json and .png
(`--quick`: saturation_quick.*).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "bench" / "saturation"
BASE_LR, BASE_SAMPLES = 3e-4, 256
EVAL, WINDOW, PATIENCE = 20, 4, 6
COMMON = {"run.eval_samples": 16, "learner.num_minibatches": 2, "run.reproducible": True, "job.max_staleness": 0}
PRO = {"job.n_samples": 16, "job.prompts_per_step": 16, "actor.prompts_per_request": 16}
BRO = {"job.n_samples": 512, "job.prompts_per_step": 4, "actor.prompts_per_request": 2}
ARMS = {"ProRL (N=16)": (PRO, True), "BroRL (N=512)": (BRO, True), "BroRL (N=512, η0)": (BRO, False)}
ABLATIONS = {
    "BroRL (N=128)": ({"job.n_samples": 128, "job.prompts_per_step": 16, "actor.prompts_per_request": 4}, True),
    "BroRL (N=64)": ({"job.n_samples": 64, "job.prompts_per_step": 16, "actor.prompts_per_request": 8}, True),
}
SLUGS = {"ProRL (N=16)": "prorl", "BroRL (N=512)": "brorl", "BroRL (N=512, η0)": "brorl-eta0",
         "BroRL (N=128)": "brorl-n128", "BroRL (N=64)": "brorl-n64"}


def noise(row: dict, k: int) -> float:
    """Sampling noise (one standard error) of a held-out pass@1 estimate on a fixed prompt set."""
    ps = [c / k for c in row["correct"]]
    return math.sqrt(sum(p * (1 - p) for p in ps) / k) / len(ps)


def saturation_step(held: list[dict], k: int, window: int = WINDOW, patience: int = PATIENCE) -> int | None:
    """The first evaluated step by which the held-out pass@1, averaged over `window` evaluations, has not
    set a new best (by more than twice its noise) for `patience` evaluations: progress stopped (or went
    back); None if that never happens. Window means, not single points: RL on the tiny model swings by
    several points from one evaluation to the next, and a dip followed by a recovery is not a plateau."""
    best, best_at = None, 0
    for i in range(window - 1, len(held)):
        win = held[i - window + 1: i + 1]
        mean = statistics.mean(h["pass_at_1"] for h in win)
        sigma = math.sqrt(sum(noise(h, k) ** 2 for h in win)) / window
        if best is None or mean > best + 2 * sigma:
            best, best_at = mean, i
        elif i - best_at >= patience:
            return held[i]["step"]
    return None


def paired(a: list[float], b: list[float]) -> dict:
    """Paired test of b - a over instances: mean difference, t, two-sided p (normal approximation)."""
    d = [y - x for x, y in zip(a, b)]
    m, sd = statistics.mean(d), statistics.stdev(d)
    t = m / (sd / math.sqrt(len(d))) if sd > 0 else float("inf") * (1 if m > 0 else -1 if m < 0 else 0)
    p = 2 * (1 - statistics.NormalDist().cdf(abs(t))) if math.isfinite(t) else 0.0
    return {"n": len(d), "mean_diff": m, "t": t, "p": p}


def arm_overrides(arm: str, start: Path, train_samples: int, seed: int, eval_prompts: int) -> dict:
    """An arm of phase 2: phase 1's checkpoint `start` continued (its weights and AdamW state)."""
    o, scaled = {**ARMS, **ABLATIONS}[arm]
    per_step = o["job.n_samples"] * o["job.prompts_per_step"]
    steps = max(1, train_samples // per_step)
    return {**COMMON, **o, "model.path": str(start / "model"), "learner.init_from": str(start),
            "run.eval_prompts": eval_prompts, "learner.steps": steps, "learner.lr": BASE_LR,
            "learner.lr_base_samples": BASE_SAMPLES if scaled else per_step,
            "run.eval_interval": max(1, steps // 6), "run.seed": seed, "learner.seed": seed,
            "learner.checkpoint_interval": steps}


def curve(res: dict) -> list[tuple[int, float, float]]:
    return [(h["generated"], h["wall_s"], h["pass_at_1"]) for h in res["heldout"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 seed, short phases")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--pro-steps", type=int, default=480, help="phase 1: ProRL steps at most")
    ap.add_argument("--train-samples", type=int, default=61_440, help="phase 2: trained samples per arm")
    ap.add_argument("--eval-prompts", type=int, default=256, help="held-out prompts per seed")
    ap.add_argument("--ablations", action="store_true", help="also N = 128 and N = 64 at ProRL's prompts per step")
    ap.add_argument("--reuse", action="store_true", help="reuse finished runs under runs/bench/saturation")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.pro_steps, args.train_samples, args.eval_prompts = 1, 40, 4096, 32
    from bench.common import brorl_run, load_run, table, write_json

    out = OUT / "quick" if args.quick else OUT  # a quick run's short phases are never reused by a full one

    def run(run_dir: Path, o: dict) -> dict:
        """A run, or with --reuse the finished one in `run_dir` if it ran with exactly these overrides."""
        run_dir = out / run_dir
        done = run_dir / "bench_overrides.json"
        if args.reuse and (run_dir / "summary.json").exists():
            if done.exists() and json.loads(done.read_text()) == json.loads(json.dumps(o)):
                return load_run(run_dir)
            print(f"  {run_dir.name}: its finished run had other settings; running it again", file=sys.stderr)
        res = brorl_run(run_dir, o, timeout=6 * 3600)  # phase 1: up to 480 steps
        done.write_text(json.dumps(o, indent=1, sort_keys=True))
        return res

    k = COMMON["run.eval_samples"]
    arms = {**ARMS, **(ABLATIONS if args.ablations else {})}
    p1 = {**COMMON, **PRO, "learner.steps": args.pro_steps, "learner.lr": BASE_LR, "run.eval_prompts": args.eval_prompts,
          "learner.lr_base_samples": BASE_SAMPLES, "run.eval_interval": EVAL, "learner.checkpoint_interval": EVAL,
          "learner.checkpoint_keep": args.pro_steps // EVAL + 1, "run.seed": 0, "learner.seed": 0}
    print(f"  phase 1: ProRL up to {args.pro_steps} steps ...", file=sys.stderr, flush=True)
    phase1 = run(Path("phase1"), p1)
    sat = saturation_step(phase1["heldout"], k)
    start = sat if sat is not None else phase1["heldout"][-1]["step"]
    ckpt = out / "phase1" / "checkpoints" / f"step-{start:06d}"
    print(f"  saturated at step {sat} (criterion); phase 2 starts from step {start}", file=sys.stderr, flush=True)

    runs = []
    for seed in range(args.seeds):
        for arm in arms:
            o = arm_overrides(arm, ckpt, args.train_samples, seed, args.eval_prompts)
            print(f"  {arm}, seed {seed}: {o['learner.steps']} steps ...", file=sys.stderr, flush=True)
            res = run(Path(f"{SLUGS[arm]}-s{seed}"), o)
            m, h = res["metrics"], res["heldout"]
            runs.append({"arm": arm, "seed": seed, "steps": len(m), "pass_at_1_start": h[0]["pass_at_1"],
                         "pass_at_1_end": h[-1]["pass_at_1"], "gain": h[-1]["pass_at_1"] - h[0]["pass_at_1"],
                         "pass_at_k_start": h[0]["pass_at_k"], "pass_at_k_end": h[-1]["pass_at_k"],
                         "generated": sum(r["generated"] for r in m), "trained": sum(r["samples"] for r in m),
                         "pass_rate": statistics.mean(r["pass_rate"] for r in m), "train_wall_s": h[-1]["wall_s"],
                         "correct_start": h[0]["correct"], "correct_end": h[-1]["correct"], "curve": curve(res)})
            r = runs[-1]
            print(f"    pass@1 {r['pass_at_1_start']:.3f} -> {r['pass_at_1_end']:.3f}, pass@{k} "
                  f"{r['pass_at_k_start']:.3f} -> {r['pass_at_k_end']:.3f}, {r['generated']} generated, "
                  f"pass rate {r['pass_rate']:.2f}", file=sys.stderr, flush=True)

    def instances(arm: str, key: str, at_k: bool = False) -> list[float]:
        """Per (seed, prompt): the pass rate of its k samples, or (at_k) whether any was right (pass@k)."""
        return [float(c > 0) if at_k else c / k for r in runs if r["arm"] == arm for c in r[key]]

    tests = {}
    for at_k, what in ((False, "pass@1"), (True, f"pass@{k}")):
        tests.update({f"{what}: {arm} vs ProRL (N=16)": paired(instances("ProRL (N=16)", "correct_end", at_k),
                                                              instances(arm, "correct_end", at_k))
                      for arm in arms if arm != "ProRL (N=16)"})
        tests.update({f"{what}: {arm}, end vs start": paired(instances(arm, "correct_start", at_k),
                                                            instances(arm, "correct_end", at_k)) for arm in arms})
    rows = []
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm]

        def ms(key, rs=rs, scale=1.0):
            xs = [scale * r[key] for r in rs]
            return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.1f}"

        rows.append({"arm": arm, "steps": rs[0]["steps"], "pass@1 start %": ms("pass_at_1_start", scale=100),
                     "pass@1 end %": ms("pass_at_1_end", scale=100), "gain (points)": ms("gain", scale=100),
                     f"pass@{k} start %": ms("pass_at_k_start", scale=100),
                     f"pass@{k} end %": ms("pass_at_k_end", scale=100),
                     "generated": ms("generated"), "pass rate %": ms("pass_rate", scale=100),
                     "train wall s": ms("train_wall_s")})
    held1 = phase1["heldout"]
    print("\nPhase 1 (ProRL): held-out pass@1 by step: "
          + ", ".join(f"{h['step']}: {100 * h['pass_at_1']:.1f}%" for h in held1)
          + f"\nsaturated at step {sat} (no new best of the {WINDOW}-evaluation mean for {PATIENCE} evaluations); phase 2 from step {start}")
    print(f"\nPhase 2, {args.seeds} seed(s), {args.train_samples} trained samples per arm, mean ± std over seeds")
    print(table(rows, list(rows[0])))
    print("\nPaired tests over (seed, prompt) instances, per-prompt pass rate (b − a)")
    print(table([{"comparison": name, **t} for name, t in tests.items()], ["comparison", "n", "mean_diff", "t", "p"]))
    path = write_json("saturation_quick" if args.quick else "saturation", {"pro_steps": args.pro_steps, "train_samples": args.train_samples,
                                     "eval_every": EVAL, "window": WINDOW, "saturated_at": sat, "start": start,
                                     "phase1": [{k2: h[k2] for k2 in ("step", "generated", "wall_s", "pass_at_1")}
                                                for h in held1],
                                     "arms": {a: v[0] for a, v in arms.items()}, "runs": runs, "table": rows,
                                     "eval_prompts": args.eval_prompts, "k": k, "reproducible": True,
                                     "tests": tests})
    _plot(held1, sat, runs, arms, path.with_suffix(".png"))
    print(f"\nwrote {path}")


def _plot(held1, sat, runs, arms, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.bro_vs_pro import plot_curves

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    axes[0].plot([h["generated"] for h in held1], [h["pass_at_1"] for h in held1], "o-", color="C0", ms=3)
    if sat is not None:
        g = next(h["generated"] for h in held1 if h["step"] == sat)
        axes[0].axvline(g, color="k", ls=":", label=f"saturated (step {sat})")
        axes[0].legend(fontsize=8)
    axes[0].set_title("phase 1: ProRL (N = 16)", fontsize=9)
    axes[0].set_xlabel("generated samples")
    plot_curves(axes[1], axes[2], runs, arms)
    axes[1].set_xlabel("phase 2: generated samples")
    axes[2].set_xlabel("phase 2: training wall time, s (evaluation excluded)")
    for ax in axes:
        ax.set_ylabel("held-out pass@1")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("Saturate with ProRL, then broaden: tiny model on CPU; one line per seed", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
