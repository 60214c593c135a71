"""One BroRL training step over a batch of groups.

    trainer = Trainer(model, learner_cfg, n_samples=N, temperature=T, pad_id=eos)
    metrics = trainer.step(groups)          # groups: list[TrainGroup], the batch the learner assembled

Inside a step (design.md, "The algorithm, precisely"):
  1. dynamic sampling mask and REINFORCE++-baseline advantages over the step's kept samples;
  2. π_old: the learner's log-probs of every kept sample, recomputed once under no_grad (chunked);
     π_ref likewise when `kl_coef > 0`;
  3. the kept samples are shuffled and cut into `num_minibatches` mini-batches — a fixed number
     whatever N is, so larger N means larger mini-batches (paper 4.2); one optimizer step each, at
     η = η0 · sqrt(B_samples / B0);
  4. every `ref_reset_interval` steps the reference policy is reset to the current one (and, if
     configured, the AdamW state is cleared).
A mini-batch whose loss or gradient norm is not finite is skipped: no optimizer step, weights and AdamW
state untouched; counted in `nonfinite_skipped` (and `step_skipped` = 1 when no mini-batch was left, or
when the advantages themselves are not finite).
With DeepSpeed and several ranks each rank trains on its slice of every mini-batch; its loss is scaled
by its share of the mini-batch's tokens so that the averaged gradient equals the single-process one.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

import torch

from config.schema import LearnerConfig
from learner.algorithm import (
    dynamic_sampling_mask,
    pass_rate,
    policy_loss,
    reinforce_pp_advantages,
    scaled_lr,
)
from learner.backends import Backend, make_backend
from learner.logprobs import pack, token_logprobs
from transport import wire


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
                   correct=[bool(c) for c in g.correct], version=g.policy_version)


@dataclass
class StepState:
    step: int = 0
    """Completed training steps (= current policy version)."""
    ref_model: torch.nn.Module | None = field(default=None, repr=False)


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        cfg: LearnerConfig,
        *,
        n_samples: int,
        temperature: float = 1.0,
        pad_id: int = 0,
        backend: Backend | None = None,
    ):
        self.cfg = cfg
        self.n_samples = n_samples
        self.temperature = temperature
        self.pad_id = pad_id
        self.backend = backend or make_backend(model, cfg)
        self.state = StepState()
        self.samples_per_step = cfg.prompts_per_step * n_samples
        self.lr = scaled_lr(cfg.lr, cfg.lr_base_samples or self.samples_per_step, self.samples_per_step)
        self.backend.set_lr(self.lr)
        if cfg.kl_coef > 0:
            self.state.ref_model = self._frozen_copy()
        self._gen = torch.Generator().manual_seed(cfg.seed)

    @property
    def model(self) -> torch.nn.Module:
        return self.backend.module

    def _frozen_copy(self) -> torch.nn.Module:
        ref = copy.deepcopy(self.model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def reset_reference(self) -> None:
        """Reference policy := current policy (and optionally a fresh optimizer state)."""
        if self.state.ref_model is not None:
            self.state.ref_model.load_state_dict(self.model.state_dict())
        if self.cfg.reset_optimizer_on_ref_reset:
            self.backend.reset_optimizer()

    def state_dict(self) -> dict:
        """Step, optimizer state and the mini-batch shuffling generator: what an exact resume needs."""
        return {"step": self.state.step, "optimizer": self.backend.optimizer.state_dict(),
                "generator": self._gen.get_state()}

    def load_state_dict(self, st: dict) -> None:
        self.state.step = int(st["step"])
        self.backend.optimizer.load_state_dict(st["optimizer"])
        self.backend.set_lr(self.lr)
        self._gen.set_state(st["generator"])

    def _logp(self, model: torch.nn.Module, packed, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.set_grad_enabled(grad):
            return token_logprobs(
                model, packed, temperature=self.temperature, chunk_mb=self.cfg.logprob_chunk_mb
            )

    def step(self, groups: list[TrainGroup]) -> dict[str, float]:
        if not groups:
            raise ValueError("groups is empty: a step needs at least one group")
        self.updates_in_step = 0  # optimizer steps applied so far in this step (0: an exception changed nothing)
        t0 = time.perf_counter()
        cfg, dev = self.cfg, self.cfg.device
        n = len(groups[0].rewards)
        if any(len(g.rewards) != n for g in groups):
            raise ValueError("groups differ in N; one step takes groups of one rollout size")
        rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
        correct = torch.tensor([g.correct for g in groups], dtype=torch.bool)
        keep = dynamic_sampling_mask(correct) if cfg.dynamic_sampling else torch.ones(len(groups), dtype=torch.bool)
        adv = reinforce_pp_advantages(rewards, keep)
        metrics: dict[str, float] = {
            "reward_mean": rewards.mean().item(),
            "accuracy": correct.float().mean().item(),
            "groups": float(len(groups)),
            "groups_kept": float(keep.sum().item()),
            "pass_rate": pass_rate(keep, n),
            "lr": self.lr,
        }
        if not torch.isfinite(adv[keep]).all():  # e.g. rewards so large that their spread overflows
            self.state.step += 1
            metrics.update(nonfinite_skipped=float(cfg.num_minibatches), step_skipped=1.0, grad_norm=float("nan"),
                           train_s=time.perf_counter() - t0)
            return metrics
        prompts, comps, behav, sample_adv = [], [], [], []
        for gi, g in enumerate(groups):
            if not keep[gi]:
                continue
            for i in range(n):
                prompts.append(g.prompt_ids)
                comps.append(g.completion_ids[i])
                behav.append(g.behav_logp[i])
                sample_adv.append(adv[gi, i].item())
        if not prompts:
            raise ValueError("no group survived dynamic sampling: the caller must backfill before a step")
        S = len(prompts)
        order = torch.randperm(S, generator=self._gen)
        mbs = [order[i::cfg.num_minibatches] for i in range(cfg.num_minibatches)]
        mbs = [mb.sort().values for mb in mbs if len(mb)]
        rank, world = self.backend.rank, self.backend.world_size
        # Pack every mini-batch (this rank's slice of it) and recompute π_old for all of them once,
        # before the first update: π_old is the policy at the start of the step.
        work = []
        for mb in mbs:
            idx = mb.tolist()
            if len(idx) < world:
                raise ValueError(f"a mini-batch of {len(idx)} samples cannot be split over {world} ranks")
            packed = pack([prompts[i] for i in idx], [comps[i] for i in idx], self.pad_id, dev)
            b = torch.zeros(packed.mask.shape, dtype=torch.float32)
            for r, i in enumerate(idx):
                b[r, : len(behav[i])] = torch.tensor(behav[i], dtype=torch.float32)
            a = torch.tensor([sample_adv[i] for i in idx], dtype=torch.float32)
            sl = slice(*self._rank_slice(len(idx), rank, world))
            weight = _share_weight(packed.mask, sl, cfg.loss_agg, world)
            mine = _slice(packed, sl)
            old, _ = self._logp(self.model, mine, grad=False)
            ref = self._logp(self.state.ref_model, mine, grad=False)[0] if self.state.ref_model else None
            work.append((mine, old, b[sl].to(dev), a[sl].to(dev), ref, weight))
        totals: dict[str, float] = {}
        grad_norms = []
        skipped = 0
        for mine, old, b, a, ref, weight in work:
            logp, ent = self._logp(self.model, mine, grad=True)
            loss, m = policy_loss(
                logp, old, b, a, mine.mask,
                eps_low=cfg.eps_low, eps_high=cfg.eps_high, tis_cap=cfg.tis_cap,
                kl_coef=cfg.kl_coef, ref_logp=ref, loss_agg=cfg.loss_agg, entropy=ent,
            )
            if not _finite_everywhere(loss, world):  # no backward, no optimizer step: nothing changes
                self.backend.discard_gradients()
                skipped += 1
                continue
            self.backend.backward(loss * weight)
            norm = self.backend.step()
            if not math.isfinite(norm):  # the backend skipped the optimizer step
                skipped += 1
                continue
            self.updates_in_step += 1
            grad_norms.append(norm)
            m["loss"] = loss.item()
            share = weight / world  # this rank's part of the mini-batch mean
            for k, v in m.items():
                totals[k] = totals.get(k, 0.0) + v * (1.0 if k == "tokens" else share)
        if world > 1:
            totals = _all_reduce_sum(totals)
        used = max(1, len(work) - skipped)  # means over the mini-batches that were applied
        totals = {k: v if k == "tokens" else v / used for k, v in totals.items()}
        self.state.step += 1
        if cfg.ref_reset_interval and self.state.step % cfg.ref_reset_interval == 0:
            self.reset_reference()
            metrics["ref_reset"] = 1.0
        metrics.update(totals)
        metrics.update(
            grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            nonfinite_skipped=float(skipped),
            step_skipped=float(skipped == len(work)),
            samples=float(S),
            minibatches=float(len(mbs)),
            train_s=time.perf_counter() - t0,
        )
        return metrics

    @staticmethod
    def _rank_slice(n: int, rank: int, world: int) -> tuple[int, int]:
        per = -(-n // world)
        return min(rank * per, n), min((rank + 1) * per, n)


def _finite_everywhere(loss: torch.Tensor, world: int) -> bool:
    """Is the loss finite on every rank? (All ranks must skip the same mini-batch together.)"""
    ok = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item() > 0)


def _all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    import torch.distributed as dist

    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def _slice(p, sl: slice):
    from learner.logprobs import PackedCompletions

    return PackedCompletions(p.input_ids[sl], p.attention_mask[sl], p.target_pos[sl], p.targets[sl], p.mask[sl])


def _share_weight(mask: torch.Tensor, sl: slice, loss_agg: str, world: int) -> float:
    """Scale of a rank's loss so that the rank-averaged gradient equals the whole mini-batch's."""
    if world == 1:
        return 1.0
    if loss_agg == "token-mean":
        mine, total = mask[sl].sum().item(), mask.sum().item()
    else:
        mine, total = (mask[sl].sum(1) > 0).sum().item(), (mask.sum(1) > 0).sum().item()
    return world * mine / total
