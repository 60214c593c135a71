"""Soak: the default job with 2 actors for a long time under the faults of issue 52: an actor SIGKILLed every
few minutes, the learner SIGKILLed every 30 minutes, an actor SIGSTOPped for 60 s (at 20 and 80 minutes), one
checkpoint write failing with a real disk full.

    python -m bench.soak [--minutes 90] [--kill-every 180] [--learner-kill-every 1800] [--checkpoint-interval 20]

Runs `brorl run --no-eval` (the real launcher, which restarts killed actors and the killed learner from its
checkpoint) on the tiny-cpu preset with `actor.num_actors = 2` and effectively unbounded steps, samples every
10 s the resident memory of every process of the job (per role: the launcher, the learner, each actor with its
vLLM engine and scoring workers) and the disk use of the run folder (checkpoints, logs, the rest: ledger and
metrics), and injects:
  - a SIGKILL of the longest-lived actor every `--kill-every` seconds (±30 %, not within 60 s of another
    fault);
  - a SIGKILL of the learner every `--learner-kill-every` seconds;
  - a SIGSTOP of a random actor (the process and its children) for 60 s at 20 and 80 minutes;
  - at 45 minutes a disk full: a small tmpfs mounted on `run_dir/checkpoints` (holding a copy of the
    checkpoints there, the rest filled with a filler file) until the next checkpoint write has failed, then the
    filler removed, anything new copied back and the tmpfs unmounted (root only; a failed mount is reported
    loudly in the output and the record, never faked).
Then stops the job with SIGTERM. Reports:
  - per role the memory slope (MB/h, least squares within each process's life, pooled over lives) after the
    run's first 30 minutes and a process's first 5 minutes, and across lives (each life's median settled
    memory against time): flat means no leak;
  - the disk use of the run folder over time and its slope after 30 minutes;
  - per actor kill and stop: the longest gap between two steps in the 2 minutes after it against the step
    time before it (steps lost); per learner kill: the steps redone (step at the kill minus the step it
    resumed from, at most one checkpoint interval) and the time to the next step;
  - samples/s per minute over time and its slope;
  - the ledger's accounting (no prompt trained twice; every granted prompt trained, dropped or pending).
Writes bench/results/soak.json and soak.png. `--analyse bench/results/soak.json` recomputes the figures
from a saved run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILLER = ".soak-filler"


def roles(launcher_pid: int) -> dict[str, list]:
    """Role -> the processes of that role (the role's own process and its descendants)."""
    import psutil

    out: dict[str, list] = {}
    try:
        launcher = psutil.Process(launcher_pid)
        children = launcher.children()
        out["launcher"] = [launcher]
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


def disk_mb(run_dir: Path) -> dict[str, float]:
    """Bytes on disk of the run folder, split: checkpoints, logs, the rest (ledger, metrics); the filler of the
    disk-full fault is not counted."""
    out = {"checkpoints": 0.0, "logs": 0.0, "other": 0.0}
    for dirpath, _, files in os.walk(run_dir):
        rel = Path(dirpath).relative_to(run_dir).parts
        key = rel[0] if rel and rel[0] in ("checkpoints", "logs") else "other"
        for f in files:
            if f == FILLER:
                continue
            try:
                out[key] += os.stat(os.path.join(dirpath, f)).st_blocks * 512 / 2**20
            except FileNotFoundError:
                pass
    return out


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of y against t (seconds), per hour."""
    if len(ts) < 3:
        return float("nan")
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return 3600 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else float("nan")


def pooled_slope_per_hour(lives: list[list[tuple[float, float]]]) -> float:
    """The slope within lives (each life centred on its own means), per hour: growth of a process, not the
    jump of a restart."""
    num = var = 0.0
    for life in lives:
        if len(life) < 3:
            continue
        mt, my = statistics.fmean(t for t, _ in life), statistics.fmean(y for _, y in life)
        num += sum((t - mt) * (y - my) for t, y in life)
        var += sum((t - mt) ** 2 for t, _ in life)
    return 3600 * num / var if var else float("nan")


def last_step(run_dir: Path) -> int:
    from learner.metrics import read

    rows = read(run_dir / "metrics.jsonl")
    return rows[-1]["step"] if rows else 0


class DiskFull:
    """A real ENOSPC for the learner's next checkpoint write: a tmpfs over `run_dir/checkpoints` holding a copy
    of the checkpoints there, the rest of it filled. `end()` removes the filler, copies back what changed and
    unmounts."""

    def __init__(self, run_dir: Path):
        self.ck = run_dir / "checkpoints"
        self.under = Path(tempfile.mkdtemp(prefix="soak-under-"))
        self.mounted = self.bound = False

    def start(self) -> str:
        used = sum(f.stat().st_size for f in self.ck.rglob("*") if f.is_file())
        size_mb = used // 2**20 + 8
        subprocess.run(["mount", "--bind", str(self.ck), str(self.under)], check=True, capture_output=True, text=True)
        self.bound = True
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.ck)], check=True,
                       capture_output=True, text=True)
        self.mounted = True
        for p in self.under.iterdir():
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, self.ck / p.name)
        with open(self.ck / FILLER, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 2**20)
                    f.flush()
            except OSError:
                pass
        free = shutil.disk_usage(self.ck).free
        return f"tmpfs of {size_mb} MB on {self.ck}, {used / 2**20:.0f} MB of checkpoints copied in, free {free} B"

    def end(self) -> str:
        (self.ck / FILLER).unlink(missing_ok=True)
        kept = {p.name for p in self.ck.iterdir()}
        for p in self.under.iterdir():  # pruned while mounted
            if p.name not in kept:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        new = []
        for p in self.ck.iterdir():
            if p.name.startswith("step-") and not (self.under / p.name).exists():
                shutil.copytree(p, self.under / p.name)
                new.append(p.name)
        if (self.ck / "latest").exists():
            shutil.copy2(self.ck / "latest", self.under / "latest")
        subprocess.run(["umount", "-l", str(self.ck)], check=True)
        self.mounted = False
        subprocess.run(["umount", str(self.under)], check=True)
        self.bound = False
        return f"filler removed, tmpfs unmounted; checkpoints written meanwhile: {new or 'none'}"

    def abort(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.ck)])
        if self.bound:
            subprocess.run(["umount", "-l", str(self.under)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=90.0)
    ap.add_argument("--kill-every", type=float, default=180.0, help="seconds between actor kills (±30 %%)")
    ap.add_argument("--learner-kill-every", type=float, default=1800.0, help="seconds between learner kills")
    ap.add_argument("--stop-at", type=float, nargs="*", default=[20.0, 80.0],
                    help="minutes at which an actor is SIGSTOPped for 60 s")
    ap.add_argument("--disk-full-at", type=float, default=45.0, help="minute of the disk-full fault (0: none)")
    ap.add_argument("--checkpoint-interval", type=int, default=20, help="learner.checkpoint_interval (steps)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", default=str(ROOT / "runs" / "bench" / "soak"))
    ap.add_argument("--analyse", metavar="JSON", help="only recompute the figures from a saved soak.json")
    ap.add_argument("--finish", metavar="RAW", help="a soak cut short (its process killed): the figures from its "
                    "raw record, RUN_DIR/../soak-raw.json, saved every 10 minutes, and its run folder")
    args = ap.parse_args()
    if args.analyse:
        return report(json.loads(Path(args.analyse).read_text()))
    if args.finish:
        raw = json.loads(Path(args.finish).read_text())
        return finish(Path(raw["run_dir"]), raw["t0"], raw["t_last"], raw["args"], raw["kills"], raw["events"],
                      raw["samples"], rc=None, died=None, command=raw["command"] + f"  (finished: --finish {args.finish})")
    from learner.metrics import read

    run_dir = Path(args.run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "cli", "run", "--no-eval", "--actor.num_actors", "2", "--learner.steps", "1000000",
           "--run.run_dir", str(run_dir), "--run.eval_interval", "0",
           "--learner.checkpoint_interval", str(args.checkpoint_interval), "--run.max_learner_restarts", "100",
           "--run.max_actor_restarts", "100"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(run_dir.parent / "soak-launcher.log", "w"),
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    rng = random.Random(args.seed)
    samples: list[dict] = []
    kills: list[dict] = []  # actor SIGKILLs
    events: list[dict] = []  # learner kills, actor stops, the disk full

    def say(msg: str) -> None:
        print(f"[soak] {time.time() - t0:6.0f} s: {msg}", flush=True)

    def quiet() -> bool:  # no other fault in the last 60 s nor under way (figures stay separable)
        last = max([k["t"] for k in kills] + [e.get("end_t", e["t"]) for e in events] + [-1e9])
        return time.time() - t0 - last > 60 and stopped is None and disk is None

    next_kill = time.time() + 120 + args.kill_every * rng.uniform(0.7, 1.3)  # after engines are up
    next_learner_kill = t0 + args.learner_kill_every
    stops = sorted(t0 + 60 * m for m in args.stop_at)
    disk_at = t0 + 60 * args.disk_full_at if args.disk_full_at > 0 else None
    stopped = disk = None  # (victim procs, until) / (DiskFull, event, step when mounted, deadline)
    end = t0 + 60 * args.minutes
    raw_file, saved = run_dir.parent / "soak-raw.json", t0
    command = "python -m bench.soak " + " ".join(sys.argv[1:])
    try:
        while time.time() < end and proc.poll() is None:
            time.sleep(10)
            now = time.time()
            if now - saved >= 600:  # a soak killed from outside still leaves its record (`--finish`)
                saved = now
                part = raw_file.with_suffix(".part")  # whole or not at all, should the kill come mid-write
                part.write_text(json.dumps({"run_dir": str(run_dir), "t0": t0, "t_last": now, "command": command,
                                            "args": {"checkpoint_interval": args.checkpoint_interval},
                                            "kills": kills, "events": events, "samples": samples}))
                os.replace(part, raw_file)
            r = roles(proc.pid)
            samples.append({"t": now - t0, **{k: rss_mb(v) for k, v in r.items()},
                            "pids": {k: v[0].pid for k, v in r.items()}, "disk": disk_mb(run_dir)})
            if stopped and now >= stopped[1]:
                for p in stopped[0]:
                    try:
                        p.send_signal(signal.SIGCONT)
                    except Exception:
                        pass
                stopped[2]["end_t"] = now - t0
                say("SIGCONT")
                stopped = None
            if disk:
                dk, ev, step0, deadline = disk
                step = last_step(run_dir)
                log = (run_dir / "logs" / "learner.log").read_text(errors="replace")
                failed = "No space left on device" in log[ev["log_offset"]:]
                if failed or now >= deadline:
                    ev.update({"end_t": now - t0, "write_failed": failed, "step_at_end": step,
                               "end": dk.end()})
                    say(f"disk full over (the write failed: {failed}): {ev['end']}")
                    disk = None
            if disk_at and now >= disk_at and quiet() and last_step(run_dir) % args.checkpoint_interval >= 2:
                disk_at = None
                ev = {"t": now - t0, "kind": "disk_full", "step": last_step(run_dir)}
                dk = None
                try:
                    ev["log_offset"] = len((run_dir / "logs" / "learner.log").read_text(errors="replace"))
                    dk = DiskFull(run_dir)
                    ev["start"] = dk.start()
                    disk = (dk, ev, ev["step"], now + 1800)
                    say(f"disk full: {ev['start']}")
                except Exception as e:  # not root, no mount: say so, loudly
                    if dk:
                        dk.abort()
                    ev["error"] = f"{type(e).__name__}: {getattr(e, 'stderr', '') or e}"
                    say(f"!!! DISK FULL NOT TESTED: could not mount a tmpfs: {ev['error']}")
                events.append(ev)
            if now >= next_learner_kill and "learner" in r and stopped is None and disk is None:
                step = last_step(run_dir)
                os.kill(r["learner"][0].pid, signal.SIGKILL)
                events.append({"t": now - t0, "kind": "learner_kill", "step": step})
                say(f"SIGKILL learner at step {step}")
                next_learner_kill = now + args.learner_kill_every
            elif stops and now >= stops[0] and quiet():
                stops.pop(0)
                actors = sorted(k for k in r if k.startswith("actor-"))
                if actors:
                    victim = rng.choice(actors)
                    for p in r[victim]:
                        try:
                            p.send_signal(signal.SIGSTOP)
                        except Exception:
                            pass
                    events.append({"t": now - t0, "kind": "actor_stop", "actor": victim, "step": last_step(run_dir)})
                    stopped = (r[victim], now + 60, events[-1])
                    say(f"SIGSTOP {victim} for 60 s at step {events[-1]['step']}")
            elif now >= next_kill and quiet():
                actors = sorted(k for k in r if k.startswith("actor-"))
                if actors:  # the longest-lived: each restarted actor gets its engine up before its next kill
                    victim = min(actors, key=lambda k: r[k][0].create_time())
                    rows = read(run_dir / "metrics.jsonl")
                    os.kill(r[victim][0].pid, signal.SIGKILL)
                    kills.append({"t": time.time() - t0, "actor": victim, "step": rows[-1]["step"] if rows else 0})
                    say(f"SIGKILL {victim} at step {kills[-1]['step']}")
                next_kill = time.time() + args.kill_every * rng.uniform(0.7, 1.3)
    finally:
        if stopped:
            for p in stopped[0]:
                try:
                    p.send_signal(signal.SIGCONT)
                except Exception:
                    pass
        if disk:
            disk[1]["end"] = disk[0].end()
        died = proc.poll()
        if died is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=600)
    if died is not None:
        print(f"[soak] !!! the job ended by itself (exit status {died}) before the soak's end", flush=True)
    return finish(run_dir, t0, time.time(), {"checkpoint_interval": args.checkpoint_interval}, kills, events, samples,
                  rc=rc, died=died, command=command)


def finish(run_dir: Path, t0: float, t_end: float, args: dict, kills: list, events: list, samples: list, *,
           rc: int | None, died: int | None, command: str) -> int:
    """The raw record of a soak (ended, or cut short and read back by `--finish`) with its run folder's metrics,
    ledger and launcher log: the figures."""
    from learner.ledger import account, check
    from learner.metrics import read

    rows = read(run_dir / "metrics.jsonl")
    acc = account(run_dir)
    if rc is None:  # cut short: no end-of-run record; what was granted and not yet settled was pending at the cut
        # (so a cut job's ledger can show prompts trained twice or regranted, never prompts lost)
        acc.end_pending = sorted(set(acc.end_pending) | (set(acc.granted) - acc.void - set(acc.trained)
                                                         - set(acc.dropped)))
    ledger_ok, ledger_error = True, ""
    try:  # a cut may fall between a step's ledger row and its metrics row: the ledger's own last step then
        check(acc, rows[-1]["step"] if rc is not None or not acc.steps else acc.steps[-1])
    except AssertionError as e:
        ledger_ok, ledger_error = False, str(e)[:500]
    launcher_log = (run_dir.parent / "soak-launcher.log").read_text(errors="replace")
    result = {
        "minutes": (t_end - t0) / 60, "launcher_rc": rc, "ended_by_itself": died is not None,
        "checkpoint_interval": args["checkpoint_interval"], "kills": kills, "events": events, "rss_samples": samples,
        "learner_restart_lines": [ln for ln in launcher_log.splitlines() if "learner died" in ln],
        "steps_rows": [{"step": r["step"], "t": r["time"] - t0, "generated": r.get("generated") or 0.0,
                        "pass_rate": r.get("pass_rate")} for r in rows if r["time"] <= t_end],
        "ledger": {"ok": ledger_ok, "error": ledger_error, "trained": len(acc.trained), "granted": len(acc.granted),
                   "dropped": len(acc.dropped), "pending_at_end": len(acc.end_pending),
                   "restarted_or_evicted_returns": sum(r["reason"] in ("restarted", "evicted") for r in acc.returned)},
        "command": command,
    }
    return report(result)


def incarnations(samples: list[dict], role: str, kill_times: list[float]) -> list[list[tuple[float, float]]]:
    """A role's (t, MB) samples cut into its processes' lives (a new pid, or in records without pids a kill of
    that role, starts a new one)."""
    lives: list[list[tuple[float, float]]] = [[]]
    cuts = sorted(kill_times)
    pid = None
    for smp in samples:
        if role not in smp:
            continue
        if "pids" in smp:
            if smp["pids"].get(role) != pid and lives[-1]:
                lives.append([])
            pid = smp["pids"].get(role)
        while cuts and smp["t"] >= cuts[0]:
            cuts.pop(0)
            lives.append([])
        lives[-1].append((smp["t"], smp[role]))
    return [life for life in lives if life]


SETTLE_S = 300.0  # a process's first minutes: engine start, vLLM's CPU KV cache touched gradually
AFTER_S = 1800.0  # the leak figures count from the run's 30th minute


def gap_loss(times: list[float], gaps: list[float], t: float, window_s: float = 120.0) -> dict:
    """The longest gap between two steps in `window_s` after a fault at `t`, against the step time before it."""
    before = [g for a, g in zip(times, gaps) if t - 300 <= a < t - 5][-20:]
    after = [g for a, g in zip(times, gaps) if t - 5 <= a <= t + window_s]
    step_s = statistics.median(before) if before else float("nan")
    gap = max(after) if after else float("nan")
    return {"step_s_before": step_s, "max_gap_s": gap,
            "steps_lost": max(0.0, gap / step_s - 1) if after and before else float("nan")}


def report(res: dict) -> int:
    """Derive the figures from a run's raw record (also: `--analyse bench/results/soak.json`), print them,
    write JSON + PNG."""
    from bench.common import RESULTS, table, write_json

    rows, kills, samples = res["steps_rows"], res["kills"], res["rss_samples"]
    events = res.get("events", [])
    times = [r["t"] for r in rows]
    gaps = [b - a for a, b in zip(times, times[1:])]
    fault_ts = sorted([k["t"] for k in kills] + [e["t"] for e in events])
    for k in kills:  # steps lost: the longest gap after the kill against the step time just before it
        k.update(gap_loss(times, gaps, k["t"]))
        k["other_faults_within_120s"] = sum(0 < abs(t - k["t"]) <= 120 for t in fault_ts)
    for e in events:
        e["other_faults_within_120s"] = sum(0 < abs(t - e["t"]) <= 120 for t in fault_ts)
        if e["kind"] == "actor_stop":
            e.update(gap_loss(times, gaps, e["t"], 70.0))  # the 60 s stop and its eviction
        elif e["kind"] == "learner_kill":  # the new learner resumes at its checkpoint: the steps after it redone
            nxt = [r for r in rows if r["t"] > e["t"]]
            if nxt:
                e["resumed_from"] = nxt[0]["step"] - 1
                e["steps_redone"] = e["step"] - e["resumed_from"]
                e["s_to_next_step"] = nxt[0]["t"] - e["t"]
                e["s_to_step_again"] = next((r["t"] - e["t"] for r in nxt if r["step"] > e["step"]), float("nan"))
    minute: dict[int, float] = {}
    for r in rows:
        minute[int(r["t"] // 60)] = minute.get(int(r["t"] // 60), 0.0) + r["generated"]
    thr = sorted((60 * m + 30, g / 60) for m, g in minute.items())[:-1]  # the last minute is cut short
    thr_warm = [(t, v) for t, v in thr if t > 300]
    roles = sorted({k for s_ in samples for k in s_ if k not in ("t", "pids", "disk")})
    mem = {}
    for role in roles:
        lives = incarnations(samples, role, [k["t"] for k in kills if k["actor"] == role])
        longest = max(lives, key=lambda life: life[-1][0] - life[0][0])
        settled = [(t, y) for t, y in longest if t - longest[0][0] >= SETTLE_S]
        late = [[(t, y) for t, y in life if t >= AFTER_S and t - life[0][0] >= SETTLE_S] for life in lives]
        late = [life for life in late if len(life) >= 3]
        medians = [(statistics.fmean(t for t, _ in life), statistics.median(y for _, y in life)) for life in late]
        mem[role] = {"processes": len(lives), "longest_life_min": (longest[-1][0] - longest[0][0]) / 60,
                     "settled_first_mb": settled[0][1] if settled else float("nan"),
                     "settled_last_mb": settled[-1][1] if settled else float("nan"),
                     "slope_mb_per_h": slope_per_hour(*zip(*settled)) if len(settled) >= 3 else float("nan"),
                     "lives_after_30min": len(late), "minutes_counted": sum(life[-1][0] - life[0][0]
                                                                             for life in late) / 60,
                     "slope_within_lives_mb_per_h": pooled_slope_per_hour(late),
                     "slope_across_lives_mb_per_h": slope_per_hour(*zip(*medians)) if len(medians) >= 3
                     else float("nan")}
    disk = {}
    dsamples = [s_ for s_ in samples if "disk" in s_]
    if dsamples:
        late = [s_ for s_ in dsamples if s_["t"] >= AFTER_S]
        for part in ("checkpoints", "logs", "other"):
            ys = [s_["disk"][part] for s_ in dsamples]
            disk[part] = {"max_mb": max(ys), "last_mb": ys[-1],
                          "slope_after_30min_mb_per_h": slope_per_hour([s_["t"] for s_ in late],
                                                                       [s_["disk"][part] for s_ in late])}
    res.update({"memory": mem, "disk": disk, "samples_per_s_by_minute": thr, "steps": rows[-1]["step"],
                "samples_per_s_mean": statistics.fmean(v for _, v in thr_warm) if thr_warm else float("nan"),
                "samples_per_s_slope_per_h": slope_per_hour(*zip(*thr_warm)) if len(thr_warm) >= 3 else float("nan"),
                "pass_rate_first_last": [rows[0].get("pass_rate"), rows[-1].get("pass_rate")]})
    write_json("soak", res)
    plot(res, RESULTS / "soak.png")
    r1 = lambda v: round(v, 1) if isinstance(v, float) else v  # noqa: E731
    print(table([{"role": k, **{m: r1(v) for m, v in mem[k].items()}} for k in roles],
                ["role", "processes", "longest_life_min", "lives_after_30min", "minutes_counted",
                 "slope_within_lives_mb_per_h", "slope_across_lives_mb_per_h", "slope_mb_per_h"]))
    if disk:
        print(table([{"part": k, **{m: r1(v) for m, v in d.items()}} for k, d in disk.items()],
                    ["part", "max_mb", "last_mb", "slope_after_30min_mb_per_h"]))
    print(table([{k: r1(v) for k, v in kk.items()} for kk in kills],
                ["t", "actor", "step", "step_s_before", "max_gap_s", "steps_lost", "other_faults_within_120s"]))
    for e in events:
        print("  " + json.dumps({k: r1(v) for k, v in e.items() if k != "log_offset"}))
    lost = [k["steps_lost"] for k in kills if k["steps_lost"] == k["steps_lost"]]
    redone = [e["steps_redone"] for e in events if "steps_redone" in e]
    print(f"{res['steps']} steps in {res['minutes']:.0f} min, {len(kills)} actor kills, steps lost per actor kill: "
          f"median {statistics.median(lost) if lost else float('nan'):.1f}, max {max(lost, default=float('nan')):.1f}; "
          f"{len(redone)} learner kills, steps redone: {redone} (checkpoint interval "
          f"{res.get('checkpoint_interval', '?')}); samples/s {res['samples_per_s_mean']:.0f} "
          f"(slope {res['samples_per_s_slope_per_h']:+.0f} per h); "
          f"ledger {'ok' if res['ledger']['ok'] else 'BROKEN: ' + res['ledger']['error']}: {json.dumps(res['ledger'])}")
    return 0 if res["ledger"]["ok"] else 1


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    (st, a), (d, b) = axes
    st.plot([r["t"] / 60 for r in res["steps_rows"]], [r["step"] for r in res["steps_rows"]], ".", ms=1.5)
    st.set_title("learner step (a learner kill: the steps since its checkpoint are redone)")
    roles_ = sorted({k for s in res["rss_samples"] for k in s if k not in ("t", "pids", "disk")})
    for k in roles_:
        pts = [(s["t"] / 60, s[k]) for s in res["rss_samples"] if k in s]
        m = res["memory"][k]
        a.plot(*zip(*pts), lw=0.8, label=f"{k} (after 30 min: {m.get('slope_within_lives_mb_per_h', float('nan')):+.0f}"
                                       f" MB/h within lives)")
    a.set_title("resident memory per role (process + children), MB")
    a.set_yscale("log")
    ds = [s for s in res["rss_samples"] if "disk" in s]
    for part in ("checkpoints", "logs", "other"):
        if ds:
            d.plot([s["t"] / 60 for s in ds], [s["disk"][part] for s in ds], label=part)
    d.set_title("disk use of the run folder, MB")
    b.plot([t / 60 for t, _ in res["samples_per_s_by_minute"]], [v for _, v in res["samples_per_s_by_minute"]],
           marker=".", label=f"slope {res['samples_per_s_slope_per_h']:+.1f} per h")
    b.set_title("generated samples/s (per minute)")
    colour = {"learner_kill": "black", "actor_stop": "orange", "disk_full": "purple"}
    for ax in axes.flat:
        for k in res["kills"]:
            ax.axvline(k["t"] / 60, color="red", alpha=0.25, lw=0.8)
        for e in res.get("events", []):
            ax.axvline(e["t"] / 60, color=colour[e["kind"]], alpha=0.6, lw=1.2)
        ax.set_xlabel("minutes (red: actor SIGKILL, black: learner SIGKILL, orange: actor SIGSTOP 60 s, "
                      "purple: disk full)", fontsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    n_l = sum(e["kind"] == "learner_kill" for e in res.get("events", []))
    fig.suptitle(f"brorl soak: default job, 2 actors, {res['minutes']:.0f} min, {len(res['kills'])} actor kills, "
                 f"{n_l} learner kills", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
