"""Test code as call tests, never run: HumanEval's check(candidate), LeetCode's check(Solution().m), MBPP's
asserts and pytest-style test functions (KodCode). Each assert must have a form whose verdict the scoring
process reaches on its own — a call of the solution's function with literal arguments compared with a
literal (`SUPPORTED_ASSERTS`) — and becomes a `CallTest`; any other statement refuses the code, naming it.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from verifiers.code_compare import _POST, ABS_TOL, REL_TOL, CallTest, Spec, checked


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
            if (isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass)) or _docstring(node) or _main_guard(node)
                    or _always_true(node)):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _name(node.value.func) == "check":
                continue
            if isinstance(node, ast.Assign) and _literal_assign(node, env):
                continue
            if isinstance(node, ast.Assert):
                tests.append(_assert(node, dict(env), {}, candidate, defined))
            elif isinstance(node, ast.For):
                tests += _evalplus_loop(node, env, {"candidate": candidate} if candidate else {}, defined)
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
    return checked(Spec("call", tuple(tests), f"{origin} ({len(tests)} asserts)"))


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


def _always_true(node: ast.AST) -> bool:
    """`assert True, "..."` (HumanEval's debugging lines): no test."""
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and bool(node.test.value)


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
        if _docstring(node) or isinstance(node, (ast.Pass, ast.Import, ast.ImportFrom)) or _always_true(node):
            continue
        if isinstance(node, ast.Assign) and _literal_assign(node, env):
            calls.pop(node.targets[0].id, None)  # the name is a literal again
            continue
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)):
            calls[node.targets[0].id] = node.value  # result = f(...); assert result == ...
            env.pop(node.targets[0].id, None)
            continue
        if isinstance(node, ast.Assert):
            out.append(_assert(node, env, calls, None, defined, aliases))
            continue
        if isinstance(node, ast.For):
            out += _evalplus_loop(node, env, aliases, defined)
            continue
        raise _Refused(f"line {node.lineno}: {_src(node)!r} in {fn.name} is not an assert or a literal assignment")
    return out


def _evalplus_loop(node: ast.For, env: dict, aliases: dict, defined: set) -> list[CallTest]:
    """EvalPlus's (HumanEval+, MBPP+) loop over literal `inputs` and `results`:
    `for i, (inp, exp) in enumerate(zip(inputs, results)): assertion(f(*inp), exp, atol)`, the `assertion`
    being its own (equal, floats within atol, 1e-6 where atol is 0)."""
    where = f"line {node.lineno}: {_src(node)!r}"
    it, target = node.iter, node.target
    if isinstance(it, ast.Call) and _name(it.func) == "enumerate" and len(it.args) == 1:
        it = it.args[0]
        target = target.elts[1] if isinstance(target, ast.Tuple) and len(target.elts) == 2 else None
    names = [_name(e) for e in target.elts] if isinstance(target, ast.Tuple) else []
    zipped = [_name(a) for a in it.args] if isinstance(it, ast.Call) and _name(it.func) == "zip" else []
    body = node.body[0] if len(node.body) == 1 and not node.orelse else None
    call = body.value if isinstance(body, ast.Expr) and isinstance(body.value, ast.Call) else None
    if not (len(names) == 2 and all(names) and len(zipped) == 2 and all(z in env for z in zipped) and call
            and _name(call.func) == "assertion" and "assertion" in defined and len(call.args) == 3):
        raise _Refused(f"{where} is not EvalPlus's loop of assertion(f(*inp), exp, atol) over inputs and results")
    inner, exp, atol = call.args
    fname = _name(inner.func) if isinstance(inner, ast.Call) else None
    fname = aliases.get(fname, fname)
    if (not fname or fname in defined or inner.keywords or len(inner.args) != 1
            or not isinstance(inner.args[0], ast.Starred) or _name(inner.args[0].value) != names[0]
            or _name(exp) != names[1]):
        raise _Refused(f"{where}: the loop's assertion is not assertion(f(*{names[0]}), {names[1]}, atol)")
    inputs, results, tol = env[zipped[0]], env[zipped[1]], _lit(atol, env)
    if not isinstance(inputs, (list, tuple)) or not isinstance(results, (list, tuple)) or len(inputs) != len(results):
        raise _Refused(f"{where}: {zipped[0]} and {zipped[1]} are not lists of the same length")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool):
        raise _Refused(f"{where}: the tolerance is not a number")
    return [CallTest(fname, list(i), {}, r, "equal", (), (REL_TOL, max(float(tol), ABS_TOL)))
            for i, r in zip(inputs, results)]


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
        if (c and isinstance(op, ast.Is) and isinstance(right, ast.Constant)
                and any(right.value is v for v in (True, False, None))):
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
