"""`brorl run`: every role on one machine, as processes.

Writes the resolved config to `run_dir/config.toml`, starts `brorl learner` and `actor.num_actors`
× `brorl actor` from it, prints a live one-line status from the metrics file, and:
  - restarts an actor that dies (it rejoins and gets the current weights before taking work);
  - on Ctrl-C / SIGTERM, sends SIGTERM to every process it started (by pid), so the learner writes a
    resumable checkpoint, and waits for them;
  - when the learner finishes, stops the actors, evaluates the checkpoint before and after training
    (held-out pass@1), writes the plots and prints a summary.
It starts no role in its own process: children are separate `brorl` processes (the same commands
`docker run IMAGE …` would run); it reads their metrics files for the display.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli.display import status_lines
from config.loader import to_toml
from config.schema import BrorlConfig
from learner import metrics as metrics_mod


def _brorl(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


class Launcher:
    def __init__(self, cfg: BrorlConfig, resume: bool = False, quiet: bool = False):
        self.cfg = cfg
        self.resume = resume
        self.quiet = quiet
        self.run_dir = Path(cfg.run.run_dir)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = self.run_dir / "logs"
        self.restarts = 0
        self._stopping = False
        self._drawn = 0  # lines of the live panel on screen

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        p = subprocess.Popen(_brorl(*args), stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.run_dir / "config.toml"
        cfg_path.write_text(to_toml(self.cfg))
        self._start("learner", ["learner", "--config", str(cfg_path), *(["--resume"] if self.resume else [])])
        for i in range(self.cfg.actor.num_actors):
            self._start(f"actor-{i}", ["actor", "--config", str(cfg_path), "--actor-id", f"actor-{i}"])

    def stop(self, timeout_s: float = 90.0) -> None:
        """SIGTERM the learner and wait for it (it finishes the step in hand, writes a checkpoint and tells
        the actors to stop), then SIGTERM the actors and wait; SIGKILL whatever outlives the timeout."""
        self._stopping = True
        learner = [n for n in self.procs if n == "learner"]
        actors = [n for n in self.procs if n != "learner"]
        for group in (learner, actors):
            for name in group:
                p = self.procs[name]
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for name in group:
                p = self.procs[name]
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()

    def wait(self) -> int:
        """Until the learner exits; actors that die are restarted. Returns the learner's exit code."""
        learner = self.procs["learner"]
        last = 0.0
        while learner.poll() is None:
            for name, p in list(self.procs.items()):
                if name != "learner" and p.poll() is not None and not self._stopping:
                    self.restarts += 1
                    print(f"[brorl run] {name} exited with {p.returncode}; restarting it", flush=True)
                    self._start(name, ["actor", "--config", str(self.run_dir / "config.toml"), "--actor-id", name])
            if not self.quiet and time.monotonic() - last > 5:
                last = time.monotonic()
                self._status()
            time.sleep(0.5)
        if not self.quiet:
            self._status()
        return learner.returncode

    def _status(self) -> None:
        """On a terminal, a live panel redrawn in place; otherwise (logs, CI) one line per call."""
        rows = metrics_mod.read(self.run_dir / "metrics.jsonl")
        if not rows:
            print("[brorl run] waiting for the first step (engines start in ~20-60 s)...", flush=True)
            return
        lines = status_lines(rows, self.cfg.learner.steps, self.restarts,
                             metrics_mod.read(self.run_dir / "heldout.jsonl"))
        if sys.stdout.isatty():
            up = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
            print(up + "\n".join(lines), flush=True)
            self._drawn = len(lines)
        else:
            print(lines[0], flush=True)


def run(cfg: BrorlConfig, resume: bool = False, evaluate: bool = True) -> int:
    from cli.plots import plot_run

    la = Launcher(cfg, resume=resume)
    before = _evaluate(cfg, cfg.model.path, "before") if evaluate and not resume else None
    la.start()
    interrupted = False
    t0 = time.monotonic()
    try:
        rc = la.wait()
    except KeyboardInterrupt:
        interrupted = True
        rc = 130
        print("\n[brorl run] stopping: the learner writes a checkpoint; resume with --resume", flush=True)
    finally:
        la.stop()
    wall = time.monotonic() - t0
    rows = metrics_mod.read(la.run_dir / "metrics.jsonl")
    if rows:
        plot_run(la.run_dir)
    if interrupted or rc != 0:
        return rc
    ckpt = la.run_dir / "checkpoints"
    after = None
    if evaluate and (ckpt / "latest").exists():
        after = _evaluate(cfg, str(ckpt / (ckpt / "latest").read_text().strip() / "model"), "after")
    summary = _summary(cfg, rows, before, after, wall, la.restarts)
    (la.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(_summary_text(summary, la.run_dir))
    return 0


def _evaluate(cfg: BrorlConfig, model_path: str, tag: str) -> dict | None:
    run_dir = Path(cfg.run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.toml"
    cfg_path.write_text(to_toml(cfg))
    out = run_dir / f"eval-{tag}.json"
    r = subprocess.run(_brorl("eval", "--config", str(cfg_path), "--checkpoint", model_path, "--out", str(out)),
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"[brorl run] evaluation '{tag}' failed:\n{r.stderr[-2000:]}", flush=True)
        return None
    return json.loads(out.read_text())


def _summary(cfg, rows, before, after, wall, restarts) -> dict:
    def total(k):
        return sum(r.get(k) or 0 for r in rows)

    return {
        "steps": len(rows), "wall_s": wall, "actor_restarts": restarts,
        "pass_at_1_before": before and before["pass_at_1"], "pass_at_1_after": after and after["pass_at_1"],
        "samples": total("generated"), "samples_per_s": total("generated") / wall if wall else 0,
        "time_wait_s": total("wait_s"), "time_train_s": total("train_s"), "time_broadcast_s": total("broadcast_s"),
        "mean_pass_rate": total("pass_rate") / len(rows) if rows else 0,
    }


def _summary_text(s: dict, run_dir: Path) -> str:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    busy = s["time_wait_s"] + s["time_train_s"] + s["time_broadcast_s"] or 1
    return (f"\n== brorl run: {s['steps']} steps in {s['wall_s']:.0f} s ==\n"
            f"held-out pass@1: {pct(s['pass_at_1_before'])} -> {pct(s['pass_at_1_after'])}\n"
            f"throughput: {s['samples']:.0f} samples, {s['samples_per_s']:.1f} samples/s; "
            f"dynamic-sampling pass rate {s['mean_pass_rate']:.2f}\n"
            f"learner time: waiting for data {100 * s['time_wait_s'] / busy:.0f}%, training "
            f"{100 * s['time_train_s'] / busy:.0f}%, broadcasting {100 * s['time_broadcast_s'] / busy:.0f}%\n"
            f"plots: {run_dir / 'plots.png'}   metrics: {run_dir / 'metrics.jsonl'}\n")
