"""Builds bench/data/agreement/*.jsonl from the peers' public test suites (a one-off, kept for provenance).

    python -m bench.agreement_extract math_verify PATH/TO/Math-Verify > bench/data/agreement/math_verify.jsonl

Math-Verify's tests are read with `ast` (never imported or run): every `@pytest.mark.parametrize` case of a
test that calls `compare_strings(...)` or `verify(parse(gold), parse(pred))`, with the settings that call
passes (`match_types`, `precision`, `strict`, `allow_set_relation_comp`). A case whose settings differ from
math-verify's defaults (what brorl uses) is marked `"default": false`. The other suites are a few cases
each, copied by hand into their files.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

DEFAULTS = {"match_types": ["latex", "expr"], "precision": 6, "strict": True, "allow_set_relation_comp": False}


def _parametrize(fn: ast.FunctionDef) -> tuple[list[str], list[ast.expr]] | None:
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "parametrize":
            names = [n.strip() for n in ast.literal_eval(d.args[0]).split(",")]
            return names, list(d.args[1].elts)
    return None


def _call_settings(fn: ast.FunctionDef) -> dict[str, object] | None:
    """The keyword settings of the compare_strings / verify call (a parameter's name where it passes one)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("compare_strings", "verify"):
            out = {}
            for kw in node.keywords:
                out[kw.arg] = ("param", kw.value.id) if isinstance(kw.value, ast.Name) else ast.literal_eval(kw.value)
            return out
    return None


def math_verify(root: Path) -> list[dict]:
    cases = []
    for path in sorted((root / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef) or not (p := _parametrize(fn)):
                continue
            settings = _call_settings(fn)
            if settings is None:
                continue
            names, values = p
            for i, elt in enumerate(values):
                try:
                    row = dict(zip(names, ast.literal_eval(elt)))
                except ValueError:  # an f-string or a call: not a literal case
                    continue
                if "gold" not in row or "pred" not in row:
                    continue
                s = dict(DEFAULTS)
                for k, v in settings.items():
                    s[k] = row[v[1]] if isinstance(v, tuple) else v
                expected = row.get("expected", row.get("result"))
                diff = {k: v for k, v in s.items() if v != DEFAULTS.get(k)}
                cases.append({"suite": "math_verify", "path": str(path.relative_to(root)), "test": f"{fn.name}[{i}]",
                              "verifier": "math", "completion": row["pred"], "reference": row["gold"],
                              "expected": bool(expected), "default": not diff, "settings": diff})
    return cases


if __name__ == "__main__":
    suite, root = sys.argv[1], Path(sys.argv[2])
    for c in {"math_verify": math_verify}[suite](root):
        print(json.dumps(c, ensure_ascii=False))
