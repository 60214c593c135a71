"""The simulator's component costs from what our benchmarks measured.

`bench.staleness` writes `bench/results/fleet_calibration.json` from its on-policy run (K = 0), in steady
state: the job's own per-step metrics give the learner's time per trained token (a least-squares line over
the steps, or the mean step) and, where the roles share a host's cores, how much the actor's generating
slows it (`fit_step`), the weight update's cost (the fastest step's broadcast: nothing in flight to wait
for), the actor's weight load (its fastest update of a step, less the transfer) and scoring time per
group, the mean completion length and the dynamic-sampling keep rate; the actor engine's rate is its
tokens/s while it had work, scaled until the simulated run gives the measured samples/s (one fitted
number). The runs with K > 0 are then predictions, compared with what was measured (`python -m bench.fleet`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from fleet.model import Fleet, Rates
from learner.metrics import loop_seconds

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
DEFAULT = RESULTS / "fleet_calibration.json"
H200_DEFAULT = RESULTS / "fleet_calibration_h200.json"
"""A 1.5B job's rates from the whole loop on H200s (`python -m bench.fleet --only gpu`; `--calibration h200-1.5b`)."""


def _pairs(metrics: list[dict]) -> list[tuple[dict, dict]]:
    """(previous row, row) for each step that follows its predecessor in `metrics`: the actor's counters grow
    between them (rows of several runs may be pooled: a run's first row follows another run's last)."""
    return [(a, b) for a, b in zip(metrics, metrics[1:]) if b["step"] == a["step"] + 1]


def _grown(metrics: list[dict], key: str) -> np.ndarray:
    """How much the actor's counter `key` grew in each step (`_pairs`)."""
    return np.array([b.get(key, 0.0) - a.get(key, 0.0) for a, b in _pairs(metrics)])


def overlap_s(metrics: list[dict]) -> list[tuple[dict, float]]:
    """(row, seconds the actor generated while the learner trained) for each step of `_pairs`: the actor's
    busy seconds in the step (its length less the growth of its idle seconds) less the learner's waiting,
    which the actor spends generating for it."""
    return [(b, max((b["time"] - a["time"]) - (b["actor_idle_s"] - a["actor_idle_s"]) - b["wait_s"], 0.0))
            for a, b in _pairs(metrics) if "actor_idle_s" in b]


def _step_rows(metrics: list[dict], shared_host: bool) -> list[tuple[dict, float]]:
    """(row, the actor's generating seconds during it: `overlap_s` on a shared host, else 0)."""
    return overlap_s(metrics) if shared_host else [(r, 0.0) for r in metrics]


def fit_step(metrics: list[dict], shared_host: bool = False) -> tuple[float, float, float]:
    """-> (train_s_per_token, train_s_fixed, contention): a least-squares line of the step's time over its
    trained tokens (the mean step where the sizes spread too little to tell the two apart); with
    `shared_host` (roles on one host's cores) also over the seconds the actor generated meanwhile, whose
    coefficient β is the learner's slowdown while both run: 1 + contention = 1 / (1 - β)."""
    rows = _step_rows(metrics, shared_host)
    train_s = np.array([r["train_s"] for r, _ in rows])
    cols = {"tokens": np.array([r["train_tokens"] for r, _ in rows], float), "overlap": np.array([o for _, o in rows])}
    for use in (("tokens", "overlap"), ("overlap",), ("tokens",), ()):
        x = [cols[k] for k in use if np.ptp(cols[k]) > 0]
        if len(x) != len(use) or len(train_s) <= len(use) + 1:
            continue
        coef = np.linalg.lstsq(np.column_stack([np.ones_like(train_s), *x]), train_s, rcond=None)[0]
        if coef[0] >= 0 and all(c > 0 for c in coef[1:]) and ("overlap" not in use or coef[-1] < 0.9):
            got = dict(zip(use, coef[1:]))
            beta = got.get("overlap", 0.0)
            return float(got.get("tokens", 0.0)), float(coef[0]), float(beta / (1.0 - beta))
    return 0.0, float(train_s.mean()), 0.0


def step_spread(metrics: list[dict], per_token: float, fixed: float, contention: float,
                shared_host: bool = False) -> tuple[float, ...]:
    """Each step's measured time over the time `fit_step`'s numbers give it (its tokens; on a shared host
    also the actor's generating meanwhile, which the simulator applies itself)."""
    rows = _step_rows(metrics, shared_host)
    beta = contention / (1.0 + contention)
    return tuple(float(r["train_s"] / max(fixed + per_token * r["train_tokens"] + beta * o, 1e-9)) for r, o in rows)


def calibrate(metrics: list[dict], actor_idle_s: float, n: int, seqs_in_flight: int, gen_half_seqs: float = 16.0,
              fit: dict | None = None, shared_host: bool = False, spread: bool = False) -> dict:
    """Rates and job shape from one run's per-step metrics (`metrics.jsonl` rows, start-up excluded by the
    caller) and its actor's total idle seconds. With `fit` (the run's `Fleet` settings: actors, B, credits,
    K), the engine's rate is then scaled until the simulator reproduces the run's samples/s: a group lasts
    as long as its longest completion, which per-step totals do not show. `shared_host`: the roles ran on
    one host's cores (`fit_step`). `spread`: the simulated steps vary as the measured ones did
    (`step_spread`), not all at the fitted time."""
    slope, fixed, contention = fit_step(metrics, shared_host)
    loop = loop_seconds(metrics)
    generated_tokens = sum(r["tokens"] for r in metrics)
    sync = float(min(r["broadcast_s"] for r in metrics))
    # the actor's weight load: its fastest update of a step (nothing in flight to finish first) less the
    # transfer, which the simulator adds itself (`sync_s_fixed`)
    updates = _grown(metrics, "actor_update_s")
    updates = updates[updates > 0]
    load = max(float(updates.min()) - sync, 0.0) if updates.size else 0.0
    busy = max(loop - actor_idle_s, 1e-9)
    rate = generated_tokens / busy  # tokens/s of the engine while it had work
    # dynamic sampling's keep rate: of the groups that reached it (`groups_received`: a group stale on arrival,
    # or whose lease had gone, is the admission rules' doing, which the simulator applies itself; one found
    # too stale when its batch is formed had passed dynamic sampling, in the simulator too)
    received = sum(r["groups_received"] for r in metrics)
    dropped = sum(r["drop_all_correct"] + r["drop_all_wrong"] for r in metrics)
    # scoring: each group's own seconds (the actor scores groups concurrently with generating others)
    scored = _grown(metrics, "actor_score_s")
    groups = sum(b["generated"] for _, b in _pairs(metrics)) / n
    cal = {
        "rates": asdict(Rates(
            gen_tokens_per_s=rate * (seqs_in_flight + gen_half_seqs) / seqs_in_flight, gen_half_seqs=gen_half_seqs,
            train_s_per_token=slope, train_s_fixed=fixed, sync_s_fixed=sync, load_s=load, contention=contention,
            score_s_per_group=float(scored.sum()) / groups if groups else 0.0,
            train_s_spread=step_spread(metrics, slope, fixed, contention, shared_host) if spread else ())),
        "mean_tokens": generated_tokens / max(sum(r["generated"] for r in metrics), 1),
        "keep_rate": 1.0 - dropped / max(received, 1),
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
    the weight update over NCCL (`weight_sync_nccl.json`: a least-squares line of its time over the GB
    sent, 10M to 7B parameters, so that `Fleet.model_gb` sizes it; the actor's load, the 1.5B row's time)."""
    actor = max((r for r in json.loads((RESULTS / "actor_h200.json").read_text())["rows"] if r["logprobs"]),
                key=lambda r: r["tokens_per_s"])
    learner = json.loads((RESULTS / "learner_gpu.json").read_text())["mfu"][0]
    syncs = json.loads((RESULTS / "weight_sync_nccl.json").read_text())["rows"]
    per_gb, fixed = np.polyfit([r["GB"] for r in syncs], [r["total_s"] for r in syncs], 1)
    load = [r for r in syncs if r["params"] == 1_500_000_000][0]["total_s"]
    return Rates(gen_tokens_per_s=actor["tokens_per_s"] * 1.25, gen_half_seqs=128.0,  # R(512 seqs) = measured
                 train_s_per_token=1.0 / learner["tokens_per_s"], train_s_fixed=0.5,
                 sync_s_fixed=max(float(fixed), 0.0), sync_s_per_gb=float(per_gb), sync_s_per_member=0.001, load_s=load)


GPU_MODEL_GB = 3.0
"""The weights `gpu_rates` describe: 1.5B parameters in bf16."""
