"""The program the code sandbox runs for call-based tests: it runs the candidate's code and calls its function.

It reads one JSON object from stdin — {"nonce", "code", "calls": [{"fn", "args", "kwargs"}], "per_call_s"} —
and writes one line per call, `<nonce> <index> <json>`, to the stdout it had at start: {"ok": value} (the
return value in a tagged encoding: tuples, sets and dicts with any keys survive), {"error": "..."} or
{"timeout": true}. It never sees an expected value and decides nothing: the scoring process compares the
values it reports. Anything the candidate prints goes to /dev/null; its stdin is empty.
Runs inside the sandbox as `python3 -I main.py`; standard library only.
"""

import io
import json
import os
import signal
import sys

# what LiveCodeBench's and verl's harnesses import for a solution (LeetCode code uses List, deque unimported);
# math's pow is dropped again so that the built-in three-argument pow stays
PRELUDE = ("from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
           "from itertools import *\nfrom functools import *\nfrom math import *\ndel pow\nimport collections, "
           "heapq, bisect, itertools, functools, math, string, re, sys, json, random, operator, copy\n")


class CallTimeout(BaseException):
    pass


def encode(x, depth=0):
    """A value as JSON-able data that keeps its Python type (an opaque marker for anything else)."""
    if depth > 100:
        return {"$o": "too deep"}
    t = type(x)
    if t is int and x.bit_length() > 10000:  # past the decimal digits json may print: hex (linear either way)
        return {"$i": hex(x)}
    if x is None or t in (bool, int, float, str):
        return x
    if t is list:
        return [encode(v, depth + 1) for v in x]
    if t is tuple:
        return {"$t": [encode(v, depth + 1) for v in x]}
    if t in (set, frozenset):
        return {"$s": [encode(v, depth + 1) for v in x]}
    if t is dict:
        return {"$d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    for base in (bool, int, float, str):  # numpy scalars, IntEnum, str subclasses: their plain value
        if isinstance(x, base) or (base is not str and hasattr(x, "item") and isinstance(x.item(), base)):
            return encode(base(x.item() if hasattr(x, "item") else x), depth + 1)
    if hasattr(x, "tolist"):  # numpy arrays
        return encode(x.tolist(), depth + 1)
    return {"$o": type(x).__name__}


def decode(v):
    """The scoring process's tagged encoding of arguments (tuples, sets, dicts) back to values."""
    if type(v) is list:
        return [decode(x) for x in v]
    if type(v) is dict:
        (tag, body), = v.items()
        if tag == "$t":
            return tuple(decode(x) for x in body)
        if tag == "$s":
            return set(decode(x) for x in body)
        return {decode(k): decode(x) for k, x in body}
    return v


def main():
    payload = json.loads(sys.stdin.read())
    nonce = payload["nonce"]
    out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    sys.stdout, sys.stdin = os.fdopen(null, "w"), io.StringIO("")

    def report(index, value):
        out.write(f"{nonce} {index} {json.dumps(value)}\n")
        out.flush()

    def on_alarm(signum, frame):
        raise CallTimeout()

    sys.setrecursionlimit(100000)
    ns = {"__name__": "solution"}
    try:
        exec(PRELUDE, ns)
        exec(compile(payload["code"], "solution.py", "exec"), ns)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: nothing of it counts as a result
        report("load", {"error": f"{type(e).__name__}: {e}"[:300]})
        return
    signal.signal(signal.SIGALRM, on_alarm)
    for i, call in enumerate(payload["calls"]):
        fn = call["fn"]
        try:
            signal.setitimer(signal.ITIMER_REAL, payload["per_call_s"])
            try:
                cls = ns.get("Solution")
                if isinstance(cls, type) and hasattr(cls, fn):
                    target = getattr(cls(), fn)  # a fresh instance per test, as LeetCode's judge
                elif callable(ns.get(fn)):
                    target = ns[fn]
                else:
                    report(i, {"error": f"no function named {fn}"})
                    continue
                value = target(*decode(call["args"]), **decode(call["kwargs"]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            report(i, {"ok": encode(value)})
        except CallTimeout:
            report(i, {"timeout": True})
            return
        except BaseException as e:
            try:
                report(i, {"error": f"{type(e).__name__}: {e}"[:300]})
            except BaseException:
                report(i, {"error": "unprintable exception"})


if __name__ == "__main__":  # as main.py in the sandbox; importing it runs nothing
    main()
