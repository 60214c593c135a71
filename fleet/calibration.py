"""The simulator's component costs from what our benchmarks measured.

`bench.staleness` writes `bench/results/fleet_calibration.json` from its on-policy run (K = 0), in steady
state: the job's own per-step metrics give the learner's time per trained token (a least-squares line over
the steps, or the mean step), the weight update's cost (the fastest step's broadcast: nothing in flight to
wait for), the actor's weight load (its fastest update of a step, less the transfer), the mean
completion length and the dynamic-sampling keep rate; the actor engine's rate is its tokens/s while it
had work, scaled until the simulated run gives the measured samples/s (one fitted
number). The runs with K > 0 are then predictions, compared with what was measured (`python -m bench.fleet`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from fleet.sim import Fleet, Rates
from learner.metrics import loop_seconds

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
DEFAULT = RESULTS / "fleet_calibration.json"


def calibrate(metrics: list[dict], actor_idle_s: float, n: int, seqs_in_flight: int, gen_half_seqs: float = 16.0,
              fit: dict | None = None) -> dict:
    """Rates and job shape from one run's per-step metrics (`metrics.jsonl` rows, start-up excluded by the
    caller) and its actor's total idle seconds. With `fit` (the run's `Fleet` settings: actors, B, credits,
    K), the engine's rate is then scaled until the simulator reproduces the run's samples/s: a group lasts
    as long as its longest completion, which per-step totals do not show."""
    train_s = np.array([r["train_s"] for r in metrics])
    tokens = np.array([r["train_tokens"] for r in metrics], float)
    slope, fixed = np.polyfit(tokens, train_s, 1) if np.ptp(tokens) > 0 else (0.0, train_s.mean())
    if slope <= 0 or fixed < 0:  # too little spread in step sizes to tell the two apart: the mean step
        slope, fixed = 0.0, float(train_s.mean())
    loop = loop_seconds(metrics)
    generated_tokens = sum(r["tokens"] for r in metrics)
    sync = float(min(r["broadcast_s"] for r in metrics))
    # the actor's weight load: its fastest update of a step (nothing in flight to finish first) less the
    # transfer, which the simulator adds itself (`sync_s_fixed`). Rows of several runs may be pooled: a
    # run's first row then follows another run's last, and that difference is not an update.
    updates = np.diff([r.get("actor_update_s", 0.0) for r in metrics])
    updates = updates[updates > 0]
    load = max(float(updates.min()) - sync, 0.0) if updates.size else 0.0
    busy = max(loop - actor_idle_s, 1e-9)
    rate = generated_tokens / busy  # tokens/s of the engine while it had work
    # dynamic sampling's keep rate: of the groups that reached it (a group dropped as too stale, or whose lease
    # had gone, is the admission rules' doing, which the simulator applies itself)
    received = sum(r["groups_received"] - r.get("drop_stale", 0) - r.get("drop_unleased", 0) for r in metrics)
    cal = {
        "rates": asdict(Rates(
            gen_tokens_per_s=rate * (seqs_in_flight + gen_half_seqs) / seqs_in_flight, gen_half_seqs=gen_half_seqs,
            train_s_per_token=max(float(slope), 0.0), train_s_fixed=max(float(fixed), 0.0),
            sync_s_fixed=sync, load_s=load)),
        "mean_tokens": generated_tokens / max(sum(r["generated"] for r in metrics), 1),
        "keep_rate": sum(r["groups_kept"] for r in metrics) / max(received, 1),
        "n": n,
        "busy_tokens_per_s": rate,
    }
    if fit is not None:
        cal["samples_per_s"] = sum(r["generated"] for r in metrics) / loop
        cal["rates"]["gen_tokens_per_s"] *= fit_engine_scale(cal, fit)
    return cal


def fit_engine_scale(cal: dict, fit: dict, seeds: int = 4) -> float:
    """The factor on the engine's rate at which the simulated run gives the measured samples/s (bisection:
    simulated throughput grows with the engine's rate)."""
    import statistics

    from fleet.sim import simulate

    def samples_per_s(scale: float) -> float:
        c = {**cal, "rates": {**cal["rates"], "gen_tokens_per_s": cal["rates"]["gen_tokens_per_s"] * scale}}
        return statistics.mean(simulate(fleet_from(c, **fit, seed=s)).samples_per_s for s in range(seeds))

    lo, hi = 0.02, 4.0
    for _ in range(16):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if samples_per_s(mid) > cal["samples_per_s"] else (mid, hi)
    return (lo + hi) / 2


def save(cal: dict, stamp: dict, path: Path = DEFAULT) -> None:
    path.write_text(json.dumps({"stamp": stamp, **cal}, indent=2) + "\n")


def load(path: Path | str = DEFAULT) -> dict:
    data = json.loads(Path(path).read_text())
    known = {f.name for f in fields(Rates)}
    unknown = set(data["rates"]) - known
    if unknown:
        raise ValueError(f"{path}: unknown rate(s) {sorted(unknown)}; known: {sorted(known)}")
    return data


def fleet_from(cal: dict, **over) -> Fleet:
    """A `Fleet` with the calibration's rates and job shape (mean length, keep rate, N), then `over`."""
    base = {"rates": Rates(**cal["rates"]), "mean_tokens": cal["mean_tokens"], "keep_rate": cal["keep_rate"],
            "n": cal["n"]}
    return Fleet(**{**base, **over})


def gpu_rates() -> Rates:
    """A 1.5B model's component costs, from our GPU benchmarks' result files: an actor's decode rate with
    log-probs (`actor_h200.json`, H200), the learner's tokens/s on one GPU (`learner_gpu.json`, H100) and
    the weight update over NCCL (`weight_sync_nccl.json`, 1.5B)."""
    actor = max((r for r in json.loads((RESULTS / "actor_h200.json").read_text())["rows"] if r["logprobs"]),
                key=lambda r: r["tokens_per_s"])
    learner = json.loads((RESULTS / "learner_gpu.json").read_text())["mfu"][0]
    sync = [r for r in json.loads((RESULTS / "weight_sync_nccl.json").read_text())["rows"]
            if r["params"] == 1_500_000_000][0]
    return Rates(gen_tokens_per_s=actor["tokens_per_s"] * 1.25, gen_half_seqs=128.0,  # R(512 seqs) = measured
                 train_s_per_token=1.0 / learner["tokens_per_s"], train_s_fixed=0.5,
                 sync_s_fixed=sync["total_s"], sync_s_per_member=0.001, load_s=sync["total_s"])
