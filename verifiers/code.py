"""Python programs scored against input/output tests in `verifiers.sandbox`.

The reference is JSON: {"tests": [{"input": "...", "output": "..."}, ...]} (brorl's), or the layouts of
APPS / TACO / verl's code data: {"inputs": [...], "outputs": [...]}, or a bare list of {"input", "output"}.
The program is the last ```python fenced block of the completion (else the whole completion). Each test runs
in a fresh sandbox; a test passes when the stripped standard output equals the stripped expected output.
A reference is refused when the data is loaded (`check_reference`) if it has no test, or a test whose
expected output is empty: a program that prints nothing would pass it.
reward = fraction of tests passed; correct = all passed.
"""

from __future__ import annotations

import json
import re

from verifiers.base import VerifierResult
from verifiers.sandbox import Limits, Sandbox

NAME = "code"
VERSION = "1"
LIMITS = Limits(cpu_s=5, wall_s=10.0, mem_mb=512)
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)

_DOUBLE = json.dumps({"tests": [{"input": "2\n", "output": "4"}, {"input": "5\n", "output": "10"}]})
SELF_TEST = [
    ("```python\nprint(int(input()) * 2)\n```", _DOUBLE, True),
    ("```python\nprint(int(input()) + 2)\n```", _DOUBLE, False),
]


def extract_program(completion: str) -> str:
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def tests_of(reference: str) -> list[dict]:
    """The reference's tests as [{"input": str, "output": str}]; ValueError if it has none or is malformed."""
    obj = json.loads(reference)
    if isinstance(obj, dict) and "tests" in obj:
        obj = obj["tests"]
    if isinstance(obj, dict) and "inputs" in obj and "outputs" in obj:
        if len(obj["inputs"]) != len(obj["outputs"]):
            raise ValueError(f"{len(obj['inputs'])} inputs but {len(obj['outputs'])} outputs")
        obj = [{"input": i, "output": o} for i, o in zip(obj["inputs"], obj["outputs"])]
    if not isinstance(obj, list) or not all(isinstance(t, dict) and "input" in t and "output" in t for t in obj):
        raise ValueError("expected {\"tests\": [{\"input\", \"output\"}, ...]} or {\"inputs\": [...], \"outputs\": [...]}")
    if not obj:
        raise ValueError("reference has no tests")
    return [{"input": _text(t["input"]), "output": _text(t["output"])} for t in obj]


def _text(v) -> str:
    return "\n".join(map(str, v)) if isinstance(v, list) else str(v)


def describe(reference: str) -> str:
    tests = tests_of(reference)
    return f"{len(tests)} stdin/stdout tests; the first: input {tests[0]['input'][:60]!r} -> {tests[0]['output'][:60]!r}"


def check_reference(reference: str) -> str:
    try:
        tests = tests_of(reference)
    except (ValueError, TypeError) as e:
        return f"not a code reference: {e}"
    silent = [i for i, t in enumerate(tests) if not t["output"].strip()]
    if silent:
        return f"test {silent[0]} expects no output: any program that prints nothing would pass it"
    return ""


def score(completion: str, reference: str, sandbox: Sandbox | None = None) -> VerifierResult:
    if why := check_reference(reference):  # a bad reference is a dataset bug: an error, never a silent pass
        raise ValueError(why)
    tests = tests_of(reference)
    program = extract_program(completion)
    if not program.strip():
        return VerifierResult(0.0, False, "no program")
    sb = sandbox or Sandbox(LIMITS)
    passed, reasons = 0, []
    for t in tests:
        r = sb.run(program, t["input"])
        if r.timed_out:
            reasons.append("timeout")
        elif r.returncode != 0:
            reasons.append(f"exit {r.returncode}")
        elif r.stdout.strip() == t["output"].strip():
            passed += 1
        else:
            reasons.append("wrong output")
    ok = passed == len(tests)
    reason = "all tests passed" if ok else f"{passed}/{len(tests)} passed; " + ", ".join(sorted(set(reasons)))
    return VerifierResult(passed / len(tests), ok, reason)
