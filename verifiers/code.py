"""Python programs scored against tests in `verifiers.sandbox`.

The reference is one of the formats `verifiers.code_formats.parse` reads — stdin/stdout tests, call-based
tests (APPS / TACO / verl `fn_name`, LiveCodeBench functional, PrimeIntellect function_call, LeetCode's
`class Solution`), or test code whose asserts are call-and-compare (HumanEval check(candidate), MBPP,
KodCode's pytest functions) — or it is refused when the data is loaded (`check_reference`) with the reason.
The program is the last python fenced block of the completion (`code_formats.extract_program`).

stdin/stdout: each test runs in a fresh sandbox; its output is compared by `code_formats.outputs_match`.
Call-based: one sandbox run of `verifiers/call_harness.py` executes the program and calls its function
with each test's arguments, reporting the returned values on lines tagged with a random nonce; the scoring
process (never the sandbox) compares them with the expected values, which never enter the sandbox. A
program can therefore only report values it computed: a printed "passed", an early exit, SystemExit, a
patched builtin or comparison, an object whose __eq__ says yes, or forged result lines all score 0 (a
test left without exactly one result fails; two results for one test fail every test).
reward = fraction of tests passed; correct = all passed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import replace

from verifiers.base import VerifierResult
from verifiers.code_compare import Spec, decode, extract_program, outputs_match, tagged
from verifiers.code_formats import parse
from verifiers.sandbox import Limits, Sandbox

NAME = "code"
VERSION = "2"
LIMITS = Limits(cpu_s=5, wall_s=10.0, mem_mb=512)
CALL_S = 5.0
"""Wall-clock seconds one call of a call-based test may take (the run's CPU limit grows with the tests)."""
HARNESS = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "call_harness.py")).read()

_DOUBLE = json.dumps({"tests": [{"input": "2\n", "output": "4"}, {"input": "5\n", "output": "10"}]})
_CALL = json.dumps({"fn_name": "double", "inputs": [[2], [5]], "outputs": [[4], [10]]})
SELF_TEST = [
    ("```python\nprint(int(input()) * 2)\n```", _DOUBLE, True),
    ("```python\nprint(int(input()) + 2)\n```", _DOUBLE, False),
    ("```python\ndef double(x):\n    return 2 * x\n```", _CALL, True),
    ("```python\ndef double(x):\n    print(2 * x)\n```", _CALL, False),
]


def tests_of(reference: str) -> list[dict]:
    """A stdin/stdout reference's tests as [{"input": str, "output": str}]; ValueError otherwise."""
    spec = parse(reference)
    if spec.kind != "stdio":
        raise ValueError(f"not stdin/stdout tests but {spec.origin}")
    return [{"input": t.input, "output": t.output} for t in spec.tests]


def describe(reference: str) -> str:
    spec = parse(reference)
    t = spec.tests[0]
    if spec.kind == "stdio":
        return f"{len(spec.tests)} {spec.origin}; the first: input {t.input[:60]!r} -> {t.output[:60]!r}"
    args = ", ".join([repr(a) for a in t.args] + [f"{k}={v!r}" for k, v in t.kwargs.items()])
    return f"{len(spec.tests)} {spec.origin}; the first: {t.fn}({args[:60]}) {t.check} {t.expected!r:.60}"


def check_reference(reference: str) -> str:
    try:
        parse(reference)
    except (ValueError, TypeError) as e:
        return str(e) or type(e).__name__
    return ""


def score(completion: str, reference: str, sandbox: Sandbox | None = None) -> VerifierResult:
    try:
        spec = parse(reference)
    except (ValueError, TypeError) as e:  # a bad reference is a dataset bug: an error, never a silent pass
        raise ValueError(f"not a code reference: {e}") from None
    program = extract_program(completion)
    if not program.strip():
        return VerifierResult(0.0, False, "no program")
    sb = sandbox or Sandbox(LIMITS)
    outcomes = _run_stdio(sb, program, spec) if spec.kind == "stdio" else _run_calls(sb, program, spec)
    passed = sum(o == "" for o in outcomes)
    n = len(outcomes)
    ok = passed == n
    reason = "all tests passed" if ok else f"{passed}/{n} passed; " + ", ".join(sorted({o for o in outcomes if o}))
    return VerifierResult(passed / n, ok, reason)


def _run_stdio(sb: Sandbox, program: str, spec: Spec) -> list[str]:
    out = []
    for t in spec.tests:
        r = sb.run(program, t.input)
        if r.timed_out:
            out.append("timeout")
        elif r.returncode != 0:
            out.append(f"exit {r.returncode}")
        else:
            out.append("" if outputs_match(r.stdout, t.output) else "wrong output")
    return out


def call_limits(base: Limits, n: int) -> Limits:
    """One run for n calls: CPU seconds grow with the tests (to 30), the wall clock with the CPU."""
    cpu = min(max(base.cpu_s, n), 30)
    return replace(base, cpu_s=cpu, wall_s=max(base.wall_s, 2.0 * cpu + 5))


def _run_calls(sb: Sandbox, program: str, spec: Spec) -> list[str]:
    """Every test's outcome ("" = passed) from one harness run; the verdicts are reached here."""
    nonce = secrets.token_hex(16)
    calls = [{"fn": t.fn, "args": tagged(t.args), "kwargs": tagged(t.kwargs)} for t in spec.tests]
    payload = json.dumps({"nonce": nonce, "code": program, "calls": calls, "per_call_s": CALL_S})
    r = sb.run(HARNESS, payload, limits=call_limits(sb.limits, len(calls)))
    results: dict[int, dict] = {}
    load_error, forged = "", False
    for line in r.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag != nonce:
            continue
        index, _, body = rest.partition(" ")
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):  # malformed, nested too deep, an integer of too many digits
            value = {"error": "an unreadable result"}
        if index == "load":
            load_error = str(value.get("error", "")) if isinstance(value, dict) else "load"
            continue
        if not re.fullmatch(r"[0-9]{1,9}", index) or int(index) in results or int(index) >= len(calls):
            forged = True
            continue
        results[int(index)] = value if isinstance(value, dict) else {"error": "a malformed result"}
    if forged:
        return ["results the harness did not write"] * len(calls)
    if load_error:
        return [f"the program failed to load ({load_error.split(':')[0]})"] * len(calls)
    out = []
    timed_out = r.timed_out or any(v.get("timeout") is True for v in results.values())  # the harness stops there
    for i, t in enumerate(spec.tests):
        res = results.get(i)
        if res is None:
            out.append("timeout" if timed_out else f"exit {r.returncode}" if r.returncode else "no result")
        elif "ok" in res:
            out.append(_verdict(t, res["ok"]))
        elif res.get("timeout") is True:
            out.append("timeout")
        else:
            out.append(f"error {str(res.get('error', '?')).split(':')[0][:40]}")
    return out


def _verdict(test, raw) -> str:
    try:
        got = decode(raw)
    except RecursionError:
        return "a result nested too deep"
    return "" if test.passes(got) else "wrong answer"
