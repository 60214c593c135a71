"""The audit trail of a run: reading `ledger.jsonl` (written by the learner service) back into an account
of every prompt — what was granted to whom, trained, dropped, returned, and left pending.

Rows: {"start": step, "epoch", "next_id", "pending"} when a learner process starts (a resume starts again at its checkpoint's
step); {"granted": [...], "actor", "incarnation", "sources": [...]} (each prompt's data source); {"returned": [...], "actor", "reason"} when prompts go back
to the queue to be granted again (reason: restarted, evicted, handed_back — the actor aborted or failed
them —, invalid, unleased, stale, expired — unanswered past its lease deadline —, duplicate);
{"step": s, "trained": [...], "dropped": [...]}; {"end": step, "pending": [...]} when a learner finishes.
Steps a learner trained after its last checkpoint and before it died are lost: the next process trains
from the checkpoint again, so only each process's steps up to the next one's start count."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from learner.metrics import read


@dataclass
class Account:
    trained: list[int] = field(default_factory=list)
    """Prompts trained, in order, over the run's effective history."""
    dropped: list[int] = field(default_factory=list)
    """Prompts whose groups dynamic sampling dropped (committed with a step)."""
    steps: list[int] = field(default_factory=list)
    granted: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    """Prompt -> every (actor, incarnation) it was granted to, in order."""
    returned: list[dict] = field(default_factory=list)
    end_pending: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    regranted: list[int] = field(default_factory=list)
    """Prompts granted again without having come back (a learner handing out one prompt twice)."""
    void: set[int] = field(default_factory=set)
    """Prompts granted only by a learner that died before checkpointing them (its successor starts from an
    earlier data cursor and hands those ids out afresh, or never)."""


def account(run_dir: str | Path) -> Account:
    rows = read(Path(run_dir) / "ledger.jsonl")
    segments: list[list[dict]] = []
    for r in rows:
        if "start" in r or not segments:
            segments.append([])
        segments[-1].append(r)
    acc = Account()
    for i, seg in enumerate(segments):
        if "start" in seg[0]:
            acc.starts.append(seg[0]["start"])
        nxt = segments[i + 1][0] if i + 1 < len(segments) else {}
        upto = nxt.get("start", 10**9)
        later = {pid for s2 in segments[i + 1:] for r in s2 for pid in r.get("granted", [])}
        acc.void |= {pid for r in seg for pid in r.get("granted", [])
                     if pid >= nxt.get("next_id", 10**18) and pid not in later}
        # a grant hands out a fresh id (at or past the start's cursor, once) or one that came back (left
        # pending by the process before, or returned since)
        back, issued, cursor = set(seg[0].get("pending", [])), set(), seg[0].get("next_id", 0)
        for r in seg:
            back |= set(r.get("returned", []))
            for pid in r.get("granted", []):
                if pid in back:
                    back.discard(pid)
                elif pid >= cursor and pid not in issued:
                    issued.add(pid)
                else:
                    acc.regranted.append(pid)
            if "trained" in r and r["step"] <= upto:
                acc.steps.append(r["step"])
                acc.trained += r["trained"]
                acc.dropped += r["dropped"]
            for pid in r.get("granted", []):
                acc.granted.setdefault(pid, []).append((r["actor"], r.get("incarnation", "")))
            if "returned" in r:
                acc.returned.append(r)
            if "end" in r:
                acc.end_pending = r["pending"]
    return acc


class LedgerError(AssertionError):
    """The ledger shows a prompt trained twice, a step missing, or a granted prompt unaccounted for."""


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise LedgerError(what)


def check(acc: Account, steps: int, per_step: int | None = None) -> None:
    """Every step once, no prompt trained twice or granted again unless it came back, every granted prompt
    trained, dropped or still pending; raises LedgerError naming what is wrong (tests and `bench/soak.py`)."""
    _require(acc.steps == list(range(1, steps + 1)), f"steps trained: {acc.steps}, expected 1..{steps}")
    dup = sorted(p for p, n in Counter(acc.trained).items() if n > 1)
    _require(not dup, f"prompts trained twice: {dup}")
    _require(set(acc.trained) <= set(acc.granted), "a trained prompt was never granted")
    _require(not set(acc.dropped) & set(acc.trained), "a prompt was both dropped and trained")
    if per_step is not None:
        _require(len(acc.trained) == per_step * steps, f"{len(acc.trained)} prompts trained, expected "
                                                        f"{per_step} x {steps}")
    _require(not acc.regranted, f"granted again without having come back: {acc.regranted}")
    unaccounted = set(acc.granted) - acc.void - set(acc.trained) - set(acc.dropped) - set(acc.end_pending)
    _require(not unaccounted, f"granted but never trained, dropped or pending at the end: {sorted(unaccounted)}")
