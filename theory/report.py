"""`brorl simulate`'s work: run the section 4.1 simulator for several N, write CSV + PNG, print a table."""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

from theory.simulator import SimConfig, Trajectory, simulate_one


def write_csv(trajs: list[Trajectory], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["N", "step", "q_pos", "pct_correct_increased", "worst_drop", "worst_rel_drop"])
        for t in trajs:
            for s in range(len(t.q_pos)):
                w.writerow([t.n, s, f"{t.q_pos[s]:.8f}", f"{t.pct_increased[s]:.4f}",
                            f"{t.worst_drop[s]:.6e}", f"{t.worst_rel_drop[s]:.6e}"])


def plot(trajs: list[Trajectory], cfg: SimConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for t in trajs:
        steps = range(len(t.q_pos))
        axes[0].plot(steps, t.q_pos, label=f"N={t.n}")
        axes[1].plot(steps, t.pct_increased, label=f"N={t.n}")
        axes[2].plot(steps, [max(x, 1e-12) for x in t.worst_drop], label=f"N={t.n}")
    axes[0].set_title("correct probability mass $Q_{pos}$")
    axes[1].set_title("% of correct tokens increased vs step 0")
    axes[2].set_title("worst probability drop among correct tokens")
    axes[2].set_yscale("log")
    axes[2].set_ylim(bottom=1e-10)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[1].legend()
    fig.suptitle(f"BroRL token-level simulator (paper 4.1): d={cfg.vocab:,}, |P|={cfg.n_correct:,}, "
                 f"{cfg.optimizer} η={cfg.lr}, init={cfg.init}, seed={cfg.seed}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(cfg: SimConfig, out: Path) -> list[Trajectory]:
    """Simulate every N of `cfg.ns`; write `simulate.csv` and `simulate.png` into `out`; print the table."""
    out.mkdir(parents=True, exist_ok=True)
    trajs = []
    for n in cfg.ns:
        t0 = time.perf_counter()
        trajs.append(simulate_one(cfg, n))
        print(f"  N={n:>6}: {cfg.steps} steps in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    write_csv(trajs, out / "simulate.csv")
    plot(trajs, cfg, out / "simulate.png")
    print(f"\n{'N':>7} {'Q_pos(0)':>9} {'Q_pos(T)':>9} {'ΔQ_pos':>10} {'%incr(T)':>9} {'worst drop(T)':>14} {'max worst drop':>15}")
    for t in trajs:
        print(f"{t.n:>7} {t.q_pos[0]:>9.4f} {t.q_pos[-1]:>9.4f} {t.q_pos[-1] - t.q_pos[0]:>+10.4f} "
              f"{t.pct_increased[-1]:>9.2f} {t.worst_drop[-1]:>14.3e} {max(t.worst_drop):>15.3e}")
    print(f"\nwrote {out / 'simulate.csv'} and {out / 'simulate.png'}")
    return trajs
