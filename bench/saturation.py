"""The paper's experiment on CPU: saturate the model with ProRL, then broaden (BroRL) or keep scaling steps.

    python -m bench.saturation [--quick] [--seeds 5] [--ablations]

The tiny model after its warm start (the default job's), the synthetic arithmetic task. Every run is
`run.reproducible` (one actor, K = 0): a run is a pure function of its command, so two arms of one seed
differ by their settings only, and a figure can be rerun exactly.

Phase 1, ProRL (N = 16, 16 prompts per step, lr 3e-4) for up to `--pro-steps` steps, a held-out estimate
and a checkpoint every `EVAL` steps. **Saturation criterion:** held-out pass@1 averaged over a window of
`WINDOW` evaluations has set no new best, by more than twice its sampling noise, for `PATIENCE`
evaluations and sets none for the rest of phase 1. The same prompts are used at every evaluation, so the
noise of one estimate is that of k
samples per prompt, sqrt(Σ p_i(1 - p_i) / k) / n over the n prompts. Phase 2 starts from the checkpoint
of the step where the criterion holds (the last one if it never does, which is then said).

Phase 2 continues the job from that checkpoint (`learner.init_from`: the weights *and* phase 1's AdamW
state, as a continuing job would; the √ rule changes only the rate), the same trained samples per arm:
    ProRL (N = 16):       16 prompts/step,    256 samples/step, lr 3e-4 (continue as before)
    BroRL (N = 512):       4 prompts/step,  2,048 samples/step, lr 3e-4 · sqrt(2048 / 256) ≈ 8.5e-4
    BroRL (N = 512, η0):  the same at lr 3e-4 (separates N from the rate)
    with --ablations:
    BroRL (N = 128):      16 prompts/step,  2,048 samples/step, lr ≈ 8.5e-4 (ProRL's prompts per update, √-scaled rate)
    BroRL (N = 64):       16 prompts/step,  1,024 samples/step, lr 3e-4 · sqrt(4) = 6e-4
    BroRL (N = 128, η0):  16 prompts/step,  2,048 samples/step, lr 3e-4 (N alone: ProRL's prompts per update
                          and rate; only the samples per prompt, and so the number of updates, differ)
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
    "BroRL (N=128, η0)": ({"job.n_samples": 128, "job.prompts_per_step": 16, "actor.prompts_per_request": 4}, False),
}
SLUGS = {"ProRL (N=16)": "prorl", "BroRL (N=512)": "brorl", "BroRL (N=512, η0)": "brorl-eta0",
         "BroRL (N=128)": "brorl-n128", "BroRL (N=64)": "brorl-n64",
         "BroRL (N=128, η0)": "brorl-n128-eta0"}


def noise(row: dict, k: int) -> float:
    """Sampling noise (one standard error) of a held-out pass@1 estimate on a fixed prompt set."""
    ps = [c / k for c in row["correct"]]
    return math.sqrt(sum(p * (1 - p) for p in ps) / k) / len(ps)


def saturation_step(held: list[dict], k: int, window: int = WINDOW, patience: int = PATIENCE) -> int | None:
    """The evaluated step by which the held-out pass@1, averaged over `window` evaluations, had set no new best
    (by more than twice its noise) for `patience` evaluations, *and set none for the rest of phase 1*: progress
    stopped for good; None if no such step (phase 1 was still improving at its end). Window means, not single
    points: RL on the tiny model swings by several points from one evaluation to the next, and a dip followed
    by a recovery is not a plateau. With hindsight, because phase 1 runs to its end anyway: a slow climb whose
    window means stall for `patience` evaluations and then rise again is not saturated (the first design of
    this criterion stopped at the first stall and called a model saturated 6 points below where it went on
    to)."""
    best, best_at, fired = None, 0, None
    for i in range(window - 1, len(held)):
        win = held[i - window + 1: i + 1]
        mean = statistics.mean(h["pass_at_1"] for h in win)
        sigma = math.sqrt(sum(noise(h, k) ** 2 for h in win)) / window
        if best is None or mean > best + 2 * sigma:
            best, best_at, fired = mean, i, None
        elif fired is None and i - best_at >= patience:
            fired = held[i]["step"]
    return fired


def start_model_sha() -> str:
    """SHA-256 of phase 1's start, the preset's model (built by `brorl run` where it is missing): a record
    from another session is only worth reusing from the same start."""
    import hashlib

    from config.loader import load_config

    return hashlib.sha256((ROOT / load_config("tiny-cpu").model.path / "model.safetensors").read_bytes()).hexdigest()


def token_level_prediction(arms: dict, q0: float, train_samples: int, seeds: int = 5, vocab: int = 1000) -> dict:
    """What the paper's token-level simulator (section 4.1, `theory.simulator`) predicts for each arm's phase
    2: one prompt whose correct tokens hold the measured start pass@1 `q0` of the probability (uniform logits
    over `vocab` tokens), N samples a step, as many AdamW steps at the arm's rate as the arm makes updates.
    It has free logits per prompt, no weights shared between prompts: where it and the runs disagree, what it
    leaves out is the suspect. Gain of the correct mass in points and the share of correct tokens whose
    probability rose, mean over `seeds`."""
    from learner.algorithm import scaled_lr
    from theory.simulator import SimConfig, simulate_one

    out = {}
    for arm, (o, scaled) in arms.items():
        per_step = o["job.n_samples"] * o["job.prompts_per_step"]
        steps = max(1, train_samples // per_step)
        lr = scaled_lr(BASE_LR, BASE_SAMPLES if scaled else per_step, per_step)  # the learner's own rule
        trajs = [simulate_one(SimConfig(vocab=vocab, n_correct=max(1, round(q0 * vocab)), ns=(o["job.n_samples"],),
                                        steps=steps, lr=lr, init="uniform", seed=seed), o["job.n_samples"])
                 for seed in range(seeds)]
        out[arm] = {"steps": steps, "lr": lr,
                    "gain_points": 100 * statistics.mean(t.q_pos[-1] - t.q_pos[0] for t in trajs),
                    "correct_tokens_up_pct": statistics.mean(t.pct_increased[-1] for t in trajs)}
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 seed, short phases")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--pro-steps", type=int, default=480, help="phase 1: ProRL steps at most")
    ap.add_argument("--train-samples", type=int, default=61_440, help="phase 2: trained samples per arm")
    ap.add_argument("--eval-prompts", type=int, default=256, help="held-out prompts per seed")
    ap.add_argument("--ablations", action="store_true", help="also N = 128 and N = 64 at ProRL's prompts per step "
                    "(√-scaled rate), and N = 128 at ProRL's rate")
    ap.add_argument("--reuse", action="store_true", help="reuse finished runs (records, runs/)")
    ap.add_argument("--phase1", action="store_true", help="phase 1 only (its checkpoints start bench.adaptive "
                    "--from-saturated); with --reuse it must reproduce the stored curve")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.pro_steps, args.train_samples, args.eval_prompts = 1, 40, 4096, 32
    from bench.arms import Records, Runner, plot_runs, record, rows as arm_rows, tests as arm_tests
    from bench.common import RESULTS, table, write_json

    out = OUT / "quick" if args.quick else OUT  # a quick run's short phases are never reused by a full one
    run = Runner(out, args.reuse)
    # the finished records: kept with the results (a full run takes longer than one session), in runs/ if --quick
    store = Records(out / "records.jsonl" if args.quick else RESULTS / "saturation_runs.jsonl", args.reuse)

    k = COMMON["run.eval_samples"]
    arms = {**ARMS, **(ABLATIONS if args.ablations else {})}
    p1 = {**COMMON, **PRO, "learner.steps": args.pro_steps, "learner.lr": BASE_LR, "run.eval_prompts": args.eval_prompts,
          "learner.lr_base_samples": BASE_SAMPLES, "run.eval_interval": EVAL, "learner.checkpoint_interval": EVAL,
          "learner.checkpoint_keep": args.pro_steps // EVAL + 1, "run.seed": 0, "learner.seed": 0}

    def plan(held1: list[dict]) -> tuple[int | None, int, list[tuple[str, int, str, dict]]]:
        sat = saturation_step(held1, k)
        start = sat if sat is not None else held1[-1]["step"]
        ckpt = out / "phase1" / "checkpoints" / f"step-{start:06d}"
        return sat, start, [(arm, seed, f"{SLUGS[arm]}-s{seed}", arm_overrides(arm, ckpt, args.train_samples, seed,
                                                                                  args.eval_prompts))
                            for seed in range(args.seeds) for arm in arms]

    stored = store.get("phase1", p1)
    held1 = stored["heldout"] if stored else None
    if held1 is None or args.phase1 or any(store.get(name, o) is None for _, _, name, o in plan(held1)[2]):
        print(f"  phase 1: ProRL up to {args.pro_steps} steps ...", file=sys.stderr, flush=True)
        ran = [{key: h[key] for key in ("step", "generated", "wall_s", "pass_at_1", "correct")}
               for h in run("phase1", p1)["heldout"]]
        sha = start_model_sha()
        if held1 is not None and [(h["step"], h["correct"]) for h in ran] != [(h["step"], h["correct"])
                                                                                for h in held1]:
            was = stored.get("model_sha256")
            why = (f"its start differs: the preset's model hashes {sha[:12]} now, {was[:12]} when stored"
                   if was and was != sha else "from the same start model (the code has changed since?)")
            raise SystemExit(f"phase 1 did not reproduce the held-out curve stored in {store.path} (pass@1 "
                             f"{[h['pass_at_1'] for h in held1]} stored, {[h['pass_at_1'] for h in ran]} now), "
                             f"{why}: its phase-2 records started from another model; run again without --reuse")
        if held1 is None or "model_sha256" not in stored:
            store.put("phase1", p1, {"heldout": ran, "model_sha256": sha})
        held1 = ran
    sat, start, planned = plan(held1)
    print(f"  saturated at step {sat} (criterion); phase 2 starts from step {start}", file=sys.stderr, flush=True)
    if args.phase1:
        return

    runs = []
    for arm, seed, name, o in planned:
        print(f"  {arm}, seed {seed}: {o['learner.steps']} steps ...", file=sys.stderr, flush=True)
        runs.append(store.get_or_run(name, o, lambda: record(arm, seed, run(name, o), k)))
    tests = arm_tests(runs, arms, "ProRL (N=16)", k)
    rows = arm_rows(runs, arms, k)
    print("\nPhase 1 (ProRL): held-out pass@1 by step: "
          + ", ".join(f"{h['step']}: {100 * h['pass_at_1']:.1f}%" for h in held1)
          + f"\nsaturated at step {sat} (no new best of the {WINDOW}-evaluation mean for {PATIENCE} evaluations); phase 2 from step {start}")
    print(f"\nPhase 2, {args.seeds} seed(s), {args.train_samples} trained samples per arm, mean ± std over seeds")
    print(table(rows, list(rows[0])))
    print("\nPaired tests over (seed, prompt) instances, per-prompt pass rate (b − a)")
    print(table([{"comparison": name, **t} for name, t in tests.items()], ["comparison", "n", "mean_diff", "t", "p"]))
    q0 = statistics.mean(r["pass_at_1_start"] for r in runs)
    predicted = token_level_prediction(arms, q0, args.train_samples)
    print(f"\nThe token-level simulator's prediction (one prompt at pass@1 {100 * q0:.1f} %, free logits)")
    print(table([{"arm": a, **p} for a, p in predicted.items()], ["arm", "steps", "lr", "gain_points",
                                                                   "correct_tokens_up_pct"]))
    path = write_json("saturation_quick" if args.quick else "saturation", {"pro_steps": args.pro_steps, "train_samples": args.train_samples,
                                     "eval_every": EVAL, "window": WINDOW, "saturated_at": sat, "start": start,
                                     "phase1": [{k2: h[k2] for k2 in ("step", "generated", "wall_s", "pass_at_1")}
                                                for h in held1],
                                     "arms": {a: v[0] for a, v in arms.items()}, "runs": runs, "table": rows,
                                     "eval_prompts": args.eval_prompts, "k": k, "reproducible": True,
                                     "tests": tests, "token_level_prediction": predicted})
    plot_runs(runs, arms, path.with_suffix(".png"), "Saturate with ProRL, then broaden: tiny model on CPU; one line per seed",
              lead=_phase1(held1, sat), k=k)
    print(f"\nwrote {path}")


def _phase1(held1, sat):
    """The saturation plot's first panel: phase 1's held-out curve and where it saturated."""
    def draw(ax) -> None:
        gen = [h["generated"] for h in held1]
        ax.plot(gen, [h["pass_at_1"] for h in held1], "o-", color="C0", ms=3, label="pass@1")
        # pass@k from the stored per-prompt counts: any of the k samples right
        ax.plot(gen, [sum(c > 0 for c in h["correct"]) / len(h["correct"]) for h in held1], "s--", color="C7", ms=3,
                label=f"pass@{COMMON['run.eval_samples']}")
        if sat is not None:
            g = next(h["generated"] for h in held1 if h["step"] == sat)
            ax.axvline(g, color="k", ls=":", label=f"saturated (step {sat})")
        ax.legend(fontsize=8)
        ax.set_title("phase 1: ProRL (N = 16), held-out", fontsize=9)
        ax.set_xlabel("generated samples")
    return draw


if __name__ == "__main__":
    main()
