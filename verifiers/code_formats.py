"""The code verifier's reference formats, its answer extraction and its output comparison (no sandbox here).

`parse(reference)` reads every layout below into a `Spec` of stdin/stdout tests or call tests, or raises
ValueError saying why the reference cannot be scored (the row is then refused when the data is loaded):

  stdin/stdout    {"tests": [{"input", "output"}]}, a bare list of them, {"inputs": [...], "outputs": [...]}
                  (APPS, TACO, verl), LiveCodeBench's {"testtype": "stdin"}, PrimeIntellect's
                  {"type": "stdin_stdout"}; `input_output` / `verification_info` / `test_cases` wrappers
  call-based      the same with `fn_name` (APPS / TACO / verl prime_code: argument lists or newline-separated
                  JSON arguments, outputs wrapped in a list or not), LiveCodeBench's {"testtype": "functional"}
                  with metadata.func_name, PrimeIntellect's {"type": "function_call", "fn_name"}
  test code       {"functional": code} (LeetCode: check(candidate) + check(Solution().m)), {"test": code,
                  "entry_point"} (HumanEval / evalplus base), {"test_list": [...]} (MBPP), pytest-style code
                  (KodCode: from solution import f; def test_...) or a bare string of such code

Test code is never run: each of its asserts must have a form whose verdict the scoring process can reach on
its own — a call of the solution's function with literal arguments compared with a literal — and is turned
into a call test; a statement of any other form refuses the reference, naming it.
"""

from __future__ import annotations

import ast
import copy
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


def close(got: float, expected: float) -> bool:
    if math.isnan(expected) or math.isinf(expected):
        return got == expected or (math.isnan(got) and math.isnan(expected))
    return abs(got - expected) <= ABS_TOL + REL_TOL * abs(expected)


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


def equal(got: Any, expected: Any) -> bool:
    """Python equality on plain values, floats within the tolerance; an Opaque value equals nothing."""
    if isinstance(got, Opaque) or isinstance(expected, Opaque):
        return False
    if type(expected) is float and type(got) in (int, float):
        return close(float(got), expected)
    if isinstance(expected, (list, tuple)):
        return (type(got) is type(expected) and len(got) == len(expected)
                and all(equal(g, e) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return type(got) is dict and got.keys() == expected.keys() and all(equal(got[k], expected[k]) for k in got)
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
    """(relative, absolute) tolerance for `close`."""

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
            return equal(g, e) or (isinstance(e, list) and len(e) > 0 and equal(g, e[0]))
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
        return equal(got, self.expected)


_POST = {"sorted": sorted, "set": set, "len": len, "list": list, "tuple": tuple, "abs": abs,
         "frozenset": frozenset, "str": str, "int": int, "float": float, "bool": bool}


@dataclass(frozen=True)
class Spec:
    kind: str
    """"stdio" or "call"."""
    tests: tuple
    origin: str
    """The format, in words."""


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
    return bool(re.search(r"^\s*(assert\b|def (test_?\w*|check)\s*\()", text, re.MULTILINE))


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
        tests = tuple(CallTest(fn, _call_args(i, k), {}, _json_value(o, k), "apps") for k, (i, o) in enumerate(zip(ins, outs)))
        return _checked(Spec("call", tests, f"call-based tests of {fn} (APPS/TACO/verl)"))
    return _checked(Spec("stdio", tuple(StdioTest(_text(i), _text(o)) for i, o in zip(ins, outs)),
                         "stdin/stdout tests"))


def _test_list(items: list, fn: str | None) -> Spec:
    if not items:
        raise ValueError("reference has no tests")
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
        return _checked(Spec("call", tuple(calls), f"call-based tests of {calls[0].fn}"))
    return _checked(Spec("stdio", tuple(stdio), "stdin/stdout tests"))


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


def _checked(spec: Spec) -> Spec:
    if spec.kind == "stdio":
        silent = [i for i, t in enumerate(spec.tests) if not t.output.strip()]
        if silent:
            raise ValueError(f"test {silent[0]} expects no output: any program that prints nothing would pass it")
    else:
        def idle(t: CallTest) -> bool:  # what a function that returns None passes
            return not t.post and (t.check == "falsy" or (t.check in ("equal", "apps", "is") and t.expected in (None, [None])))

        if all(idle(t) for t in spec.tests):
            raise ValueError("every test expects None: a function that does nothing would pass them")
        for k, t in enumerate(spec.tests):
            if not all(_carriable(v) for v in (t.args, t.kwargs, t.expected)):
                raise ValueError(f"test {k} holds a value other than numbers, strings, None, lists, tuples, "
                                 f"sets and dicts (bytes, complex): its call cannot be sent or its result compared")
    return spec


# --- test code -------------------------------------------------------------------------------------------

_NOT_SOLUTION = {"print", "len", "sorted", "set", "list", "tuple", "dict", "abs", "round", "int", "float", "str",
                 "bool", "all", "any", "sum", "min", "max", "isinstance", "type", "range", "map", "zip", "frozenset"}
SUPPORTED_ASSERTS = ("assert f(<literals>) == <literal> (or `is` True/False/None), assert f(...), "
                     "assert not f(...), abs(f(...) - x) < tol, math.isclose(f(...), x), "
                     "f(...) == pytest.approx(x); f may be wrapped in sorted/set/len/list/tuple")


class _Refused(ValueError):
    pass


def test_code(code: str, entry_point: str | None = None, origin: str = "test code") -> Spec:
    """Asserts of test code as call tests (see the module docstring); ValueError naming what cannot be."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise ValueError(f"the test code does not parse: {e}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    invocations = []  # check(X) at module level: what `candidate` is
    for n in tree.body:
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and _name(n.value.func) == "check":
            if len(n.value.args) == 1:
                invocations.append(_target(n.value.args[0]))
    candidate = invocations[-1] if invocations else entry_point
    tests: list[CallTest] = []
    env: dict[str, Any] = {}
    try:
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass)) or _docstring(node) or _main_guard(node):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _name(node.value.func) == "check":
                continue
            if isinstance(node, ast.Assign) and _literal_assign(node, env):
                continue
            if isinstance(node, ast.Assert):
                tests.append(_assert(node, dict(env), {}, candidate, defined))
            elif isinstance(node, ast.FunctionDef) and (node.name == "check" or node.name.startswith("test")):
                tests += _function(node, dict(env), candidate, defined)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                for m in node.body:
                    if isinstance(m, ast.FunctionDef) and m.name.startswith("test"):
                        tests += _function(m, dict(env), candidate, defined)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue  # a helper: an assert that uses it is refused where it does
            else:
                raise _Refused(f"line {node.lineno}: {_src(node)!r} is not an assert or a test function")
    except _Refused as e:
        raise ValueError(f"{origin} cannot be scored outside the program: {e} (supported: {SUPPORTED_ASSERTS})") from None
    if not tests:
        raise ValueError(f"{origin} holds no assert")
    return _checked(Spec("call", tuple(tests), f"{origin} ({len(tests)} asserts)"))


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _target(node: ast.AST) -> str | None:
    """`f` or `Solution().f` as the function the tests call."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and _name(node.value.func) == "Solution":
        return node.attr
    return None


def _docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _main_guard(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)


def _src(node: ast.AST) -> str:
    s = ast.unparse(node).split("\n")[0]
    return s if len(s) < 80 else s[:77] + "..."


def _literal_assign(node: ast.Assign, env: dict) -> bool:
    if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        try:
            env[node.targets[0].id] = _lit(node.value, env)
            return True
        except _Refused:
            return False
    return False


def _function(fn: ast.FunctionDef, env: dict, candidate: str | None, defined: set) -> list[CallTest]:
    params = [a.arg for a in fn.args.args]
    if fn.name == "check":
        if len(params) != 1:
            raise _Refused(f"line {fn.lineno}: check() takes {len(params)} arguments, not one (candidate)")
        if not candidate:
            raise _Refused(f"line {fn.lineno}: check(candidate) but no entry_point or check(...) call names the function")
        aliases = {params[0]: candidate}
    else:
        if [p for p in params if p != "self"] or fn.decorator_list:
            raise _Refused(f"line {fn.lineno}: test function {fn.name} takes fixtures or has decorators")
        aliases = {}
    calls: dict[str, ast.Call] = {}
    out = []
    for node in fn.body:
        if _docstring(node) or isinstance(node, (ast.Pass, ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and _literal_assign(node, env):
            continue
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)):
            calls[node.targets[0].id] = node.value  # result = f(...); assert result == ...
            env.pop(node.targets[0].id, None)
            continue
        if isinstance(node, ast.Assert):
            out.append(_assert(node, env, calls, None, defined, aliases))
            continue
        raise _Refused(f"line {node.lineno}: {_src(node)!r} in {fn.name} is not an assert or a literal assignment")
    return out


def _assert(node: ast.Assert, env: dict, calls: dict, candidate: str | None, defined: set,
            aliases: dict | None = None) -> CallTest:
    aliases = dict(aliases or {})
    if candidate:
        aliases.setdefault("candidate", candidate)
    where = f"line {node.lineno}: {_src(node)!r}"

    def call_of(e: ast.AST) -> tuple[str, list, dict, tuple] | None:
        post: list[str] = []
        while (isinstance(e, ast.Call) and _name(e.func) in _POST and len(e.args) == 1 and not e.keywords):
            post.append(e.func.id)
            e = e.args[0]
        if isinstance(e, ast.Name) and e.id in calls:
            e = calls[e.id]
        if not isinstance(e, ast.Call):
            return None
        fname = _target(e.func) if isinstance(e.func, ast.Attribute) else _name(e.func)
        fname = aliases.get(fname, fname)
        if not fname or fname in _NOT_SOLUTION or (fname in defined and fname not in aliases.values()):
            return None
        if any(isinstance(a, ast.Starred) for a in e.args) or any(k.arg is None for k in e.keywords):
            return None
        try:
            args = [_lit(a, env) for a in e.args]
            kwargs = {k.arg: _lit(k.value, env) for k in e.keywords}
        except _Refused:
            return None
        return fname, args, kwargs, tuple(reversed(post))

    def make(c, expected=None, check="equal", tol=(REL_TOL, ABS_TOL)) -> CallTest:
        return CallTest(c[0], c[1], c[2], expected, check, c[3], tol)

    t = node.test
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and (c := call_of(t.operand)):
        return make(c, check="falsy")
    if (c := call_of(t)):
        return make(c, check="truthy")
    if isinstance(t, ast.Compare) and len(t.ops) == 1:
        left, op, right = t.left, t.ops[0], t.comparators[0]
        if isinstance(op, (ast.Eq, ast.Is)) and not call_of(left) and call_of(right):
            left, right = right, left
        c = call_of(left)
        if c and isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (True, False, None):
            return make(c, right.value, "is")
        if c and isinstance(op, ast.Eq):
            if (isinstance(right, ast.Call) and isinstance(right.func, ast.Attribute) and right.func.attr == "approx"
                    and len(right.args) == 1):
                kw = {k.arg: _lit(k.value, env) for k in right.keywords}
                return make(c, _lit(right.args[0], env), "close", (kw.get("rel", 1e-6), kw.get("abs", 1e-12)))
            try:
                return make(c, _lit(right, env))
            except _Refused:
                pass
        # abs(f(x) - y) < tol
        if (isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and _name(left.func) == "abs"
                and len(left.args) == 1 and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub)):
            inner = left.args[0]
            c2 = call_of(inner.left)
            try:
                if c2:
                    return make(c2, _lit(inner.right, env), "close", (0.0, float(_lit(right, env))))
            except (_Refused, TypeError, ValueError):
                pass
    if (isinstance(t, ast.Call) and isinstance(t.func, ast.Attribute) and t.func.attr == "isclose"
            and len(t.args) == 2 and (c := call_of(t.args[0]))):
        try:
            kw = {k.arg: _lit(k.value, env) for k in t.keywords}
            return make(c, _lit(t.args[1], env), "close", (kw.get("rel_tol", 1e-9), kw.get("abs_tol", 0.0)))
        except _Refused:
            pass
    raise _Refused(f"{where} is not a call of the solution with literal arguments compared with a literal")


def _lit(node: ast.AST, env: dict) -> Any:
    """A literal (numbers, strings, bytes, lists, tuples, sets, dicts, True/False/None, float('inf'), names
    bound to literals earlier); _Refused otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return copy.deepcopy(env[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _lit(node.operand, env)
        if type(v) in (int, float, complex):
            return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.List):
        return [_lit(e, env) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_lit(e, env) for e in node.elts)
    if isinstance(node, ast.Set):
        return {_lit(e, env) for e in node.elts}
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_lit(k, env): _lit(v, env) for k, v in zip(node.keys, node.values)}
    if (isinstance(node, ast.Call) and _name(node.func) in ("float", "set", "tuple", "list", "frozenset")
            and not node.keywords and len(node.args) <= 1):
        arg = [_lit(a, env) for a in node.args]
        if node.func.id == "float" and arg and isinstance(arg[0], str):
            return float(arg[0])
        if node.func.id != "float":
            return _POST[node.func.id](*arg) if arg else _POST[node.func.id]()
    raise _Refused(f"line {getattr(node, 'lineno', '?')}: {_src(node)!r} is not a literal")


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
