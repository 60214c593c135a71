"""What a role tells the console of `brorl run`: events, one JSON line each, appended to the run's events file.

A role (learner, actor, evaluation) started by `brorl run` finds the file in `BRORL_EVENTS` and its name in
`BRORL_ROLE`; without them (a role started by hand) `emit` writes nothing. `brorl run` tails the file
(`Reader`) and prints each event as one line (`line`). Levels:
  fatal   the role is ending and why (its uncaught exception's message; the traceback stays in its log)
  error   something failed that the role survives
  stall   the job makes no progress, and why (the learner's no-progress diagnosis)
  warning worth a user's attention
  phase   what the role is doing now (engine start, evaluation), so a long wait is not silent
Standard library only: every role and the launcher import it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV_FILE = "BRORL_EVENTS"
ENV_ROLE = "BRORL_ROLE"
LEVELS = ("fatal", "error", "stall", "warning", "phase")
MAX_CHARS = 1000  # one console line: a longer message is cut (the role's log has it whole)

_said: set[str] = set()  # keys of `once` events this process has emitted


def role_env(path: str | Path, role: str) -> dict[str, str]:
    """The environment that makes a child process a role writing to `path`."""
    return {ENV_FILE: str(path), ENV_ROLE: role}


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1] + "…"


def emit(level: str, message: str, fix: str = "", role: str | None = None, path: str | Path | None = None) -> dict | None:
    """Append one event (one `write` of one line to a file opened O_APPEND: lines of several roles do not
    interleave). Returns it, or None when this process has no events file. Never raises: telling the console
    must not be what kills a role."""
    path = path or os.environ.get(ENV_FILE)
    if not path:
        return None
    if level not in LEVELS:
        raise ValueError(f"event level {level!r}: one of {LEVELS}")
    ev = {"t": time.time(), "role": role or os.environ.get(ENV_ROLE) or "brorl", "level": level,
          "message": _one_line(message), "fix": _one_line(fix)}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(ev) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        return None
    return ev


def once(key: str, level: str, message: str, fix: str = "") -> dict | None:
    """`emit`, unless this process already emitted an event of `key` (not yet `forget`-ten)."""
    if key in _said:
        return None
    _said.add(key)
    return emit(level, message, fix)


def forget(prefix: str = "") -> None:
    """The `once` keys starting with `prefix` may be said again (e.g. a stall that ended)."""
    for k in [k for k in _said if k.startswith(prefix)]:
        _said.discard(k)


FIXES = (  # (exception type name or text in its message, the fix to suggest)
    ("DataError", "correct data.train / data.eval (check them with `brorl data preview`)"),
    ("ConfigError", "correct the config (see it resolved with `brorl show-config`)"),
    ("RenderError", "check data.* and actor.max_model_len with `brorl data preview`"),
    ("no control-channel barrier", "check that the learner runs and that this actor reaches it (transport.host and "
                                   "ports, or --learner; the same transport.curve keys on both)"),
    ("out of memory", "lower the batch (job.prompts_per_step, learner.micro_batch_tokens) or give the role more memory"),
)


def chain(exc: BaseException) -> list[BaseException]:
    """The exception and its explicit causes (`raise ... from e`), outermost first."""
    out = [exc]
    while out[-1].__cause__ is not None and all(out[-1].__cause__ is not e for e in out):
        out.append(out[-1].__cause__)
    return out


def describe(exc: BaseException) -> tuple[str, str]:
    """(message, fix) of an exception: the type and message of the outermost exception that is not a mere
    wrapper (one with `wraps = True`, e.g. "task X died" around the task's error); the fix the first of the
    chain carries (`fix` attribute), or else one its type or message suggests (`FIXES`)."""
    causes = chain(exc)
    said = next((e for e in causes if not getattr(e, "wraps", False)), causes[-1])
    message = f"{type(said).__name__}: {said}" if str(said) else type(said).__name__
    fix = next((e.fix for e in causes if isinstance(getattr(e, "fix", None), str) and e.fix), "")
    for e in causes if not fix else ():
        names = {t.__name__ for t in type(e).__mro__}
        fix = next((f for key, f in FIXES if key in names or key in str(e)), "")
        if fix:
            break
    return message, fix


def fatal(exc: BaseException) -> dict | None:
    """The role is ending with `exc`: one fatal event (nothing if it has no events file)."""
    message, fix = describe(exc)
    return emit("fatal", message, fix)


class Reader:
    """Tails an events file: `read` returns the events appended since the last call (complete lines only)."""

    def __init__(self, path: str | Path):
        self.path, self.offset = Path(path), 0

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("level") in LEVELS:
                out.append(ev)
        return out

    def skip_to_end(self) -> None:
        """Past what is there now (a resumed run's earlier events are not news)."""
        try:
            self.offset = self.path.stat().st_size
        except OSError:
            self.offset = 0


def line(ev: dict, log: str | Path | None = None) -> str:
    """One console line: `[brorl run] ROLE LEVEL: message — fix: …` (phases: `ROLE: message`). For a fatal
    or error event, `log` (the role's log) is named where the traceback is."""
    role, level = ev.get("role", "?"), ev.get("level", "?")
    text = f"[brorl run] {role}: {ev.get('message', '')}" if level == "phase" else \
        f"[brorl run] {role} {level.upper()}: {ev.get('message', '')}"
    if ev.get("fix"):
        text += f" — fix: {ev['fix']}"
    if log and level in ("fatal", "error"):
        text += f" (details: {log})"
    return text
