"""Staleness against throughput: sweep `job.max_staleness` on the default job.

    python -m bench.staleness [--quick] [--values 0 1 2 4 8] [--repeats 3]

Each value runs the tiny-cpu job (`brorl run`, one actor, tiny model on CPU) with N = 16 and B = 8 prompts
per step for the same number of steps, i.e. the same trained samples, with a credit window of two steps'
prompts (`actor.prompts_per_request` = B) so the actor can run ahead as far as the bound lets it. Per value: generated samples/s over the
learner's loop time (waiting + training + broadcasting; start-up and evaluation excluded), the share
of that time the actor's engine had no request (loading weights, gated by the bound, or granted nothing
because the learner's freshness bound was reached — the actor's heartbeat `idle_s`), the share the
learner waited for data, the staleness histogram of trained groups, the mismatch KL,
the truncated-IS clip fraction, and held-out pass@1 at the end (64 prompts × 16 samples); and the same
throughput, waiting and idle shares in steady state (the first `WARM` steps, which wait for the engine's
first groups, left out). On 2 shared cores one run's figures move by up to ~25 % between runs of the same
settings, so each value runs `--repeats` times (seeds `--seed`, `--seed` + 1, …): the table gives the mean
of the runs, the spread (standard deviation over runs) of the steady-state figures, and every run is kept
in the JSON. Writes bench/results/staleness.json and .png, and the fleet simulator's rates measured in the
steady state of the K = 0 runs, pooled (bench/results/fleet_calibration.json, see bench/fleet.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARM = 3  # steps left out of the steady-state figures (and of the fleet simulator's calibration)


def one(value: int, steps: int, seed: int, rep: int = 0, reuse: bool = False) -> dict:
    """One run of the job at K = `value`; its figures, and (`_steady`, `_steady_idle_s`) what calibration needs."""
    from bench.common import brorl_run, load_run
    from learner.metrics import loop_seconds

    o = {"job.max_staleness": value, "learner.steps": steps, "job.prompts_per_step": 8,
         "actor.prompts_per_request": 8,
         "run.eval_interval": steps, "run.eval_prompts": 64, "run.eval_samples": 16, "run.seed": seed,
         "learner.seed": seed, "learner.checkpoint_interval": steps}
    run_dir = ROOT / "runs" / "bench" / "staleness" / (f"k{value}" + (f"-r{rep}" if rep else ""))
    res = load_run(run_dir) if reuse and (run_dir / "summary.json").exists() else brorl_run(run_dir, o)
    m, h = res["metrics"], res["heldout"]
    loop = loop_seconds(m)
    hist: dict[int, float] = {}
    for r in m:
        for k, v in r.items():
            if k.startswith("staleness_") and k[len("staleness_"):].isdigit():
                hist[int(k[len("staleness_"):])] = hist.get(int(k[len("staleness_"):]), 0.0) + v
    total = sum(hist.values()) or 1.0
    # steady state: from step WARM on (the first steps wait for the engine's first groups)
    steady, warm_idle = m[WARM:], m[WARM - 1].get("actor_idle_s", 0.0)
    steady_loop = loop_seconds(steady)
    steady_idle = m[-1].get("actor_idle_s", 0.0) - warm_idle
    return {"max_staleness": value, "seed": seed, "steps": len(m),
            "steady_samples_per_s": sum(r["generated"] for r in steady) / steady_loop,
            "steady_wait_share": sum(r["wait_s"] for r in steady) / steady_loop,
            "steady_idle_share": steady_idle / steady_loop,
            "steady_train_s": statistics.mean(r["train_s"] for r in steady),
            "generated": sum(r["generated"] for r in m),
            "samples_per_s": sum(r["generated"] for r in m) / loop, "loop_s": loop,
            "idle_share": m[-1].get("actor_idle_s", 0.0) / loop,
            "wait_share": sum(r["wait_s"] for r in m) / loop,
            "staleness_mean": sum(k * v for k, v in hist.items()) / total,
            "staleness_hist": {str(k): v / total for k, v in sorted(hist.items())},
            "tis_clip_frac": statistics.mean(r.get("tis_clip_frac", 0.0) for r in m),
            "mismatch_kl": statistics.mean(r.get("mismatch_kl", 0.0) for r in m),
            "pass_at_1_start": h[0]["pass_at_1"], "pass_at_1_end": h[-1]["pass_at_1"],
            "_steady": steady, "_steady_idle_s": steady_idle}


SPREAD = ("steady_samples_per_s", "steady_wait_share", "staleness_mean")


def combine(runs: list[dict]) -> dict:
    """One row for a value's runs: the mean of every figure, the standard deviation over runs of `SPREAD`
    (`<key>_std`), the staleness histogram averaged, and the runs themselves."""
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    row = {k: statistics.mean(r[k] for r in public) for k, v in public[0].items()
           if isinstance(v, (int, float)) and k not in ("max_staleness", "seed")}
    row["max_staleness"] = runs[0]["max_staleness"]
    for k in SPREAD:
        row[f"{k}_std"] = statistics.stdev(r[k] for r in public) if len(public) > 1 else 0.0
    keys = sorted({k for r in public for k in r["staleness_hist"]}, key=int)
    row["staleness_hist"] = {k: statistics.mean(r["staleness_hist"].get(k, 0.0) for r in public) for k in keys}
    row["runs"] = public
    return row


def calibration(runs: list[dict], steps: int) -> dict:
    """The simulator's rates from the on-policy runs' steady states, pooled."""
    from fleet.calibration import calibrate

    steady = [r for run in runs for r in run["_steady"]]
    n, per_request = 16, 8
    return calibrate(steady, sum(run["_steady_idle_s"] for run in runs), n=n, seqs_in_flight=n * 2 * per_request,
                     fit={"actors": 1, "prompts_per_step": 8, "prompts_per_request": per_request,
                          "max_staleness": 0, "steps": steps - WARM}, shared_host=True)  # 2 cores for all roles


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="values 0 and 2, fewer steps")
    ap.add_argument("--values", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="runs per value (seeds seed, seed + 1, ...)")
    ap.add_argument("--reuse", action="store_true", help="read finished runs under runs/bench/staleness again")
    args = ap.parse_args()
    if args.quick:
        args.values, args.steps, args.repeats = [0, 2], 12, 1
    from bench.common import table, write_json

    rows, on_policy = [], []
    for v in args.values:
        runs = []
        for i in range(args.repeats):
            print(f"  max_staleness = {v}, run {i + 1} of {args.repeats} ...", file=sys.stderr, flush=True)
            runs.append(one(v, args.steps, args.seed + i, i, args.reuse))
            r = runs[-1]
            print(f"    {r['samples_per_s']:.0f} samples/s (steady {r['steady_samples_per_s']:.0f}), idle "
                  f"{100 * r['idle_share']:.0f}%, staleness mean {r['staleness_mean']:.2f}, pass@1 "
                  f"{r['pass_at_1_end']:.3f}", file=sys.stderr, flush=True)
        rows.append(combine(runs))
        if v == 0:
            on_policy = runs
    print(f"\nmax_staleness sweep, default job, {args.steps} steps each (same trained samples), mean of "
          f"{args.repeats} run(s)")
    print(table(rows, ["max_staleness", "samples_per_s", "idle_share", "wait_share", "staleness_mean",
                       "tis_clip_frac", "mismatch_kl", "pass_at_1_start", "pass_at_1_end"]))
    print(f"\nsteady state (from step {WARM + 1} on: no engine start-up), mean and spread over runs")
    print(table(rows, ["max_staleness", "steady_samples_per_s", "steady_samples_per_s_std", "steady_wait_share",
                       "steady_wait_share_std", "staleness_mean", "staleness_mean_std", "steady_idle_share",
                       "steady_train_s"]))
    path = write_json("staleness", {"steps": args.steps, "seed": args.seed, "repeats": args.repeats, "rows": rows})
    _plot(rows, path.with_suffix(".png"))
    print(f"\nwrote {path}")
    if on_policy:  # the fleet simulator's rates: this machine's, from the on-policy runs (bench/fleet.py)
        from bench.common import stamp
        from fleet.calibration import DEFAULT, save

        save({**calibration(on_policy, args.steps), "prompts_per_step": 8, "prompts_per_request": 8,
              "steps": args.steps, "runs": len(on_policy)}, stamp())
        print(f"wrote {DEFAULT}")


def _plot(rows, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["max_staleness"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    axes[0].errorbar(ks, [r["steady_samples_per_s"] for r in rows], yerr=[r["steady_samples_per_s_std"] for r in rows],
                     fmt="o-", capsize=3, label="samples/s (steady state, mean ± sd over runs)")
    ax2 = axes[0].twinx()
    ax2.plot(ks, [100 * r["idle_share"] for r in rows], "s--", color="C3", label="actor engine idle %")
    axes[0].set_ylabel("generated samples / s, steady state")
    ax2.set_ylabel("actor engine idle, %")
    axes[0].set_title("throughput")
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        h = r["staleness_hist"]
        axes[1].bar([int(k) + i * width for k in h], list(h.values()), width=width, label=f"K={r['max_staleness']}")
    axes[1].set_xlabel("staleness of trained groups (steps)")
    axes[1].set_ylabel("share")
    axes[1].legend(fontsize=7)
    axes[1].set_title("staleness histogram")
    axes[2].plot(ks, [r["pass_at_1_end"] for r in rows], "o-", label="held-out pass@1 (end)")
    axes[2].plot(ks, [r["tis_clip_frac"] for r in rows], "x--", label="TIS clip fraction")
    axes[2].set_title("quality")
    axes[2].legend(fontsize=7)
    for ax in (axes[0], axes[2]):
        ax.set_xlabel("max_staleness K")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(ks, [str(k) for k in ks])
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
