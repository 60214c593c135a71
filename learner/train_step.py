"""One BroRL training step over a batch of groups.

    trainer = Trainer(model, learner_cfg, job_cfg, temperature=T, pad_id=eos)   # job_cfg: N and B
    metrics = trainer.step(groups)          # groups: list[TrainGroup], the batch the learner assembled

Inside a step (docs/architecture.md, "The algorithm"):
  1. dynamic sampling mask and REINFORCE++-baseline advantages over the step's kept samples;
  2. π_old: the learner's log-probs of every kept sample, recomputed once under no_grad (chunked), but
     those of the first mini-batch: π_old is the policy at the start of the step, which before the first
     optimizer step is the policy being trained, so that mini-batch's training forward computes them itself
     (detached; the ratio is exactly 1 there, as PPO defines it). That is the one pass the algorithm lets a
     step skip exactly: 1 / `num_minibatches` of the π_old pass, all of it with one mini-batch
     (`tests/integration/test_train_step.py::test_reusing_the_first_minibatch_forward_as_pi_old_is_exact`);
     π_ref likewise when `kl_coef > 0`;
  3. the kept samples are shuffled and cut into `num_minibatches` mini-batches — a fixed number
     whatever N is, so larger N means larger mini-batches (paper 4.2); one optimizer step each, at
     η = η0 · sqrt(B_samples / B0);
  4. every `ref_reset_interval` steps the reference policy is reset to the current one (and, if
     configured, the AdamW state is cleared).
A mini-batch whose loss or gradient norm is not finite is skipped: no optimizer step, weights and AdamW
state untouched; counted in `nonfinite_skipped` (and `step_skipped` = 1 when no mini-batch was left, or
when the advantages themselves are not finite).
Precision: the parameters and the AdamW state are float32 (master weights); `compute_dtype` (the job's
`model.dtype`) is the dtype of the forward and backward passes (autocast) — a bf16 parameter updated in
place by AdamW at RL learning rates rounds most updates away, so a model with bf16 or fp16 parameters is
refused.
A step is `plan` (everything above that needs no model: dynamic sampling, advantages, the shuffle and
every rank's micro-batches of each mini-batch, a `RankShare` per rank) then `run` (π_old, the updates). With
several ranks (`learner/ranks.py`) rank 0 plans and hands each rank its share; each rank's loss is scaled
by its share of the mini-batch's tokens so that the averaged gradient equals the single-process one.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from config.schema import JobConfig, LearnerConfig
from learner.algorithm import policy_loss, scaled_lr
from learner.backends import Backend, enable_activation_checkpointing, make_backend
from learner.compiling import PAD_MULTIPLE, WarmUp, compile_layers, compiled_frames, min_tokens, warm_up_batches
from learner.flops import ModelShape, peak_flops
from learner.batch import build, prefetched
from learner.kernels import apply_liger_kernels
from learner.logprobs import token_logprobs
from learner.lora import MergedView
from learner.microbatch import Micro, RankShare
from learner.packing import use_packed_attention
from learner.planning import FlatGroup, TrainGroup, plan_step

if TYPE_CHECKING:
    from learner.ranks import Ranks


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
        job: JobConfig,
        *,
        max_tokens: int = 0,
        temperature: float = 1.0,
        pad_id: int = 0,
        backend: Backend | None = None,
        compute_dtype: torch.dtype = torch.float32,
        ranks: "Ranks | None" = None,
    ):
        # (a LoRA base is frozen in the compute dtype: only what AdamW updates must be float32)
        low = sorted({str(p.dtype) for p in model.parameters()
                      if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)})
        if low:
            raise ValueError(
                f"the learner's model has {', '.join(low)} parameters: AdamW would update them in place and "
                f"round most RL-sized updates away. Load it in float32 (the master weights) and train in "
                f"{compute_dtype} through compute_dtype (model.dtype)")
        self.cfg = cfg
        self.compute_dtype = compute_dtype
        self.job = job
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.pad_id = pad_id
        if cfg.packing and cfg.share_prompt:
            raise ValueError("learner.packing does not work with learner.share_prompt: turn one off")
        if cfg.packing:
            use_packed_attention(model)
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model, cfg.activation_checkpointing_fraction)
        if cfg.liger_kernels:  # before compiling: the compiled layers are the patched ones
            apply_liger_kernels(model, cfg.device)
        if cfg.compile:
            compile_layers(model)
        self.min_tokens = min_tokens(model, cfg.device) if cfg.compile else 0
        """Tokens a micro-batch is padded up to (`learner.compiling.min_tokens`: one compiled regime on a GPU)."""
        self.backend = backend or make_backend(model, cfg)
        self.lora = MergedView(self.model) if cfg.lora_rank else None
        """`learner.lora_rank`: the merged weights the actors and checkpoints get (`learner/lora.py`)."""
        self.ranks = ranks  # rank 0 hands the others their shares through it (else every rank plans alike)
        self.state = StepState()
        self.samples_per_step = job.prompts_per_step * job.n_samples
        self.lr = scaled_lr(cfg.lr, cfg.lr_base_samples or self.samples_per_step, self.samples_per_step)
        self.backend.set_lr(self.lr)
        if cfg.kl_coef > 0:
            self.state.ref_model = self._frozen_copy()
        self._gen = torch.Generator().manual_seed(cfg.seed)
        self.compiling = WarmUp()
        """`learner.compile`: every rank compiles what a step meets at the start of the first step."""
        self.reuse_old = True
        """π_old of the first mini-batch from its training forward (the module's docstring); False recomputes it."""
        self._shape: ModelShape | None = None  # for the step's model FLOPs (learner/flops.py), read at the first step

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
            self.backend.set_lr(self.lr)  # the step's (sqrt-scaled) rate, not the optimizer's η0

    def state_dict(self) -> dict:
        """Step, optimizer state and the mini-batch shuffling generator: what an exact resume needs."""
        return {"step": self.state.step, "optimizer": self.backend.optimizer_state(),
                "generator": self._gen.get_state()}

    def load_state_dict(self, st: dict) -> None:
        self.state.step = int(st["step"])
        self.backend.load_optimizer_state(st["optimizer"])
        self.backend.set_lr(self.lr)
        self._gen.set_state(st["generator"])

    def _autocast(self):
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.cfg.device).type, dtype=self.compute_dtype)

    def _logp(self, model: torch.nn.Module, packed, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.set_grad_enabled(grad), self._autocast():
            return token_logprobs(
                model, packed, temperature=self.temperature, chunk_mb=self.cfg.logprob_chunk_mb,
                compiled=self.cfg.compile, recompute=self.cfg.logprob_recompute, kernel=self.cfg.logprob_kernel)

    def warm_up(self) -> float:
        """This rank's compilation before the first step (`learner.compiling`): the policy's log-probs without
        and with gradients (and the reference policy's, with a KL term), and their backward, on the
        `warm_up_batches`. Gradients are taken with `torch.autograd.grad`: nothing accumulates into a
        parameter, and no optimizer or ZeRO state changes. Returns the seconds it took; 0 without
        `learner.compile`."""
        if not self.cfg.compile:
            return 0.0
        t0 = time.perf_counter()
        emb = self.model.get_input_embeddings()
        for packed in warm_up_batches(emb.num_embeddings, self.pad_id, self.cfg.device, self.min_tokens,
                                      packed=self.cfg.packing):
            self._logp(self.model, packed, grad=False)
            if self.state.ref_model is not None:
                self._logp(self.state.ref_model, packed, grad=False)
            logp, _ = self._logp(self.model, packed, grad=True)
            # the backward through every layer: to the embeddings, or with LoRA (a frozen base) to the adapters
            wrt = [emb.weight] if emb.weight.requires_grad else [p for p in self.model.parameters() if p.requires_grad]
            torch.autograd.grad(logp[packed.mask].sum(), wrt)
        return time.perf_counter() - t0

    def step(self, groups: list[TrainGroup | FlatGroup]) -> dict[str, float]:
        """One training step on `groups` (rank 0, or the only process): plan it, hand every rank its share,
        train on our own. Returns the step's metrics (summed or averaged over all ranks)."""
        self.compiling.ensure(self)
        self.updates_in_step = 0  # optimizer steps applied so far in this step (0: an exception changed nothing)
        t0 = time.perf_counter()
        metrics, shares = self.plan(groups)
        ranks = self.ranks
        frames = compiled_frames()
        metrics.update(self.run(ranks.step(shares) if ranks else shares[self.backend.rank]))
        metrics["train_s"] = time.perf_counter() - t0
        if self.cfg.compile:  # frames torch compiled during the step (this rank): 0 once the warm-up covered all
            metrics["compiled_frames"] = float(compiled_frames() - frames)
        flops = metrics.pop("_model_flops", 0.0)
        if flops and metrics["train_s"] > 0:
            metrics["model_tflops"] = flops / metrics["train_s"] / 1e12  # of all ranks (learner/flops.py)
            peak = peak_flops(self.cfg.device)
            if peak:
                metrics["mfu"] = flops / metrics["train_s"] / (self.world * peak)
        return metrics

    def plan(self, groups: list[TrainGroup | FlatGroup]) -> tuple[dict[str, float], list[RankShare]]:
        """Advantages, the shuffle into `num_minibatches` mini-batches and every rank's
        micro-batches of each (a share per rank); the step's group-level metrics (`learner/planning.py`)."""
        if self._shape is None:
            self._shape = ModelShape.of(self.model)
        return plan_step(groups, self.cfg, world=self.world, generator=self._gen, max_tokens=self.max_tokens,
                         lr=self.lr, shape=self._shape, reuse_old=self.reuse_old,
                         reference=self.state.ref_model is not None,
                         multiple=PAD_MULTIPLE if self.cfg.compile else 1, floor=self.min_tokens)

    def run(self, share: RankShare) -> dict[str, float]:
        """Train on this rank's share of a step: π_old (and π_ref) of every micro-batch first, then one
        optimizer step per mini-batch. Every rank calls it with its own share; the metrics returned are
        over all ranks."""
        cfg, world = self.cfg, self.world
        self.updates_in_step = 0
        if share.skip:
            self.state.step += 1
            return {}
        # π_old is the policy at the start of the step: recomputed for every micro-batch before the first update,
        # but the first mini-batch's, which are its training forward's own log-probs (the module's docstring).
        # Each pass's tensors are built from the share's arrays just ahead of it (`_batches`), not all at once
        todo = [(j, k) for j, passes in enumerate(share.minibatches) for k in range(len(passes))
                if not (j == 0 and self.reuse_old) or self.state.ref_model is not None]
        old_ref = {}  # (mini-batch, pass) -> (π_old, π_ref) log-probs; None: the training forward's own
        for (j, k), mb in zip(todo, self._batches(share, [share.minibatches[j][k] for j, k in todo])):
            old = None if j == 0 and self.reuse_old else self._logp(self.model, mb.packed, grad=False)[0]
            ref = self._logp(self.state.ref_model, mb.packed, grad=False)[0] if self.state.ref_model else None
            old_ref[j, k] = (old, ref)
        padded, real = 0, 0
        totals: dict[str, float] = {}
        grad_norms = []
        skipped = 0
        for j, passes in enumerate(share.minibatches):
            finite, parts_m = True, []
            for k, (micro, mb) in enumerate(zip(passes, self._batches(share, passes))):
                packed, b, a, weight = mb.packed, mb.behav, mb.adv, micro.weight
                old, ref = old_ref.pop((j, k), (None, None))
                counts = packed.token_counts()
                padded, real = padded + counts[0], real + counts[1]
                logp, ent = self._logp(self.model, packed, grad=True)
                loss, m = policy_loss(
                    logp, logp.detach() if old is None else old, b, a, packed.mask,
                    eps_low=cfg.eps_low, eps_high=cfg.eps_high, tis_cap=cfg.tis_cap,
                    kl_coef=cfg.kl_coef, ref_logp=ref, loss_agg=cfg.loss_agg, entropy=ent,
                    dual_clip_c=cfg.dual_clip_c,
                )
                # every rank agrees on each part (the same number of parts everywhere); after a non-finite
                # one the mini-batch is skipped: no more backward, no optimizer step
                finite = finite and self._finite_everywhere(loss)
                if finite:
                    self.backend.backward(loss * weight, boundary=k == len(passes) - 1)
                m["loss"] = loss.item()
                parts_m.append((m, weight))
            if not finite:
                self.backend.discard_gradients()  # no optimizer step: nothing changes
                skipped += 1
                continue
            norm = self.backend.step()
            if not math.isfinite(norm):  # the backend skipped the optimizer step
                skipped += 1
                continue
            self.updates_in_step += 1
            grad_norms.append(norm)
            for m, weight in parts_m:
                share_w = weight / world  # this micro-batch's part of the mini-batch mean
                for k, v in m.items():
                    totals[k] = totals.get(k, 0.0) + v * (1.0 if k == "train_tokens" else share_w)
        totals["_padded"], totals["_real"] = float(padded), float(real)
        totals = self._sum_over_ranks(totals)
        padded, real = totals.pop("_padded"), totals.pop("_real")
        used = max(1, len(share.minibatches) - skipped)  # means over the mini-batches that were applied
        metrics = {k: v if k == "train_tokens" else v / used for k, v in totals.items()}
        self.state.step += 1
        if cfg.ref_reset_interval and self.state.step % cfg.ref_reset_interval == 0:
            self.reset_reference()
            metrics["ref_reset"] = 1.0
        metrics.update(
            grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            nonfinite_skipped=float(skipped),
            step_skipped=float(skipped == len(share.minibatches)),
            micro_batches=float(sum(len(m) for m in share.minibatches)),  # of one rank (every rank makes as many passes)
            padding_frac=1.0 - real / max(padded, 1.0),  # of all ranks' passes (sequences sorted by length)
            decoder_tokens=padded,  # positions one pass over the step's samples runs the decoder on (all ranks)
        )
        return metrics

    def _batches(self, share: RankShare, passes: list[Micro]):
        """The passes' tensors on the device, in order; each built on a worker thread while the one before
        runs (numpy and the copy release the GIL), so building overlaps the GPU's work."""
        cfg = self.cfg
        layout = "shared" if cfg.share_prompt else "packed" if cfg.packing else "padded"
        opts = dict(pad_id=self.pad_id, layout=layout, multiple=PAD_MULTIPLE if cfg.compile else 1,
                    min_tokens=self.min_tokens)
        dev = cfg.device
        return prefetched(lambda m: build(share.table, m.rows, **opts).to(dev), passes)

    @property
    def world(self) -> int:
        return self.backend.world_size

    def _reduce(self, values: list[float], op: str) -> list[float]:
        """`values` reduced over the ranks (op "sum" or "min"): on the ranks' gloo command group if there
        is one, else on the training backend's group."""
        if self.world == 1:
            return values
        import torch.distributed as dist

        group = self.ranks.group if self.ranks else None
        dev = "cpu" if group is not None else self.cfg.device
        t = torch.tensor(values, dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MIN, group=group)
        return t.tolist()

    def _finite_everywhere(self, loss: torch.Tensor) -> bool:
        """Is the loss finite on every rank? (All ranks must skip the same mini-batch together.)"""
        return self._reduce([float(torch.isfinite(loss.detach()).item())], "min")[0] > 0

    def _sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        keys = sorted(values)
        return dict(zip(keys, self._reduce([values[k] for k in keys], "sum")))
