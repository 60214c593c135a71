"""The learner's micro-batches: sorted by length and cut where the passes compute the fewest positions."""

import random

import pytest

from bench.padding import greedy_cuts as greedy
from learner.microbatch import PASS_TOKENS, micro_batches


def cost(runs, seq_len, multiple=1, floor=0, pass_tokens=PASS_TOKENS):
    """Positions a step's passes compute (each padded to its longest, rounded up and floored) plus a pass's cost."""
    return sum(max(len(r) * -(-max(seq_len[i] for i in r) // multiple) * multiple, floor) + pass_tokens for r in runs)


def test_the_cuts_pad_less_than_cutting_at_the_budget():
    # one long sample, then many of half its length: cutting at the budget puts a short one beside the long one,
    # padded to its length; the cheapest cuts leave the long one alone, in as many passes
    seq_len = [40, 20, 20, 20, 20]
    assert greedy(range(5), seq_len, 100) == [[0, 1], [2, 3, 4]]
    assert micro_batches(list(range(5)), seq_len, 100, pass_tokens=0) == [[0], [1, 2, 3, 4]]
    assert cost([[0], [1, 2, 3, 4]], seq_len) < cost([[0, 1], [2, 3, 4]], seq_len)


@pytest.mark.parametrize("seed", range(20))
def test_every_sample_once_in_budget_and_never_costlier_than_greedy(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    seq_len = [min(4096, max(8, int(rng.lognormvariate(5.5, 1.0)))) for _ in range(n)]
    idx = sorted(rng.sample(range(n), rng.randint(1, n)))
    budget = rng.choice([2048, 8192, 32768])
    multiple, floor = rng.choice([(1, 0), (8, 4096)])
    runs = micro_batches(idx, seq_len, budget, multiple=multiple, floor=floor)
    assert sorted(i for r in runs for i in r) == idx
    flat = [i for r in runs for i in r]  # runs are consecutive pieces of the longest-first order
    assert flat == sorted(idx, key=lambda i: (-seq_len[i], i))
    assert all(len(r) == 1 or len(r) * max(seq_len[i] for i in r) <= budget for r in runs)
    assert cost(runs, seq_len, multiple, floor) <= cost(greedy(idx, seq_len, budget), seq_len, multiple, floor)


def test_a_pass_costs_something_so_equal_lengths_share_a_pass_and_small_passes_are_floored():
    seq_len = [10] * 8
    assert micro_batches(list(range(8)), seq_len, 80) == [list(range(8))]  # one pass of 80, not eight of 10
    # a floor of 64 positions a pass: two passes of 4 × 10 would compute 128; one of 8 × 10 computes 80
    assert micro_batches(list(range(8)), seq_len, 80, pass_tokens=0, floor=64) == [list(range(8))]
    assert micro_batches([], seq_len, 80) == []
