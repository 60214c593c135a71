"""One learner step written out eagerly: one rank, no compile, no packing, no micro-batches, each sample its
own forward, every formula inline. It is the definition the fast path (`learner.planning`, `learner.train_step`,
`learner.logprobs`) is tested against (tests/unit/test_reference.py); read it for the algorithm in one place
(docs/architecture.md, "The algorithm"). Not covered here: the k3 KL term (`learner.kl_coef`), `seq-mean`.
"""

from __future__ import annotations

import torch

from config.schema import LearnerConfig
from learner.planning import TrainGroup


def sample_logp(model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float = 1.0):
    """log π(y_t | prompt, y_<t) of each completion token: float[T], with gradients."""
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def reference_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, groups: list[TrainGroup],
                   cfg: LearnerConfig, *, max_tokens: int = 0, temperature: float = 1.0) -> list[dict]:
    """Train one step on `groups` (the batcher's kept groups). Returns per mini-batch its loss and the gradient
    it applied, {parameter name: grad}, before clipping."""
    if cfg.kl_coef or cfg.loss_agg != "token-mean":
        raise ValueError("the reference step covers kl_coef = 0 and loss_agg = 'token-mean' only")
    samples = []  # (prompt, completion, log μ, A, weight in the whitening)
    for g in groups:
        R = torch.tensor(g.rewards, dtype=torch.float32)
        n = torch.tensor([len(c) for c in g.completion_ids], dtype=torch.float32)
        if cfg.overlong_buffer:  # DAPO's soft overlong punishment, on the reward before the baseline
            over = (n - (max_tokens - cfg.overlong_buffer)).clamp(0, cfg.overlong_buffer)
            R = R - cfg.overlong_penalty * over / cfg.overlong_buffer
        A = R - R.mean()  # the group's baseline: all of its completions
        for i, c in enumerate(g.completion_ids):
            if not c or (cfg.overlong_filter and g.truncated and g.truncated[i]):
                continue  # nothing to train, or masked out of the loss (still in the baseline above)
            samples.append((g.prompt_ids, c, g.behav_logp[i], A[i], len(c) if cfg.advantage_whitening == "tokens" else 1))
    w = torch.tensor([s[4] for s in samples], dtype=torch.float32)
    a = torch.stack([s[3] for s in samples])
    mean = (w * a).sum() / w.sum()
    std = ((w * (a - mean) ** 2).sum() / w.sum()).sqrt()  # population std over samples (or tokens)
    adv = (a - mean) / (std + 1e-8)

    gen = torch.Generator().manual_seed(cfg.seed)  # the trainer's shuffle: a fixed number of mini-batches
    order = torch.randperm(len(samples), generator=gen)
    minibatches = [sorted(order[k::cfg.num_minibatches].tolist()) for k in range(cfg.num_minibatches)]
    with torch.no_grad():  # π_old: the policy at the start of the step, for every sample
        old = [sample_logp(model, p, c, temperature) for p, c, *_ in samples]

    out = []
    for mb in filter(None, minibatches):
        tokens = sum(len(samples[i][1]) for i in mb)
        loss = torch.zeros(())
        for i in mb:
            prompt, comp, behav, _, _ = samples[i]
            logp = sample_logp(model, prompt, comp, temperature)
            ratio = torch.exp(logp - old[i])
            tis = torch.clamp(torch.exp(old[i] - torch.tensor(behav)), max=cfg.tis_cap)  # truncated IS, detached
            surr = torch.minimum(ratio * adv[i], torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high) * adv[i])
            if cfg.dual_clip_c and adv[i] < 0:
                surr = torch.maximum(surr, cfg.dual_clip_c * adv[i])
            loss = loss + (-tis * surr).sum() / tokens  # token mean over the whole mini-batch
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        out.append({"loss": loss.detach().item(), "grads": grads})
    return out
