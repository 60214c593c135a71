"""The code verifier's reference formats, answer extraction and output comparison (no sandbox): every
format users bring is read into the tests it holds, or refused with the reason."""

import json

import pytest

from verifiers import code as code_v
from verifiers.code_compare import CallTest, decode, extract_program, outputs_match, tagged
from verifiers.code_formats import parse


def test_fences_in_every_spelling_and_the_last_python_block():
    for tag in ("python", "python3", "Python", "PYTHON", "py", ""):
        assert extract_program(f"Here:\n```{tag}\nprint(1)\n```\nDone.") == "print(1)\n"
    two = "```python\nold()\n```\ntext\n```python\nnew()\n```\nexample:\n```\n3 4\n```"
    assert extract_program(two) == "new()\n"  # a tagged block wins over a later untagged example
    assert extract_program("```python\nfirst()\n```\n```python\ncut off()") == "cut off()"  # unclosed at the end
    assert extract_program("```cpp\nint main(){}\n```") == ""  # another language: no program
    assert extract_program("print(2)") == "print(2)"  # no fence: the whole answer


@pytest.mark.parametrize("got,expected,same", [
    ("1 2 \r\n3\r\n\r\n", "1 2\n3", True),                      # CRLF, trailing space, trailing blank lines
    ("0.333333\n", "0.333333333333333", True),                   # 6 decimals against 15: within 1e-5 relative
    ("0.3334\n", "0.333333333333333", False),                    # outside the tolerance
    ("2.0000001", "2", False),                                   # an integer is compared exactly
    ("1   2", "1 2", True),                                      # whitespace between tokens
    ("1 2\n3", "1 2", False),                                    # an extra line
    ("YES", "yes", False),
    ("1e-9", "0.0", True),                                       # absolute tolerance 1e-8 near zero
])
def test_output_comparison(got, expected, same):
    assert outputs_match(got, expected) is same


def test_call_based_layouts_users_bring():
    apps = parse(json.dumps({"fn_name": "f", "inputs": [[1, 2], [[3], "x"]], "outputs": [[3], [[3, "x"]]]}))
    assert apps.kind == "call" and apps.tests[0] == CallTest("f", [1, 2], {}, [3], "apps")
    prime = parse(json.dumps({"fn_name": "f", "inputs": ["[1, 2]\n3"], "outputs": ["[4]"]}))  # verl prime_code
    assert prime.tests[0].args == [[1, 2], 3] and prime.tests[0].expected == [4]
    lcb = parse(json.dumps([{"input": "\"ab\"\n2", "output": "\"abab\"", "testtype": "functional",
                             "metadata": json.dumps({"func_name": "rep"})}]))
    assert lcb.tests[0] == CallTest("rep", ["ab", 2], {}, "abab", "equal")
    pi = parse(json.dumps({"verification_info": json.dumps({"language": "python", "test_cases": [
        {"type": "function_call", "fn_name": "g", "input": [5], "output": [25]}]})}))
    assert pi.tests[0].fn == "g" and pi.tests[0].check == "apps"
    stdin = parse(json.dumps({"input_output": json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})}))
    assert stdin.kind == "stdio" and stdin.tests[0].output == "2\n"


def test_apps_wrapped_outputs_tuples_dict_keys_and_opaque_values():
    wrapped = CallTest("f", [], {}, [3], "apps")
    assert wrapped.passes(3) and wrapped.passes([3]) and not wrapped.passes(4)
    pair = CallTest("f", [], {}, [[1, 2]], "apps")
    assert pair.passes((1, 2)) and pair.passes([1, 2])  # a returned tuple is a JSON list
    assert not CallTest("f", [], {}, [1, 2], "apps").passes(1)  # only a single-element list is a wrapper
    assert CallTest("f", [], {}, [{"1": "a"}], "apps").passes({1: "a"})  # JSON made the keys strings
    exact = CallTest("f", [], {}, (1, 2))
    assert exact.passes((1, 2)) and not exact.passes([1, 2])  # test code keeps Python's types
    assert CallTest("f", [], {}, 0.1 + 0.2).passes(0.3) and not CallTest("f", [], {}, 0.5).passes(0.51)
    # what leaves the sandbox is data: an object of another type, or a malformed record, equals nothing
    for forged in ({"$o": "Always"}, {"$x": 1}, {"a": 1, "b": 2}, {"$d": [[[1], 2]]}):
        value = decode(forged)
        assert not any(CallTest("f", [], {}, e).passes(value) for e in (1, {"a": 1, "b": 2}, "Always"))
    assert decode(tagged({(1, 2): {3}})) == {(1, 2): {3}} and decode({"$i": hex(-3 ** 9000)}) == -3 ** 9000


def test_test_code_formats_become_call_tests():
    leetcode = parse(json.dumps({"functional": "def check(candidate):\n    assert candidate(nums=[1, 2], k=1) == 2\n"
                                               "    assert candidate(nums=[], k=0) == 0\n\ncheck(Solution().solve)\n"}))
    assert leetcode.tests[0] == CallTest("solve", [], {"nums": [1, 2], "k": 1}, 2)
    humaneval = parse(json.dumps({"entry_point": "below", "test": (
        "METADATA = {'author': 'x'}\n\ndef check(candidate):\n    assert candidate([1, 2], 3) is True\n"
        "    assert not candidate([5], 3)\n    assert abs(candidate([0.5], 1.0) - 0.25) < 1e-6\n"
        "    assert True, 'This prints if this assert fails'\n")}))  # HumanEval's debugging line: no test
    assert [t.check for t in humaneval.tests] == ["is", "falsy", "close"] and humaneval.tests[0].fn == "below"
    mbpp = parse(json.dumps({"test_list": ["assert sq(3) == 9", "assert sorted(pairs(2)) == [(0, 1), (1, 0)]"]}))
    assert mbpp.tests[1].post == ("sorted",) and mbpp.tests[1].expected == [(0, 1), (1, 0)]
    kodcode = parse("import pytest\nfrom solution import area\n\ndef test_area():\n    side = 3\n"
                    "    result = area(side)\n    assert result == 9\n    assert area(0.5) == pytest.approx(0.25)\n")
    assert [(t.fn, t.args, t.check) for t in kodcode.tests] == [("area", [3], "equal"), ("area", [0.5], "close")]
    assert code_v.describe(json.dumps({"test_list": ["assert sq(3) == 9"]})).startswith("1 MBPP asserts")
    evalplus = parse("def assertion(out, exp, atol):\n    assert out == exp\n\ninputs = [[(1, 2)], [[3]]]\n"
                     "results = [(2, 1), [3]]\nfor i, (inp, exp) in enumerate(zip(inputs, results)):\n"
                     "    assertion(rev(*inp), exp, 1e-4)\n")  # MBPP+: the function by its name
    assert evalplus.tests[0] == CallTest("rev", [(1, 2)], {}, (2, 1), "equal", (), (1e-5, 1e-4))


@pytest.mark.parametrize("reference,why", [
    ("from solution import f\ndef test_f():\n    x = f(1)\n    x.append(2)\n    assert x == [1, 2]\n", "not an assert"),
    ("def test_f():\n    assert helper(f(1)) == 2\n\ndef helper(v):\n    return v\n", "not a call of the solution"),
    (json.dumps({"test_list": ["assert f(1) == 1"], "test_setup_code": "import x"}), "test_setup_code"),
    (json.dumps({"language": "cpp", "test_cases": [{"input": "1", "output": "1"}]}), "Python programs only"),
    (json.dumps([{"input": "1", "output": "2", "testtype": "functional"}]), "names no function"),
    (json.dumps([{"input": "1", "output": "2"}, {"input": "[1]", "output": "2", "type": "function_call",
                                                 "fn_name": "f"}]), "mixes"),
    (json.dumps({"fn_name": "sort_in_place", "inputs": [[[2, 1]]], "outputs": [[None]]}), "does nothing"),
    (json.dumps({"fn_name": "f", "inputs": ["not json"], "outputs": ["1"]}), "newline-separated JSON"),
    ("def check(candidate):\n    assert candidate(1) == 1\n", "names the function"),
    (json.dumps({"tests": [{"input": "1", "output": "  \n"}]}), "prints nothing"),
    ("assert f(b'x') == 1", "bytes"),
    ("def assertion(o, e, a):\n    pass\ninputs, results = [[1]], [1]\nfor inp, exp in zip(inputs, results):\n"
     "    assertion(ref_func(*inp), f(*inp), 0)\n", "is not an assert"),  # evalplus's cross-check form
    ("just some prose", "not JSON and not test code"),
])
def test_formats_that_cannot_be_scored_are_refused_at_load_with_the_reason(reference, why):
    assert why in code_v.check_reference(reference)
    with pytest.raises(ValueError, match="not a code reference"):
        code_v.score("```python\npass\n```", reference)


def test_code_rows_of_the_data_sets_users_bring_load_with_their_test_columns():
    from taskdata.layouts import detect, fields_of, to_task

    lcb = json.dumps([{"input": "1", "output": "2", "testtype": "functional", "metadata": {"func_name": "inc"}}])
    rows = {  # data source (the file's stem): a row as the data set ships it
        "deepcoder": {"problem": "p", "tests": lcb, "solutions": ["..."]},
        "taco": {"question": "q", "solutions": "[]", "input_output": json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})},
        "kodcode": {"question": "q", "solution": "def inc(x): ...", "test": "from solution import inc\n\n"
                                                                         "def test_inc():\n    assert inc(1) == 2\n"},
        "humaneval": {"prompt": "def inc(x):", "test": "def check(candidate):\n    assert candidate(1) == 2\n",
                      "entry_point": "inc", "canonical_solution": "    return x + 1"},
        "mbpp": {"prompt": "p", "test_list": ["assert inc(1) == 2"], "code": "def inc(x): return x + 1"},
    }
    for source, row in rows.items():
        t = to_task(row, fields_of(detect(set(row))), task_id="x", default_source=source, verifier="", user_map={})
        assert t.verifier == "code" and code_v.check_reference(t.reference) == "", (source, t.reference)
    assert detect({"prompt", "test", "entry_point"}) == "prompt-tests"
