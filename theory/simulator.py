"""Token-level simulator of paper section 4.1.

A single "prompt" whose answer is one token from a vocabulary of d tokens; a set P of correct tokens has
reward +1, every other token −1. The policy is p = softmax(z / τ) over free logits z. Each step draws N
i.i.d. tokens from p, centres their rewards with the batch baseline b = mean_j R_j, and takes one AdamW
step on the linear (TRPO-style) surrogate

    L_sur = −(1/N) Σ_j (R_j − b) · p_{y_j}.

After every step it records Q_pos = Σ_{i∈P} p_i, the percentage of correct tokens whose probability rose
relative to step 0, and the worst probability drop among correct tokens (knowledge shrinkage).

Initialisation: "seeded" (the default) sets z_i = 3 for i ∈ P and an anchor z_0 = 5 on an incorrect
token, everything else 0; "uniform" leaves all logits at 0. From uniform logits, AdamW at η = 1e-3
barely moves Q_pos in 1000 steps for any N (the correct mass is 10,000/128,000 and each logit moves at
most ~η per step), so that run shows little; both are offered.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

PAPER_NS = (4, 8, 16, 512, 51200)


@dataclass(frozen=True)
class SimConfig:
    vocab: int = 128_000
    """d, vocabulary size (paper: 128,000)."""
    n_correct: int = 10_000
    """|P|, number of correct tokens (paper: 10,000)."""
    ns: tuple[int, ...] = PAPER_NS
    """Rollout sizes N to compare (paper: 4, 8, 16, 512, 51200)."""
    steps: int = 1000
    """T, optimizer steps (paper: 1000)."""
    lr: float = 1e-3
    """η, AdamW learning rate (paper: 1e-3)."""
    weight_decay: float = 0.01
    """AdamW weight decay (torch's default; the paper does not give one)."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """Optimizer on the logits (paper: AdamW)."""
    init: Literal["seeded", "uniform"] = "seeded"
    """Logit initialisation: seeded (z_P = 3, anchor z_0 = 5) or uniform (all 0)."""
    seed_logit: float = 3.0
    """Initial logit of correct tokens under seeded initialisation (paper: 3)."""
    anchor_logit: float = 5.0
    """Initial logit of the anchor token 0, an incorrect token (paper: 5)."""
    tau: float = 1.0
    """Softmax temperature τ (paper: 1)."""
    seed: int = 0
    """Seed of the correct set and of the sampling."""


@dataclass
class Trajectory:
    n: int
    q_pos: list[float] = field(default_factory=list)
    pct_increased: list[float] = field(default_factory=list)
    worst_drop: list[float] = field(default_factory=list)
    """max_{i∈P} (p_i(0) − p_i(t)), clipped at 0: the largest probability any correct token lost."""
    worst_rel_drop: list[float] = field(default_factory=list)
    """max_{i∈P} (1 − p_i(t)/p_i(0)), clipped at 0."""


def correct_set(cfg: SimConfig) -> torch.Tensor:
    """bool[d]: the correct tokens P, a random subset that never contains the anchor token 0."""
    if not 0 < cfg.n_correct < cfg.vocab:
        raise ValueError(f"n_correct must be in (0, vocab), got {cfg.n_correct} of {cfg.vocab}")
    g = torch.Generator().manual_seed(cfg.seed)
    idx = torch.randperm(cfg.vocab - 1, generator=g)[: cfg.n_correct] + 1
    mask = torch.zeros(cfg.vocab, dtype=torch.bool)
    mask[idx] = True
    return mask


def initial_logits(cfg: SimConfig, is_correct: torch.Tensor) -> torch.Tensor:
    z = torch.zeros(cfg.vocab, dtype=torch.float64)
    if cfg.init == "seeded":
        z[is_correct] = cfg.seed_logit
        z[0] = cfg.anchor_logit
    return z


def simulate_one(cfg: SimConfig, n: int) -> Trajectory:
    """Run T steps at rollout size n; returns the per-step trajectory (entry 0 is step 0)."""
    if n < 1:
        raise ValueError(f"N must be >= 1, got {n}")
    is_correct = correct_set(cfg)
    reward = torch.where(is_correct, 1.0, -1.0).to(torch.float64)
    z = initial_logits(cfg, is_correct).requires_grad_(True)
    opt = (torch.optim.AdamW([z], lr=cfg.lr, weight_decay=cfg.weight_decay) if cfg.optimizer == "adamw"
           else torch.optim.SGD([z], lr=cfg.lr))
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + n)
    with torch.no_grad():
        p0 = torch.softmax(z / cfg.tau, 0)[is_correct].clone()
    traj = Trajectory(n)
    _record(traj, p0, p0)
    for _ in range(cfg.steps):
        p = torch.softmax(z / cfg.tau, 0)
        with torch.no_grad():
            ys = torch.multinomial(p.detach(), n, replacement=True, generator=g)
            r = reward[ys]
            r_tilde = r - r.mean()
        loss = -(r_tilde * p[ys]).sum() / n
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            _record(traj, p0, torch.softmax(z / cfg.tau, 0)[is_correct])
    return traj


def _record(traj: Trajectory, p0: torch.Tensor, pc: torch.Tensor) -> None:
    traj.q_pos.append(float(pc.sum()))
    traj.pct_increased.append(float((pc > p0).double().mean() * 100))
    traj.worst_drop.append(float(torch.clamp((p0 - pc).max(), min=0)))
    traj.worst_rel_drop.append(float(torch.clamp((1 - pc / p0).max(), min=0)))


def simulate(cfg: SimConfig) -> list[Trajectory]:
    return [simulate_one(cfg, n) for n in cfg.ns]


def config_dict(cfg: SimConfig) -> dict:
    return asdict(cfg)
