"""Synthetic integer arithmetic: a task generator and its verifier, learnable by the tiny model.

Problems are `a+b=` / `a-b=` with operands of up to `difficulty` digits; the expected completion is the
integer result followed by end-of-sequence. The split of a problem (train or eval) is a pure function of
the problem itself, so the two splits never overlap whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Iterator, Literal

from verifiers.base import Task, VerifierResult

NAME = "synthetic"
VERSION = "1"
_ANSWER = re.compile(r"^\s*(-?\d+)")
EVAL_SHARE = 0.1  # fraction of the problem space held out for evaluation


def problem_split(a: int, op: str, b: int) -> Literal["train", "eval"]:
    h = int.from_bytes(hashlib.sha256(f"{a}{op}{b}".encode()).digest()[:4], "little")
    return "eval" if (h % 1000) < EVAL_SHARE * 1000 else "train"


def _make(a: int, op: str, b: int) -> Task:
    result = a + b if op == "+" else a - b
    return Task(prompt=f"{a}{op}{b}=", reference=str(result), verifier=NAME, task_id=f"{a}{op}{b}")


def generate(
    seed: int, difficulty: int = 1, split: Literal["train", "eval"] = "train"
) -> Iterator[Task]:
    """Endless stream of tasks of one split, reproducible for a seed."""
    if difficulty < 1:
        raise ValueError(f"difficulty must be >= 1, got {difficulty}")
    rng = random.Random(seed)
    hi = 10**difficulty - 1
    while True:
        a, b, op = rng.randint(0, hi), rng.randint(0, hi), rng.choice("+-")
        if problem_split(a, op, b) == split:
            yield _make(a, op, b)


def score(completion: str, reference: str) -> VerifierResult:
    """Correct iff the completion starts with the reference integer."""
    expected = int(reference)  # a non-integer reference is a dataset bug: let it raise
    m = _ANSWER.match(completion)
    if m is None:
        return VerifierResult(0.0, False, "no answer")
    ok = int(m.group(1)) == expected
    return VerifierResult(1.0 if ok else 0.0, ok, "match" if ok else "mismatch")


def corpus(seed: int, n: int, difficulty: int = 1) -> list[str]:
    """Prompt+answer lines (both splits) for training a tokenizer or warm-starting the model."""
    rng = random.Random(seed)
    hi = 10**difficulty - 1
    lines = []
    for _ in range(n):
        a, b, op = rng.randint(0, hi), rng.randint(0, hi), rng.choice("+-")
        t = _make(a, op, b)
        lines.append(t.prompt + t.reference)
    return lines


SELF_TEST = [(" 12", "12", True), ("-3", "-3", True), ("13", "12", False), ("", "1", False)]
