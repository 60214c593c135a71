"""PNG plots of a run's main curves, from its metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from learner.metrics import read

PANELS = [
    ("rollout_reward", "rollout reward (all generated samples)"),
    ("pass_rate", "dynamic-sampling pass rate"),
    ("loss", "policy loss"),
    ("tis_mean", "TIS weight mean"),
    ("mismatch_kl", "mismatch KL(μ ‖ π_old)"),
    ("entropy", "entropy"),
    ("staleness_mean", "mean staleness (versions)"),
    ("samples_per_s", "samples / s"),
    ("grad_norm", "gradient norm"),
]


def plot_run(run_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read(run_dir / "metrics.jsonl")
    fig, axes = plt.subplots(3, 3, figsize=(13, 9))
    for ax, (key, title) in zip(axes.flat, PANELS):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), marker=".")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(f"brorl run: {run_dir}", fontsize=11)
    fig.tight_layout()
    out = run_dir / "plots.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
