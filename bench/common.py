"""Shared benchmark helpers: a machine/version stamp, a plain-text table, JSON output, peak RSS."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def stamp() -> dict:
    info = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:
        pass
    for mod in ("vllm", "zmq", "deepspeed", "transformers"):
        try:
            m = __import__(mod)
            info[mod] = getattr(m, "__version__", getattr(m, "pyzmq_version", lambda: "?")())
        except Exception:
            pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except Exception:
        pass
    return info


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return "(not measured)"
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.rjust(w) for c, w in zip(cols, widths))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line, sep] + ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in cells])


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return "" if v is None else str(v)


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"stamp": stamp(), **payload}, indent=2) + "\n")
    return path


def run_isolated(module: str, args: list[str], timeout: float = 1800, env: dict | None = None) -> dict:
    """Run `python -m module args` in a fresh process (clean peak RSS; `env` added to the environment);
    it prints one JSON line last."""
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                         timeout=timeout, cwd=Path(__file__).resolve().parents[1],
                         env=None if env is None else {**os.environ, **env})
    if out.returncode != 0:
        raise RuntimeError(f"{module} {args} failed:\n{out.stderr[-3000:]}")
    if os.environ.get("TORCH_LOGS"):  # what the compiler was asked to say (recompiles, graph breaks) is kept
        sys.stderr.write("".join(line for line in out.stderr.splitlines(keepends=True) if "torch._dynamo" in line
                                 or "ecompil" in line or "graph break" in line.lower())[-20000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def brorl_run(run_dir: Path, overrides: dict, preset: str = "tiny-cpu", timeout: float = 3600,
              resume: bool = False) -> dict:
    """Run `brorl run --no-eval` (every role, as processes) into `run_dir` (emptied first; `resume`: kept, and
    the run continues from its latest checkpoint); returns its metrics rows, held-out rows (run.eval_interval),
    summary and wall seconds. Raises with the log tail on failure."""
    import shutil

    run_dir = Path(run_dir)
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)
    if not any(k.endswith("_port") for k in overrides):  # not the defaults: another job may hold them
        from transport.ports import free_ports

        base = free_ports(3)
        overrides = {**overrides, "transport.work_port": base, "transport.rollout_port": base + 1,
                     "transport.control_port": base + 2}
    args = [f"--{k}={v}" for k, v in {**overrides, "run.run_dir": str(run_dir)}.items()]
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "cli", "run", "--config", preset, "--no-eval",
                          *(["--resume"] if resume else []), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=Path(__file__).resolve().parents[1])
    wall = time.monotonic() - t0
    if out.returncode != 0:
        logs = "".join(p.read_text()[-1500:] for p in sorted((run_dir / "logs").glob("*.log"))) if (run_dir / "logs").exists() else ""
        raise RuntimeError(f"brorl run {args} failed ({out.returncode}):\n{out.stdout[-1500:]}\n{logs}")
    return {**load_run(run_dir), "wall_s": wall}


def load_run(run_dir: Path) -> dict:
    """A finished run folder's metrics rows, held-out rows and summary. A held-out estimate that failed (an
    `error` row: the run trained on without it) leaves a hole in the curve a benchmark compares: refused."""
    from learner import metrics as metrics_mod

    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    heldout = metrics_mod.read(run_dir / "heldout.jsonl")
    if failed := [h for h in heldout if "error" in h]:
        raise SystemExit(f"{run_dir}: the held-out estimate failed at step(s) {[h['step'] for h in failed]} "
                         f"({failed[0]['error']}); the learner's log says why")
    return {"metrics": metrics_mod.read(run_dir / "metrics.jsonl"), "heldout": heldout, "summary": summary}


class GpuMemory:
    """The memory in use on card `gpu` (None: the fullest card), every process on it, by nvidia-smi every `every`
    s in a thread: `peak_gib` is None where there is no nvidia-smi."""

    def __init__(self, gpu: int | None = None, every: float = 1.0):
        self.gpu, self.every, self.peak_gib = gpu, every, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  *(["-i", str(self.gpu)] if self.gpu is not None else [])],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return
        if out.returncode == 0 and out.stdout.strip():
            gib = max(float(x) for x in out.stdout.split()) / 1024
            self.peak_gib = gib if self.peak_gib is None else max(self.peak_gib, gib)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> "GpuMemory":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self.sample()
