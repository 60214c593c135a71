"""Theorem 1 and Lemma 1 of the paper (section 2, appendix A), as checkable functions.

Theorem 1 (sign of correct-mass change). One gradient step of size η on the linear surrogate
L = −(1/N) Σ_i R_i p_i, where R_i = R_c for sampled correct tokens (set A), R_w for sampled incorrect
ones (set B) and 0 for unsampled ones (U), moves the logits by Δz_j = (η/N) p_j (R_j − S_R) with
S_R = R_c P_pos + R_w P_neg, and to first order changes the correct mass by

    ΔQ_pos = (η/N) [ (R_c − S_R) Q_neg A_2                      (sampled correct,   ≥ 0)
                   + (S_R − R_w) Q_pos B_2                      (sampled incorrect, ≥ 0)
                   + S_R (Q_pos U_neg,2 − Q_neg U_pos,2) ]      (unsampled coupling, either sign)

`theorem1_terms` evaluates the three terms; `exact_delta_q` applies the logit step and measures the
true change of Σ_{i∈P} softmax(z)_i in float64. Their difference is O(η²).

Lemma 1. A token of probability p is missed by all of N i.i.d. draws with probability (1 − p)^N, so
E[U_2] = Σ_i p_i² (1 − p_i)^N, which decreases monotonically in N.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MassTerms:
    sampled_correct: float
    """(η/N)(R_c − S_R) Q_neg A_2 — never negative."""
    sampled_incorrect: float
    """(η/N)(S_R − R_w) Q_pos B_2 — never negative."""
    unsampled_coupling: float
    """(η/N) S_R (Q_pos U_neg,2 − Q_neg U_pos,2) — either sign; shrinks as N grows."""
    s_r: float
    """S_R = R_c P_pos + R_w P_neg."""

    @property
    def total(self) -> float:
        return self.sampled_correct + self.sampled_incorrect + self.unsampled_coupling


def _rewards(is_correct: torch.Tensor, sampled: torch.Tensor, r_c: float, r_w: float) -> torch.Tensor:
    if r_c < 0 or r_w > 0:
        raise ValueError(f"Theorem 1 assumes R_c >= 0 >= R_w, got R_c={r_c}, R_w={r_w}")
    r = torch.zeros(is_correct.shape, dtype=torch.float64)
    r[sampled & is_correct] = r_c
    r[sampled & ~is_correct] = r_w
    return r


def theorem1_terms(
    z: torch.Tensor, is_correct: torch.Tensor, sampled: torch.Tensor, *, r_c: float, r_w: float,
    eta: float, n: int,
) -> MassTerms:
    """The closed form of Theorem 1. z: float[V] logits; is_correct, sampled: bool[V]."""
    p = torch.softmax(z.to(torch.float64), 0)
    a, b = sampled & is_correct, sampled & ~is_correct
    u_pos, u_neg = ~sampled & is_correct, ~sampled & ~is_correct
    q_pos = p[is_correct].sum()
    q_neg = 1 - q_pos
    s_r = r_c * p[a].sum() + r_w * p[b].sum()
    a2, b2 = (p[a] ** 2).sum(), (p[b] ** 2).sum()
    up2, un2 = (p[u_pos] ** 2).sum(), (p[u_neg] ** 2).sum()
    k = eta / n
    return MassTerms(
        sampled_correct=float(k * (r_c - s_r) * q_neg * a2),
        sampled_incorrect=float(k * (s_r - r_w) * q_pos * b2),
        unsampled_coupling=float(k * s_r * (q_pos * un2 - q_neg * up2)),
        s_r=float(s_r),
    )


def exact_delta_q(
    z: torch.Tensor, is_correct: torch.Tensor, sampled: torch.Tensor, *, r_c: float, r_w: float,
    eta: float, n: int,
) -> float:
    """Q_pos(z + Δz) − Q_pos(z) with Δz_j = (η/N) p_j (R_j − S_R), computed exactly in float64."""
    z = z.to(torch.float64)
    p = torch.softmax(z, 0)
    r = _rewards(is_correct, sampled, r_c, r_w)
    s_r = (r * p).sum()
    dz = (eta / n) * p * (r - s_r)
    return float(torch.softmax(z + dz, 0)[is_correct].sum() - p[is_correct].sum())


def surrogate_gradient_step(z: torch.Tensor, is_correct: torch.Tensor, sampled: torch.Tensor, *,
                            r_c: float, r_w: float, eta: float, n: int) -> torch.Tensor:
    """Δz from autograd on L = −(1/N) Σ_i R_i p_i (a check that the appendix's Δz is its gradient)."""
    z = z.to(torch.float64).clone().requires_grad_(True)
    r = _rewards(is_correct, sampled, r_c, r_w)
    loss = -(r * torch.softmax(z, 0)).sum() / n
    loss.backward()
    return -eta * z.grad


def expected_unsampled_second_moment(p: torch.Tensor, n: int) -> float:
    """Lemma 1 / corollary: E[Σ_{i unsampled} p_i²] = Σ_i p_i² (1 − p_i)^N."""
    p = p.to(torch.float64)
    return float((p**2 * (1 - p) ** n).sum())


def mc_unsampled_second_moment(p: torch.Tensor, n: int, trials: int, seed: int = 0) -> tuple[float, float]:
    """Monte-Carlo estimate of E[U_2] after N i.i.d. draws: (mean, standard error)."""
    g = torch.Generator().manual_seed(seed)
    p = p.to(torch.float64)
    vals = torch.empty(trials, dtype=torch.float64)
    for t in range(trials):
        drawn = torch.zeros(p.shape, dtype=torch.bool)
        drawn[torch.multinomial(p, n, replacement=True, generator=g)] = True
        vals[t] = (p[~drawn] ** 2).sum()
    return float(vals.mean()), float(vals.std() / trials**0.5)
