"""`brorl simulate-fleet`: predict a job's throughput, staleness and idle time on a fleet (fleet/sim.py).

    brorl simulate-fleet --actors 48 --learner-gpus 16 --n 512 --prompts-per-step 128 --max-staleness 0,1,2
    brorl simulate-fleet --gpus 4 --calibration gpu-1.5b --n 16,512   # every learner : actor split of 4 GPUs

Every flag that takes a comma-separated list makes a grid (one simulation per combination). Component
costs come from `--calibration` (default: the rates our benchmarks measured on this kind of machine,
`bench/results/fleet_calibration.json`; `gpu-1.5b` for the 1.5B rates of our GPU benchmarks; `h200-1.5b` for the
1.5B rates of the whole loop on H200s at N = 512, `bench/results/fleet_calibration_h200.json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path

TAKES_OVERRIDES = False
GRID = {"actors": int, "learner_gpus": int, "n": int, "prompts_per_step": int, "max_staleness": int,
        "in_flight": str, "mean_tokens": float, "length_sigma": float, "model_gb": float, "first_wave": int,
        "settled_first": float}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("simulate-fleet", help="predict throughput, staleness and idle time of a fleet")
    p.add_argument("--actors", default="4", help="actor engines (comma-separated: a grid)")
    p.add_argument("--learner-gpus", default="1", help="learner GPUs")
    p.add_argument("--gpus", type=int, default=0,
                   help="instead of --actors and --learner-gpus: every split of this many GPUs (L for the learner, "
                        "the rest one actor each); the split with the most trained samples/s is marked, per grid point")
    p.add_argument("--n", default="16", help="N, completions per prompt")
    p.add_argument("--prompts-per-step", default="8", help="B, kept groups per step")
    p.add_argument("--max-staleness", default="1", help="K")
    p.add_argument("--in-flight", default="finish", help="finish or keep (actor.in_flight_on_update)")
    p.add_argument("--mean-tokens", default="256", help="median completion length")
    p.add_argument("--length-sigma", default="0.0", help="log-σ of completion lengths (0: all the median)")
    p.add_argument("--max-tokens", type=int, default=0, help="cap of a completion (0: none)")
    p.add_argument("--lengths", choices=["completion", "prompt"], default="completion",
                   help="completion: each completion draws its length (a real task); prompt: a prompt's "
                        "completions share one (actor.length_dist's budget, run to by a random model)")
    p.add_argument("--model-gb", default=None,
                   help="GB of weights sent at each update (with gpu-1.5b: 3, the 1.5B model in bf16; the time "
                        "grows by the GB as our NCCL benchmark measured). Default: the calibration's model")
    p.add_argument("--first-wave", default="0", help="adaptive rollouts: a prompt's first wave (0: fixed N)")
    p.add_argument("--settled-first", default="0.0",
                   help="with --first-wave: share of prompts whose first wave all agree (they stop there, dropped); "
                        "at least 1 - the keep rate, since a prompt all right or all wrong at N is so at its first wave")
    p.add_argument("--prompts-per-request", type=int, default=2)
    p.add_argument("--keep-rate", type=float, default=None, help="dynamic-sampling keep rate (default: calibration's)")
    p.add_argument("--mtbf-s", type=float, default=float("inf"), help="mean seconds between an actor's failures")
    p.add_argument("--restart-s", type=float, default=30.0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seeds", type=int, default=3, help="simulations averaged per grid point")
    p.add_argument("--calibration", default=None, help="rates JSON; gpu-1.5b (a 1.5B model from our component "
                   "benchmarks), or h200-1.5b (a 1.5B model from the whole loop on H200s, bench.fleet --only gpu)")
    p.add_argument("--contention", type=float, default=None,
                   help="slowdown while the learner trains and an actor generates on shared cores (0.5: each "
                        "takes 1.5 x as long); 0: roles on devices of their own (default: the calibration's, "
                        "measured on the 2-core machine that ran bench.staleness; 0 for gpu-1.5b)")
    p.add_argument("--out", default="runs/simulate-fleet", help="folder for fleet.json")
    return p


def _values(name: str, raw: str) -> list:
    try:
        return [GRID[name](x) for x in raw.split(",")]
    except ValueError:
        raise SystemExit(f"brorl simulate-fleet: --{name.replace('_', '-')} must be comma-separated "
                         f"{GRID[name].__name__} values, got {raw!r}") from None


def rates_and_shape(spec: str | None):
    """(Rates, keep rate, the calibrated model's GB) from `--calibration`."""
    from fleet.calibration import DEFAULT, load
    from fleet.model import Rates

    if spec == "gpu-1.5b":
        from fleet.calibration import GPU_MODEL_GB, gpu_rates

        return gpu_rates(), 0.5, GPU_MODEL_GB
    if spec == "h200-1.5b":
        from fleet.calibration import H200_DEFAULT

        spec = str(H200_DEFAULT)
    path = Path(spec) if spec else DEFAULT
    if not path.exists():
        if spec:
            raise SystemExit(f"brorl simulate-fleet: --calibration {spec}: no such file")
        print(f"brorl simulate-fleet: no {path} (run `python -m bench.staleness`): the simulator's default rates")
        return Rates(), 0.6, 0.0
    cal = load(path)  # its update time is one model's, all in `sync_s_fixed`
    return Rates(**cal["rates"]), cal["keep_rate"], 0.0


def main(args: argparse.Namespace, overrides: list[str]) -> int:
    import statistics

    from fleet.model import Fleet
    from fleet.sim import simulate

    if not set(args.in_flight.split(",")) <= {"finish", "keep"}:
        raise SystemExit(f"brorl simulate-fleet: --in-flight must be finish or keep, got {args.in_flight!r}")
    rates, keep_rate, model_gb = rates_and_shape(args.calibration)
    if args.model_gb is None:
        args.model_gb = str(model_gb)
    if args.contention is not None:
        if not args.contention >= 0:
            raise SystemExit(f"brorl simulate-fleet: --contention must be >= 0, got {args.contention}")
        rates = dataclasses.replace(rates, contention=args.contention)
    grid = {name: _values(name, getattr(args, name)) for name in GRID}
    if args.gpus:
        if args.gpus < 2:
            raise SystemExit(f"brorl simulate-fleet: --gpus needs at least 2 (a learner GPU and an actor's), got {args.gpus}")
        grid["actors"], grid["learner_gpus"] = list(range(1, args.gpus)), list(range(1, args.gpus))
    if any(not 0 <= w < n for w in grid["first_wave"] for n in grid["n"] if w):
        raise SystemExit(f"brorl simulate-fleet: --first-wave must be below --n (or 0: fixed N), got {args.first_wave!r}")
    if any(not 0.0 <= x <= 1.0 for x in grid["settled_first"]):
        raise SystemExit(f"brorl simulate-fleet: --settled-first must be in [0, 1], got {args.settled_first!r}")
    if any(v < 0 for v in grid["model_gb"]):
        raise SystemExit(f"brorl simulate-fleet: --model-gb must be >= 0, got {args.model_gb!r}")
    if any(grid["model_gb"]) and rates.sync_s_per_gb == 0:
        print("brorl simulate-fleet: this calibration's update time is its own model's (no cost per GB): "
              "--model-gb changes nothing; --calibration gpu-1.5b has one")
    rows = []
    for combo in itertools.product(*grid.values()):
        point = dict(zip(grid, combo))
        if args.gpus and point["actors"] + point["learner_gpus"] != args.gpus:
            continue
        runs = [simulate(Fleet(**point, max_tokens=args.max_tokens, lengths=args.lengths,
                               prompts_per_request=args.prompts_per_request,
                               keep_rate=args.keep_rate if args.keep_rate is not None else keep_rate,
                               mtbf_s=args.mtbf_s, restart_s=args.restart_s, steps=args.steps, seed=s, rates=rates))
                for s in range(args.seeds)]
        res = {k: statistics.mean(getattr(r, k) for r in runs) for k in (
            "samples_per_s", "trained_samples_per_s", "learner_wait_share", "actor_idle_share", "staleness_mean", "lag_mean",
            "learner_train_share", "learner_sync_share")}
        keys = sorted({k for r in runs for k in r.staleness_hist}, key=int)
        hist = {k: statistics.mean(r.staleness_hist.get(k, 0.0) for r in runs) for k in keys}
        rows.append({**point, **res, "staleness_hist": hist, "bottleneck": bottleneck(res)})
    cols = [k for k in grid if len(grid[k]) > 1] or ["actors"]
    if args.gpus:
        mark_best_splits(rows, [k for k in cols if k not in ("actors", "learner_gpus")])
    print(_table(rows, cols + ["samples_per_s", "trained_samples_per_s", "staleness_mean", "lag_mean", "learner_wait_share", "actor_idle_share",
                               "learner_train_share", "learner_sync_share", "bottleneck"] + (["best_split"] if args.gpus else [])))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps({"rates": vars(rates), "rows": rows}, indent=2) + "\n")
    _plot(rows, cols, out / "fleet.png")
    print(f"wrote {out / 'fleet.json'} and {out / 'fleet.png'}")
    return 0


def _plot(rows: list[dict], cols: list[str], path: Path) -> None:
    """Per grid point: samples/s; the learner's waiting and the actors' idle shares; the staleness histogram
    of trained samples (stacked: how many steps behind)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["\n".join(f"{c}={r[c]}" for c in cols) for r in rows]
    x = range(len(rows))
    fig, axes = plt.subplots(1, 3, figsize=(max(10, 1.2 * len(rows) * 3), 3.8))
    axes[0].bar(x, [r["samples_per_s"] for r in rows])
    axes[0].set_title("generated samples/s")
    for i, (key, name) in enumerate((("learner_wait_share", "learner waiting"), ("actor_idle_share", "actors idle"))):
        axes[1].bar([j + 0.4 * i for j in x], [r[key] for r in rows], width=0.4, label=name)
    axes[1].set_title("shares of the time")
    axes[1].legend(fontsize=7)
    bottom = [0.0] * len(rows)
    for k in sorted({k for r in rows for k in r["staleness_hist"]}, key=int):
        h = [r["staleness_hist"].get(k, 0.0) for r in rows]
        axes[2].bar(x, h, bottom=bottom, label=f"{k} behind")
        bottom = [b + v for b, v in zip(bottom, h)]
    axes[2].set_title("staleness of trained samples")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(list(x), labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def mark_best_splits(rows: list[dict], others: list[str]) -> None:
    """`best_split` on each row: "best" where its learner : actor split trains the most samples/s among the
    rows that share its other grid values (`others`), else ""."""
    best = {}
    for r in rows:
        key = tuple(r[k] for k in others)
        if key not in best or r["trained_samples_per_s"] > best[key]["trained_samples_per_s"]:
            best[key] = r
    for r in rows:
        r["best_split"] = "best" if best[tuple(r[k] for k in others)] is r else ""


def bottleneck(r: dict) -> str:
    """What limits the simulated job, by where the time goes."""
    if r["learner_sync_share"] > 0.3:
        return "weight updates (drain + send)"
    if r["learner_train_share"] > 0.7:
        return "learner"
    if r["actor_idle_share"] > 0.5:
        return "grants (freshness bound)"
    return "generation"


def _table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in cols]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(fmt(r[c]).rjust(w) for c, w in zip(cols, widths)) for r in rows]
    return "\n".join(lines)
