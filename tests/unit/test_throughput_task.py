"""The throughput task (a set pass rate whatever the model) and the long-tailed completion budgets that
make stragglers realistic in throughput measurements."""

import statistics

import pytest

from actors.engine import request_max_tokens
from config.loader import ConfigError, load_config
from verifiers import throughput
from taskdata.generators import DatasetError, task_source
from verifiers.registry import Registry, load, run_self_test


def take(spec, n, split="train", seed=0):
    src = task_source(spec, seed, split)
    return [next(src) for _ in range(n)]


def test_completions_pass_at_the_set_rate_and_groups_are_kept_at_a_realistic_rate():
    tasks = take("throughput:0.3:32", 400)
    assert all(len(t.prompt) == 32 and set(t.prompt) <= set(throughput.ALPHABET) for t in tasks)
    n = 16
    passed = [[throughput.score(f"completion {j}", t.reference).correct for j in range(n)] for t in tasks]
    rate = sum(map(sum, passed)) / (len(tasks) * n)
    assert rate == pytest.approx(0.3, abs=0.03)
    # per-prompt rates vary (Beta with mean 0.3): some groups all wrong or all right, most mixed
    kept = sum(0 < sum(g) < n for g in passed) / len(tasks)
    assert 0.5 < kept < 0.95, kept
    assert statistics.mean(float(t.reference) for t in tasks) == pytest.approx(0.3, abs=0.03)


def test_scores_are_pure_and_splits_never_share_a_prompt():
    t = take("throughput:0.5", 1)[0]
    assert [throughput.score("x", t.reference) for _ in range(3)] == [throughput.score("x", t.reference)] * 3
    assert take("throughput:0.5", 50) == take("throughput:0.5", 50)
    train = {t.prompt for t in take("throughput:0.5:8", 300)}
    assert not train & {t.prompt for t in take("throughput:0.5:8", 300, split="eval")}
    with pytest.raises(ValueError, match="not a pass rate"):
        throughput.score("x", "1.5")


@pytest.mark.parametrize("spec, match", [("throughput:1.2", "strictly between 0 and 1"),
                                         ("throughput:x", "'x' is not a number"),
                                         ("throughput:0.3:2", "at least 3 characters"),
                                         ("throughput:0.3:ab", "'ab' is not an integer")])
def test_a_bad_spec_is_refused_with_the_part_named(spec, match):
    with pytest.raises(DatasetError, match=match):
        task_source(spec, 0, "train")


def test_the_verifier_is_built_in_and_passes_its_self_test():
    run_self_test(load(Registry().path("throughput")))


def test_completion_budgets_have_a_long_tail_capped_at_max_tokens():
    a = load_config("tiny-cpu", {"actor.max_tokens": 4096, "actor.length_dist": "lognormal",
                                 "actor.length_median": 256, "actor.length_sigma": 1.0}).actor
    draws = [request_max_tokens(a, 0, i) for i in range(4000)]
    assert statistics.median(draws) == pytest.approx(256, rel=0.1)
    assert max(draws) == 4096 and min(draws) >= 1  # the cap is reached: the tail is cut there
    p99 = sorted(draws)[int(0.99 * len(draws))]
    assert p99 > 6 * 256  # log-σ 1: the 99th percentile ~10 × the median (before the cap)
    assert [request_max_tokens(a, 0, i) for i in range(50)] == draws[:50]  # a prompt keeps its budget
    assert draws[:50] != [request_max_tokens(a, 1, i) for i in range(50)]  # the seed changes them
    fixed = load_config("tiny-cpu", {"actor.max_tokens": 64}).actor
    assert {request_max_tokens(fixed, 0, i) for i in range(20)} == {64}
    with pytest.raises(ConfigError, match=r"actor.length_median \(100\) exceeds actor.max_tokens \(64\)"):
        load_config("tiny-cpu", {"actor.max_tokens": 64, "actor.length_median": 100})
