"""The fleet simulator against what we measured, then the fleet we cannot run.

    python -m bench.fleet [--seeds 5]

1. Validation: `bench.staleness` measured the default job (1 actor, tiny model, 2 CPU cores) at
   K = 0, 1, 2, 4, 8, several runs each, and wrote the simulator's rates from the K = 0 runs' steady
   state (`bench/results/fleet_calibration.json`). The simulator predicts every K from those rates alone;
   the table sets predicted samples/s, learner waiting share and mean staleness beside the measured
   steady-state ones (mean over runs, and their spread; engine start-up is not modelled).
2. Scaling: the 1.5B job on 4 to 1,024 GPUs (a quarter of them learner GPUs, the rest one actor each) for
   ProRL's shape (N = 16, B = 512 prompts) and BroRL's (N = 512, B = 128), K = 1, completions log-normal
   around 2,048 tokens (σ 0.8, cap 16,384), with rates from our GPU benchmarks: an actor's decode rate
   from `bench/results/actor_h200.json` (1.5B, H200, with log-probs), the learner's tokens/s per GPU from
   `learner_gpu.json` (H100), the weight update from `weight_sync_nccl.json` (1.5B over NCCL). Reports
   samples/s, mean staleness, and the learner's training and weight-update shares (where they approach 1,
   the learner or the sync is the bottleneck).
3. GPU validation: the 1.5B job of `bench.e2e` on H100s (1 learner GPU + 1 actor GPU, N = 16, K = 1,
   updates kept, budgets log-normal per prompt: `bench/results/e2e_h100.json` and that run's metrics
   `e2e_h100_run-1-n16-keep.jsonl`) and on H200s (3 learner GPUs + 1 actor GPU, N = 16 and 512:
   `e2e_h200_3l.json`, `e2e_h200_3l_run-1-n{16,512}-keep.jsonl`; again with updates finished too:
   `e2e_h200_3l_p3.json` and its runs' metrics), each predicted from the raw engine's samples/s measured beside it and the
   learner's step time and weight-update cost from the run's steady state (`fleet.calibration.calibrate`),
   against the run's own steady state.
Writes bench/results/fleet.json and fleet.png (`--only gpu`: the GPU validation alone, the rest kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fleet.calibration import DEFAULT, GPU_MODEL_GB, fleet_from, gpu_rates, load
from fleet.model import Fleet
from fleet.sim import simulate

RESULTS = Path(__file__).resolve().parent / "results"


def validate(seeds: int) -> list[dict]:
    measured = json.loads((RESULTS / "staleness.json").read_text())["rows"]
    cal = load(DEFAULT)
    rows = []
    for m in measured:
        k = m["max_staleness"]
        runs = [simulate(fleet_from(cal, actors=1, prompts_per_step=cal["prompts_per_step"],
                                    prompts_per_request=cal["prompts_per_request"], max_staleness=k,
                                    steps=cal["steps"], seed=s)) for s in range(seeds)]
        pred = {"samples_per_s": statistics.mean(r.samples_per_s for r in runs),
                "wait_share": statistics.mean(r.learner_wait_share for r in runs),
                "staleness_mean": statistics.mean(r.staleness_mean for r in runs)}
        got = {"samples_per_s": m["steady_samples_per_s"], "wait_share": m["steady_wait_share"],
               "staleness_mean": m["staleness_mean"]}
        spread = {"samples_per_s": m.get("steady_samples_per_s_std", 0.0),
                  "wait_share": m.get("steady_wait_share_std", 0.0), "staleness_mean": m.get("staleness_mean_std", 0.0)}
        row = {"max_staleness": k, "runs": len(m.get("runs", [])) or 1}
        for key in pred:
            row[f"{key}_measured"], row[f"{key}_predicted"] = got[key], pred[key]
            row[f"{key}_measured_std"] = spread[key]
            row[f"{key}_error"] = (pred[key] - got[key]) / got[key] if got[key] else pred[key]
            # how far off, in units of the measurement's own spread over runs
            row[f"{key}_z"] = (pred[key] - got[key]) / spread[key] if spread[key] else float("nan")
        rows.append(row)
    return rows


GPU_RUNS = ["e2e_h100", "e2e_h200_3l", "e2e_h200_3l_p3", "e2e_h200x2b", "e2e_h200x2b_omp4", "e2e_h200x2c_2048", "e2e_h200x2c_fp8"]
"""The end-to-end GPU runs validated against (`bench/results/<stem>.json` and each run's metrics beside it)."""


H200_CALIBRATION = ("e2e_h200x2c_2048", 512)
"""The run (and its N) whose rates `simulate-fleet --calibration h200-1.5b` takes: the 1 + 1 H200 loop at N = 512
with 2,048-sample steps, the engine kept full (bench/results/fleet_calibration_h200.json)."""


def gpu_validate(seeds: int) -> list[dict]:
    from bench.common import stamp
    from fleet.calibration import H200_DEFAULT, save

    rows = []
    for stem in GPU_RUNS:
        got, cals = _gpu_validate_one(stem, seeds)
        rows += got
        if stem == H200_CALIBRATION[0]:
            save(cals[H200_CALIBRATION[1]], {**stamp(), "from": f"bench/results/{stem}.json"}, H200_DEFAULT)
    return rows


def _gpu_validate_one(stem: str, seeds: int) -> tuple[list[dict], dict[int, dict]]:
    """(each run of `stem` against its simulation, the calibration each simulation used by N)."""
    from bench.e2e import WARM, summarise
    from fleet.calibration import calibrate

    e2e = json.loads((RESULTS / f"{stem}.json").read_text())
    job, raw = e2e["job"], {r["n"]: r for r in e2e["raw"]}
    rows, cals = [], {}
    for run in e2e["runs"]:
        path = RESULTS / f"{stem}_run-{run['actors']}-n{run['n']}-{run['update']}.jsonl"
        metrics = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steady = metrics[WARM:]
        idle = metrics[-1].get("actor_idle_s", 0.0) - metrics[WARM - 1].get("actor_idle_s", 0.0)
        b = max(1, e2e["samples_per_step"] // run["n"])  # the run's prompts a step (the job written is N = 16's)
        seqs = run["n"] * b
        cal = calibrate(steady, idle, run["n"], seqs, gen_half_seqs=128.0, spread=True)
        mean_tokens = sum(r["tokens"] for r in steady) / sum(r["generated"] for r in steady)
        load = sum(p["actor_update_s"] for p in summarise(metrics, run["actors"])["per_step"][WARM:]) / len(steady)
        # the engine at the raw run's rate (it too had about `seqs` sequences at once): its tokens/s where the
        # result has them (its completions drew other budgets than the loop's, so its samples/s would carry
        # the difference in length), else its samples/s at the loop's mean length (results before 2026-11-29)
        w = raw[run["n"]]
        tokens_per_s = w.get("tokens_per_s") or w["samples_per_s"] * mean_tokens
        cal = cals[run["n"]] = {**cal, "rates": {**cal["rates"], "gen_tokens_per_s": tokens_per_s * (seqs + 128) / seqs,
                                                 "load_s": load}}
        k = job.get("job.max_staleness", job.get("learner.max_staleness"))  # older results: K before [job]
        sims = [simulate(fleet_from(cal, actors=run["actors"], n=run["n"],
                                    prompts_per_step=b, prompts_per_request=b,
                                    max_staleness=k, mean_tokens=job["actor.length_median"],
                                    length_sigma=job.get("actor.length_sigma", 1.0),  # the schema default
                                    max_tokens=job["actor.max_tokens"], lengths="prompt",
                                    in_flight=run["update"], steps=30, seed=s)) for s in range(seeds)]
        measured = {"samples_per_s": run["samples_per_s"], "wait_share": run["learner_wait_share"],
                    "actor_idle_share": run["actor_idle_share"],
                    "staleness_mean": statistics.mean(r["staleness_mean"] for r in steady)}
        predicted = {"samples_per_s": statistics.mean(r.samples_per_s for r in sims),
                     "wait_share": statistics.mean(r.learner_wait_share for r in sims),
                     "actor_idle_share": statistics.mean(r.actor_idle_share for r in sims),
                     "staleness_mean": statistics.mean(r.staleness_mean for r in sims)}
        row = {"run": stem, "card": e2e["stamp"].get("device", ""), "gpus": f"{run.get('learner_gpus', 1)} + {run['actors']}",
               "n": run["n"], "update": run["update"]}
        for k in measured:
            row[f"{k}_measured"], row[f"{k}_predicted"] = measured[k], predicted[k]
            row[f"{k}_error"] = (predicted[k] - measured[k]) / measured[k] if measured[k] else predicted[k]
        rows.append(row)
    return rows, cals


def scaling(seeds: int) -> list[dict]:
    rates = gpu_rates()
    rows = []
    for shape, n, b in (("ProRL N=16", 16, 512), ("BroRL N=512", 512, 128)):
        for gpus in (4, 16, 64, 256, 1024):
            learner_gpus = max(1, gpus // 4)
            runs = [simulate(Fleet(actors=gpus - learner_gpus, learner_gpus=learner_gpus, n=n, prompts_per_step=b,
                                   prompts_per_request=max(1, 512 // n), max_staleness=1, mean_tokens=2048,
                                   length_sigma=0.8, max_tokens=16384, keep_rate=0.5 if n == 16 else 0.62,
                                   in_flight="keep", model_gb=GPU_MODEL_GB, steps=12, seed=s, rates=rates))
                    for s in range(seeds)]
            rows.append({"shape": shape, "gpus": gpus, "learner_gpus": learner_gpus,
                         **{k: statistics.mean(getattr(r, k) for r in runs) for k in (
                             "samples_per_s", "staleness_mean", "learner_wait_share", "learner_train_share",
                             "learner_sync_share", "actor_idle_share")}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--only", choices=["gpu"], help="gpu: the GPU validation alone, the other parts kept")
    args = ap.parse_args()
    from bench.common import stamp, table, write_json

    gpu = gpu_validate(args.seeds)
    print("GPU validation: the 1.5B job on GPUs (bench.e2e; card per row), predicted from the raw engine and the learner's "
          "step, against the run")
    print(table(gpu, ["card", "gpus", "n", "update", "samples_per_s_measured", "samples_per_s_predicted", "samples_per_s_error",
                      "wait_share_measured", "wait_share_predicted", "wait_share_error", "actor_idle_share_measured",
                      "actor_idle_share_predicted", "staleness_mean_measured", "staleness_mean_predicted",
                      "staleness_mean_error"]))
    if args.only == "gpu":
        old = json.loads((RESULTS / "fleet.json").read_text())
        path = write_json("fleet", {**{k: v for k, v in old.items() if k != "stamp"}, "gpu_validation": gpu,
                                    "gpu_validation_simulated_on": stamp()})
        _plot(old["validation"], old["scaling"], path.with_suffix(".png"))
        print(f"\nwrote {path}")
        return
    val = validate(args.seeds)
    print("\nvalidation: the simulator (rates from the K = 0 runs) against bench.staleness (2 CPU cores; measured: "
          "mean and sd over runs)")
    print(table(val, ["max_staleness", "runs", "samples_per_s_measured", "samples_per_s_measured_std",
                      "samples_per_s_predicted", "samples_per_s_error", "wait_share_measured",
                      "wait_share_measured_std", "wait_share_predicted", "staleness_mean_measured",
                      "staleness_mean_measured_std", "staleness_mean_predicted", "staleness_mean_error"]))
    sc = scaling(max(1, args.seeds // 2))
    print("\nscaling: 1.5B on GPUs (a quarter learner GPUs), K = 1, in-flight updates kept")
    print(table(sc, ["shape", "gpus", "samples_per_s", "staleness_mean", "learner_wait_share",
                     "learner_train_share", "learner_sync_share", "actor_idle_share"]))
    path = write_json("fleet", {"validation": val, "scaling": sc, "gpu_validation": gpu, "calibration": load(DEFAULT),
                                "gpu_rates": vars(gpu_rates()), "simulated_on": stamp()})
    _plot(val, sc, path.with_suffix(".png"))
    print(f"\nwrote {path}")


def _plot(val, sc, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ks = [r["max_staleness"] for r in val]
    for key, ax, label in (("samples_per_s", axes[0], "generated samples/s"),
                           ("staleness_mean", axes[0].twinx(), "mean staleness")):
        ax.errorbar(ks, [r[f"{key}_measured"] for r in val], yerr=[r.get(f"{key}_measured_std", 0.0) for r in val],
                    fmt="o-" if key == "samples_per_s" else "s-", capsize=3,
                    color="C0" if key == "samples_per_s" else "C3", label=f"{label}, measured (mean ± sd)")
        ax.plot(ks, [r[f"{key}_predicted"] for r in val], "o--" if key == "samples_per_s" else "s--",
                color="C0" if key == "samples_per_s" else "C3", alpha=0.6, label=f"{label}, simulated")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, loc="lower right" if key == "samples_per_s" else "center right")
    axes[0].set_xlabel("max_staleness K")
    axes[0].set_title("validation: 2 CPU cores, tiny model")
    for shape, style in (("ProRL N=16", "o-"), ("BroRL N=512", "s-")):
        rows = [r for r in sc if r["shape"] == shape]
        g = [r["gpus"] for r in rows]
        axes[1].plot(g, [r["samples_per_s"] for r in rows], style, label=shape)
        axes[2].plot(g, [r["learner_train_share"] for r in rows], style, label=f"{shape}: learner training")
        axes[2].plot(g, [r["learner_sync_share"] for r in rows], style.replace("-", "--"),
                     label=f"{shape}: weight updates")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("GPUs (¼ learner)")
    axes[1].set_ylabel("samples/s")
    axes[1].set_title("1.5B, K = 1, simulated")
    axes[1].legend(fontsize=7)
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("GPUs")
    axes[2].set_ylabel("share of the learner's time")
    axes[2].set_title("where the learner's time goes")
    axes[2].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
