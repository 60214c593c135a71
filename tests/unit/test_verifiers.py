import json
import textwrap

import pytest

from verifiers import math as math_v
from verifiers import reasoning_gym as rg_v
from verifiers import synthetic
from verifiers.datasets import DatasetError, load_jsonl, split_of, task_source
from verifiers.registry import Registry, VerifierLoadError, run_self_test

# (completion, reference, equivalent?)
MATH_TABLE = [
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("$\\frac{1}{2}$", "1/2", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{\\{1,2,3\\}}", "\\{3,1,2\\}", True),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),
    ("The answer is \\boxed{42}.", "42", True),
    ("\\boxed{42.0}", "42", True),
    ("\\boxed{-3}", "-3", True),
    ("\\boxed{\\pi}", "\\pi", True),
    ("\\boxed{2\\pi}", "\\pi \\cdot 2", True),
    ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", True),
    ("\\boxed{(0, 1]}", "(0,1]", True),
    ("\\boxed{[1, 5)}", "[1,5)", True),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\boxed{1000}", "10^3", True),
    ("\\boxed{25\\%}", "25", True),
    ("\\boxed{3, 5}", "5, 3", True),
    ("first 7 then finally \\boxed{9}", "9", True),
    ("\\boxed{e^{0}}", "1", True),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", True),
    ("\\boxed{0.333}", "\\frac{1}{3}", False),
    ("\\boxed{(0, 1)}", "(0,1]", False),
    ("\\boxed{[0, 1]}", "(0,1)", False),
    ("\\boxed{\\{1,2\\}}", "\\{1,2,3\\}", False),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{8}", False),
    ("\\boxed{-\\frac{1}{2}}", "\\frac{1}{2}", False),
    ("\\boxed{x^2 + 1}", "(x+1)^2", False),
    ("\\boxed{43}", "42", False),
    ("\\boxed{3\\pi}", "2\\pi", False),
    ("I don't know", "7", False),
    ("\\boxed{0.51}", "0.5", False),
]


@pytest.mark.parametrize("completion,reference,expected", MATH_TABLE)
def test_math_known_answers(completion, reference, expected):
    res = math_v.score(completion, reference)
    assert res.correct is expected, (completion, reference, res)
    assert res.reward == (1.0 if expected else 0.0)


def test_math_table_is_large_enough():
    assert len(MATH_TABLE) >= 30 and sum(not e for *_, e in MATH_TABLE) >= 10


def test_math_bad_reference_raises():
    with pytest.raises(ValueError, match="reference"):
        math_v.score("\\boxed{1}", "")


def test_synthetic_generator_and_verifier():
    tasks = [t for _, t in zip(range(200), synthetic.generate(3, difficulty=2))]
    assert all(synthetic.problem_split(*_parts(t.task_id)) == "train" for t in tasks)
    ev = {t.task_id for _, t in zip(range(200), synthetic.generate(3, 2, "eval"))}
    assert ev and not ev & {t.task_id for t in tasks}
    assert [t.prompt for _, t in zip(range(5), synthetic.generate(3, 2))] == [t.prompt for t in tasks[:5]]
    t = tasks[0]
    assert synthetic.score(t.reference, t.reference).correct
    assert not synthetic.score(str(int(t.reference) + 1), t.reference).correct
    assert synthetic.score("abc", t.reference).reason == "no answer"
    assert max(abs(int(x)) for x in tasks[0].task_id.replace("+", " ").replace("-", " ").split()) < 100


def _parts(task_id):
    op = "+" if "+" in task_id else "-"
    a, b = task_id.split(op)
    return int(a), op, int(b)


@pytest.mark.parametrize("name", ["basic_arithmetic", "chain_sum", "leg_counting", "spell_backward",
                                  "letter_counting", "word_sorting", "family_relationships"])
def test_reasoning_gym_round_trip(name):
    ref = rg_v.reference_for(name, seed=5, size=20, index=3)
    entry = rg_v.dataset(name, 5, 20)[3]
    assert rg_v.score(f"<answer>{entry['answer']}</answer>", ref).correct
    assert rg_v.score(f"Answer: {entry['answer']}", ref).reward == 1.0
    wrong = rg_v.score("<answer>definitely-not-it-123</answer>", ref)
    assert not wrong.correct and wrong.reward == 0.0


def test_reasoning_gym_splits_never_overlap():
    tr = [t for _, t in zip(range(300), task_source("reasoning_gym:basic_arithmetic", 0, "train"))]
    ev = [t for _, t in zip(range(50), task_source("reasoning_gym:basic_arithmetic", 0, "eval"))]
    assert not {t.prompt for t in tr} & {t.prompt for t in ev}


def test_registry_scores_builtins_and_contains_errors():
    reg = Registry()
    res, version = reg.score("synthetic", "7", "7")
    assert res.correct and version == "1"
    res, _ = reg.score("synthetic", "7", "not-an-int")  # bad reference: verifier raises
    assert not res.correct and res.reward == 0 and res.reason.startswith("error: ValueError")
    with pytest.raises(KeyError, match="no verifier named"):
        reg.get("nope")
    for name in ("synthetic", "math", "code", "reasoning_gym"):
        run_self_test(reg.get(name))


def _write_module(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_hot_swap_accepts_good_rejects_bad(tmp_path, monkeypatch):
    _write_module(tmp_path, monkeypatch, "strict_v2", '''
        from verifiers.base import VerifierResult
        NAME, VERSION = "strict", "2"
        def score(completion, reference):
            ok = completion.strip() == reference
            return VerifierResult(float(ok), ok, "exact" if ok else "not exact")
        SELF_TEST = [("5", "5", True), (" 5x", "5", False)]
    ''')
    _write_module(tmp_path, monkeypatch, "liar", '''
        from verifiers.base import VerifierResult
        NAME, VERSION = "liar", "1"
        def score(completion, reference):
            return VerifierResult(1.0, True, "always")
        SELF_TEST = [("1", "2", False)]
    ''')
    _write_module(tmp_path, monkeypatch, "broken", "import definitely_not_a_module\n")
    reg = Registry()
    assert reg.score("synthetic", "5x", "5")[0].correct  # the built-in accepts a leading integer
    v = reg.swap("synthetic", "strict_v2")
    assert v.version == "2"
    res, version = reg.score("synthetic", "5x", "5")
    assert not res.correct and version == "2"
    for bad, why in (("liar", "self-test 0 failed"), ("broken", "cannot be imported"),
                     ("verifiers.base", "lacks"), ("verifiers.registry:BUILTINS", "not a Verifier")):
        with pytest.raises(VerifierLoadError, match=why):
            reg.swap("synthetic", bad)
        assert reg.get("synthetic").version == "2"  # the previous one stays in force
    reg.swap("strict", "strict_v2")  # adding a new name works too
    assert "strict" in reg.names()


def test_jsonl_loading_reports_bad_lines(tmp_path):
    lines = [
        json.dumps({"prompt": "1+1=", "reference": "2", "verifier": "synthetic", "split": "train"}),
        "{not json",
        json.dumps({"prompt": "", "reference": "2", "verifier": "synthetic"}),
        json.dumps({"prompt": "x", "verifier": "math"}),
        json.dumps(["a list"]),
        json.dumps({"prompt": "q", "reference": {"tests": []}, "verifier": "code", "split": "train", "extra": 1}),
        "",
        json.dumps({"prompt": "2+2=", "reference": "4", "verifier": "synthetic", "split": "eval", "id": "t2"}),
    ]
    f = tmp_path / "tasks.jsonl"
    f.write_text("\n".join(lines) + "\n")
    rep = load_jsonl(f)
    assert [t.prompt for t in rep.tasks] == ["1+1=", "2+2="]
    assert [e.split(":")[1] for e in rep.errors] == ["2", "3", "4", "5", "6"]
    assert "not valid JSON" in rep.errors[0] and "'prompt'" in rep.errors[1] and "reference" in rep.errors[2]
    assert [t.task_id for t in load_jsonl(f, split="eval").tasks] == ["t2"]
    with pytest.raises(DatasetError, match=r"tasks.jsonl:2"):
        load_jsonl(f, on_error="fatal")
    with pytest.raises(DatasetError, match="unknown task spec"):
        task_source("bogus", 0, "train")


def test_split_is_a_function_of_content():
    texts = [f"question {i}" for i in range(2000)]
    share = sum(split_of(t) == "eval" for t in texts) / len(texts)
    assert 0.05 < share < 0.15
    assert all(split_of(t) == split_of(t) for t in texts[:50])
