"""BroRL against ProRL on CPU: same model, task and trained-sample budget, several seeds.

    python -m bench.bro_vs_pro [--quick] [--seeds 3]

Both arms run the default job (`brorl run`, tiny model after its warm start, synthetic arithmetic) and
differ only as the paper's arms do (section 5):
    ProRL-style: N = 16,  B = 32 prompts per step  ->   512 samples per step, `steps` steps
    BroRL-style: N = 512, B = 8 prompts per step   -> 4,096 samples per step, steps / 8 steps
(the paper's ratios: 4× fewer prompts, 8× the samples per step), so both train on the same number of
samples. The learning rate follows the square-root rule from ProRL's η0 = 3e-4 at 512 samples per step
(the default job's rate) to 8.5e-4 for BroRL; PPO mini-batches per step stay 2 in both. A third arm,
"BroRL (N=512, η0)", keeps BroRL's batches at ProRL's 3e-4 to separate N from the rate. The learner
estimates held-out pass@1 (64 prompts × 16 samples, temperature 0.6, top_p 0.95) every 1/8 of the run
(`run.eval_interval`), which gives pass@1 against generated samples and against training wall time
(evaluation time excluded). Also reported: the dynamic-sampling pass rate and generated samples per
second. Seeds vary the data order, the sampling and the held-out prompts; both arms share each seed.
Writes bench/results/bro_vs_pro.json and .png and prints a table (mean ± std over seeds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_LR, BASE_SAMPLES = 3e-4, 512
ARMS = {
    "ProRL (N=16)": {"job.n_samples": 16, "job.prompts_per_step": 32, "actor.prompts_per_request": 16},
    "BroRL (N=512)": {"job.n_samples": 512, "job.prompts_per_step": 8, "actor.prompts_per_request": 4},
    # ablation: BroRL's batches with ProRL's learning rate (no square-root scaling)
    "BroRL (N=512, η0)": {"job.n_samples": 512, "job.prompts_per_step": 8, "actor.prompts_per_request": 4},
}
SLUGS = {"ProRL (N=16)": "prorl", "BroRL (N=512)": "brorl", "BroRL (N=512, η0)": "brorl-eta0"}
SCALED = {"ProRL (N=16)": True, "BroRL (N=512)": True, "BroRL (N=512, η0)": False}


def arm_overrides(arm: str, pro_steps: int, seed: int) -> dict:
    o = dict(ARMS[arm])
    per_step = o["job.n_samples"] * o["job.prompts_per_step"]
    steps = pro_steps * BASE_SAMPLES // per_step
    base = BASE_SAMPLES if SCALED[arm] else per_step  # B0 = B: η = η0
    return {**o, "learner.steps": steps, "learner.lr": BASE_LR, "learner.lr_base_samples": base,
            "run.eval_interval": max(1, steps // 8), "run.eval_prompts": 64, "run.eval_samples": 16,
            "run.seed": seed, "learner.seed": seed, "learner.checkpoint_interval": steps}


def summarize(arm: str, seed: int, res: dict) -> dict:
    m, h = res["metrics"], res["heldout"]
    per_step = ARMS[arm]["job.n_samples"] * ARMS[arm]["job.prompts_per_step"]
    gen = sum(r["generated"] for r in m)
    train_wall = h[-1]["wall_s"] if h else float("nan")
    return {"arm": arm, "seed": seed, "steps": len(m), "pass_at_1_start": h[0]["pass_at_1"],
            "pass_at_1_end": h[-1]["pass_at_1"], "gain": h[-1]["pass_at_1"] - h[0]["pass_at_1"],
            "generated": gen, "trained": per_step * len(m),
            "pass_rate": statistics.mean(r["pass_rate"] for r in m),
            "samples_per_s": gen / train_wall if train_wall else float("nan"), "train_wall_s": train_wall,
            "curve": [(x["generated"], x["wall_s"], x["pass_at_1"]) for x in h]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 seed, a quarter of the budget")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--pro-steps", type=int, default=80, help="ProRL steps; BroRL gets an eighth")
    ap.add_argument("--reuse", action="store_true", help="reuse finished runs of the same settings in runs/bench/bro_vs_pro")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.pro_steps = 1, 16
    from bench.arms import Runner, plot_runs
    from bench.common import table, write_json

    run, runs = Runner(ROOT / "runs" / "bench" / "bro_vs_pro", args.reuse, timeout=3600), []
    for seed in range(args.seeds):
        for arm in ARMS:
            o = arm_overrides(arm, args.pro_steps, seed)
            print(f"  {arm}, seed {seed}: {o['learner.steps']} steps ...", file=sys.stderr, flush=True)
            runs.append(summarize(arm, seed, run(f"{SLUGS[arm]}-s{seed}", o)))
            r = runs[-1]
            print(f"    pass@1 {r['pass_at_1_start']:.3f} -> {r['pass_at_1_end']:.3f}, {r['generated']} generated, "
                  f"pass rate {r['pass_rate']:.2f}, {r['samples_per_s']:.0f} samples/s", file=sys.stderr, flush=True)
    rows = []
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]

        def ms(k, rs=rs):
            xs = [r[k] for r in rs]
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            return f"{statistics.mean(xs):.3f} ± {sd:.3f}"

        rows.append({"arm": arm, "seeds": len(rs), "steps": rs[0]["steps"], "trained": rs[0]["trained"],
                     "pass@1 start": ms("pass_at_1_start"), "pass@1 end": ms("pass_at_1_end"), "gain": ms("gain"),
                     "generated": ms("generated"), "pass rate": ms("pass_rate"), "samples/s": ms("samples_per_s"),
                     "train wall s": ms("train_wall_s")})
    cols = list(rows[0])
    print(f"\nBroRL vs ProRL, tiny model on CPU, {args.seeds} seed(s), mean ± std")
    print(table(rows, cols))
    path = write_json("bro_vs_pro", {"pro_steps": args.pro_steps, "base_lr": BASE_LR, "base_samples": BASE_SAMPLES,
                                     "arms": ARMS, "runs": runs, "table": rows})
    plot_runs(runs, ARMS, path.with_suffix(".png"),
              "BroRL (N=512) vs ProRL (N=16), same trained samples; one line per seed")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
