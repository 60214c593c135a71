"""Math answers, checked with `math-verify`: the final answer is extracted (the last \\boxed{...}, else
the last LaTeX or plain expression) and compared with the reference symbolically — fractions,
decimals, radicals, LaTeX, intervals, unordered sets. Parsing and comparison each have a time limit
(math-verify's own, signal-based: it works on a process's main thread only, where every brorl scoring path
runs it, in worker processes). On any other thread the limit is off rather than failing (math-verify's
signal call would raise there and the answer would read wrong); the caller must bound the time.

References: bare LaTeX or plain text (`\\frac{1}{2}`, `0.5`), read whole even across line breaks (a
`pmatrix`, `x = 1,\\ny = 3`); or a JSON list of accepted answers (`["0.5", "1/2"]`): any match is correct.

Several boxes: a completion that boxes several *different* answers (`verifiers.answers.boxed`) is read as
one answer made of them, in order (`\\boxed{1}, \\boxed{2}, \\boxed{3}` is `1, 2, 3`), when the reference
itself has several parts (a set, a list, a tuple or pair, several equations). Against a single-valued
reference several different boxes are hedging and score wrong, whichever box is right.
"""

from __future__ import annotations

import json
import re
import threading

from verifiers.answers import boxed, normalize
from verifiers.base import VerifierResult

NAME = "math"
VERSION = "2"
TIME_LIMIT_S = 5

# (completion, reference, expected correct) — run by the registry before this verifier is accepted.
SELF_TEST = [
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", True),
    ("$2\\sqrt{2}$", "\\sqrt{8}", True),
    ("\\boxed{3}", "4", False),
    ("\\boxed{3} or \\boxed{4}", "4", False),
    ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "\\{1,2,3\\}", True),
    ("\\boxed{\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}}", "\\begin{pmatrix}\n1 & 2 \\\\\n3 & 4\n\\end{pmatrix}", True),
    ("\\boxed{4}", "\\begin{pmatrix}\n1 & 2 \\\\\n3 & 4\n\\end{pmatrix}", False),
    ("\\boxed{\\frac{1}{2}}", '["0.5", "1/2"]', True),
]


def alternatives(reference: str) -> list[str]:
    """The accepted answers: a JSON list of strings gives each of them, anything else is one answer."""
    s = reference.strip()
    if s.startswith("["):
        try:
            obj = json.loads(s)
        except ValueError:  # LaTeX such as `[0, 1)`
            return [reference]
        if isinstance(obj, list) and all(isinstance(a, str) for a in obj):
            return obj
    return [reference]


def check_reference(reference: str) -> str:
    """An empty reference, list of accepted answers, or accepted answer (`""`, `\\boxed{}`) is refused at load."""
    alts = alternatives(reference)
    if not alts:
        return "an empty list of accepted answers"
    empty = [i for i, a in enumerate(alts) if not re.sub(r"\\(?:boxed|fbox)\s*\{\s*\}", "", a).strip("$ \n")]
    if empty:
        return "an empty reference" if alts == [reference] else \
            f"accepted answer(s) {empty} of {reference[:80]!r} are empty: remove them or fix the data"
    return ""


def score(completion: str, reference: str) -> VerifierResult:
    from math_verify import parse, verify

    limit = TIME_LIMIT_S if threading.current_thread() is threading.main_thread() else None
    golds = []
    for ref in alternatives(reference):
        gold = parse(_dollars(ref), parsing_timeout=limit)
        if not gold:
            raise ValueError(f"reference {ref!r} does not parse as a math answer")
        golds.append(gold)
    pred = parse(_bare_latex(completion), parsing_timeout=limit)
    boxes = boxed(completion)
    if len(distinct := _distinct(boxes)) > 1 and (not pred or _from_boxes(pred[1], boxes, distinct)):
        several = [g for g in golds if _several_parts(g[0])]
        if not several:
            return VerifierResult(0.0, False, "several different boxed answers")
        golds = several
        pred = parse("\\boxed{" + ", ".join(distinct) + "}", parsing_timeout=limit)
    if not pred:
        return VerifierResult(0.0, False, "no answer")
    ok = any(verify(gold, pred, timeout_seconds=limit) for gold in golds)
    return VerifierResult(1.0 if ok else 0.0, ok, "match" if ok else "mismatch")


def _from_boxes(read: str, boxes: list[str], distinct: list[str]) -> bool:
    """Is the answer math-verify read one of the boxes, or all of them joined (not a final answer stated
    outside them)?"""
    def key(s: str) -> str:
        return re.sub(r"\s+", "", normalize(s))

    return key(read) in {key(b) for b in boxes} | {key(",".join(boxes)), key(",".join(distinct))}


def _bare_latex(completion: str) -> str:
    """A completion that is only a LaTeX expression, without `$` or a box (`\\frac{\\sqrt{5}}{7}`,
    `x^2 + 4x`), is read whole, as a reference is; anything with words or delimiters is left to math-verify."""
    s = completion.strip()
    if (re.search(r"[\\^_{]", s) and not re.search(r"\$|\\[(\[]|\\boxed|\\fbox", s)
            and not re.search(r"[A-Za-z]{3,}", re.sub(r"\\(?:begin|end)\{\w+\*?\}|\\[A-Za-z]+", " ", s))):
        return _dollars(s)
    return completion


def _distinct(boxes: list[str]) -> list[str]:
    """The boxed answers in order, repeats (after `normalize`) dropped."""
    seen, out = set(), []
    for b in boxes:
        if (k := normalize(b)) not in seen:
            seen.add(k)
            out.append(b)
    return out


def _several_parts(gold) -> bool:
    """Does the parsed reference have several parts (a set or list of 2+, a pair or tuple)?"""
    import sympy

    if isinstance(gold, sympy.FiniteSet):
        return len(gold) > 1
    return isinstance(gold, (sympy.Interval, sympy.Tuple))


def _dollars(ref: str) -> str:
    """References are bare LaTeX (`\\frac{1}{2}`); math-verify extracts LaTeX inside $...$, on one line: a
    line break in a reference is a space in LaTeX."""
    s = " ".join(ref.split("\n")).strip()
    return s if s.startswith("$") or "\\boxed" in s else f"${s}$"
