"""When `brorl run` restarts a learner that died, and what it says: the policy (budget, back-off, which exits
restart), whether the learner had started serving (its `start` row in the ledger), the checkpoint it resumes
from, and waiting for its ports to be free."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from actors.verifier_set import EXIT_REFUSED  # the role cannot work as configured: never restarted

RESET_AFTER_S = 600.0  # a learner that lived this long before dying starts the count of restarts afresh
MAX_BACKOFF_S = 60.0


@dataclass
class Verdict:
    restart: bool
    why: str
    """How it ended, for the console: "signal 9", "exit status 1"."""
    delay_s: float = 0.0
    n: int = 0
    """This restart's number (1-based), when `restart`."""
    reason: str = ""
    """Why not, when not `restart`."""


def how_it_ended(returncode: int) -> str:
    return f"signal {-returncode}" if returncode < 0 else f"exit status {returncode}"


class RestartPolicy:
    """A learner that died restarts from its checkpoint when it was killed by a signal (SIGKILL, the OOM killer)
    or failed after it had started serving (its `start` row in the ledger); not when it finished (0), refused
    (`EXIT_REFUSED`: restarting would not help), or failed before serving (a config, data or checkpoint
    problem that the next start would meet again). At most `budget` restarts in a row (a learner that lived
    `RESET_AFTER_S` starts the count afresh), each after `backoff_s` doubling up to `MAX_BACKOFF_S`."""

    def __init__(self, budget: int, backoff_s: float):
        self.budget, self.backoff_s = budget, backoff_s
        self.used = 0  # restarts in a row
        self.total = 0

    def decide(self, returncode: int, served: bool, lived_s: float) -> Verdict:
        why = how_it_ended(returncode)
        if returncode == 0:
            return Verdict(False, why, reason="it finished")
        if returncode == EXIT_REFUSED:
            return Verdict(False, why, reason="it refused to go on (restarting would not help)")
        if returncode > 0 and not served:
            return Verdict(False, why, reason="it failed before it started serving (restarting would meet the "
                                              "same error)")
        if lived_s >= RESET_AFTER_S:
            self.used = 0
        if self.budget == 0:
            return Verdict(False, why, reason="run.max_learner_restarts = 0 (resume with --resume)")
        if self.used >= self.budget:
            return Verdict(False, why, reason=f"it was restarted {self.used} times in a row "
                                              f"(run.max_learner_restarts = {self.budget}; resume with --resume)")
        delay = min(MAX_BACKOFF_S, self.backoff_s * 2.0 ** self.used)
        self.used += 1
        self.total += 1
        return Verdict(True, why, delay_s=delay, n=self.used)

    def line(self, v: Verdict, step: int | None) -> str:
        """The console's one line about a learner that died."""
        if not v.restart:
            return f"learner died ({v.why}); not restarted: {v.reason}"
        frm = f"checkpoint step {step}" if step is not None else "the start (no checkpoint yet)"
        when = f" in {v.delay_s:.0f} s" if v.delay_s >= 1 else ""
        return f"learner died ({v.why}); restarting from {frm}{when} (restart {v.n} of {self.budget})"


def ledger_size(run_dir: str | Path) -> int:
    """Where the next learner's first ledger row will begin: past the last whole line (a learner opening the
    ledger cuts off a torn last line, which a SIGKILL in the middle of a write leaves)."""
    try:
        with open(Path(run_dir) / "ledger.jsonl", "rb") as f:
            end = f.seek(0, 2)
            pos = end
            while pos > 0:
                step = min(pos, 1 << 16)
                f.seek(pos - step)
                nl = f.read(step).rfind(b"\n")
                if nl >= 0:
                    return pos - step + nl + 1
                pos -= step
            return 0
    except OSError:
        return 0


def served_since(run_dir: str | Path, offset: int) -> bool:
    """Has a learner written its `start` row (its first, once it has loaded and bound its sockets) to the
    ledger at `offset`?"""
    try:
        with open(Path(run_dir) / "ledger.jsonl", "rb") as f:
            f.seek(offset)
            row = json.loads(f.readline() or b"{}")
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and "start" in row


def checkpoint_step(run_dir: str | Path) -> int | None:
    """The step of the checkpoint `checkpoints/latest` names (what a resume starts from), None if none."""
    try:
        return int((Path(run_dir) / "checkpoints" / "latest").read_text().strip().rsplit("-", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def busy_ports(host: str, ports: tuple[int, ...]) -> list[int]:
    """Those of `ports` that a listening socket holds on `host` (connections in TIME_WAIT do not count: the
    learner's sockets bind with SO_REUSEADDR, as ZeroMQ does)."""
    busy = []
    for port in ports:
        if not port:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def wait_ports_free(host: str, ports: tuple[int, ...], timeout_s: float) -> list[int]:
    """Wait until no listening socket holds `ports` on `host` (a dead learner's ranks may still be stopping),
    at most `timeout_s`; returns those still held."""
    end = time.monotonic() + timeout_s
    while (busy := busy_ports(host, ports)) and time.monotonic() < end:
        time.sleep(0.2)
    return busy
