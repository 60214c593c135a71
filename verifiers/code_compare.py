"""The code verifier's answer extraction, output comparison and tests (no sandbox here): what a program is,
when its output or a returned value counts as the expected one, and the rule every reference's tests obey.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

REL_TOL, ABS_TOL = 1e-5, 1e-8
"""Float tolerance, numpy.allclose's defaults as verl's prime_code and TACO use them:
|got - expected| <= ABS_TOL + REL_TOL * |expected|."""

PYTHON_TAGS = {"python", "python3", "py", "py3"}


# --- answer extraction -----------------------------------------------------------------------------------

_BLOCK = re.compile(r"```[ \t]*([A-Za-z0-9_+.#-]*)[^\n`]*\n(.*?)```", re.DOTALL)
_OPEN = re.compile(r"```[ \t]*([A-Za-z0-9_+.#-]*)[^\n`]*\n(.*)\Z", re.DOTALL)


def extract_program(completion: str) -> str:
    """The last ```python block (any spelling: python, python3, Python, py), else the last block without a
    language tag, else an unclosed python block at the end, else — with no fence at all — the whole text.
    Only blocks of another language: no program ("")."""
    python, plain, end = [], [], 0
    for m in _BLOCK.finditer(completion):
        tag = m.group(1).lower()
        (python if tag in PYTHON_TAGS else plain if not tag else []).append(m.group(2))
        end = m.end()
    tail = _OPEN.search(completion, end)
    if tail and tail.group(1).lower() in PYTHON_TAGS:
        return tail.group(2)
    if python or plain:
        return (python or plain)[-1]
    return "" if "```" in completion else completion


# --- output comparison -----------------------------------------------------------------------------------

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")


def _lines(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def close(got: float, expected: float, rel: float = REL_TOL, ab: float = ABS_TOL) -> bool:
    if math.isnan(expected) or math.isinf(expected):
        return got == expected or (math.isnan(got) and math.isnan(expected))
    return abs(got - expected) <= ab + rel * abs(expected)


def _token_match(got: str, expected: str) -> bool:
    if got == expected:
        return True
    if _INTEGER.fullmatch(expected) or not (_NUMBER.fullmatch(expected) and _NUMBER.fullmatch(got)):
        return False
    return close(float(got), float(expected))


def outputs_match(got: str, expected: str) -> bool:
    """Standard output against the expected output: line endings (CRLF), whitespace at the ends of lines and
    leading/trailing blank lines ignored; lines that differ are compared token by token (whitespace-split),
    an expected token that is a decimal number (not an integer) within the float tolerance."""
    a, b = _lines(got), _lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.strip() == y.strip():
            continue
        tx, ty = x.split(), y.split()
        if len(tx) != len(ty) or not all(_token_match(p, q) for p, q in zip(tx, ty)):
            return False
    return True


# --- call results ----------------------------------------------------------------------------------------


class Opaque:
    """A returned value of no plain type: equal to nothing."""

    def __init__(self, what: str):
        self.what = what

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self.what}>"


def tagged(v: Any) -> Any:
    """Arguments in the harness's encoding: lists and plain values as JSON, tuples, sets and dicts tagged."""
    if isinstance(v, list):
        return [tagged(x) for x in v]
    if isinstance(v, tuple):
        return {"$t": [tagged(x) for x in v]}
    if isinstance(v, (set, frozenset)):
        return {"$s": [tagged(x) for x in v]}
    if isinstance(v, dict):
        return {"$d": [[tagged(k), tagged(x)] for k, x in v.items()]}
    return v


def decode(v: Any) -> Any:
    """The harness's tagged encoding back to plain Python values; anything malformed is Opaque."""
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) is list:
        return [decode(x) for x in v]
    if type(v) is dict and len(v) == 1:
        (tag, body), = v.items()
        try:
            if tag == "$t" and type(body) is list:
                return tuple(decode(x) for x in body)
            if tag == "$s" and type(body) is list:
                return set(decode(x) for x in body)
            if tag == "$d" and type(body) is list:
                return {decode(k): decode(x) for k, x in body}
        except (TypeError, ValueError):
            return Opaque("unhashable")
        if tag == "$i" and type(body) is str:
            try:
                return int(body, 16)  # a big integer (no digit limit for base 16)
            except ValueError:
                return Opaque("malformed")
        if tag == "$o":
            return Opaque(str(body)[:60])
    return Opaque("malformed")


def jsonish(v: Any) -> Any:
    """A value as it would be after a JSON round trip (tuples are lists, dict keys strings) — the shape of
    the expected values of JSON test data."""
    if isinstance(v, (list, tuple)):
        return [jsonish(x) for x in v]
    if isinstance(v, dict):
        return {k if isinstance(k, str) else json.dumps(k): jsonish(x) for k, x in v.items()}
    return v


def equal(got: Any, expected: Any, tol: tuple[float, float] = (REL_TOL, ABS_TOL)) -> bool:
    """Python equality on plain values, floats within the (relative, absolute) tolerance; an Opaque value
    equals nothing."""
    if isinstance(got, Opaque) or isinstance(expected, Opaque):
        return False
    if type(expected) is float and type(got) in (int, float):
        return close(float(got), expected, *tol)
    if isinstance(expected, (list, tuple)):
        return (type(got) is type(expected) and len(got) == len(expected)
                and all(equal(g, e, tol) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (type(got) is dict and got.keys() == expected.keys()
                and all(equal(got[k], expected[k], tol) for k in got))
    return type(got) in (bool, int, float, str, type(None), set, frozenset) and got == expected


# --- the reference's tests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StdioTest:
    input: str
    output: str


@dataclass(frozen=True)
class CallTest:
    fn: str
    args: list
    kwargs: dict = field(default_factory=dict)
    expected: Any = None
    check: str = "equal"
    """equal | apps (equal, or equal to the single value of a wrapped output list, on JSON shapes) | truthy |
    falsy | is (identity with True / False / None) | close (within tol)"""
    post: tuple[str, ...] = ()
    """Built-ins the test applied to the returned value before comparing (sorted, set, len, ...), innermost
    first."""
    tol: tuple[float, float] = (REL_TOL, ABS_TOL)
    """(relative, absolute) tolerance: for floats in `equal` / `apps`, and for `close`."""

    def passes(self, got: Any) -> bool:
        try:
            return self._passes(got)
        except Exception:  # a returned value the check cannot handle (sorted([1, "a"]), abs of a list)
            return False

    def _passes(self, got: Any) -> bool:
        for p in self.post:
            got = _POST[p](got)
        if isinstance(got, Opaque):
            return False
        if self.check == "apps":
            g, e = jsonish(got), jsonish(self.expected)
            return equal(g, e, self.tol) or (isinstance(e, list) and len(e) == 1 and equal(g, e[0], self.tol))
        if self.check == "truthy":
            return bool(got)
        if self.check == "falsy":
            return not got
        if self.check == "is":
            return got is self.expected
        if self.check == "close":
            rel, ab = self.tol
            return (type(got) in (int, float) and not isinstance(got, bool)
                    and abs(got - self.expected) <= max(ab, rel * max(abs(got), abs(self.expected))))
        return equal(got, self.expected, self.tol)


_POST = {"sorted": sorted, "set": set, "len": len, "list": list, "tuple": tuple, "abs": abs,
         "frozenset": frozenset, "str": str, "int": int, "float": float, "bool": bool}


@dataclass(frozen=True)
class Spec:
    kind: str
    """"stdio" or "call"."""
    tests: tuple
    origin: str
    """The format, in words."""


def checked(spec: Spec) -> Spec:
    if spec.kind == "stdio":
        silent = [i for i, t in enumerate(spec.tests) if not t.output.strip()]
        if silent:
            raise ValueError(f"test {silent[0]} expects no output: any program that prints nothing would pass it")
    else:
        def idle(t: CallTest) -> bool:  # what a function that returns None passes
            nothing = t.check in ("equal", "apps", "is") and t.expected in (None, [None])
            return not t.post and (t.check == "falsy" or nothing)

        if all(idle(t) for t in spec.tests):
            raise ValueError("every test expects None: a function that does nothing would pass them")
        for k, t in enumerate(spec.tests):
            if not all(_carriable(v) for v in (t.args, t.kwargs, t.expected)):
                raise ValueError(f"test {k} holds a value other than numbers, strings, None, lists, tuples, "
                                 f"sets and dicts (bytes, complex): its call cannot be sent or its result compared")
    return spec


def _carriable(v: Any, depth: int = 0) -> bool:
    if depth > 100:
        return False
    if v is None or type(v) in (bool, int, float, str):
        return True
    if type(v) in (list, tuple, set, frozenset):
        return all(_carriable(x, depth + 1) for x in v)
    if type(v) is dict:
        return all(_carriable(k, depth + 1) and _carriable(x, depth + 1) for k, x in v.items())
    return False
