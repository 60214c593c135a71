"""Dynamic sampling's metric and its one filter, what enters Â's statistics, whitening over tokens and
dual-clip: each against a direct transcription or a hand-computed case."""

import math

import numpy as np
import pytest
import torch

from learner.algorithm import drop_reason, dynamic_sampling_mask, policy_loss, reinforce_pp_advantages
from tests.support.transport_helpers import make_group

KW = dict(eps_low=0.2, eps_high=0.28, tis_cap=2.0)


def test_partial_credit_keeps_an_all_incorrect_group_whose_rewards_differ():
    rewards = torch.tensor([[0.2, 0.8, 0.2], [0.5, 0.5, 0.5], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    correct = torch.tensor([[False] * 3, [False] * 3, [True, False, False], [True] * 3])
    assert dynamic_sampling_mask(rewards).tolist() == [True, False, True, False]
    assert dynamic_sampling_mask(correct).tolist() == [False, False, True, False]
    # padding of a smaller group is not a value: [0.3, 0.3 | pad 0.0] carries no signal
    valid = torch.tensor([[True, True, False]])
    assert dynamic_sampling_mask(torch.tensor([[0.3, 0.3, 0.0]]), valid).tolist() == [False]
    assert [drop_reason(r, c, "reward") for r, c in zip(rewards, correct)] == ["", "all_wrong", "", "all_correct"]
    assert [drop_reason(r, c, "correct") for r, c in zip(rewards, correct)] == ["all_wrong", "all_wrong", "",
                                                                                 "all_correct"]
    assert drop_reason([0.5, 0.5], [True, False], "reward") == "equal_reward"
    with pytest.raises(ValueError, match="metric"):
        drop_reason([0.0, 1.0], [False, True], "spread")


def test_the_batcher_is_the_one_filter_and_train_pass_rate_counts_what_trains():
    import asyncio

    from learner.batching import Admission, Batcher

    def group(i, rewards, correct, version=5):
        g = make_group(f"a:{i}", n=len(rewards), version=version, seed=i)
        g.rewards[:], g.correct[:] = rewards, correct
        return g

    back: list[int] = []
    b = Batcher(2, admission=Admission(max_staleness=1), give_back=back.extend)  # metric "reward"
    b.add(group(0, [0.2, 0.8, 0.2, 0.2], [0, 0, 0, 0], version=0))  # kept (partial credit), too stale at step 5
    b.add(group(1, [0.2, 0.8, 0.2, 0.2], [0, 0, 0, 0]))  # kept: all incorrect, rewards differ
    b.add(group(2, [0.5] * 4, [0, 0, 0, 0]))  # dropped: all wrong, equal rewards
    b.add(group(3, [1, 0, 1, 0], [1, 0, 1, 0]))  # kept
    batch = asyncio.run(asyncio.wait_for(b.next_batch(step=5, interrupted=lambda: False), 1.0))
    assert [g.group_id for g in batch.groups] == ["a:1", "a:3"] and back == [0]
    st = batch.stats
    assert (st["drop_all_wrong"], st["drop_all_correct"], st["drop_equal_reward"]) == (1, 0, 0)
    # dynamic sampling kept 3 of 4 groups; the step trains 2 (the stale one left at the batch's admission)
    assert st["pass_rate"] == pytest.approx(12 / 16) and st["train_pass_rate"] == pytest.approx(8 / 16)
    c = Batcher(2, metric="correct")
    c.add(group(4, [0.2, 0.8, 0.2, 0.2], [0, 0, 0, 0]))
    assert not c.kept and c.stats["drop_all_wrong"] == 1


def _whiten(x: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    m = float((w * x).sum() / w.sum())
    return m, math.sqrt(float((w * (x - m) ** 2).sum() / w.sum()))


def test_masked_and_empty_completions_are_in_the_baseline_but_not_in_the_whitening():
    R = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.5]])
    keep = torch.tensor([True, True])
    trained = torch.tensor([[True, True, False, True], [True, False, True, True]])  # one cut, one empty
    got = reinforce_pp_advantages(R, keep, trained=trained)
    A = (R - R.mean(dim=1, keepdim=True)).numpy()  # each group's baseline: all four completions
    m, s = _whiten(A[trained.numpy()], np.ones(int(trained.sum())))
    np.testing.assert_allclose(got.numpy(), (A - m) / (s + 1e-8), rtol=1e-5, atol=1e-6)
    # the statistics differ from whitening over every completion, so the mask matters
    assert not torch.allclose(got, reinforce_pp_advantages(R, keep))


def test_whitening_over_tokens_is_openrlhfs_masked_whitening_of_the_token_tensor():
    """OpenRLHF's REINFORCE++ whitens the [S, T] advantage tensor over its response tokens: the same as each
    sample weighted by its length."""
    g = torch.Generator().manual_seed(3)
    R = torch.rand(3, 4, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, 6, (3, 4), generator=g)
    lengths[0, 0] = 5
    got = reinforce_pp_advantages(R, torch.ones(3, dtype=torch.bool), trained=lengths > 0, tokens=lengths)
    A = (R - R.mean(dim=1, keepdim=True)).reshape(-1)
    per_token = torch.cat([a.repeat(int(n)) for a, n in zip(A, lengths.reshape(-1))])  # the token tensor
    m, s = per_token.mean(), per_token.std(correction=0)
    torch.testing.assert_close(got.reshape(-1), (A - m) / (s + 1e-8))
    over_samples = reinforce_pp_advantages(R, torch.ones(3, dtype=torch.bool), trained=lengths > 0)
    assert not torch.allclose(got, over_samples)


def test_dual_clip_bounds_negative_advantages_at_c():
    old = torch.full((4, 1), -1.0, dtype=torch.float64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    adv = torch.tensor([-1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    r = torch.tensor([[4.0], [2.0], [4.0], [0.5]], dtype=torch.float64)  # ratio past c = 3 for 0 and 2

    def grad_and_loss(**kw):
        lp = (old + torch.log(r)).requires_grad_(True)
        loss, m = policy_loss(lp, old, old, adv, mask, **KW, **kw)
        loss.backward()
        return lp.grad[:, 0], loss.item(), m

    g0, l0, _ = grad_and_loss()
    g3, l3, m = grad_and_loss(dual_clip_c=3.0)
    # per token (w = 1): −min(rÂ, clip(r)Â), raised to c·Â's bound where Â < 0: token 0 is 3, not 4
    want = [-max(min(4 * -1, 1.28 * -1), -3.0), -min(2 * -1, 1.28 * -1), -min(4.0, 1.28), -min(0.5 * -1, 0.8 * -1)]
    assert l3 == pytest.approx(sum(want) / 4) and l0 == pytest.approx((4 + 2 - 1.28 + 0.8) / 4)
    assert g3[0] == 0 and g0[0] != 0  # the bound is flat: no gradient from a ratio past c
    assert torch.equal(g3[1:], g0[1:])  # below c, and for positive advantages, nothing changes
    assert m["dual_clip_frac"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(old, old, old, adv, mask, **KW, dual_clip_c=1.0)


def test_the_settings_load_and_a_bad_dual_clip_is_named():
    from config.loader import load_config

    cfg = load_config("tiny-cpu", {"learner.dual_clip_c": 3.0, "learner.advantage_whitening": "tokens",
                                   "learner.dynamic_sampling_metric": "correct"})
    assert (cfg.learner.dual_clip_c, cfg.learner.advantage_whitening) == (3.0, "tokens")
    assert load_config("tiny-cpu").learner.dynamic_sampling_metric == "reward"
    with pytest.raises(Exception, match="learner.dual_clip_c"):
        load_config("tiny-cpu", {"learner.dual_clip_c": 0.5})
