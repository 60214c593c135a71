"""Adaptive rollouts against fixed N, on CPU: held-out gain per generated sample.

    python -m bench.adaptive [--quick] [--seeds 3] [--from-saturated] [--eta0]

The tiny model after its warm start (the default job's), the synthetic arithmetic task, every run
`run.reproducible` (one actor, K = 0). Three arms, the same trained samples each (`--train-samples`):
    fixed N = 16:               16 prompts per step,   256 samples per step (ProRL's shape)
    fixed N = 512:               4 prompts per step, 2,048 samples per step (BroRL's: a quarter of the prompts)
    adaptive N = 512, n0 = 16:   4 prompts per step, a first wave of 16, a mixed prompt completed to 512
lr 3e-4 at 256 samples per step, √-scaled with the step's samples (the paper's rule). Dynamic sampling keeps
only mixed groups, so the adaptive arm trains the same full groups of 512 as fixed N = 512 and differs in
what it generated to find them: a settled prompt cost it 16 samples instead of 512. Seeds vary the data
order, the sampling and the held-out prompts (`--eval-prompts` per seed, k samples each); the arms of a seed
share them, so end points are compared prompt by prompt (paired tests, as bench.saturation).

The goal (issue: adaptive rollouts): the same held-out gain for at most half the generated samples of the
better fixed N, or a clearly higher gain at equal samples. Writes bench/results/adaptive.json and .png
(`--from-saturated`: adaptive_saturated.*; `--quick`: *_quick.*).

`--from-saturated` starts every arm from the end of bench.saturation's phase 1 (weights and AdamW state),
where ProRL has narrowed the model: held-out pass@16 fell from 77 % to about 40 % there, so most prompts are
all wrong at 16 samples — the regime the adaptive rule is for. From the warm start nearly every prompt is
mixed at 16 samples, the rule stops almost nothing, and the adaptive arm is fixed N = 512 (under
`run.reproducible` its two waves sample what one request of 512 would).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "bench" / "adaptive"
BASE_LR, BASE_SAMPLES = 3e-4, 256
COMMON = {"run.eval_samples": 16, "learner.num_minibatches": 2, "run.reproducible": True, "job.max_staleness": 0,
          "learner.lr": BASE_LR, "learner.lr_base_samples": BASE_SAMPLES}
ARMS = {
    "fixed N=16": {"job.n_samples": 16, "job.prompts_per_step": 16, "actor.prompts_per_request": 16},
    "fixed N=512": {"job.n_samples": 512, "job.prompts_per_step": 4, "actor.prompts_per_request": 2},
    "adaptive N=512, n0=16": {"job.n_samples": 512, "job.prompts_per_step": 4, "actor.prompts_per_request": 4,
                              "job.rollouts": "adaptive", "job.first_wave": 16},
}
ETA0 = {"fixed N=512, η0": "fixed N=512", "adaptive N=512, n0=16, η0": "adaptive N=512, n0=16"}
"""With --eta0: the N = 512 arms again at fixed N = 16's rate (no √ scaling), which separates the rollout
allocation from the step size (at the √-scaled rate both N = 512 arms collapsed from the saturated start)."""
SLUGS = {"fixed N=16": "fixed16", "fixed N=512": "fixed512", "adaptive N=512, n0=16": "adaptive512",
         "fixed N=512, η0": "fixed512-eta0", "adaptive N=512, n0=16, η0": "adaptive512-eta0"}


def overrides(arm: str, train_samples: int, seed: int, eval_prompts: int, start: Path | None = None) -> dict:
    """An arm's run: from the warm start, or (`start`) a checkpoint's weights and AdamW state."""
    o = ARMS[ETA0.get(arm, arm)]
    per_step = o["job.n_samples"] * o["job.prompts_per_step"]
    steps = max(1, train_samples // per_step)
    if arm in ETA0:
        o = {**o, "learner.lr_base_samples": per_step}  # the rate as is, not √-scaled
    if start is not None:
        o = {**o, "model.path": str(start / "model"), "learner.init_from": str(start)}
    return {**COMMON, **o, "learner.steps": steps, "run.eval_prompts": eval_prompts,
            "run.eval_interval": max(1, steps // 6), "run.seed": seed, "learner.seed": seed,
            "learner.checkpoint_interval": steps}


def saturated_start() -> Path:
    """The last checkpoint of bench.saturation's phase 1, or a clear error if it has not run."""
    ckpts = sorted((ROOT / "runs" / "bench" / "saturation" / "phase1" / "checkpoints").glob("step-*"))
    if not ckpts:
        raise SystemExit("--from-saturated: no checkpoint under runs/bench/saturation/phase1/checkpoints; "
                         "run `python -m bench.saturation --reuse --phase1` first (phase 1 alone, 11 min)")
    return ckpts[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 seed, a short budget")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--train-samples", type=int, default=61_440, help="trained samples per arm (bench.saturation's "
                    "phase 2 budget: with --from-saturated its fixed-N runs are the same runs, read from its records)")
    ap.add_argument("--eval-prompts", type=int, default=256, help="held-out prompts per seed")
    ap.add_argument("--reuse", action="store_true", help="reuse finished runs of the same settings")
    ap.add_argument("--eta0", action="store_true", help="also the N = 512 arms at N = 16's rate (no √ scaling)")
    ap.add_argument("--from-saturated", action="store_true",
                    help="start every arm from the end of bench.saturation's phase 1 (run that first): a model "
                         "trained until many prompts are all right or all wrong at 16 samples")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.train_samples, args.eval_prompts = 1, 4096, 32
    from bench.arms import Records, Runner, plot_runs, record, rows, tests
    from bench.common import RESULTS, table, write_json

    start = saturated_start() if args.from_saturated else None
    out = (OUT / "quick" if args.quick else OUT) / ("saturated" if start else "warm")
    name = "adaptive" + ("_saturated" if start else "") + ("_quick" if args.quick else "")
    run, k = Runner(out, args.reuse), COMMON["run.eval_samples"]
    # the finished records, kept with the results (bench.arms.Records): the study goes on over sessions
    store = Records(out / "records.jsonl" if args.quick else RESULTS / f"{name}_runs.jsonl", args.reuse)
    # from the saturated start, fixed N = 16, fixed N = 512 and its η0 arm at bench.saturation's budget are its
    # ProRL and BroRL arms, run by the same overrides: read from its records instead of run again
    shared = Records(RESULTS / "saturation_runs.jsonl", True) if start and args.reuse and not args.quick else None
    arms = [*ARMS, *(ETA0 if args.eta0 else ())]
    runs = []
    for seed in range(args.seeds):
        for arm in arms:
            o = overrides(arm, args.train_samples, seed, args.eval_prompts, start)
            print(f"  {arm}, seed {seed}: {o['learner.steps']} steps ...", file=sys.stderr, flush=True)
            def make(name=f"{SLUGS[arm]}-s{seed}", arm=arm, seed=seed, o=o) -> dict:
                found = shared.find(o) if shared else None
                if found:
                    print(f"    the same run as bench.saturation's {found[0]}: its record", file=sys.stderr, flush=True)
                    r = {**found[1], "arm": arm}
                else:
                    r = record(arm, seed, run(name, o), k)
                r["gain_per_msample"] = 1e6 * r["gain"] / max(1.0, r["generated"])  # per 10⁶ generated
                return r

            runs.append(store.get_or_run(f"{SLUGS[arm]}-s{seed}", o, make))
    t = tests(runs, arms, "fixed N=512", k)
    if args.eta0:  # each η0 arm against fixed N = 512 at the same rate
        t.update(tests([r for r in runs if r["arm"] in ETA0], list(ETA0), "fixed N=512, η0", k))
    table_rows = rows(runs, arms, k, {"gain per 10⁶ generated": ("gain_per_msample", 100)})
    print(f"\n{args.seeds} seed(s), {args.train_samples} trained samples per arm, mean ± std over seeds")
    print(table(table_rows, list(table_rows[0])))
    print("\nPaired tests over (seed, prompt) instances, per-prompt pass rate (b − a)")
    print(table([{"comparison": name, **v} for name, v in t.items()], ["comparison", "n", "mean_diff", "t", "p"]))
    path = write_json(name, {"start": str(start.relative_to(ROOT)) if start else "the warm start",
        "train_samples": args.train_samples, "eval_prompts": args.eval_prompts, "k": k, "arms": ARMS, "eta0_arms": list(ETA0) if args.eta0 else [],
        "common": COMMON, "runs": runs, "table": table_rows, "tests": t, "reproducible": True})
    plot_runs(runs, arms, path.with_suffix(".png"),
              "Adaptive rollouts against fixed N, the same trained samples; one line per seed", k=k)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
