"""A step's plan: everything before the model runs. REINFORCE++-baseline advantages (of the groups the batcher's
dynamic sampling kept: the one filter, `learner.batching`), the
shuffle into `num_minibatches` mini-batches, every rank's micro-batches of each (`learner/microbatch.py`) and
the step's model FLOPs (`learner/flops.py`). Rank 0 plans; each rank runs its `RankShare`
(`learner/train_step.py`). Tokens stay in arrays from the wire on (`FlatGroup`, `learner.batch.SampleTable`):
the plan's Python work is per group and per sample, never per token."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from config.schema import LearnerConfig
from learner.algorithm import overlong_penalty, reinforce_pp_advantages
from learner.batch import SampleTable
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
    def from_wire(cls, g: wire.RolloutGroup) -> "FlatGroup":
        """The trainer's view of a received group: its arrays as they came (`FlatGroup`), no list per token."""
        return FlatGroup.from_wire(g)

    def flat(self) -> "FlatGroup":
        lens = np.array([len(c) for c in self.completion_ids], np.int64)
        cat = lambda rows, dt: (np.concatenate([np.asarray(r, dt).ravel() for r in rows])  # noqa: E731
                                if len(rows) else np.zeros(0, dt))
        return FlatGroup(np.asarray(self.prompt_ids, np.int32), cat(self.completion_ids, np.int32),
                         cat(self.behav_logp, np.float32), lens, np.asarray(self.rewards, np.float32),
                         np.asarray(self.correct, bool), self.version,
                         np.asarray(self.truncated if self.truncated is not None else [False] * len(lens), bool))


@dataclass
class FlatGroup:
    """One prompt and its N completions as arrays, the wire's layout (`transport/messages.py`): the
    completions concatenated, `lengths` cutting them. What the learner trains on (`TrainGroup.flat` turns the
    list form into it)."""

    prompt_ids: np.ndarray
    """int32[P]."""
    tokens: np.ndarray
    """int32[T] — the N completions, concatenated."""
    logprobs: np.ndarray
    """float32[T] — log μ of each token."""
    lengths: np.ndarray
    """int64[N] — completion lengths, sum T."""
    rewards: np.ndarray
    """float32[N]."""
    correct: np.ndarray
    """bool[N]."""
    version: int = 0
    truncated: np.ndarray | None = None
    """bool[N] — cut at `actor.max_tokens`; None: none was."""

    def __post_init__(self) -> None:
        n = len(self.lengths)
        if self.truncated is None:
            self.truncated = np.zeros(n, bool)
        for name in ("rewards", "correct", "truncated"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"FlatGroup.{name} has {len(getattr(self, name))} entries for {n} completions")
        total = int(np.sum(self.lengths))
        if len(self.tokens) != total or len(self.logprobs) != total:
            raise ValueError(f"FlatGroup: {len(self.tokens)} tokens and {len(self.logprobs)} log-probs for "
                             f"completions of {total} tokens")

    @classmethod
    def from_wire(cls, g: wire.RolloutGroup) -> "FlatGroup":
        return cls(g.prompt_ids, g.tokens, g.logprobs, g.lengths.astype(np.int64), g.rewards,
                   g.correct.astype(bool), g.policy_version, g.finish == LENGTH)

    @property
    def n(self) -> int:
        return len(self.lengths)

    @property
    def starts(self) -> np.ndarray:
        """int64[N] — where each completion starts in `tokens`."""
        return np.cumsum(self.lengths) - self.lengths

    @property
    def completion_ids(self) -> list[np.ndarray]:
        return np.split(self.tokens, np.cumsum(self.lengths)[:-1]) if self.n else []

    @property
    def behav_logp(self) -> list[np.ndarray]:
        return np.split(self.logprobs, np.cumsum(self.lengths)[:-1]) if self.n else []


def as_flat(g: "TrainGroup | FlatGroup") -> FlatGroup:
    return g if isinstance(g, FlatGroup) else g.flat()


def plan_step(groups: list[TrainGroup | FlatGroup], cfg: LearnerConfig, *, world: int, generator: torch.Generator,
              max_tokens: int, lr: float, shape: ModelShape, reuse_old: bool, reference: bool,
              multiple: int = 1, floor: int = 0) -> tuple[dict[str, float], list[RankShare]]:
    """The step's group-level metrics (and `_model_flops`, its model FLOPs: π_old of the first mini-batch not
    counted with `reuse_old`, the reference forward with `reference`) and every rank's share: its samples as
    flat arrays (`learner.batch.SampleTable`) and its micro-batches, rows of them. `multiple`, `floor`: how
    the trainer pads a pass (`logprobs.pack`), which the micro-batches' cuts take into account."""
    if not groups:
        raise ValueError("groups is empty: a step needs at least one group")
    groups = [as_flat(g) for g in groups]
    # groups may differ in size (`job.rollouts = "adaptive"`): [G, N] tensors padded to the largest, `valid`
    # marking the completions
    sizes = torch.tensor([g.n for g in groups])
    valid = torch.arange(int(sizes.max())) < sizes[:, None]

    def padded(rows: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(valid.shape, dtype=dtype)
        out[valid] = torch.from_numpy(np.concatenate(rows)).to(dtype)
        return out

    rewards = padded([g.rewards for g in groups], torch.float32)
    correct = padded([g.correct for g in groups], torch.bool)
    lengths = padded([g.lengths for g in groups], torch.long)
    cut = padded([g.truncated for g in groups], torch.bool)
    prompt_lens = np.array([len(g.prompt_ids) for g in groups], np.int64)
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
        "prompt_len_mean": float(prompt_lens.mean()),
        "prompt_len_min": float(prompt_lens.min()),
        "reward_mean": rewards[valid].mean().item(),
        "accuracy": correct[valid].float().mean().item(),
        "groups": float(len(groups)),
        "groups_kept": float(keep.sum().item()),
        "lr": lr,
    }
    if not torch.isfinite(adv[keep]).all():  # e.g. rewards so large that their spread overflows
        metrics.update(nonfinite_skipped=float(cfg.num_minibatches), step_skipped=1.0, grad_norm=float("nan"))
        return metrics, [RankShare([], skip=True)] * world
    # the samples trained, in group order: overlong filtering keeps a cut completion in its group's baseline and
    # out of the loss; an empty completion has no token to train (and none to count)
    masked_cut = valid & keep[:, None] & cut if cfg.overlong_filter else torch.zeros_like(valid)
    chosen = (valid & keep[:, None] & ~masked_cut & (lengths > 0)).numpy()
    metrics["overlong_masked"] = float(masked_cut.sum().item())
    group_of, member = np.nonzero(chosen)  # row-major: group order, then completion order
    if not len(group_of):  # every completion empty or masked: nothing to train, the step only moves the version
        metrics.update(step_empty=1.0, samples=0.0)
        return metrics, [RankShare([], skip=True)] * world
    comp_len = lengths.numpy()[group_of, member]
    sample_adv = adv.numpy()[group_of, member].astype(np.float32)
    S = len(group_of)
    metrics["samples"] = float(S)
    order = torch.randperm(S, generator=generator)
    mbs = [order[i::cfg.num_minibatches] for i in range(cfg.num_minibatches)]
    mbs = [mb.sort().values for mb in mbs if len(mb)]
    metrics["minibatches"] = float(len(mbs))
    first = set(mbs[0].tolist()) if reuse_old else set()
    seq = prompt_lens[group_of] + comp_len
    metrics["_model_flops"] = step_flops(shape, list(zip(seq.tolist(), comp_len.tolist())), first, reference)
    seq_len = seq.tolist()
    unit = comp_len if cfg.loss_agg == "token-mean" else (comp_len > 0).astype(np.int64)
    shared = (group_of.tolist(), prompt_lens[group_of].tolist()) if cfg.share_prompt else (None, None)
    passes: list[list[list[tuple[list[int], float]]]] = [[] for _ in range(world)]  # rank -> mini-batch -> passes
    for mb in mbs:
        idx = mb.tolist()
        if len(idx) < world:
            raise ValueError(f"a mini-batch of {len(idx)} samples cannot be split over {world} ranks")
        total = int(unit[idx].sum())  # the whole mini-batch's (all ranks') tokens or sequences: the loss's divisor
        parts = [idx[slice(*rank_slice(len(idx), r, world))] for r in range(world)]
        micro = [micro_batches(p, seq_len, cfg.micro_batch_tokens, *shared, multiple=multiple, floor=floor,
                               packed=cfg.packing) for p in parts]
        count = max(len(m) for m in micro)  # the same on every rank: collectives stay in step
        for r in range(world):
            mine = []
            for mi in even_out(micro[r], count):
                w = world * int(unit[mi].sum()) / total if mi is not None else 0.0
                mine.append((mi if mi is not None else micro[r][0][:1], w))  # None: a pass that weighs 0
            passes[r].append(mine)
    groups_of = (group_of, member, comp_len, sample_adv)
    return metrics, [_share(groups, groups_of, passes[r]) for r in range(world)]


def _share(groups: list[FlatGroup], samples, passes) -> RankShare:
    """A rank's share: the samples its passes use as a `SampleTable`, each pass as rows of it."""
    group_of, member, comp_len, sample_adv = samples
    used = np.unique(np.concatenate([np.asarray(ids, np.int64) for mb in passes for ids, _ in mb]))
    gs = np.unique(group_of[used])
    prompts = [groups[g].prompt_ids for g in gs]
    starts = {int(g): groups[g].starts for g in gs}
    tokens, behav = [], []
    for i in used.tolist():  # one slice (a view) per sample, then one copy of them all
        g, a = int(group_of[i]), int(starts[int(group_of[i])][member[i]])
        tokens.append(groups[g].tokens[a: a + comp_len[i]])
        behav.append(groups[g].logprobs[a: a + comp_len[i]])
    table = SampleTable(prompts=np.concatenate(prompts), prompt_off=_offsets([len(p) for p in prompts]),
                        tokens=np.concatenate(tokens), behav=np.concatenate(behav),
                        comp_off=_offsets(comp_len[used]), prompt_of=np.searchsorted(gs, group_of[used]),
                        adv=sample_adv[used])
    return RankShare([[Micro(np.searchsorted(used, np.asarray(ids, np.int64)), w) for ids, w in mb]
                      for mb in passes], table=table)


def _offsets(lengths) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, np.int64)
    out[1:] = np.cumsum(lengths)
    return out


def rank_slice(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous part of n samples: sizes differ by at most one, none empty if n >= world."""
    return rank * n // world, (rank + 1) * n // world
