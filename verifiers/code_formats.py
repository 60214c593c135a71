"""The code verifier's reference formats (no sandbox here).

`parse(reference)` reads every layout below into a `Spec` of stdin/stdout tests or call tests, or raises
ValueError saying why the reference cannot be scored (the row is then refused when the data is loaded):

  stdin/stdout    {"tests": [{"input", "output"}]}, a bare list of them, {"inputs": [...], "outputs": [...]}
                  (APPS, TACO, verl), LiveCodeBench's {"testtype": "stdin"}, PrimeIntellect's
                  {"type": "stdin_stdout"}; `input_output` / `verification_info` / `test_cases` wrappers
  call-based      the same with `fn_name` (APPS / TACO / verl prime_code: argument lists or newline-separated
                  JSON arguments, outputs wrapped in a list or not), LiveCodeBench's {"testtype": "functional"}
                  with metadata.func_name, PrimeIntellect's {"type": "function_call", "fn_name"}
  test code       {"functional": code} (LeetCode: check(candidate) + check(Solution().m)), {"test": code,
                  "entry_point"} (HumanEval; evalplus's inputs/results loop), {"test_list": [...]} (MBPP), pytest-style code
                  (KodCode: from solution import f; def test_...) or a bare string of such code

Test code is never run (`verifiers.code_asserts`): its call-and-compare asserts become call tests.
"""

from __future__ import annotations

import json
import re
from typing import Any

from verifiers.code_asserts import test_code
from verifiers.code_compare import PYTHON_TAGS, CallTest, Spec, StdioTest, checked


USAGE = ('expected {"tests": [{"input", "output"}]}, {"inputs": [...], "outputs": [...]} (with "fn_name" for '
         'call-based tests), LiveCodeBench / PrimeIntellect test lists, {"functional": code}, {"test": code, '
         '"entry_point"}, {"test_list": [...]} or pytest-style test code')


def parse(reference: str) -> Spec:
    """The reference's tests; ValueError saying why when it cannot be scored."""
    try:
        obj = json.loads(reference)
    except (json.JSONDecodeError, TypeError):
        if isinstance(reference, str) and _looks_like_test_code(reference):
            return test_code(reference, origin="test code")
        raise ValueError(f"not JSON and not test code; {USAGE}") from None
    return _parse_obj(obj)


def _looks_like_test_code(text: str) -> bool:
    return bool(re.search(r"^\s*(assert\b|assertion\(|def (test_?\w*|check)\s*\()", text, re.MULTILINE))


def _parse_obj(obj: Any, fn: str | None = None) -> Spec:
    if isinstance(obj, str):
        try:
            return _parse_obj(json.loads(obj), fn)
        except json.JSONDecodeError:
            if _looks_like_test_code(obj):
                return test_code(obj, origin="test code")
            raise ValueError(f"a string that is neither JSON tests nor test code; {USAGE}") from None
    if isinstance(obj, list):
        return _test_list(obj, fn)
    if not isinstance(obj, dict):
        raise ValueError(USAGE)
    lang = obj.get("language")
    if isinstance(lang, str) and lang.lower() not in PYTHON_TAGS:
        raise ValueError(f"tests for {lang!r}: the code verifier runs Python programs only")
    fn = _fn_name(obj) or fn
    for wrapper in ("input_output", "verification_info"):
        if wrapper in obj:
            return _parse_obj(obj[wrapper], fn)
    if "functional" in obj:
        return test_code(_str(obj["functional"], "functional"), origin="LeetCode-style test code")
    if "test_list" in obj:
        setup = obj.get("test_setup_code") or ""
        if str(setup).strip():
            raise ValueError("test_setup_code is not supported: its asserts could not be scored outside the program")
        asserts = obj["test_list"]
        if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
            raise ValueError("test_list: expected a list of assert statements")
        return test_code("\n".join(asserts), origin="MBPP asserts")
    if "inputs" in obj and "outputs" in obj:
        return _inputs_outputs(obj, fn)
    for key in ("tests", "test_cases"):
        if key in obj:
            return _parse_obj(obj[key], fn)
    if isinstance(obj.get("test"), str):
        return test_code(obj["test"], entry_point=obj.get("entry_point"), origin="test code")
    raise ValueError(USAGE)


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what}: expected test code as a string")
    return v


def _fn_name(d: dict) -> str | None:
    meta = d.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            meta = None
    name = d.get("fn_name") or d.get("func_name") or (meta.get("func_name") if isinstance(meta, dict) else None)
    return str(name) if name else None


def _inputs_outputs(obj: dict, fn: str | None) -> Spec:
    ins, outs = obj["inputs"], obj["outputs"]
    if not isinstance(ins, list) or not isinstance(outs, list):
        raise ValueError("inputs and outputs must be lists")
    if len(ins) != len(outs):
        raise ValueError(f"{len(ins)} inputs but {len(outs)} outputs")
    if not ins:
        raise ValueError("reference has no tests")
    if fn:
        tests = tuple(CallTest(fn, _call_args(i, k), {}, _json_value(o, k), "apps")
                      for k, (i, o) in enumerate(zip(ins, outs)))
        return checked(Spec("call", tests, f"call-based tests of {fn} (APPS/TACO/verl)"))
    return checked(Spec("stdio", tuple(StdioTest(_text(i), _text(o)) for i, o in zip(ins, outs)),
                         "stdin/stdout tests"))


def _test_list(items: list, fn: str | None) -> Spec:
    if not items:
        raise ValueError("reference has no tests")
    if all(isinstance(t, str) for t in items):  # MBPP's test_list column on its own
        return test_code("\n".join(items), origin="asserts")
    stdio, calls = [], []
    for k, t in enumerate(items):
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise ValueError(f"test {k}: expected an object with input and output; {USAGE}")
        kind = str(t.get("testtype") or t.get("type") or "").lower()
        name = _fn_name(t) or fn
        if kind in ("functional", "function_call") or (not kind and name):
            if not name:
                raise ValueError(f"test {k} is functional but names no function (fn_name or metadata.func_name)")
            check = "equal" if kind == "functional" else "apps"  # LiveCodeBench: exact; PrimeIntellect: TACO's rule
            calls.append(CallTest(name, _call_args(t["input"], k), {}, _json_value(t["output"], k), check))
        elif kind in ("", "stdin", "stdin_stdout", "stdio"):
            stdio.append(StdioTest(_text(t["input"]), _text(t["output"])))
        else:
            raise ValueError(f"test {k}: unknown test type {kind!r} (stdin, functional, stdin_stdout, function_call)")
    if stdio and calls:
        raise ValueError("the reference mixes stdin/stdout and functional tests")
    if calls:
        return checked(Spec("call", tuple(calls), f"call-based tests of {calls[0].fn}"))
    return checked(Spec("stdio", tuple(stdio), "stdin/stdout tests"))


def _call_args(v: Any, k: int) -> list:
    """A call's arguments: a list of them (APPS / TACO) or newline-separated JSON values (LiveCodeBench,
    verl prime_code)."""
    if isinstance(v, list):
        return v
    if isinstance(v, str):
        try:
            return [json.loads(line) for line in v.split("\n") if line.strip()]
        except json.JSONDecodeError as e:
            raise ValueError(f"test {k}: the input is not newline-separated JSON arguments ({e})") from None
    raise ValueError(f"test {k}: the input is not an argument list")


def _json_value(v: Any, k: int) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            raise ValueError(f"test {k}: the expected return value {v[:40]!r} is not JSON") from None
    return v


def _text(v: Any) -> str:
    return "\n".join(map(str, v)) if isinstance(v, list) else str(v)
