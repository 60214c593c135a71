import pytest
import torch

from theory.theorems import (
    exact_delta_q,
    expected_unsampled_second_moment,
    mc_unsampled_second_moment,
    surrogate_gradient_step,
    theorem1_terms,
)


def _case(seed, V=400, n_draws=12):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=torch.float64) * 2
    is_correct = torch.rand(V, generator=g) < 0.3
    p = torch.softmax(z, 0)
    sampled = torch.zeros(V, dtype=torch.bool)
    sampled[torch.multinomial(p, n_draws, replacement=True, generator=g)] = True
    return z, is_correct, sampled


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("r_c,r_w", [(1.0, -1.0), (1.0, 0.0), (0.5, -2.0)])
def test_theorem1_error_is_second_order(seed, r_c, r_w):
    z, is_correct, sampled = _case(seed)
    errs = []
    for eta in (1e-1, 1e-2, 1e-3):
        pred = theorem1_terms(z, is_correct, sampled, r_c=r_c, r_w=r_w, eta=eta, n=12)
        exact = exact_delta_q(z, is_correct, sampled, r_c=r_c, r_w=r_w, eta=eta, n=12)
        assert pred.sampled_correct >= 0 and pred.sampled_incorrect >= 0
        assert r_w <= pred.s_r <= r_c
        errs.append(abs(exact - pred.total) / abs(pred.total))
    # relative error of the first-order formula falls ~10x when η falls 10x (O(η²) absolute error)
    assert errs[1] < errs[0] / 8 and errs[2] < errs[1] / 8, errs
    assert errs[2] < 1e-3


def test_appendix_logit_step_is_the_surrogate_gradient():
    z, is_correct, sampled = _case(7)
    dz = surrogate_gradient_step(z, is_correct, sampled, r_c=1.0, r_w=-1.0, eta=0.3, n=12)
    p = torch.softmax(z, 0)
    r = torch.zeros_like(p)
    r[sampled & is_correct], r[sampled & ~is_correct] = 1.0, -1.0
    s_r = (r * p).sum()
    torch.testing.assert_close(dz, 0.3 / 12 * p * (r - s_r))


def test_coupling_term_can_be_negative_and_fades_with_n():
    # a correct token holding much mass goes unsampled in a reward-positive batch: coupling < 0
    V = 50
    z = torch.zeros(V, dtype=torch.float64)
    z[1] = 4.0  # unsampled, correct, concentrated
    is_correct = torch.zeros(V, dtype=torch.bool)
    is_correct[:5] = True
    sampled = torch.zeros(V, dtype=torch.bool)
    sampled[2] = True  # one sampled correct token: S_R > 0
    t = theorem1_terms(z, is_correct, sampled, r_c=1.0, r_w=-1.0, eta=0.1, n=4)
    assert t.s_r > 0 and t.unsampled_coupling < 0
    # sampling the concentrated token (as large N does) removes the negative coupling
    sampled[1] = True
    t2 = theorem1_terms(z, is_correct, sampled, r_c=1.0, r_w=-1.0, eta=0.1, n=4)
    assert t2.unsampled_coupling >= 0 and t2.total > 0


def test_theorem1_rejects_bad_rewards():
    z, is_correct, sampled = _case(0)
    with pytest.raises(ValueError, match="R_c"):
        exact_delta_q(z, is_correct, sampled, r_c=-1.0, r_w=-1.0, eta=0.1, n=3)


@pytest.mark.parametrize("n", [1, 4, 16, 64])
def test_lemma1_monte_carlo(n):
    g = torch.Generator().manual_seed(n)
    p = torch.softmax(torch.randn(60, generator=g, dtype=torch.float64) * 1.5, 0)
    exact = expected_unsampled_second_moment(p, n)
    mean, se = mc_unsampled_second_moment(p, n, trials=4000, seed=n)
    assert abs(mean - exact) < 4 * se + 1e-12, (mean, exact, se)


def test_lemma1_decreases_monotonically_in_n():
    p = torch.softmax(torch.randn(1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64), 0)
    vals = [expected_unsampled_second_moment(p, n) for n in (1, 2, 4, 8, 16, 512, 51200)]
    assert all(a > b for a, b in zip(vals, vals[1:]))
    assert expected_unsampled_second_moment(p, 0) == pytest.approx(float((p**2).sum()))
