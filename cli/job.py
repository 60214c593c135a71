"""The whole job of `brorl run`: held-out evaluation before, the roles (one machine: `cli/launcher.py`; Ray:
`cli/cluster.py`), an ordered stop on SIGTERM or Ctrl-C, evaluation after, the plots and a summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from cli.launcher import Launcher, Stop
from cli.procs import brorl_command, die_with_parent, kill_group
from config.loader import to_toml
from config.schema import BrorlConfig
from learner import metrics as metrics_mod
from transport import events as events_mod


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
    role = f"eval-{tag}"
    log = run_dir / "logs" / f"{role}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    reader = events_mod.Reader(run_dir / "events.jsonl")
    reader.skip_to_end()
    print(f"[brorl run] {role}: held-out pass@1 of the model {tag} training (run.eval_prompts prompts or data.eval, "
          f"run.eval_samples samples each; --no-eval skips it); log: {log}", flush=True)
    t0 = time.monotonic()
    with open(log, "ab") as f:
        p = subprocess.Popen(brorl_command("eval", "--config", str(cfg_path), "--checkpoint", model_path,
                                           "--out", str(out)), stdout=f, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1",
                                  **events_mod.role_env(reader.path.resolve(), role)},
                             start_new_session=True, preexec_fn=die_with_parent)
    said_fatal = False
    try:
        while True:
            done = p.poll() is not None
            for ev in reader.read():  # its phases (engine start, generation) and a fatal error, as they come
                said_fatal |= ev["level"] == "fatal"
                print(events_mod.line(ev, log), flush=True)
            if done:
                break
            time.sleep(0.5)
    finally:
        if p.poll() is None:  # interrupted (Ctrl-C, SIGTERM): the evaluation goes too
            kill_group(p.pid)
            p.wait()
    if p.returncode != 0:
        if not said_fatal:
            print(f"[brorl run] {role} ERROR: exited with status {p.returncode} (details: {log})", flush=True)
        print(f"[brorl run] {role}: no held-out result; the job goes on", flush=True)
        return None
    res = json.loads(out.read_text())
    print(f"[brorl run] {role}: pass@1 {100 * res['pass_at_1']:.1f}% ({time.monotonic() - t0:.0f} s)", flush=True)
    return res


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
