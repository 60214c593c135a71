"""Adaptive rollouts (`job.rollouts = "adaptive"`): the wave rule, groups of varying size through the
learner's algorithm, and what the rule does to the policy gradient, against its closed form.

The synthetic problem: a prompt answered right with probability p = sigmoid(θ). A completion's score
function is d/dθ log π(y) = r − p, so one group's REINFORCE estimate with the group-mean baseline is
g = Σ_i A_i (r_i − p) = K (n − K) / n for K correct of n — whose mean over groups of a fixed n is
(n − 1) p (1 − p), (n − 1) times the true gradient p (1 − p). Under the adaptive rule a group is either a
settled first wave (g = 0) or a full group of N whose first wave was mixed, so
E[g] = Σ_{k1 = 1}^{n0 − 1} Σ_{k2} Bin(k1; n0, p) Bin(k2; N − n0, p) (k1 + k2)(N − k1 − k2) / N."""

from math import comb

import pytest
import torch

from config.job import JobConfig
from learner.algorithm import dynamic_sampling_mask, group_advantages, pass_rate, reinforce_pp_advantages


def test_the_rule_stops_a_settled_first_wave_and_completes_a_mixed_one():
    job = JobConfig(n_samples=64, rollouts="adaptive", first_wave=8)
    assert job.first_wave_size() == 8 and job.group_sizes() == {8, 64}
    assert job.next_wave_size([True] * 8) == 0 and job.next_wave_size([False] * 8) == 0
    assert job.next_wave_size([True] + [False] * 7) == 56
    assert job.next_wave_size([True, False] * 32) == 0  # complete
    fixed = JobConfig(n_samples=64)
    assert fixed.first_wave_size() == 64 and fixed.next_wave_size([True, False] * 4) == 0 and fixed.group_sizes() == {64}
    with pytest.raises(ValueError, match="job.first_wave = 64 must be below job.n_samples = 64"):
        JobConfig(n_samples=64, rollouts="adaptive", first_wave=64)


def test_the_step_sample_budget_lets_a_second_wave_start_only_if_it_fits_the_versions_count():
    from actors.stats import WaveBudget
    from config.loader import load_config

    b = WaveBudget(100)
    for _ in range(4):
        b.charge(3, 16)  # four first waves under version 3: 64 used
    assert b.fits(3, 36) and not b.fits(3, 37)  # a second wave of 36 fits, one of 37 would pass 100
    b.charge(3, 36)
    assert not b.fits(3, 1) and b.fits(4, 100) and b.used == 0  # a new version, a new count
    assert WaveBudget(0).fits(3, 10**9)  # 0: no budget
    with pytest.raises(ValueError, match="job.step_sample_budget = 64 caps adaptive rollouts"):
        JobConfig(n_samples=32, step_sample_budget=64)
    assert JobConfig(n_samples=32, rollouts="adaptive", first_wave=4, step_sample_budget=64).step_sample_budget == 64
    with pytest.raises(ValueError, match="run.reproducible with job.step_sample_budget = 64"):
        load_config("tiny-cpu", {"run.reproducible": True, "job.max_staleness": 0, "job.rollouts": "adaptive",
                                 "job.first_wave": 4, "job.step_sample_budget": 64})


def test_groups_of_varying_size_get_their_own_baseline_and_padding_gets_nothing():
    R = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 9.0, 9.0]])
    valid = torch.tensor([[True] * 4, [True] * 4, [True, True, False, False]])
    correct = (R > 0.5) & valid
    keep = dynamic_sampling_mask(correct, valid)
    assert keep.tolist() == [True, True, True]  # the small group: 1 of 2 right, mixed (its padding ignored)
    assert dynamic_sampling_mask(torch.tensor([[True, True, True]]), torch.tensor([[True, True, False]])).tolist() == [False]
    a = group_advantages(R, valid)
    assert a[2].tolist() == [0.5, -0.5, 0.0, 0.0] and a[0].tolist() == [0.75, -0.25, -0.25, -0.25]
    adv = reinforce_pp_advantages(R, keep, valid)
    assert (adv[~valid] == 0).all()
    x = a[valid]
    torch.testing.assert_close(adv[valid], (x - x.mean()) / (x.std(correction=0) + 1e-8))
    # the same groups without padding give what they gave before groups could differ in size
    same = reinforce_pp_advantages(R[:2], keep[:2])
    torch.testing.assert_close(same, reinforce_pp_advantages(R[:2], keep[:2], valid[:2]))
    assert pass_rate(torch.tensor([True, False]), torch.tensor([64, 8])) == pytest.approx(64 / 72)
    with pytest.raises(ValueError, match="valid has a group without any completion"):
        reinforce_pp_advantages(R, keep, valid & False)


def closed_form(p: float, n0: int, N: int) -> float:
    m = N - n0
    return sum(comb(n0, k1) * p**k1 * (1 - p)**(n0 - k1) * comb(m, k2) * p**k2 * (1 - p)**(m - k2)
               * (k1 + k2) * (N - k1 - k2) / N for k1 in range(1, n0) for k2 in range(m + 1))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9])
def test_the_adaptive_estimators_expected_gradient_is_the_closed_form(p):
    """Monte Carlo of the real rule (JobConfig.next_wave_size) and the real advantages (group_advantages after
    dynamic sampling) against the closed form, within 4 standard errors; fixed N as the method's check."""
    n0, N, P = 4, 16, 40_000
    job = JobConfig(n_samples=N, rollouts="adaptive", first_wave=n0)
    gen = torch.Generator().manual_seed(int(p * 1000))
    r = (torch.rand(P, N, generator=gen) < p)
    # the rule reads only how many of the first wave were right: ask it once per count
    by_count = torch.tensor([n0 + job.next_wave_size([True] * k + [False] * (n0 - k)) for k in range(n0 + 1)])
    sizes = by_count[r[:, :n0].sum(dim=1)]
    valid = torch.arange(N) < sizes[:, None]
    for v, expect in ((valid, closed_form(p, n0, N)), (torch.ones_like(valid), (N - 1) * p * (1 - p))):
        keep = dynamic_sampling_mask(r & v, v)
        a = group_advantages(r.float(), v) * keep[:, None]
        g = (a * (r.float() - p) * v).sum(dim=1)
        se = g.std().item() / P**0.5
        assert abs(g.mean().item() - expect) < 4 * se + 1e-9, (p, g.mean().item(), expect, se)
    # what the rule saves and what it costs: samples per prompt, and the gradient against fixed N's
    saved = 1 - sizes.float().mean().item() / N
    settled = p**n0 + (1 - p)**n0
    assert saved == pytest.approx(settled * (N - n0) / N, abs=0.01)
    bias = 1 - closed_form(p, n0, N) / ((N - 1) * p * (1 - p))
    assert 0 < bias < settled  # only prompts whose first wave agreed lose their share, and not all of it


@pytest.mark.parametrize("rollouts,ok", [("fixed", {8}), ("adaptive", {2, 8})])
def test_the_learner_takes_the_sizes_the_rule_makes_and_refuses_others_by_name(rollouts, ok):
    import numpy as np

    from config.loader import load_config
    from learner.validation import GroupValidator
    from transport import wire

    cfg = load_config("tiny-cpu", {"job.n_samples": 8, "job.rollouts": rollouts, "job.first_wave": 2})
    v = GroupValidator(cfg, vocab_size=100)

    def group(n):
        c = np.arange(n) % 2
        return wire.RolloutGroup(group_id="a0:1:0", prompt_id=0, actor_id="a0", policy_version=0, verifier="v",
                                 verifier_version="1", prompt_ids=np.array([1, 2], np.int32),
                                 lengths=np.full(n, 3, np.int32), tokens=np.ones(3 * n, np.int32),
                                 logprobs=np.full(3 * n, -1.0, np.float32), rewards=c.astype(np.float32),
                                 correct=c.astype(np.uint8), finish=np.zeros(n, np.uint8))

    for n in (1, 2, 5, 8, 9):
        problem = v.check(group(n), version=0, next_prompt=1, task_verifier=None, reward_range=(0.0, 1.0))
        assert (problem == "") == (n in ok), (n, problem)
        if n not in ok:
            assert problem.startswith("n_samples: ") and str(n) in problem
            assert ("job.first_wave" in problem) == (rollouts == "adaptive")


def test_a_step_trains_groups_of_different_sizes(tiny_model_dir):
    """A full group of 8, a mixed first wave of 2 and a settled one of 2 (as `dynamic_sampling = false`
    or a later rule could send): each is its own baseline's, samples counted (with or without the settled
    one: which groups train is the batcher's dynamic sampling's choice)."""
    from transformers import AutoModelForCausalLM

    from config.schema import JobConfig as Job, LearnerConfig
    from learner.planning import TrainGroup
    from learner.train_step import Trainer
    from tests.support.train_fixtures import fixed_groups

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, eos = fixed_groups(tiny_model_dir, groups=2, model=model)
    g = groups[1]
    wave = TrainGroup(g.prompt_ids, g.completion_ids[:2], g.behav_logp[:2], g.rewards[:2], g.correct[:2])
    settled = TrainGroup(g.prompt_ids, g.completion_ids[:1] * 2, g.behav_logp[:1] * 2, [1.0] * 2, [True] * 2)
    job = Job(n_samples=8, prompts_per_step=3, rollouts="adaptive", first_wave=2)
    for keep, samples in (([groups[0], wave], 10), ([groups[0], wave, settled], 12)):  # the batcher's choice
        tr = Trainer(model, LearnerConfig(num_minibatches=2), job, pad_id=eos)
        m = tr.step(keep)
        assert m["groups_kept"] == len(keep) and m["samples"] == samples, m
        assert all(torch.isfinite(torch.tensor(v)) for v in m.values() if isinstance(v, float)), m
