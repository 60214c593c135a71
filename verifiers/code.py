"""Python programs scored against input/output tests in `verifiers.sandbox`.

The reference is JSON: {"tests": [{"input": "...", "output": "..."}, ...]}. The program is the last
```python fenced block of the completion (else the whole completion). Each test runs in a fresh sandbox;
a test passes when the stripped standard output equals the stripped expected output.
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


def score(completion: str, reference: str, sandbox: Sandbox | None = None) -> VerifierResult:
    tests = json.loads(reference)["tests"]
    if not tests:
        raise ValueError("reference has no tests")
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
        elif r.stdout.strip() == str(t["output"]).strip():
            passed += 1
        else:
            reasons.append("wrong output")
    ok = passed == len(tests)
    reason = "all tests passed" if ok else f"{passed}/{len(tests)} passed; " + ", ".join(sorted(set(reasons)))
    return VerifierResult(passed / len(tests), ok, reason)
