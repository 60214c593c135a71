"""Arms × seeds of `brorl run` on CPU, compared on held-out prompts: what bench.saturation and bench.adaptive
share. A run is reused (`--reuse`) only if it finished with exactly the same overrides; each finished run
becomes a record (held-out pass@1 and pass@k at start and end, generated and trained samples, the pass rate,
wall time, per-prompt correct counts); arms are compared by paired tests over (seed, prompt) instances
and summarised as mean ± std over seeds. `Records` keeps the finished records of a long experiment in a file
beside its results, so that it can go on over several sessions whose runs/ folders are gone."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def paired(a: list[float], b: list[float]) -> dict:
    """Paired test of b - a over instances: mean difference, t, two-sided p (normal approximation)."""
    d = [y - x for x, y in zip(a, b)]
    m, sd = statistics.mean(d), statistics.stdev(d)
    t = m / (sd / math.sqrt(len(d))) if sd > 0 else float("inf") * (1 if m > 0 else -1 if m < 0 else 0)
    p = 2 * (1 - statistics.NormalDist().cdf(abs(t))) if math.isfinite(t) else 0.0
    return {"n": len(d), "mean_diff": m, "t": t, "p": p}


class Runner:
    """`brorl run`s under `out`; with `reuse`, a finished run of the same overrides is read back instead."""

    def __init__(self, out: Path, reuse: bool, timeout: float = 6 * 3600):
        self.out, self.reuse, self.timeout = out, reuse, timeout

    def __call__(self, name: str, o: dict) -> dict:
        from bench.common import brorl_run, load_run

        run_dir = self.out / name
        done = run_dir / "bench_overrides.json"
        if self.reuse and (run_dir / "summary.json").exists():
            if done.exists() and json.loads(done.read_text()) == json.loads(json.dumps(o)):
                return load_run(run_dir)
            print(f"  {name}: its finished run had other settings; running it again", file=sys.stderr)
        res = brorl_run(run_dir, o, timeout=self.timeout)
        done.write_text(json.dumps(o, indent=1, sort_keys=True))
        return res


ROOT = Path(__file__).resolve().parents[1]


class Records:
    """Finished runs' records, one JSON line each (name, overrides, record), in a file kept with the results
    (bench/results/NAME_runs.jsonl). With `reuse`, a run of the same name and exactly the same overrides
    (paths under the checkout written relative to it) is read back instead of run again: the runs are
    `run.reproducible` (a pure function of their command), so a record from an earlier session stands for a
    run of today's. A later line of a name replaces an earlier one."""

    def __init__(self, path: Path, reuse: bool):
        self.path = path
        self.lines = {}
        if not reuse:  # a fresh experiment: its records start over
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        elif path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    d = json.loads(line)
                    self.lines[d["name"]] = d

    @staticmethod
    def key(o: dict) -> dict:
        return json.loads(json.dumps(o).replace(json.dumps(str(ROOT))[1:-1], "."))

    def get(self, name: str, o: dict) -> dict | None:
        d = self.lines.get(name)
        return d["record"] if d is not None and d["overrides"] == self.key(o) else None

    def find(self, o: dict) -> tuple[str, dict] | None:
        """(name, record) of any run with exactly the overrides `o`, whatever its name: another experiment's
        run of the same settings is the same run (the runs are reproducible)."""
        key = self.key(o)
        return next(((d["name"], d["record"]) for d in self.lines.values() if d["overrides"] == key), None)

    def get_or_run(self, name: str, o: dict, make) -> dict:
        """The stored record of `name` with overrides `o`, or `make()`'s, stored."""
        rec = self.get(name, o)
        if rec is not None:
            print(f"    the record stored in {self.path.name}", file=sys.stderr, flush=True)
            return rec
        return self.put(name, o, make())

    def put(self, name: str, o: dict, rec: dict) -> dict:
        d = {"name": name, "overrides": self.key(o), "record": rec}
        self.lines[name] = d
        with self.path.open("a") as f:
            f.write(json.dumps(d) + "\n")
        return rec


def record(arm: str, seed: int, res: dict, k: int) -> dict:
    """One finished run as the comparison reads it (and prints a line of it)."""
    m, h = res["metrics"], res["heldout"]
    r = {"arm": arm, "seed": seed, "steps": len(m), "pass_at_1_start": h[0]["pass_at_1"],
         "pass_at_1_end": h[-1]["pass_at_1"], "gain": h[-1]["pass_at_1"] - h[0]["pass_at_1"],
         "pass_at_k_start": h[0]["pass_at_k"], "pass_at_k_end": h[-1]["pass_at_k"],
         "generated": sum(x["generated"] for x in m), "trained": sum(x["samples"] for x in m),
         "pass_rate": statistics.mean(x["pass_rate"] for x in m), "train_wall_s": h[-1]["wall_s"],
         "correct_start": h[0]["correct"], "correct_end": h[-1]["correct"],
         "curve": [(x["generated"], x["wall_s"], x["pass_at_1"]) for x in h],
         "curve_k": [(x["generated"], x["wall_s"], x["pass_at_k"]) for x in h], **train_stats(m)}
    print(f"    pass@1 {r['pass_at_1_start']:.3f} -> {r['pass_at_1_end']:.3f}, pass@{k} "
          f"{r['pass_at_k_start']:.3f} -> {r['pass_at_k_end']:.3f}, {r['generated']} generated, "
          f"pass rate {r['pass_rate']:.2f}", file=sys.stderr, flush=True)
    return r


def train_stats(m: list[dict], ends: int = 3) -> dict:
    """How far and how each update moved the policy, from a run's metrics rows: the mean per-update KL to the
    rollout policy (`approx_kl`, over the PPO mini-batches) and share of tokens clipped below (ratio < 1 − ε),
    the mean gradient norm, and the policy's entropy and truncated share over its first and last `ends`
    steps: why an arm lost, not only that it did."""
    def mean(key, rows=m):
        return statistics.mean(float(x.get(key, 0.0)) for x in rows)

    return {"approx_kl": mean("approx_kl"), "clip_frac_low": mean("clip_frac_low"), "grad_norm": mean("grad_norm"),
            "entropy_start": mean("entropy", m[:ends]), "entropy_end": mean("entropy", m[-ends:]),
            "truncated_end": mean("truncated_frac", m[-ends:])}


def tests(runs: list[dict], arms, base: str, k: int) -> dict:
    """Paired tests of every arm's end point against `base`'s, and of each arm's end against its start, for
    pass@1 (per-prompt pass rate of k samples) and pass@k (any of them right)."""
    def instances(arm: str, key: str, at_k: bool) -> list[float]:
        return [float(c > 0) if at_k else c / k for r in runs if r["arm"] == arm for c in r[key]]

    out = {}
    for at_k, what in ((False, "pass@1"), (True, f"pass@{k}")):
        out.update({f"{what}: {arm} vs {base}": paired(instances(base, "correct_end", at_k),
                                                       instances(arm, "correct_end", at_k))
                    for arm in arms if arm != base})
        out.update({f"{what}: {arm}, end vs start": paired(instances(arm, "correct_start", at_k),
                                                          instances(arm, "correct_end", at_k)) for arm in arms})
    return out


def rows(runs: list[dict], arms, k: int, extra: dict | None = None) -> list[dict]:
    """Per arm, mean ± std over seeds of the end points (`extra`: more columns, name -> (key, scale))."""
    out = []
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm]

        def ms(key, scale=1.0, digits=1):
            xs = [scale * r[key] for r in rs]
            return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.{digits}f}"

        out.append({"arm": arm, "steps": rs[0]["steps"], "pass@1 start %": ms("pass_at_1_start", 100),
                    "pass@1 end %": ms("pass_at_1_end", 100), "gain (points)": ms("gain", 100),
                    f"pass@{k} start %": ms("pass_at_k_start", 100), f"pass@{k} end %": ms("pass_at_k_end", 100),
                    "generated": ms("generated"), "pass rate %": ms("pass_rate", 100),
                    "train wall s": ms("train_wall_s"),
                    **({"update KL": ms("approx_kl", digits=4), "clipped low %": ms("clip_frac_low", 100),
                        "entropy start": ms("entropy_start", digits=3), "entropy end": ms("entropy_end", digits=3)}
                       if all("approx_kl" in r for r in rs) else {}),
                    **{name: ms(key, scale) for name, (key, scale) in (extra or {}).items()}})
    return out


def plot_runs(runs: list[dict], arms, out: Path, title: str, lead=None, k: int | None = None) -> None:
    """Held-out pass@1 of each run (its `curve`) against generated samples and against training wall time,
    one colour per arm and one line per seed, and below them pass@`k` (`curve_k`) where every run has it;
    `lead(ax)` draws a first panel before them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [("curve", "held-out pass@1")]
    if k and all("curve_k" in r for r in runs):
        curves.append(("curve_k", f"held-out pass@{k}"))
    cols = 3 if lead else 2
    fig, grid = plt.subplots(len(curves), cols, figsize=(16 if lead else 11, 4 * len(curves)), squeeze=False)
    if lead:
        lead(grid[0][0])
        for row in grid[1:]:
            row[0].axis("off")
    prefix = "phase 2: " if lead else ""
    for (key, label), axes in zip(curves, grid):
        ax_gen, ax_wall = axes[-2:]
        for i, arm in enumerate(arms):
            for r in (r for r in runs if r["arm"] == arm):
                gen, wall, p = zip(*r[key])
                kw = dict(color=f"C{i}", alpha=0.8, marker="o", ms=3, label=arm if r["seed"] == min(
                    x["seed"] for x in runs if x["arm"] == arm) else None)
                ax_gen.plot(gen, p, **kw)
                ax_wall.plot(wall, p, **kw)
        ax_gen.set_xlabel(f"{prefix}generated samples")
        ax_wall.set_xlabel(f"{prefix}training wall time, s (evaluation excluded)")
        for ax in axes[-2:]:
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        ax_gen.legend(fontsize=8)
    if lead:
        grid[0][0].set_ylabel("held-out pass@1, pass@k")
        grid[0][0].grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
