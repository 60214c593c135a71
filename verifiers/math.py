"""Math answers, checked with `math-verify`: the final answer is extracted (the last \\boxed{...}, else
the last LaTeX or plain expression) and compared with the reference symbolically — fractions,
decimals, radicals, LaTeX, intervals, unordered sets. Parsing and comparison each have a time limit
(math-verify's own, signal-based: it works on a process's main thread only, where every brorl scoring path
runs it, in worker processes). On any other thread the limit is off rather than failing (math-verify's
signal call would raise there and the answer would read wrong); the caller must bound the time. A
completion that boxes several different answers is hedging and scores wrong (`verifiers.answers.hedged`),
whichever box is right.
"""

from __future__ import annotations

import threading

from verifiers.answers import hedged
from verifiers.base import VerifierResult

NAME = "math"
VERSION = "1"
TIME_LIMIT_S = 5

# (completion, reference, expected correct) — run by the registry before this verifier is accepted.
SELF_TEST = [
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", True),
    ("$2\\sqrt{2}$", "\\sqrt{8}", True),
    ("\\boxed{3}", "4", False),
    ("\\boxed{3} or \\boxed{4}", "4", False),
]


def score(completion: str, reference: str) -> VerifierResult:
    from math_verify import parse, verify

    limit = TIME_LIMIT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(_dollars(reference), parsing_timeout=limit)
    if not gold:
        raise ValueError(f"reference {reference!r} does not parse as a math answer")
    if hedged(completion):
        return VerifierResult(0.0, False, "several different boxed answers")
    pred = parse(completion, parsing_timeout=limit)
    if not pred:
        return VerifierResult(0.0, False, "no answer")
    ok = bool(verify(gold, pred, timeout_seconds=limit))
    return VerifierResult(1.0 if ok else 0.0, ok, "match" if ok else "mismatch")


def _dollars(ref: str) -> str:
    """References are bare LaTeX (`\\frac{1}{2}`); math-verify extracts LaTeX inside $...$."""
    s = ref.strip()
    return s if s.startswith("$") or "\\boxed" in s else f"${s}$"
