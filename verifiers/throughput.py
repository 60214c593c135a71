"""A throughput task: prompts with a set pass rate whatever the model, for measuring the system.

A random-weight model solves no real task, so every group would be all-wrong and dynamic sampling would
keep none: nothing trains and the learner never runs. Here a completion is "correct" when a hash of it
falls under its prompt's pass rate, so any model, trained or not, yields kept groups at a realistic rate.

Task spec `throughput:<pass rate>[:<prompt characters>]` (e.g. `throughput:0.3:256`). Each prompt's own
pass rate p is drawn from Beta(2·m, 2·(1 − m)) with mean m = the spec's pass rate: as in real RL data,
some prompts are nearly always failed or nearly always solved (their groups are dropped) and the rest
are mixed. The reference carries p; the score is a pure function of the completion and the reference.
Prompts are digits and operators, so every tokenizer, the tiny model's included, reads them.
"""

from __future__ import annotations

import hashlib
import random
from typing import Iterator, Literal

from verifiers.base import Task, VerifierResult

NAME = "throughput"
VERSION = "1"
ALPHABET = "0123456789+-="
DEFAULT_PROMPT_CHARS = 64


def _unit(text: str) -> float:
    """A uniform number in [0, 1) from a hash of `text`."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") / 2.0**64


def parse_spec(arg: str) -> tuple[float, int]:
    """`<pass rate>[:<prompt characters>]` -> (pass rate, prompt characters); ValueError naming the part."""
    rate_s, _, chars_s = arg.partition(":")
    try:
        rate = float(rate_s)
    except ValueError:
        raise ValueError(f"throughput task: pass rate {rate_s!r} is not a number (throughput:0.3[:64])") from None
    if not 0.0 < rate < 1.0:
        raise ValueError(f"throughput task: pass rate {rate} must be strictly between 0 and 1")
    try:
        chars = int(chars_s) if chars_s else DEFAULT_PROMPT_CHARS
    except ValueError:
        raise ValueError(f"throughput task: prompt length {chars_s!r} is not an integer") from None
    if chars < 3:
        raise ValueError(f"throughput task: prompt length {chars} must be at least 3 characters")
    return rate, chars


def generate(seed: int, rate: float, chars: int = DEFAULT_PROMPT_CHARS,
             split: Literal["train", "eval"] = "train") -> Iterator[Task]:
    """Endless stream of one split's tasks, reproducible for a seed (the splits never share a prompt)."""
    rng = random.Random(f"{seed}:{split}")
    i = 0
    while True:
        # the first character tells the split: the two never share a prompt
        prompt = "12"[split == "eval"] + "".join(rng.choice(ALPHABET) for _ in range(chars - 2)) + "="
        p = rng.betavariate(2 * rate, 2 * (1 - rate))
        yield Task(prompt=prompt, reference=f"{p:.6f}", verifier=NAME, task_id=f"{split}:{seed}:{i}")
        i += 1


def score(completion: str, reference: str) -> VerifierResult:
    """Correct iff a hash of (reference, completion) falls under the prompt's pass rate (the reference)."""
    p = float(reference)  # a reference that is not a rate is a dataset bug: let it raise
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"throughput reference {reference!r} is not a pass rate in [0, 1]")
    ok = _unit(f"{reference}\x00{completion}") < p
    return VerifierResult(1.0 if ok else 0.0, ok, "under the rate" if ok else "over the rate")


SELF_TEST = [("anything", "1.000000", True), ("anything", "0.000000", False)]
