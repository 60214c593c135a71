"""`brorl run`: every role on one machine, as processes.

Writes the resolved config to `run_dir/config.toml`, starts `brorl learner` and `actor.num_actors`
× `brorl actor` from it, prints a live status from the metrics file, and:
  - restarts an actor that dies (a new incarnation: it rejoins and gets the current weights before taking
    work), after a back-off that doubles from 1 s to 60 s, at most `run.max_actor_restarts` times each;
  - restarts a learner that dies (a signal, or a failure after it started serving) from its last checkpoint
    (`--resume`) once its ports are free, after `run.learner_restart_backoff_s` doubling, at most
    `run.max_learner_restarts` in a row (`cli/learner_restart.py`); the actors keep running and re-sync with it;
  - on Ctrl-C, SIGTERM or SIGINT stops in order: SIGTERM to the learner, which finishes the step in hand,
    writes a resumable checkpoint and tells the actors to stop; then SIGTERM to the actors. Each wait is
    bounded by what that role may legitimately take (`stop_timeouts`); whatever outlives it is killed
    with its process group;
  - children never outlive it: each gets SIGTERM from the kernel when the launcher dies, even by SIGKILL
    (Linux parent-death signal), and runs in a process group the launcher kills on its way out;
  - rotates each role's log past `run.log_max_mb`;
  - prints each event a role writes to `run_dir/events.jsonl` (`transport/events.py`: a fatal error, a stall
    diagnosis, a phase) as one line; a fatal error of the learner, or an actor's refusal, ends the job at
    once: the roles left are stopped within seconds (they have nothing to do without it);
  - when the learner finishes, stops the actors, evaluates the checkpoint before and after training
    (held-out pass@1), writes the plots and prints a summary.
It starts no role in its own process: children are separate `brorl` processes (the same commands
`docker run IMAGE …` would run); it reads their metrics files for the display.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from actors.verifier_set import EXIT_REFUSED  # `brorl actor` cannot work as configured: never restarted
from cli.display import Display
from cli.learner_restart import RestartPolicy, checkpoint_step, ledger_size, served_since, wait_ports_free
from cli.procs import brorl_command, die_with_parent, kill_group
from config.loader import ConfigError, to_toml
from config.placement import Placement, cpu_cores, place, visible_env
from config.schema import BrorlConfig
from learner import metrics as metrics_mod
from transport import events as events_mod

ACTOR_DRAIN_S = 60.0  # an actor's SIGTERM drain bound (actors/actor.py)
PORTS_FREE_S = 60.0  # how long a restarted learner waits for its predecessor's ports
FAILED_STOP_S = (10.0, 5.0)  # (learner, actors) waits after SIGTERM once the job has failed: nothing to finish


def refusal(name: str, log: Path | None) -> str:
    """The one line for an actor that refused to start: its reason from its log where its fatal event did not
    say it already (the actor's own "actor NAME refuses to start: WHY" said once, not doubled)."""
    why = _last_error(log) if log is not None else ""
    why = why.split(" refuses to start: ", 1)[1] if " refuses to start: " in why else why
    return f"{name} refused to start{': ' + why if why else ''}; stopping the job"


class Stop(Exception):
    """SIGTERM or SIGINT reached the launcher: stop the job in order."""


def stop_timeouts(cfg: BrorlConfig) -> tuple[float, float]:
    """(learner, actors) seconds to wait after SIGTERM before killing: the learner may be inside a weight
    broadcast (up to `transport.weight_timeout_s`) and then writes a checkpoint; an actor drains its
    in-flight groups (up to 60 s) and shuts its engine down."""
    return cfg.transport.weight_timeout_s + 120.0, ACTOR_DRAIN_S + 30.0


def visible_gpus() -> int:
    """GPUs this process sees (CUDA_VISIBLE_DEVICES applied); 0 with a CPU build of torch."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def placed(cfg: BrorlConfig, gpus: int | None = None) -> tuple[BrorlConfig, Placement]:
    """The job's GPU placement on this host (`config/placement.py`; ConfigError naming the fields when it
    does not fit) and the config as the roles run it: the learner sees only its GPUs, so its device is
    "cuda" and the resolved `learner.gpus` / `actor.gpus` are recorded in the run folder's config."""
    try:
        where = place(cfg, visible_gpus() if gpus is None else gpus)
    except ValueError as e:
        raise ConfigError(f"GPU placement: {e}") from None
    if where.learner:
        cfg = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"device": "cuda", "gpus": where.learner})})
    if where.actors:
        cfg = cfg.model_copy(update={"actor": cfg.actor.model_copy(update={"gpus": sum(where.actors, [])})})
    return cfg, where


class Launcher:
    def __init__(self, cfg: BrorlConfig, resume: bool = False, quiet: bool = False, gpus: int | None = None):
        cfg, self.placement = placed(cfg, gpus)
        self.cfg = cfg
        self.resume = resume
        self.quiet = quiet
        self.run_dir = Path(cfg.run.run_dir)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = self.run_dir / "logs"
        self.restarts = 0
        self.restarts_of: dict[str, int] = {}
        self._started_at: dict[str, float] = {}
        self._restart_at: dict[str, float] = {}  # actor -> when its back-off ends
        self.given_up: list[str] = []
        self.refused = ""  # why an actor refused to start (it exited with EXIT_REFUSED): the job stops
        self.failed = ""  # why the job failed (a role's fatal event, or the learner's exit status), as printed
        self.fatal_of: dict[str, str] = {}  # role -> its last fatal event's message
        self._stopping = False
        self.learner_restarts = RestartPolicy(cfg.run.max_learner_restarts, cfg.run.learner_restart_backoff_s)
        self._learner_restart_at: float | None = None  # when a dead learner's back-off ends
        self._ledger_mark = 0  # the ledger's size when the learner started: its `start` row comes after
        self.display = Display(cfg.learner.steps)
        self.events = events_mod.Reader(self.run_dir / "events.jsonl")

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        self._rotate(name)
        log = open(self.logs / f"{name}.log", "ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **self.device_env(name),
               **events_mod.role_env(self.events.path.resolve(), name)}
        p = subprocess.Popen(brorl_command(*args), stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        self.procs[name] = p
        self._started_at[name] = time.monotonic()
        self.fatal_of.pop(name, None)  # a new process: what the last one said is not its reason
        return p

    def device_env(self, name: str) -> dict[str, str]:
        """What the role's process may use: its own GPUs (`CUDA_VISIBLE_DEVICES`), or for an actor of several on
        the CPU its own cores (`VLLM_CPU_OMP_THREADS_BIND`, unless set for the job). Empty: nothing placed."""
        p = self.placement
        if name == "learner":
            gpus = p.learner
        elif p.actors:
            gpus = p.actors[int(name.rsplit("-", 1)[1])]
        else:
            cores = cpu_cores(int(name.rsplit("-", 1)[1]), self.cfg.actor.num_actors, sorted(os.sched_getaffinity(0)))
            bound = cores is None or "VLLM_CPU_OMP_THREADS_BIND" in os.environ
            return {} if bound else {"VLLM_CPU_OMP_THREADS_BIND": cores}
        return {"CUDA_VISIBLE_DEVICES": visible_env(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))} if gpus else {}

    def _rotate(self, name: str) -> None:
        """copy-truncate: the child appends (O_APPEND) to the same file, which starts again from empty; the
        previous contents go to `<role>.log.1` (the lines written between copy and truncate are lost)."""
        path = self.logs / f"{name}.log"
        if path.exists() and path.stat().st_size > self.cfg.run.log_max_mb * 2**20:
            shutil.copyfile(path, path.with_suffix(".log.1"))
            os.truncate(path, 0)

    def _actor_args(self, name: str) -> list[str]:
        return ["actor", "--config", str(self.run_dir / "config.toml"), "--actor-id", name]

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.run_dir / "config.toml"
        cfg_path.write_text(to_toml(self.cfg))
        self.events.skip_to_end()  # what earlier runs in this folder (or the evaluation before) said is not news
        if self.placement.learner or self.placement.actors:
            print(f"[brorl run] placement: {self.placement.describe()}", flush=True)
        self._start_learner(self.resume)
        for i in range(self.cfg.actor.num_actors):
            self._start(f"actor-{i}", self._actor_args(f"actor-{i}"))

    def _start_learner(self, resume: bool) -> None:
        self._ledger_mark = ledger_size(self.run_dir)
        self.fatal_of.pop("learner", None)  # what a learner before it said
        self._start("learner", ["learner", "--config", str(self.run_dir / "config.toml"),
                                *(["--resume"] if resume else [])])

    def _learner_served(self) -> bool:
        """Had the dead learner started serving (loaded, bound its sockets, written its ledger `start` row)?"""
        return served_since(self.run_dir, self._ledger_mark)

    def _checkpoint_step(self) -> int | None:
        """The step of the checkpoint a resumed learner starts from."""
        return checkpoint_step(self.run_dir)

    def _wait_learner_ports(self) -> None:
        """Until the learner's ports are free on this machine (a dead learner's ranks may still be stopping)."""
        t = self.cfg.transport
        busy = wait_ports_free(t.host, (t.work_port, t.rollout_port, t.control_port), PORTS_FREE_S)
        if busy:  # the learner will say which port it cannot bind, and exit before serving: not restarted
            print(f"[brorl run] ports {busy} on {t.host} still in use after {PORTS_FREE_S:.0f} s; starting the "
                  f"learner anyway", flush=True)

    def _supervise_learner(self) -> bool:
        """The learner has exited: restart it after its back-off if the policy says so (True: the job goes
        on), else False: the job ends with its exit status."""
        p = self.procs["learner"]
        if self._learner_restart_at is None:
            served, step = self._learner_served(), self._checkpoint_step()
            self._reap(p)  # whatever it left behind in its process group
            v = self.learner_restarts.decide(p.returncode, served, time.monotonic() - self._started_at["learner"])
            if p.returncode != 0:
                self._tail_events()  # its reason first
                self._say(f"[brorl run] {self.learner_restarts.line(v, step)} (details: {self.logs / 'learner.log'})")
            if not v.restart:
                return False
            self._learner_restart_at = time.monotonic() + v.delay_s
        if time.monotonic() >= self._learner_restart_at:
            self._learner_restart_at = None
            self._wait_learner_ports()
            self._start_learner(resume=True)
        return True

    def stop(self, timeouts: tuple[float, float] | None = None) -> None:
        """SIGTERM the learner and wait for it (it finishes the step in hand, writes a checkpoint and tells
        the actors to stop), then SIGTERM the actors and wait; kill the process group of whatever outlives
        its timeout; after a failure (`failed`, or the learner gone) only briefly: no role has anything to finish."""
        self.display.close()  # the panel stays as it was last drawn; what follows prints below it
        self._stopping = True
        learner = [n for n in self.procs if n == "learner"]
        actors = [n for n in self.procs if n != "learner"]
        dead = any(self.procs[n].poll() not in (None, 0) for n in learner)
        failing = bool(self.failed or self.refused or dead)
        if timeouts is None:
            timeouts = FAILED_STOP_S if failing else stop_timeouts(self.cfg)
        for group, timeout_s in zip((learner, actors), timeouts):
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
                    if not failing:  # after a failure the kill is the plan, not news
                        print(f"[brorl run] {name} did not stop within {timeout_s:.0f} s; killing it", flush=True)
                    p.kill()
                    p.wait()
                self._reap(p)  # whatever it left behind in its process group

    def _reap(self, p) -> None:
        kill_group(p.pid)

    def close(self) -> None:
        """After `stop`: nothing more on one machine (a cluster launcher disconnects here)."""

    def _supervise_actors(self) -> None:
        """Restart dead actors after their back-off, up to the cap."""
        now = time.monotonic()
        for name, p in list(self.procs.items()):
            if name == "learner" or p.poll() is None or name in self.given_up:
                continue
            if name not in self._restart_at:
                kill_group(p.pid)  # the dead actor's engine and scoring processes
                if p.returncode == EXIT_REFUSED:  # misconfigured (a verifier failed its self-test): restarting
                    self._tail_events()  # its fatal event (the reason) first
                    self.refused = refusal(name, None if name in self.fatal_of else self.logs / f"{name}.log")
                    self._say(f"[brorl run] {self.refused}")  # restarting cannot help
                    return
                lived = now - self._started_at[name]
                n = 0 if lived > 600 else self.restarts_of.get(name, 0)
                if n >= self.cfg.run.max_actor_restarts:
                    self.given_up.append(name)
                    print(f"[brorl run] {name} exited with {p.returncode} and was restarted {n} times "
                          f"(run.max_actor_restarts); leaving it down", flush=True)
                    continue
                self.restarts_of[name] = n + 1
                delay = min(60.0, 2.0 ** n)
                self._restart_at[name] = now + delay
                print(f"[brorl run] {name} exited with {p.returncode}; restarting it in {delay:.0f} s "
                      f"({n + 1}/{self.cfg.run.max_actor_restarts})", flush=True)
            elif now >= self._restart_at[name]:
                del self._restart_at[name]
                self.restarts += 1
                self._start(name, self._actor_args(name))

    def wait(self) -> int:
        """Until the learner exits for good, or a role's fatal event ends the job; a learner that dies is
        restarted by `run.max_learner_restarts`, actors that die by `run.max_actor_restarts`. Returns the
        learner's exit code (1 on the fatal event of a learner that never served: a restart would fail alike)."""
        last = 0.0
        while self.procs["learner"].poll() is None or (not self._stopping and self._supervise_learner()):
            self._tail_events()
            if "learner" in self.fatal_of and not self._learner_served():  # it is on its way out: failed now
                self.failed = self.fatal_of["learner"]
                return 1
            if not self._stopping:
                self._supervise_actors()
                if self.refused:
                    self.failed = self.refused
                    return EXIT_REFUSED
            if time.monotonic() - last > 5:
                last = time.monotonic()
                for name in self.procs:
                    self._rotate(name)
                if not self.quiet:
                    self._status()
            time.sleep(0.5)
        self._tail_events()
        if not self.quiet:
            self._status()
        learner = self.procs["learner"]
        if learner.returncode != 0 and not self._stopping:  # `_supervise_learner` said how it ended
            self.failed = self.fatal_of.get("learner") or f"the learner exited with status {learner.returncode}"
        return learner.returncode

    def _tail_events(self) -> None:
        """Print what the roles said since the last call, one line each; remember each role's fatal event."""
        for ev in self.events.read():
            role = str(ev.get("role", "?"))
            if ev["level"] == "fatal":
                self.fatal_of[role] = ev.get("message", "")
            log = self.logs / f"{role}.log"
            self._say(events_mod.line(ev, log if log.exists() else None))

    def _say(self, text: str) -> None:
        self.display.say(text)

    def _status(self) -> None:
        """The live display (`cli/display.py`): a panel on a terminal, one line per completed step in a log."""
        self.display.update(metrics_mod.read(self.run_dir / "metrics.jsonl"), self.restarts,
                            metrics_mod.read(self.run_dir / "heldout.jsonl"))


def _last_error(log: Path) -> str:
    """The last ERROR line of a role's log (what made it exit), without the timestamp prefix."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if " ERROR " in ln]
    except OSError:
        return "see its log"
    return lines[-1].split(" ERROR ", 1)[1] if lines else "see its log"
