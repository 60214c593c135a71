"""Science questions: multiple choice (GPQA, MMLU-style) and short answers (a number or a term).

Reference: a choice letter ("B", "(B)"), a short answer ("6.02e23", "mitochondria"), or JSON
{"answer": ..., "choices": [...], "tolerance": 0.01}; `choices` lets an answer name the option's text
instead of its letter; `tolerance` is the relative tolerance of a numeric answer (default 1 %).

Answer extraction from the completion (after the reasoning block, `data.reasoning_end`), first hit wins:
  1. the \\boxed{...} answer — several *different* boxed answers are hedging and score wrong;
  2. the text after the last "answer is" / "Answer:" (to the end of its line);
  3. multiple choice only: the last choice letter standing alone ("(C)", "C.", "C" at a line's end);
     short answer: the last non-empty line.
Comparison: a letter against the reference letter (or a choice's text against that choice's, normalised);
numbers (decimals, 1.2e-3, 1.2 \\times 10^{-3}) within the relative tolerance; other text after
normalisation (case, LaTeX text wrappers, surrounding punctuation). correct iff it matches; reward 1/0.
"""

from __future__ import annotations

import json
import math
import re

from verifiers.answers import boxed, hedged, normalize
from verifiers.base import VerifierResult

NAME = "science"
VERSION = "1"
LETTERS = "ABCDEFGHIJ"
_LETTER = re.compile(r"^\(?([A-J])\)?\.?$")
_SAYS = re.compile(r"(?:answer is|answer:)\s*:?\s*(.+)", re.IGNORECASE)
_LONE = re.compile(r"(?:^|[\s(\[])\(?([A-J])\)?[.)\]]?\s*$", re.MULTILINE)
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:\s*(?:e|E)\s*[-+]?\d+|\s*(?:\\times|×|\*|x)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?)?")

SELF_TEST = [
    ("The correct option is (C).", "C", True),
    ("Therefore the answer is \\boxed{B}", json.dumps({"answer": "C", "choices": ["x", "y", "z"]}), False),
    ("So the answer is $6.02 \\times 10^{23}$", "6.022e23", True),
    ("\\boxed{A} or maybe \\boxed{C}", "C", False),
    ("Answer: Mitochondria.", "mitochondria", True),
]


def _parse_ref(reference: str) -> tuple[str, list[str], float]:
    s = reference.strip()
    if s.startswith("{"):
        obj = json.loads(s)
        if not isinstance(obj, dict) or "answer" not in obj:
            raise ValueError("a JSON reference needs an 'answer' field")
        choices = [str(c) for c in obj.get("choices") or []]
        return str(obj["answer"]).strip(), choices, float(obj.get("tolerance", 0.01))
    return s, [], 0.01


def describe(reference: str) -> str:
    answer, choices, tol = _parse_ref(reference)
    if _letter(answer):
        return f"multiple choice, answer {_letter(answer)}" + (f" of {len(choices)} choices" if choices else "")
    if number(answer) is not None:
        return f"short answer {answer!r} (numbers within {tol:.0%})"
    return f"short answer {normalize(answer)!r} (normalised text)"


def check_reference(reference: str) -> str:
    try:
        answer, choices, tol = _parse_ref(reference)
    except (ValueError, TypeError) as e:
        return f"not a science reference ({e})"
    if not answer:
        return "empty answer"
    if _letter(answer) and choices and LETTERS.index(_letter(answer)) >= len(choices):
        return f"answer {answer} but only {len(choices)} choices"
    return "" if tol >= 0 else "negative tolerance"


def _letter(s: str) -> str:
    m = _LETTER.match(s.strip())
    return m.group(1) if m else ""


def number(s: str) -> float | None:
    """The first number in `s` (1.5, -2e3, 6.02 \\times 10^{23}), or None."""
    m = _NUM.search(s.replace(",", ""))
    if not m:
        return None
    text = m.group(0)
    if m.group(1) is not None:  # mantissa × 10^exp
        mant = re.match(r"[-+]?(?:\d+\.?\d*|\.\d+)", text).group(0)
        return float(mant) * 10.0 ** int(m.group(1))
    return float(re.sub(r"\s+", "", text))


def extract(completion: str, multiple_choice: bool) -> str:
    boxes = boxed(completion)
    if boxes:
        return boxes[-1]
    says = _SAYS.findall(completion)
    if says:
        return says[-1].strip().splitlines()[0] if says[-1].strip() else ""
    if multiple_choice:
        lone = _LONE.findall(completion)
        return lone[-1] if lone else ""
    lines = [ln.strip() for ln in completion.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def score(completion: str, reference: str) -> VerifierResult:
    answer, choices, tol = _parse_ref(reference)
    ref_letter = _letter(answer)
    if hedged(completion):
        return VerifierResult(0.0, False, "several different boxed answers")
    got = extract(completion, bool(ref_letter))
    if not got:
        return VerifierResult(0.0, False, "no answer")
    if ref_letter:
        letter = _letter(got) or _letter(got.split()[0].rstrip(":") if got.split() else "")
        if not letter and choices:  # the option's text instead of its letter
            by_text = {normalize(c): LETTERS[i] for i, c in enumerate(choices)}
            letter = by_text.get(normalize(got), "")
        ok = letter == ref_letter
    else:
        want, have = number(answer), number(got)
        if want is not None and have is not None and re.fullmatch(r"[-+0-9.eE\s\\times×x^{}*]+", answer):
            ok = math.isclose(have, want, rel_tol=tol, abs_tol=1e-12)
        else:
            ok = normalize(got) == normalize(answer)
    return VerifierResult(1.0 if ok else 0.0, ok, "match" if ok else "mismatch")
