"""The BroRL update as pure functions (paper section 3; docs/architecture.md, "The algorithm").

Names follow the paper: `eps_low`, `eps_high` (clip-higher), `tis_cap` (C of truncated importance
sampling), `pass_rate` (dynamic-sampling pass rate). Shapes: G groups, N completions per group,
S = samples in a mini-batch, T = padded response length.

    keep = dynamic_sampling_mask(rewards or correct)      # bool[G] (the learner's batcher decides per group)
    adv  = reinforce_pp_advantages(rewards, keep)         # float[G, N]
    pen  = overlong_penalty(lengths, max_tokens, buffer)   # float[G, N], added to rewards (DAPO)
    loss, metrics = policy_loss(logp, old_logp, behav_logp, adv_of_samples, mask, ...)
    lr   = scaled_lr(base_lr, base_batch, batch)
"""

from __future__ import annotations

import math

import torch

ADV_EPS = 1e-8  # ε in Â = (A − mean A) / (std A + ε)


def _valid(x: torch.Tensor, valid: torch.Tensor | None, name: str) -> torch.Tensor:
    """`valid` (bool[G, N]: which of a group's N slots hold a completion; groups of varying size, padded),
    checked against `x`; all True when None (every group has N)."""
    if valid is None:
        return torch.ones(x.shape, dtype=torch.bool)
    if valid.shape != x.shape or valid.dtype != torch.bool:
        raise ValueError(f"valid must be bool{list(x.shape)} like {name}, got {valid.dtype}{list(valid.shape)}")
    if not valid.any(dim=1).all():
        raise ValueError("valid has a group without any completion")
    return valid


def dynamic_sampling_mask(signal: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """DAPO dynamic sampling: keep group g iff its completions' `signal` values are not all equal.

    signal:  bool[G, N]  correctness: keep iff 0 < #correct(g) < N(g); or
             float[G, N] rewards: keep iff they differ within g (partial credit: an all-incorrect group
                         scored 0.2 and 0.8 carries signal). `learner.dynamic_sampling_metric` picks which.
    valid:   bool[G, N]  groups of varying size (`job.rollouts = "adaptive"`): which slots hold one.
    returns: bool[G]     True for groups that carry a learning signal.
    """
    if signal.ndim != 2:
        raise ValueError(f"signal (correct or rewards) must be [G, N], got shape {tuple(signal.shape)}")
    if signal.dtype != torch.bool and not signal.is_floating_point():
        raise ValueError(f"signal must be bool (correct) or float (rewards), got {signal.dtype}")
    valid = _valid(signal, valid, "signal")
    if signal.dtype == torch.bool:
        n_correct = (signal & valid).sum(dim=1)
        return (n_correct > 0) & (n_correct < valid.sum(dim=1))
    inf = torch.tensor(float("inf"), dtype=signal.dtype)
    return torch.where(valid, signal, -inf).amax(dim=1) > torch.where(valid, signal, inf).amin(dim=1)


def drop_reason(rewards, correct, metric: str) -> str:
    """Why dynamic sampling drops one group ("" keeps it): "all_correct", "all_wrong" or, under the "reward"
    metric, "equal_reward" (equal rewards, correctness mixed). rewards: float[N], correct: bool[N]."""
    if metric not in DS_METRICS:
        raise ValueError(f"dynamic sampling metric must be one of {DS_METRICS}, got {metric!r}")
    c = torch.as_tensor(correct, dtype=torch.bool)[None]
    signal = c if metric == "correct" else torch.as_tensor(rewards, dtype=torch.float64)[None]
    if dynamic_sampling_mask(signal)[0]:
        return ""
    n = int(c.sum())
    return "all_correct" if n == c.shape[1] else "all_wrong" if n == 0 else "equal_reward"


DS_METRICS = ("reward", "correct")


def pass_rate(keep: torch.Tensor, sizes: int | torch.Tensor) -> float:
    """Dynamic-sampling pass rate: kept samples / generated samples (paper table 4). `sizes`: every group's
    N, or one N for all."""
    if keep.numel() == 0:
        return 0.0
    sizes = torch.as_tensor(sizes, dtype=torch.float64).expand(keep.shape)
    return float(sizes[keep].sum().item()) / float(sizes.sum().item())


def reinforce_pp_advantages(rewards: torch.Tensor, keep: torch.Tensor, valid: torch.Tensor | None = None, *,
                            trained: torch.Tensor | None = None, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE++-baseline advantages.

    A[g, i] = R[g, i] − mean_i R[g, i] (the mean over group g's own completions, however many it has, those
    masked out of the loss included); then Â = (A − m) / (s + 1e-8), with m and s the mean and population std
    (ddof = 0) of A over the samples that train: kept groups' completions that `trained` marks (default:
    all), each weighted by `tokens` (its response tokens: whitening over tokens, as OpenRLHF's REINFORCE++)
    or by 1 (whitening over samples, the default). Dropped groups, and the padding of groups smaller than N,
    get 0.

    rewards: float[G, N]; keep: bool[G]; valid, trained: bool[G, N] or None; tokens: float[G, N] or None
      ->  float[G, N]
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be float[G, N], got shape {tuple(rewards.shape)}")
    if keep.shape != rewards.shape[:1]:
        raise ValueError(f"keep must be bool[G] with G = {rewards.shape[0]}, got shape {tuple(keep.shape)}")
    if keep.dtype != torch.bool:
        raise ValueError(f"keep must have dtype bool, got {keep.dtype}")
    valid = _valid(rewards, valid, "rewards")
    if trained is not None and (trained.shape != rewards.shape or trained.dtype != torch.bool):
        raise ValueError(f"trained must be bool{list(rewards.shape)} like rewards, got {trained.dtype}{list(trained.shape)}")
    if tokens is not None and (tokens.shape != rewards.shape or (tokens < 0).any()):
        raise ValueError(f"tokens must be [G, N] counts >= 0 like rewards, got shape {tuple(tokens.shape)}")
    if not torch.isfinite(rewards[valid]).all():
        raise ValueError("rewards contains NaN or inf")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    out = torch.zeros_like(rewards)
    if not keep.any():
        return out
    a, v = group_advantages(rewards[keep], valid[keep]), valid[keep]
    t = v if trained is None else v & trained[keep]
    w = (torch.ones_like(a) if tokens is None else tokens[keep].to(a.dtype))[t]
    if w.sum() > 0:
        x = a[t]
        mean = (w * x).sum() / w.sum()
        std = ((w * (x - mean) ** 2).sum() / w.sum()).sqrt()
        a[v] = (a[v] - mean) / (std + ADV_EPS)
    else:  # nothing trains: no statistics to whiten by, nothing uses these values
        a[v] = 0.0
    out[keep] = a
    return out


def group_advantages(rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A[g, i] = R[g, i] − the mean of group g's valid rewards; 0 on padding. float[G, N], bool[G, N]."""
    r = torch.where(valid, rewards, torch.zeros((), dtype=rewards.dtype))
    return torch.where(valid, r - r.sum(dim=1, keepdim=True) / valid.sum(dim=1, keepdim=True), 0.0)


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to max_tokens − buffer tokens, then falling linearly to
    −penalty at max_tokens (a completion cannot be longer: the engine stops it there).

    lengths: int[G, N] completion lengths  ->  float[G, N] added to the rewards
    """
    if not 0 < buffer < max_tokens:
        raise ValueError(f"buffer must be in (0, max_tokens = {max_tokens}), got {buffer}")
    over = (lengths.to(torch.float32) - (max_tokens - buffer)).clamp(min=0.0, max=float(buffer))
    return -penalty * over / buffer


def scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """Square-root learning-rate scaling (paper 4.2): η = η0 · sqrt(B / B0), batches in samples."""
    if not base_lr > 0:
        raise ValueError(f"base_lr must be > 0, got {base_lr}")
    if base_batch <= 0:
        raise ValueError(f"base_batch must be > 0 samples, got {base_batch}")
    if batch <= 0:
        raise ValueError(f"batch must be > 0 samples, got {batch}")
    return base_lr * math.sqrt(batch / base_batch)


KL_LOG_RATIO_MAX = 20.0  # |log π_ref/πθ| beyond this is clipped before exp() in the k3 term
KL_TOKEN_MAX = 10.0  # and each token's k3 value is capped here (as verl's low_var_kl)


def _check_token_tensor(name: str, t: torch.Tensor, shape: torch.Size, mask: torch.Tensor) -> None:
    if t.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} like logp, got {tuple(t.shape)}")
    if not torch.isfinite(t[mask]).all():
        raise ValueError(f"{name} contains NaN or inf on response tokens")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    tis_cap: float,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    loss_agg: str = "token-mean",
    entropy: torch.Tensor | None = None,
    dual_clip_c: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO with clip-higher, weighted by truncated importance sampling, plus optional k3 KL and
    dual-clip.

    logp:       float[S, T]  log πθ(y_t) — carries the gradient
    old_logp:   float[S, T]  log π_old(y_t), the learner's policy at the start of the step
    behav_logp: float[S, T]  log μ(y_t), reported by the actor that sampled y_t
    advantages: float[S]     Â of each sample, broadcast to its response tokens
    mask:       bool[S, T]   True on response tokens
    ref_logp:   float[S, T]  log π_ref(y_t), needed when kl_coef > 0
    entropy:    float[S, T]  per-token entropy of πθ (metrics only), optional

    Per token:  r_t = exp(logp − old_logp)
                w_t = min(exp(old_logp − behav_logp), tis_cap)          (detached)
                ℓ_t = −w_t · min(r_t Â, clip(r_t, 1 − eps_low, 1 + eps_high) Â)
                      (dual-clip, dual_clip_c = c > 1: for Â < 0 the min is raised to at least c Â,
                       so a token whose ratio ran past c cannot push the loss without bound; 0: off)
                      + kl_coef · min(exp(d) − d − 1, 10),  d = clip(ref − logp, ±20)  (k3, clamped:
                        one token the policy has moved far from the reference cannot swamp the loss)
    Aggregation: "token-mean" = Σ ℓ_t / #tokens over the mini-batch; "seq-mean" = mean over samples
    of each sample's token mean.
    """
    if eps_high < eps_low:
        raise ValueError(f"eps_high ({eps_high}) must be >= eps_low ({eps_low})")
    if not 0 <= eps_low < 1:
        raise ValueError(f"eps_low must be in [0, 1), got {eps_low}")
    if tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {tis_cap}")
    if dual_clip_c and not dual_clip_c > 1:
        raise ValueError(f"dual_clip_c must be > 1 (or 0: off), got {dual_clip_c}")
    if loss_agg not in ("token-mean", "seq-mean"):
        raise ValueError(f"loss_agg must be 'token-mean' or 'seq-mean', got {loss_agg!r}")
    if logp.ndim != 2:
        raise ValueError(f"logp must be float[S, T], got shape {tuple(logp.shape)}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask must have shape {tuple(logp.shape)} like logp, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must have dtype bool, got {mask.dtype}")
    if logp.shape[0] == 0 or not mask.any():
        raise ValueError("empty batch: mask selects no response token")
    _check_token_tensor("logp", logp, logp.shape, mask)
    _check_token_tensor("old_logp", old_logp, logp.shape, mask)
    _check_token_tensor("behav_logp", behav_logp, logp.shape, mask)
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be float[S] with S = {logp.shape[0]}, got {tuple(advantages.shape)}")
    if not torch.isfinite(advantages).all():
        raise ValueError("advantages contains NaN or inf")
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when kl_coef > 0")
        _check_token_tensor("ref_logp", ref_logp, logp.shape, mask)

    m = mask.to(logp.dtype)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Padding positions may hold anything: neutralise them before exp() so no inf/NaN leaks into grads.
    logp_ = torch.where(mask, logp, zero)
    old = torch.where(mask, old_logp, zero).detach()
    behav = torch.where(mask, behav_logp, zero).detach()
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)

    log_ratio = logp_ - old
    ratio = torch.exp(log_ratio)
    raw_w = torch.exp(old - behav)
    w = torch.clamp(raw_w, max=tis_cap)
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    surr = torch.minimum(surr1, surr2)
    if dual_clip_c:
        surr = torch.where(adv < 0, torch.maximum(surr, dual_clip_c * adv), surr)
    per_token = -w * surr

    kl_tok = None
    if kl_coef > 0:
        d = torch.clamp(torch.where(mask, ref_logp, zero).detach() - logp_, -KL_LOG_RATIO_MAX, KL_LOG_RATIO_MAX)
        kl_tok = torch.clamp(torch.exp(d) - d - 1.0, max=KL_TOKEN_MAX)
        per_token = per_token + kl_coef * kl_tok

    n_tok = m.sum()
    if loss_agg == "token-mean":
        loss = (per_token * m).sum() / n_tok
    else:
        per_seq_tokens = m.sum(dim=1)
        has = per_seq_tokens > 0
        loss = ((per_token * m).sum(dim=1)[has] / per_seq_tokens[has]).mean()

    with torch.no_grad():

        def tok_mean(x: torch.Tensor) -> float:
            return float(((x * m).sum() / n_tok).item())

        pos, neg = (adv > 0).expand_as(mask), (adv < 0).expand_as(mask)
        log_mu_over_old = behav - old  # k3 estimator of KL(μ ‖ π_old) with samples from μ
        metrics = {
            "clip_frac_high": tok_mean((pos & (ratio > 1 + eps_high)).to(m.dtype)),
            "clip_frac_low": tok_mean((neg & (ratio < 1 - eps_low)).to(m.dtype)),
            "tis_mean": tok_mean(w),
            "tis_clip_frac": tok_mean((raw_w > tis_cap).to(m.dtype)),
            "mismatch_kl": tok_mean(torch.exp(-log_mu_over_old) - 1 + log_mu_over_old),
            "approx_kl": tok_mean(ratio - 1 - log_ratio),
            "ratio_mean": tok_mean(ratio),
            "pg_loss": tok_mean(-w * surr),
            "train_tokens": float(n_tok.item()),
        }
        if dual_clip_c:
            metrics["dual_clip_frac"] = tok_mean((neg & (ratio > dual_clip_c)).to(m.dtype))
        if kl_tok is not None:
            metrics["ref_kl"] = tok_mean(kl_tok)
        if entropy is not None:
            metrics["entropy"] = tok_mean(entropy)
    return loss, metrics
