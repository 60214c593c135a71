"""The whole job of `brorl run`: held-out evaluation before, the roles (one machine: `cli/launcher.py`; Ray:
`cli/cluster.py`), an ordered stop on SIGTERM or Ctrl-C, evaluation after, the plots and a summary."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli.launcher import Launcher, Stop
from cli.procs import brorl_command, die_with_parent
from config.loader import to_toml
from config.schema import BrorlConfig
from learner import metrics as metrics_mod


def run(cfg: BrorlConfig, resume: bool = False, evaluate: bool = True, cluster: str | None = None) -> int:
    """The whole job; `cluster`: a Ray address ("auto", "host:port" or "local"), where Ray places the roles
    (`cli/cluster.py`)."""
    from cli.plots import plot_run

    if cluster:
        from cli.cluster import RayLauncher

        la = RayLauncher(cfg, cluster, resume=resume)
    else:
        la = Launcher(cfg, resume=resume)

    def on_signal(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one ordered stop; a second signal changes nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    interrupted = False
    t0 = time.monotonic()
    try:
        before = _evaluate(cfg, cfg.model.path, "before") if evaluate and not resume else None
        t0 = time.monotonic()
        la.start()
        rc = la.wait()
    except Stop as e:
        interrupted = True
        rc = 130 if str(e) == "SIGINT" else 143
        print(f"\n[brorl run] {e}: stopping — the learner writes a checkpoint; resume with --resume", flush=True)
    finally:
        la.stop()
        la.close()
    wall = time.monotonic() - t0
    # a restarted learner trains again the steps after its checkpoint: the last row of each step stands
    rows = list({r["step"]: r for r in metrics_mod.read(la.run_dir / "metrics.jsonl")}.values())
    if rows:
        plot_run(la.run_dir)
    if la.refused:
        print(f"[brorl run] {la.refused}", file=sys.stderr, flush=True)
    if interrupted or rc != 0:
        return rc
    ckpt = la.run_dir / "checkpoints"
    after = None
    if evaluate and (ckpt / "latest").exists():
        after = _evaluate(cfg, str(ckpt / (ckpt / "latest").read_text().strip() / "model"), "after")
    summary = _summary(cfg, rows, before, after, wall, la.restarts, la.learner_restarts.total)
    (la.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(_summary_text(summary, la.run_dir))
    return 0


def _evaluate(cfg: BrorlConfig, model_path: str, tag: str) -> dict | None:
    run_dir = Path(cfg.run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.toml"
    cfg_path.write_text(to_toml(cfg))
    out = run_dir / f"eval-{tag}.json"
    r = subprocess.run(brorl_command("eval", "--config", str(cfg_path), "--checkpoint", model_path, "--out", str(out)),
                       capture_output=True, text=True, preexec_fn=die_with_parent)
    if r.returncode != 0:
        print(f"[brorl run] evaluation '{tag}' failed:\n{r.stderr[-2000:]}", flush=True)
        return None
    return json.loads(out.read_text())


def _summary(cfg, rows, before, after, wall, restarts, learner_restarts=0) -> dict:
    def total(k):
        return sum(r.get(k) or 0 for r in rows)

    return {
        "steps": len(rows), "wall_s": wall, "actor_restarts": restarts, "learner_restarts": learner_restarts,
        "pass_at_1_before": before and before["pass_at_1"], "pass_at_1_after": after and after["pass_at_1"],
        "samples": total("generated"), "samples_per_s": total("generated") / wall if wall else 0,
        "time_wait_s": total("wait_s"), "time_train_s": total("train_s"), "time_broadcast_s": total("broadcast_s"),
        "mean_pass_rate": total("pass_rate") / len(rows) if rows else 0,
        "pass_at_1_by_source": {src: [(before or {}).get("by_source", {}).get(src, {}).get("pass_at_1"), r["pass_at_1"]]
                                for src, r in (after or {}).get("by_source", {}).items()},
    }


def _summary_text(s: dict, run_dir: Path) -> str:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    busy = s["time_wait_s"] + s["time_train_s"] + s["time_broadcast_s"] or 1
    return (f"\n== brorl run: {s['steps']} steps in {s['wall_s']:.0f} s ==\n"
            f"held-out pass@1: {pct(s['pass_at_1_before'])} -> {pct(s['pass_at_1_after'])}\n"
            + "".join(f"  {src}: {pct(b)} -> {pct(a)}\n" for src, (b, a) in s["pass_at_1_by_source"].items()
                      if len(s["pass_at_1_by_source"]) > 1) +
            f"throughput: {s['samples']:.0f} samples, {s['samples_per_s']:.1f} samples/s; "
            f"kept by dynamic sampling {s['mean_pass_rate']:.2f} of the samples\n"
            f"learner time: waiting for data {100 * s['time_wait_s'] / busy:.0f}%, training "
            f"{100 * s['time_train_s'] / busy:.0f}%, broadcasting {100 * s['time_broadcast_s'] / busy:.0f}%\n"
            f"plots: {run_dir / 'plots.png'}   metrics: {run_dir / 'metrics.jsonl'}\n")
