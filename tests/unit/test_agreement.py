"""brorl's math verifier agrees with the peers' public test cases (bench/data/agreement, `python -m bench.agreement`)
on at least 99 % of those whose expectation does not rest on a non-default peer setting."""

from bench.agreement import load_cases, outcome


def test_math_agrees_with_the_peers_test_suites_on_99_percent_of_their_default_cases():
    cases = [c for c in load_cases() if c["verifier"] == "math" and c["default"]]
    assert len(cases) >= 150 and {c["suite"] for c in cases} >= {"math_verify", "open_r1", "rllm", "verl_prime_math"}
    misses = [(c["suite"], c["test"], reason) for c in cases if (reason := outcome(c))[0] != c["expected"]]
    assert len(misses) <= 0.01 * len(cases), misses
