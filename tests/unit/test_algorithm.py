"""The BroRL update functions against direct transcriptions of the formulas, plus properties."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.algorithm import (
    dynamic_sampling_mask,
    pass_rate,
    policy_loss,
    reinforce_pp_advantages,
    scaled_lr,
)

KW = dict(eps_low=0.2, eps_high=0.28, tis_cap=2.0)


# ---------- direct transcriptions (loops, float64, no vectorisation tricks) ----------

def ref_keep(correct):
    return [0 < sum(row) < len(row) for row in correct]


def ref_adv(R, keep):
    G, N = len(R), len(R[0])
    A = [[R[g][i] - sum(R[g]) / N for i in range(N)] if keep[g] else None for g in range(G)]
    flat = [a for g in range(G) if keep[g] for a in A[g]]
    out = [[0.0] * N for _ in range(G)]
    if not flat:
        return out
    mu = sum(flat) / len(flat)
    sd = math.sqrt(sum((a - mu) ** 2 for a in flat) / len(flat))
    for g in range(G):
        if keep[g]:
            out[g] = [(a - mu) / (sd + 1e-8) for a in A[g]]
    return out


def ref_loss(logp, old, behav, adv, mask, eps_low, eps_high, cap, agg, kl_coef=0.0, ref=None):
    S, T = len(logp), len(logp[0])
    tot, n, seq_means = 0.0, 0, []
    for s in range(S):
        st_, sn = 0.0, 0
        for t in range(T):
            if not mask[s][t]:
                continue
            r = math.exp(logp[s][t] - old[s][t])
            w = min(math.exp(old[s][t] - behav[s][t]), cap)
            clipped = min(max(r, 1 - eps_low), 1 + eps_high)
            l = -w * min(r * adv[s], clipped * adv[s])
            if kl_coef:
                d = min(max(ref[s][t] - logp[s][t], -20.0), 20.0)
                l += kl_coef * min(math.exp(d) - d - 1, 10.0)
            tot += l
            n += 1
            st_ += l
            sn += 1
        if sn:
            seq_means.append(st_ / sn)
    return tot / n if agg == "token-mean" else sum(seq_means) / len(seq_means)


def rand_batch(S, T, seed, spread=0.3, pad=True):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(S, T, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = old + torch.randn(S, T, generator=g, dtype=torch.float64) * spread
    behav = old + torch.randn(S, T, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(S, generator=g, dtype=torch.float64)
    mask = torch.ones(S, T, dtype=torch.bool)
    if pad:
        lens = torch.randint(1, T + 1, (S,), generator=g)
        mask = torch.arange(T)[None, :] < lens[:, None]
        logp = torch.where(mask, logp, torch.full_like(logp, float("nan")))  # padding holds garbage
    return logp, old, behav, adv, mask


# ---------- dynamic sampling ----------

def test_dynamic_sampling_matches_formula():
    g = torch.Generator().manual_seed(0)
    correct = torch.rand(50, 8, generator=g) < torch.rand(50, 1, generator=g)
    correct[0] = True
    correct[1] = False
    keep = dynamic_sampling_mask(correct)
    assert keep.tolist() == ref_keep(correct.tolist())
    assert not keep[0] and not keep[1]
    assert pass_rate(keep, 8) == pytest.approx(keep.float().mean().item())


@pytest.mark.parametrize("bad", [torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, dtype=torch.bool)])
def test_dynamic_sampling_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="correct"):
        dynamic_sampling_mask(bad)


# ---------- advantages ----------

@pytest.mark.parametrize("G,N,seed", [(1, 2, 0), (4, 16, 1), (16, 8, 2), (3, 512, 3)])
def test_advantages_match_formula(G, N, seed):
    g = torch.Generator().manual_seed(seed)
    R = (torch.rand(G, N, generator=g) < 0.5).float() + 0.1 * torch.rand(G, N, generator=g)
    keep = dynamic_sampling_mask(torch.rand(G, N, generator=g) < 0.5)
    keep[0] = True
    got = reinforce_pp_advantages(R, keep)
    want = torch.tensor(ref_adv(R.double().tolist(), keep.tolist()), dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_advantages_all_correct_all_wrong_and_zero_variance():
    R = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    correct = R > 0.5
    keep = dynamic_sampling_mask(correct)
    assert keep.tolist() == [False, False, True]
    adv = reinforce_pp_advantages(R, keep)
    assert (adv[:2] == 0).all()
    # kept groups whose centred rewards are all equal (zero variance across the batch) give 0, not NaN
    R2 = torch.tensor([[1.0, 1.0], [0.5, 0.5]])
    adv2 = reinforce_pp_advantages(R2, torch.tensor([True, True]))
    assert torch.isfinite(adv2).all() and (adv2 == 0).all()
    assert (reinforce_pp_advantages(R, torch.zeros(3, dtype=torch.bool)) == 0).all()


def test_advantages_reject_bad_input():
    with pytest.raises(ValueError, match="keep"):
        reinforce_pp_advantages(torch.zeros(3, 4), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="rewards"):
        reinforce_pp_advantages(torch.tensor([[float("nan"), 1.0]]), torch.ones(1, dtype=torch.bool))


@settings(max_examples=60, deadline=None)
@given(
    G=st.integers(1, 8),
    N=st.integers(2, 32),
    seed=st.integers(0, 10_000),
    p=st.floats(0.05, 0.95),
)
def test_advantage_properties(G, N, seed, p):
    g = torch.Generator().manual_seed(seed)
    correct = torch.rand(G, N, generator=g) < p
    R = correct.float()
    keep = dynamic_sampling_mask(correct)
    adv = reinforce_pp_advantages(R, keep)
    assert (adv[~keep] == 0).all()
    if keep.any():
        a = adv[keep].double()
        assert abs(a.mean().item()) < 1e-5
        # binary rewards in a kept group always have variance, so the normalised std is 1
        assert a.std(correction=0).item() == pytest.approx(1.0, abs=1e-4)


# ---------- policy loss ----------

@pytest.mark.parametrize("S,T,seed,agg", [(1, 1, 0, "token-mean"), (4, 7, 1, "token-mean"),
                                          (8, 16, 2, "seq-mean"), (32, 5, 3, "seq-mean")])
def test_policy_loss_matches_formula(S, T, seed, agg):
    logp, old, behav, adv, mask = rand_batch(S, T, seed, spread=0.4)
    loss, m = policy_loss(logp, old, behav, adv, mask, loss_agg=agg, **KW)
    want = ref_loss(logp.tolist(), old.tolist(), behav.tolist(), adv.tolist(), mask.tolist(),
                    0.2, 0.28, 2.0, agg)
    assert loss.item() == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert 0 <= m["clip_frac_low"] <= 1 and 0 <= m["clip_frac_high"] <= 1
    assert m["tis_mean"] <= 2.0 and m["mismatch_kl"] >= 0 and m["approx_kl"] >= 0


def test_policy_loss_with_k3_kl_matches_formula():
    logp, old, behav, adv, mask = rand_batch(6, 9, 7)
    ref = old + 0.1
    loss, m = policy_loss(logp, old, behav, adv, mask, kl_coef=0.05, ref_logp=ref, **KW)
    want = ref_loss(logp.tolist(), old.tolist(), behav.tolist(), adv.tolist(), mask.tolist(),
                    0.2, 0.28, 2.0, "token-mean", 0.05, ref.tolist())
    assert loss.item() == pytest.approx(want, rel=1e-9)
    assert m["ref_kl"] > 0


def test_kl_is_zero_when_reference_equals_policy():
    logp, old, behav, adv, mask = rand_batch(5, 6, 3, pad=False)
    _, m = policy_loss(logp, old, behav, adv, mask, kl_coef=0.1, ref_logp=logp.clone(), **KW)
    assert m["ref_kl"] == pytest.approx(0.0, abs=1e-12)


def _grad(logp, old, behav, adv, mask, **kw):
    lp = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(lp, old, behav, adv, mask, **{**KW, **kw})
    loss.backward()
    return lp.grad


def test_clip_higher_gradients():
    old = torch.full((4, 1), -1.0, dtype=torch.float64)
    behav = old.clone()
    mask = torch.ones(4, 1, dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    # ratios: 1.35 (> 1+eps_high), 1.1, 0.7 (< 1-eps_low), 0.9
    logp = old + torch.log(torch.tensor([[1.35], [1.1], [0.7], [0.9]], dtype=torch.float64))
    g = _grad(logp, old, behav, adv, mask)
    assert g[0, 0] == 0  # positive advantage above 1+eps_high: no gradient
    assert g[2, 0] == 0  # negative advantage below 1-eps_low: no gradient
    assert g[1, 0] < 0 and g[3, 0] > 0  # inside the trust region: descent raises / lowers logp
    _, m = policy_loss(logp, old, behav, adv, mask, **KW)
    assert m["clip_frac_high"] == 0.25 and m["clip_frac_low"] == 0.25
    # the same ratio 1.25 is clipped under symmetric 0.2 but not under clip-higher 0.28
    logp2 = old + math.log(1.25)
    assert _grad(logp2, old, behav, adv, mask)[0, 0] != 0
    assert _grad(logp2, old, behav, adv, mask, eps_high=0.2)[0, 0] == 0


def test_tis_weight_is_capped_and_detached():
    old = torch.zeros(3, 2, dtype=torch.float64) - 1
    behav = old - torch.tensor([[5.0], [0.0], [-1.0]], dtype=torch.float64)  # π_old/μ = e^5, 1, e^-1
    mask = torch.ones(3, 2, dtype=torch.bool)
    adv = torch.ones(3, dtype=torch.float64)
    g = _grad(old.clone(), old, behav, adv, mask)
    # gradient on a token = −w·Â/#tokens at ratio 1; w = min(π_old/μ, cap)
    torch.testing.assert_close(-g[:, 0] * 6, torch.tensor([2.0, 1.0, math.exp(-1)], dtype=torch.float64))
    _, m = policy_loss(old, old, behav, adv, mask, **KW)
    assert m["tis_clip_frac"] == pytest.approx(1 / 3)


@settings(max_examples=80, deadline=None)
@given(S=st.integers(1, 6), T=st.integers(1, 8), seed=st.integers(0, 10_000),
       cap=st.floats(1.0, 5.0), spread=st.floats(0.0, 3.0))
def test_policy_loss_properties(S, T, seed, cap, spread):
    logp, old, behav, adv, mask = rand_batch(S, T, seed, spread=spread)
    loss, m = policy_loss(logp, old, behav, adv, mask, eps_low=0.2, eps_high=0.3, tis_cap=cap)
    assert math.isfinite(loss.item())
    assert m["tis_mean"] <= cap + 1e-12  # the TIS weight never exceeds tis_cap
    # with old = behaviour = current, each token's gradient has the sign of its advantage
    cur = old.clone()
    g = _grad(cur, cur, cur, adv, mask, eps_low=0.2, eps_high=0.3, tis_cap=cap)
    for s in range(S):
        gs = g[s][mask[s]]
        if adv[s] > 0:
            assert (gs < 0).all()  # descent direction −g raises logp of positive-advantage tokens
        elif adv[s] < 0:
            assert (gs > 0).all()
        assert (g[s][~mask[s]] == 0).all()


def test_dropped_groups_contribute_no_gradient():
    logp, old, behav, _, mask = rand_batch(6, 5, 11, pad=False)
    R = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])  # group 0 all-correct: dropped
    keep = dynamic_sampling_mask(R > 0.5)
    adv = reinforce_pp_advantages(R, keep).reshape(-1).double()
    g = _grad(logp, old, behav, adv, mask)
    assert (g[:3] == 0).all() and (g[3:] != 0).any()


@pytest.mark.parametrize(
    "mutate, name",
    [
        (lambda a: a.__setitem__("logp", a["logp"].clone().fill_(float("nan"))), "logp"),
        (lambda a: a.__setitem__("old_logp", a["old_logp"].clone().fill_(float("inf"))), "old_logp"),
        (lambda a: a.__setitem__("behav_logp", a["behav_logp"][:, :2]), "behav_logp"),
        (lambda a: a.__setitem__("advantages", a["advantages"][:1]), "advantages"),
        (lambda a: a.__setitem__("mask", torch.zeros_like(a["mask"])), "empty batch"),
        (lambda a: a.__setitem__("mask", a["mask"].float()), "mask"),
    ],
)
def test_policy_loss_rejects_bad_input(mutate, name):
    logp, old, behav, adv, mask = rand_batch(3, 4, 0, pad=False)
    args = dict(logp=logp, old_logp=old, behav_logp=behav, advantages=adv, mask=mask)
    mutate(args)
    with pytest.raises(ValueError, match=name):
        policy_loss(**args, **KW)


def test_policy_loss_rejects_bad_hyperparameters():
    logp, old, behav, adv, mask = rand_batch(2, 2, 0, pad=False)
    with pytest.raises(ValueError, match="eps_high"):
        policy_loss(logp, old, behav, adv, mask, eps_low=0.3, eps_high=0.2, tis_cap=2.0)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, old, behav, adv, mask, kl_coef=0.1, **KW)


def test_scaled_lr():
    assert scaled_lr(1e-6, 8192, 65536) == pytest.approx(1e-6 * np.sqrt(8))
    assert scaled_lr(3e-4, 128, 128) == 3e-4
    for bad in [(0, 1, 1), (1e-3, 0, 1), (1e-3, 1, -5)]:
        with pytest.raises(ValueError):
            scaled_lr(*bad)


def test_k3_kl_is_clamped_so_one_far_token_cannot_swamp_the_loss():
    """A token whose reference log-prob is 100 nats above the policy's: unclamped, exp(100) ≈ 2.7e43 would
    swamp (or overflow) the loss; clamped, its k3 term is at most 10 and the gradient stays finite."""
    S, T = 2, 3
    logp = torch.full((S, T), -2.0, requires_grad=True)
    old = torch.full((S, T), -2.0)
    mask = torch.ones(S, T, dtype=torch.bool)
    ref = old.clone()
    ref[0, 0] = 98.0  # d = ref − logp = 100
    loss, m = policy_loss(logp, old, old.clone(), torch.zeros(S), mask, kl_coef=1.0, ref_logp=ref, **KW)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert loss.item() == pytest.approx(10.0 / (S * T))  # the far token contributes exactly the cap
    assert m["ref_kl"] == pytest.approx(10.0 / (S * T))
