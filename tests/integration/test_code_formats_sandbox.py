"""The code verifier in the real sandbox: every reference format scores a correct solution 1 and a wrong one
0, and a program that tries to forge its verdict instead of computing the answer scores 0."""

import json

import pytest

from verifiers import code as code_v


def py(src: str) -> str:
    return f"Here is my solution.\n```python\n{src}\n```\n"


FORMATS = {  # name: (reference, correct program, wrong program)
    "apps call-based, wrapped outputs": (
        json.dumps({"fn_name": "pair", "inputs": [[1, 2], [3, 4]], "outputs": [[[2, 1]], [[4, 3]]]}),
        "def pair(a, b):\n    return (b, a)", "def pair(a, b):\n    return (a, b)"),
    "verl prime_code JSON-line inputs": (
        json.dumps({"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]}),
        "def add(a, b):\n    return a + b", "def add(a, b):\n    return a"),
    "LiveCodeBench functional, class Solution": (
        json.dumps([{"input": "[3, 1, 2]", "output": "[1, 2, 3]", "testtype": "functional",
                     "metadata": {"func_name": "sortIt"}}]),
        "class Solution:\n    def sortIt(self, xs: List[int]) -> List[int]:\n        return sorted(xs)",
        "class Solution:\n    def sortIt(self, xs: List[int]) -> List[int]:\n        return xs"),
    "LeetCode functional check(Solution().m)": (
        json.dumps({"functional": "def check(candidate):\n    assert candidate(s='abc') == 'cba'\n"
                                  "    assert candidate(s='') == ''\n\ncheck(Solution().rev)\n"}),
        "class Solution:\n    def rev(self, s: str) -> str:\n        return s[::-1]",
        "class Solution:\n    def rev(self, s: str) -> str:\n        return s"),
    "HumanEval check(candidate) with entry_point": (
        json.dumps({"entry_point": "mean", "test": "def check(candidate):\n    assert candidate([1, 2]) == 1.5\n"
                                                  "    assert abs(candidate([1, 2, 2]) - 1.6667) < 1e-3\n"}),
        "def mean(xs):\n    return sum(xs) / len(xs)", "def mean(xs):\n    return max(xs)"),
    "HumanEval+ / evalplus loop over inputs and results": (
        json.dumps({"entry_point": "halve", "test": (
            "import numpy as np\n\ndef assertion(out, exp, atol):\n    assert out == exp\n\n"
            "def check(candidate):\n    inputs = [[1], [3]]\n    results = [0.5, 1.5]\n"
            "    for i, (inp, exp) in enumerate(zip(inputs, results)):\n        assertion(candidate(*inp), exp, 0)\n")}),
        "def halve(x):\n    return x / 2", "def halve(x):\n    return x // 2"),
    "MBPP test_list": (
        json.dumps({"test_list": ["assert is_even(4)", "assert not is_even(3)"]}),
        "def is_even(n):\n    return n % 2 == 0", "def is_even(n):\n    return True"),
    "KodCode pytest functions": (
        "from solution import words\n\ndef test_words():\n    assert sorted(words('b a')) == ['a', 'b']\n"
        "    result = words('')\n    assert result == []\n",
        "def words(s):\n    return s.split()", "def words(s):\n    return [s]"),
    "stdin/stdout, CRLF, trailing spaces and a float": (
        json.dumps({"inputs": ["3\n"], "outputs": ["1.000000000000000\n0.333333333333333\n"]}),
        "n = int(input())\nprint('%.6f ' % 1, end='\\r\\n')\nprint('%.6f' % (1 / n))\nprint()",
        "print(1)\nprint(0.5)"),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_format_scores_a_correct_solution_1_and_a_wrong_one_0(name):
    reference, good, bad = FORMATS[name]
    assert code_v.check_reference(reference) == ""
    right, wrong = code_v.score(py(good), reference), code_v.score(py(bad), reference)
    assert right.correct and right.reward == 1.0, right
    assert not wrong.correct and wrong.reward < 1.0, wrong


EXPECTED = "answer-7f3a91"
REFERENCE = json.dumps({"fn_name": "solve", "inputs": [[1], [2]], "outputs": [[EXPECTED + "-1"], [EXPECTED + "-2"]]})
FORGERIES = {  # a program that does not compute the answer, each trying to be scored correct another way
    "prints pass markers": "print('all tests passed')\nprint('True')\ndef solve(x):\n    print('PASSED')\n    return None",
    "exits 0 at import": "import os\nos._exit(0)",
    "raises SystemExit in the call": "def solve(x):\n    raise SystemExit(0)",
    "an object equal to everything": (
        "class Yes(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
        "class Any:\n    __eq__ = lambda self, other: True\n"
        "def solve(x):\n    return Yes('x') if x == 1 else Any()"),
    "patches builtins and the harness's json": (
        "import builtins, json\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: str\n"
        "json.dumps = lambda *a, **k: '{\"ok\": true, \"passed\": true}'\njson.loads = lambda *a, **k: {}\n"
        "def solve(x):\n    return 'x'"),
    "writes results in the harness's own format with its nonce": (
        "import sys\ndef solve(x):\n    f = sys._getframe(1)\n    nonce, out = f.f_locals['nonce'], f.f_locals['out']\n"
        "    for i in range(2):\n        out.write(nonce + ' ' + str(i) + ' {\"ok\": \"answer-7f3a91-' + str(i + 1) + '\"}\\n')\n"
        "    out.flush()\n    return 'wrong'"),
    "searches memory and disk for the expected values": (
        "import gc, os, sys\ndef solve(x):\n    seen = []\n    f = sys._getframe(1)\n"
        "    for frame in (f, f.f_back):\n        seen += [repr(v) for v in (frame.f_locals if frame else {}).values()]\n"
        "    seen += [repr(o) for o in gc.get_objects()[:20000]]\n"
        "    for root in ('/work', '/tmp', '/dev/shm'):\n"
        "        for d, _, files in os.walk(root):\n            for n in files[:50]:\n"
        "                try:\n                    seen.append(open(os.path.join(d, n), errors='ignore').read(10000))\n"
        "                except Exception:\n                    pass\n"
        "    blob = '\\n'.join(seen)\n    i = blob.find('answer-7f3a91-' + str(x))\n"
        "    return blob[i:i + 15] if i >= 0 else 'not found'"),
}


def test_forging_the_verdict_instead_of_computing_the_answer_scores_0():
    honest = code_v.score(py(f"def solve(x):\n    return '{EXPECTED}-' + str(x)"), REFERENCE)
    assert honest.correct, honest
    for name, program in FORGERIES.items():
        res = code_v.score(py(program), REFERENCE)
        assert res.reward == 0.0 and not res.correct, (name, res)
    # a forged record beside the harness's own is a second result for that test: every test fails
    half = code_v.score(py(FORGERIES["writes results in the harness's own format with its nonce"]), REFERENCE)
    assert half.reason == "0/2 passed; results the harness did not write", half
    # test code is never run: an exit at import cannot pass a check(candidate) reference either
    check = json.dumps({"functional": "def check(candidate):\n    assert candidate(1) == 2\n\ncheck(inc)\n"})
    assert code_v.score(py("raise SystemExit(0)"), check).reward == 0.0
    assert code_v.score(py("def inc(x):\n    return x + 1"), check).correct
