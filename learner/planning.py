"""A step's plan: everything before the model runs. REINFORCE++-baseline advantages (of the groups the batcher's
dynamic sampling kept: the one filter, `learner.batching`), the
shuffle into `num_minibatches` mini-batches, every rank's micro-batches of each (`learner/microbatch.py`) and
the step's model FLOPs (`learner/flops.py`). Rank 0 plans; each rank runs its `RankShare`
(`learner/train_step.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from config.schema import LearnerConfig
from learner.algorithm import overlong_penalty, reinforce_pp_advantages
from learner.flops import ModelShape, step_flops
from learner.microbatch import Micro, RankShare, even_out, micro_batches
from transport import wire

LENGTH = wire.FINISH_REASONS.index("length")


@dataclass
class TrainGroup:
    """One prompt and its N completions, as the trainer takes them (`from_wire`: from an actor's group)."""

    prompt_ids: list[int]
    """Prompt token ids."""
    completion_ids: list[list[int]]
    """N completions, token ids each."""
    behav_logp: list[list[float]]
    """N lists: log μ(y_t) of each sampled token, as reported by the actor."""
    rewards: list[float]
    """N rewards."""
    correct: list[bool]
    """N correctness flags (dynamic sampling and accuracy use these)."""
    version: int = 0
    """Policy version that generated the group."""
    truncated: list[bool] | None = None
    """N flags: the completion was cut at `actor.max_tokens` (finish reason "length"); None: none was."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        for name in ("behav_logp", "rewards", "correct"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrainGroup.{name} has {len(getattr(self, name))} entries for {n} completions")
        for i, (c, b) in enumerate(zip(self.completion_ids, self.behav_logp)):
            if len(c) != len(b):
                raise ValueError(f"TrainGroup.behav_logp[{i}] has {len(b)} values for {len(c)} tokens")

    @classmethod
    def from_wire(cls, g: wire.RolloutGroup) -> "TrainGroup":
        """The trainer's view of a received group (token ids and behaviour log-probs split per completion)."""
        return cls(prompt_ids=g.prompt_ids.tolist(), completion_ids=[c.tolist() for c in g.completions()],
                   behav_logp=[c.tolist() for c in g.completion_logprobs()], rewards=g.rewards.tolist(),
                   correct=[bool(c) for c in g.correct], version=g.policy_version,
                   truncated=[bool(f == LENGTH) for f in g.finish])



def plan_step(groups: list[TrainGroup], cfg: LearnerConfig, *, world: int, generator: torch.Generator,
              max_tokens: int, lr: float, shape: ModelShape, reuse_old: bool, reference: bool,
              multiple: int = 1, floor: int = 0) -> tuple[dict[str, float], list[RankShare]]:
    """The step's group-level metrics (and `_model_flops`, its model FLOPs: π_old of the first mini-batch not
    counted with `reuse_old`, the reference forward with `reference`) and every rank's share. `multiple`,
    `floor`: how the trainer pads a pass (`logprobs.pack`), which the micro-batches' cuts take into account."""
    if not groups:
        raise ValueError("groups is empty: a step needs at least one group")
    # groups may differ in size (`job.rollouts = "adaptive"`): [G, N] tensors padded to the largest, `valid`
    # marking the completions
    sizes = torch.tensor([len(g.rewards) for g in groups])
    valid = torch.arange(int(sizes.max())) < sizes[:, None]

    def padded(rows: list[list], dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(valid.shape, dtype=dtype)
        out[valid] = torch.tensor([x for row in rows for x in row], dtype=dtype)
        return out

    rewards = padded([g.rewards for g in groups], torch.float32)
    correct = padded([g.correct for g in groups], torch.bool)
    lengths = padded([[len(c) for c in g.completion_ids] for g in groups], torch.long)
    cut = padded([g.truncated or [False] * len(g.rewards) for g in groups], torch.bool)
    if cfg.overlong_buffer:  # DAPO's soft overlong punishment, on the reward before the baseline
        rewards = rewards + overlong_penalty(lengths, max_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
    keep = torch.ones(len(groups), dtype=torch.bool)  # dynamic sampling chose these groups (learner.batching)
    # Â's statistics over what trains: completions masked by overlong filtering, and empty ones, stay in their
    # group's baseline but not in the mean and std (`learner.advantage_whitening`: per sample or per token)
    trained = valid & (lengths > 0) & ~(cut if cfg.overlong_filter else torch.zeros_like(cut))
    adv = reinforce_pp_advantages(rewards, keep, valid, trained=trained,
                                  tokens=lengths if cfg.advantage_whitening == "tokens" else None)
    metrics: dict[str, float] = {
        "truncated_frac": cut[valid].float().mean().item(),  # of the batch's completions: cut at actor.max_tokens
        "completion_len_mean": lengths[valid].float().mean().item(), "completion_len_max": float(lengths.max().item()),
        "prompt_len_mean": sum(len(g.prompt_ids) for g in groups) / len(groups),
        "prompt_len_min": float(min(len(g.prompt_ids) for g in groups)),
        "reward_mean": rewards[valid].mean().item(),
        "accuracy": correct[valid].float().mean().item(),
        "groups": float(len(groups)),
        "groups_kept": float(keep.sum().item()),
        "lr": lr,
    }
    if not torch.isfinite(adv[keep]).all():  # e.g. rewards so large that their spread overflows
        metrics.update(nonfinite_skipped=float(cfg.num_minibatches), step_skipped=1.0, grad_norm=float("nan"))
        return metrics, [RankShare([], skip=True)] * world
    prompts, comps, behav, sample_adv, group_of = [], [], [], [], []
    masked = 0
    for gi, g in enumerate(groups):
        if not keep[gi]:
            continue
        for i in range(len(g.rewards)):
            if cfg.overlong_filter and cut[gi, i]:
                masked += 1  # overlong filtering: in its group's baseline, out of the loss
                continue
            if not g.completion_ids[i]:
                continue  # an empty completion has no token to train (and none to count)
            prompts.append(g.prompt_ids)
            comps.append(g.completion_ids[i])
            behav.append(g.behav_logp[i])
            sample_adv.append(adv[gi, i].item())
            group_of.append(gi)
    metrics["overlong_masked"] = float(masked)
    if not prompts:  # every completion empty or masked: nothing to train, the step only moves the version
        metrics.update(step_empty=1.0, samples=0.0)
        return metrics, [RankShare([], skip=True)] * world
    S = len(prompts)
    metrics["samples"] = float(S)
    order = torch.randperm(S, generator=generator)
    mbs = [order[i::cfg.num_minibatches] for i in range(cfg.num_minibatches)]
    mbs = [mb.sort().values for mb in mbs if len(mb)]
    metrics["minibatches"] = float(len(mbs))
    first = set(mbs[0].tolist()) if reuse_old else set()
    metrics["_model_flops"] = step_flops(shape, [(len(p) + len(c), len(c)) for p, c in zip(prompts, comps)],
                                         first, reference)
    seq_len = [len(p) + len(c) for p, c in zip(prompts, comps)]
    shares = [RankShare([]) for _ in range(world)]
    for mb in mbs:
        idx = mb.tolist()
        if len(idx) < world:
            raise ValueError(f"a mini-batch of {len(idx)} samples cannot be split over {world} ranks")
        unit = {i: len(comps[i]) if cfg.loss_agg == "token-mean" else int(len(comps[i]) > 0) for i in idx}
        total = sum(unit.values())  # the whole mini-batch's (all ranks') tokens or sequences: the loss's divisor
        parts = [idx[slice(*rank_slice(len(idx), r, world))] for r in range(world)]
        shared = (group_of, [len(p) for p in prompts]) if cfg.share_prompt else (None, None)
        micro = [micro_batches(p, seq_len, cfg.micro_batch_tokens, *shared, multiple=multiple, floor=floor)
                 for p in parts]
        count = max(len(m) for m in micro)  # the same on every rank: collectives stay in step
        for r in range(world):
            passes = []
            for mi in even_out(micro[r], count):
                mine = sum(unit[i] for i in mi) if mi is not None else 0
                mi = mi if mi is not None else micro[r][0][:1]  # a pass that weighs 0
                passes.append(Micro([prompts[i] for i in mi], [comps[i] for i in mi], [behav[i] for i in mi],
                                    [sample_adv[i] for i in mi], world * mine / total))
            shares[r].minibatches.append(passes)
    return metrics, shares


def rank_slice(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous part of n samples: sizes differ by at most one, none empty if n >= world."""
    return rank * n // world, (rank + 1) * n // world
