"""Soak: the default job with 2 actors for a long time, a random actor killed (SIGKILL) every few minutes.

    python -m bench.soak [--minutes 30] [--kill-every 180] [--seed 0]

Runs `brorl run --no-eval` (the real launcher, which restarts killed actors) on the tiny-cpu preset with
`actor.num_actors = 2` and effectively unbounded steps, samples the resident memory of every process of
the job every 10 s (per role: the learner, each actor with its vLLM engine and scoring workers), kills a
random actor every `--kill-every` seconds (±30 %), then stops the job with SIGTERM. Reports:
  - resident memory per role over time, and the slope (MB/h, least squares) of the longest-lived process
    of each role after its first 5 minutes (engine start; vLLM's CPU KV cache is touched gradually): flat
    means no leak;
  - samples/s per minute over time and its slope;
  - per kill: the learner's step at the kill, the longest gap between two steps in the 2 minutes after it,
    and the steps lost to it (that gap over the median of the 20 step times before the kill, minus one);
  - the ledger's accounting (no prompt trained twice; every granted prompt trained, dropped or pending).
Writes bench/results/soak.json and soak.png. `--analyse bench/results/soak.json` recomputes the figures
from a saved run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def roles(launcher_pid: int) -> dict[str, list]:
    """Role -> the processes of that role (the role's own process and its descendants)."""
    import psutil

    out: dict[str, list] = {}
    try:
        children = psutil.Process(launcher_pid).children()
    except psutil.NoSuchProcess:
        return out
    for c in children:
        try:
            cmd = c.cmdline()
            role = "learner" if "learner" in cmd else cmd[cmd.index("--actor-id") + 1] if "--actor-id" in cmd else None
            if role:
                out[role] = [c] + c.children(recursive=True)
        except (psutil.NoSuchProcess, ValueError, IndexError):
            continue
    return out


def rss_mb(procs) -> float:
    import psutil

    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of y against t (seconds), per hour."""
    if len(ts) < 3:
        return float("nan")
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return 3600 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--kill-every", type=float, default=180.0, help="seconds between kills (±30 %%)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench" / "soak"))
    ap.add_argument("--analyse", metavar="JSON", help="only recompute the figures from a saved soak.json")
    args = ap.parse_args()
    if args.analyse:
        return report(json.loads(Path(args.analyse).read_text()))
    from learner.ledger import account, check
    from learner.metrics import read

    run_dir = Path(args.run_dir)
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "cli", "run", "--no-eval", "--actor.num_actors", "2", "--learner.steps", "1000000",
           "--run.run_dir", str(run_dir), "--run.eval_interval", "0", "--learner.checkpoint_interval", "50"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(run_dir.parent / "soak-launcher.log", "w"),
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    rng = random.Random(args.seed)
    samples: list[dict] = []
    kills: list[dict] = []
    next_kill = time.time() + 120 + args.kill_every * rng.uniform(0.7, 1.3)  # after engines are up
    end = t0 + 60 * args.minutes
    try:
        while time.time() < end and proc.poll() is None:
            time.sleep(10)
            r = roles(proc.pid)
            samples.append({"t": time.time() - t0, **{k: rss_mb(v) for k, v in r.items()}})
            if time.time() >= next_kill:
                actors = sorted(k for k in r if k.startswith("actor-"))
                if actors:
                    victim = rng.choice(actors)
                    rows = read(run_dir / "metrics.jsonl")
                    os.kill(r[victim][0].pid, signal.SIGKILL)
                    kills.append({"t": time.time() - t0, "actor": victim, "step": rows[-1]["step"] if rows else 0})
                    print(f"[soak] {time.time() - t0:6.0f} s: SIGKILL {victim} at step {kills[-1]['step']}", flush=True)
                next_kill = time.time() + args.kill_every * rng.uniform(0.7, 1.3)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=600)
    rows = read(run_dir / "metrics.jsonl")
    acc = account(run_dir)
    ledger_ok, ledger_error = True, ""
    try:
        check(acc, rows[-1]["step"])
    except AssertionError as e:
        ledger_ok, ledger_error = False, str(e)[:500]
    result = {
        "minutes": (time.time() - t0) / 60, "launcher_rc": rc, "kills": kills, "rss_samples": samples,
        "steps_rows": [{"step": r["step"], "t": r["time"] - t0, "generated": r.get("generated") or 0.0,
                        "pass_rate": r.get("pass_rate")} for r in rows],
        "ledger": {"ok": ledger_ok, "error": ledger_error, "trained": len(acc.trained), "granted": len(acc.granted),
                   "dropped": len(acc.dropped), "pending_at_end": len(acc.end_pending),
                   "restarted_or_evicted_returns": sum(r["reason"] in ("restarted", "evicted") for r in acc.returned)},
        "command": "python -m bench.soak " + " ".join(sys.argv[1:]),
    }
    return report(result)


def incarnations(samples: list[dict], role: str, kill_times: list[float]) -> list[list[tuple[float, float]]]:
    """A role's (t, MB) samples cut into its processes' lives (a kill of that role starts a new one)."""
    lives: list[list[tuple[float, float]]] = [[]]
    cuts = sorted(kill_times)
    for smp in samples:
        if role not in smp:
            continue
        while cuts and smp["t"] >= cuts[0]:
            cuts.pop(0)
            lives.append([])
        lives[-1].append((smp["t"], smp[role]))
    return [life for life in lives if life]


def report(res: dict) -> int:
    """Derive the figures from a run's raw record (also: `--analyse bench/results/soak.json`), print them,
    write JSON + PNG."""
    from bench.common import RESULTS, table, write_json

    rows, kills, samples = res["steps_rows"], res["kills"], res["rss_samples"]
    times = [r["t"] for r in rows]
    gaps = [b - a for a, b in zip(times, times[1:])]
    for k in kills:  # steps lost: the longest gap after the kill against the step time just before it
        before = [g for a, g in zip(times, gaps) if k["t"] - 300 <= a < k["t"] - 5][-20:]
        after = [g for a, g in zip(times, gaps) if k["t"] - 5 <= a <= k["t"] + 120]
        k["step_s_before"] = statistics.median(before) if before else float("nan")
        k["max_gap_s"] = max(after) if after else float("nan")
        k["steps_lost"] = max(0.0, k["max_gap_s"] / k["step_s_before"] - 1) if after and before else float("nan")
    minute: dict[int, float] = {}
    for r in rows:
        minute[int(r["t"] // 60)] = minute.get(int(r["t"] // 60), 0.0) + r["generated"]
    thr = sorted((60 * m + 30, g / 60) for m, g in minute.items())[:-1]  # the last minute is cut short
    thr_warm = [(t, v) for t, v in thr if t > 300]
    roles = sorted({k for s_ in samples for k in s_ if k != "t"})
    mem = {}
    for role in roles:
        lives = incarnations(samples, role, [k["t"] for k in kills if k["actor"] == role])
        longest = max(lives, key=lambda life: life[-1][0] - life[0][0])
        # a process's memory after its first 5 minutes (engine start, KV cache first touched): flat = no leak
        settled = [(t, y) for t, y in longest if t - longest[0][0] >= 300]
        mem[role] = {"processes": len(lives), "longest_life_min": (longest[-1][0] - longest[0][0]) / 60,
                     "settled_first_mb": settled[0][1] if settled else float("nan"),
                     "settled_last_mb": settled[-1][1] if settled else float("nan"),
                     "slope_mb_per_h": slope_per_hour(*zip(*settled)) if len(settled) >= 3 else float("nan")}
    res.update({"memory": mem, "samples_per_s_by_minute": thr, "steps": rows[-1]["step"],
                "samples_per_s_mean": statistics.fmean(v for _, v in thr_warm) if thr_warm else float("nan"),
                "samples_per_s_slope_per_h": slope_per_hour(*zip(*thr_warm)) if len(thr_warm) >= 3 else float("nan"),
                "pass_rate_first_last": [rows[0].get("pass_rate"), rows[-1].get("pass_rate")]})
    write_json("soak", res)
    plot(res, RESULTS / "soak.png")
    print(table([{"role": k, **{m: round(v, 1) for m, v in mem[k].items()}} for k in roles],
                ["role", "processes", "longest_life_min", "settled_first_mb", "settled_last_mb", "slope_mb_per_h"]))
    print(table([{k: (round(v, 1) if isinstance(v, float) else v) for k, v in kk.items()} for kk in kills],
                ["t", "actor", "step", "step_s_before", "max_gap_s", "steps_lost"]))
    lost = [k["steps_lost"] for k in kills if k["steps_lost"] == k["steps_lost"]]
    print(f"{res['steps']} steps in {res['minutes']:.0f} min, {len(kills)} kills, steps lost per kill: median "
          f"{statistics.median(lost) if lost else float('nan'):.1f}, max {max(lost, default=float('nan')):.1f}; "
          f"samples/s {res['samples_per_s_mean']:.0f} (slope {res['samples_per_s_slope_per_h']:+.0f} per h); "
          f"ledger {'ok' if res['ledger']['ok'] else 'BROKEN: ' + res['ledger']['error']}: {json.dumps(res['ledger'])}")
    return 0 if res["ledger"]["ok"] else 1


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.2))
    roles_ = sorted({k for s in res["rss_samples"] for k in s if k != "t"})
    for k in roles_:
        pts = [(s["t"] / 60, s[k]) for s in res["rss_samples"] if k in s]
        a.plot(*zip(*pts), label=f"{k} (settled: {res['memory'][k]['slope_mb_per_h']:+.0f} MB/h)")
    a.set_title("resident memory per role (process + children), MB")
    a.text(0.01, 0.02, "a killed actor restarts small; vLLM's CPU KV cache\nis touched over its first minutes, then flat",
           transform=a.transAxes, fontsize=7, alpha=0.7)
    b.plot([t / 60 for t, _ in res["samples_per_s_by_minute"]], [v for _, v in res["samples_per_s_by_minute"]],
           marker=".", label=f"slope {res['samples_per_s_slope_per_h']:+.1f} per h")
    b.set_title("generated samples/s (per minute)")
    for ax in (a, b):
        for k in res["kills"]:
            ax.axvline(k["t"] / 60, color="red", alpha=0.3)
        ax.set_xlabel("minutes (red: an actor SIGKILLed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"brorl soak: default job, 2 actors, {res['minutes']:.0f} min, {len(res['kills'])} kills", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
