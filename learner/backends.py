"""Training backends: plain torch (CPU or one GPU) and DeepSpeed ZeRO (several GPUs; gloo on CPU).

Both expose the same small surface to `learner/train_step.py`:

    backend.module          the nn.Module to run forward passes on
    backend.backward(loss, boundary)  accumulate gradients (boundary: the last micro-batch before `step`)
    backend.step() -> float clip to `grad_clip`, apply AdamW, zero grads; returns the pre-clip norm
                            (torch: a non-finite norm skips AdamW, so weights and moments stay untouched;
                            DeepSpeed applies its own step — the trainer's loss check guards it)
    backend.discard_gradients()
    backend.set_lr(lr)      the step's learning rate (paper 4.2's sqrt scaling is applied by the caller)
    backend.reset_optimizer()
    backend.optimizer_state() / backend.load_optimizer_state(sd)   this rank's optimizer state (ZeRO: its shard)
    backend.partitioned     True when no rank holds whole parameters between passes (ZeRO-3)
    backend.gathered(ts)    context: the parameters among `ts` whole while it lasts (a collective: every
                            rank enters it with the same tensors); backend.full_shape(t): t's whole shape
    backend.rank, backend.world_size

AdamW hyper-parameters are identical in both (betas 0.9/0.999, eps 1e-8, `weight_decay`), so that for
the same batch they produce the same update (tested on CPU with gloo).
"""

from __future__ import annotations

import contextlib
import os
from typing import Protocol

import torch

from config.schema import LearnerConfig

BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


class Backend(Protocol):
    module: torch.nn.Module
    rank: int
    world_size: int
    partitioned: bool

    def gathered(self, tensors: list[torch.Tensor]) -> contextlib.AbstractContextManager: ...

    def full_shape(self, t: torch.Tensor) -> torch.Size: ...

    def backward(self, loss: torch.Tensor, boundary: bool = True) -> None: ...

    def step(self) -> float: ...

    def discard_gradients(self) -> None: ...

    def set_lr(self, lr: float) -> None: ...

    def reset_optimizer(self) -> None: ...

    def optimizer_state(self) -> dict: ...

    def load_optimizer_state(self, sd: dict) -> None: ...


class TorchBackend:
    """Single-process torch: the model on `cfg.device`, torch.optim.AdamW."""

    partitioned = False

    def __init__(self, model: torch.nn.Module, cfg: LearnerConfig):
        self.cfg = cfg
        self.module = model.to(cfg.device)
        self.rank, self.world_size = 0, 1
        self.optimizer = self._make_optimizer()

    def gathered(self, tensors: list[torch.Tensor]) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def full_shape(self, t: torch.Tensor) -> torch.Size:
        return t.shape

    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters AdamW updates (with LoRA the adapters only: the frozen base has no optimizer state)."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def _make_optimizer(self) -> torch.optim.Optimizer:
        # on a GPU, one fused kernel for the whole update: one pass over weights and moments, not several
        fused = torch.device(self.cfg.device).type == "cuda"
        return torch.optim.AdamW(
            self.trainable(), lr=self.cfg.lr, betas=BETAS, eps=ADAM_EPS,
            weight_decay=self.cfg.weight_decay, **({"fused": True} if fused else {}),
        )

    def backward(self, loss: torch.Tensor, boundary: bool = True) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.trainable(), self.cfg.grad_clip)
        if torch.isfinite(norm):  # a non-finite gradient never reaches the weights or the AdamW moments
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def discard_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def reset_optimizer(self) -> None:
        self.optimizer = self._make_optimizer()

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, sd: dict) -> None:
        self.optimizer.load_state_dict(sd)


def deepspeed_config(cfg: LearnerConfig) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,  # nominal: we call backward/step ourselves per mini-batch
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage, "overlap_comm": False, "contiguous_gradients": True},
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "wall_clock_breakdown": False,
        "steps_per_print": 10**9,
    }


def _no_shm_comm_op() -> None:
    """DeepSpeed's CPU communication backend JIT-compiles a C++ shared-memory op at every start, which only
    its inference all-reduce uses (ZeRO trains through torch.distributed, gloo here). The compile is slow,
    and torch's build lock file outlives a rank killed while holding it: every later start on that machine
    would wait on the lock forever. We never build it."""
    import importlib

    # (not `import deepspeed.comm.torch as m`: that finds the `torch` module `deepspeed.comm` re-exports)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


class DeepSpeedBackend:
    """DeepSpeed ZeRO (stage 2 or 3) over torch.distributed; gloo on CPU, nccl on GPUs.

    The process group must already exist or be creatable from the usual env (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); each rank trains on its shard of every mini-batch and DeepSpeed
    averages gradients, so the caller scales each rank's loss by its share of the mini-batch.
    """

    def __init__(self, model: torch.nn.Module, cfg: LearnerConfig):
        if cfg.device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        import torch.distributed as dist

        if cfg.device == "cpu":
            _no_shm_comm_op()

        if not dist.is_initialized():
            backend = "gloo" if cfg.device == "cpu" else "nccl"
            if "WORLD_SIZE" not in os.environ:  # one process on its own (not started as a rank): a group of
                # one, in memory (no port to pick, none to collide with the job's own)
                os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            deepspeed.init_distributed(dist_backend=backend)
        self.cfg = cfg
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        model = model.to(cfg.device)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=BETAS, eps=ADAM_EPS,
                                weight_decay=cfg.weight_decay)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=deepspeed_config(cfg)
        )
        self.module = self.engine.module
        self.partitioned = cfg.zero_stage == 3

    def gathered(self, tensors: list[torch.Tensor]) -> contextlib.AbstractContextManager:
        if not self.partitioned:
            return contextlib.nullcontext()
        import deepspeed

        unique = list({id(t): t for t in tensors if hasattr(t, "ds_id")}.values())  # tied weights: once
        return deepspeed.zero.GatheredParameters(unique)

    def full_shape(self, t: torch.Tensor) -> torch.Size:
        return getattr(t, "ds_shape", t.shape)

    def backward(self, loss: torch.Tensor, boundary: bool = True) -> None:
        # gradients of the micro-batches before the boundary accumulate locally; ZeRO reduces them at it
        self.engine.set_gradient_accumulation_boundary(boundary)
        # what engine.forward() would do first (we run engine.module directly): a new backward begins, so
        # ZeRO-3 counts a micro-step and adds this micro-batch's gradient partition to the last one's
        # instead of overwriting it (only the last micro-batch's gradient survived without this)
        if hasattr(self.optimizer, "clear_backward_seen_flag"):
            self.optimizer.clear_backward_seen_flag()
        self.engine.backward(loss)

    def discard_gradients(self) -> None:
        self.engine.zero_grad()

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def reset_optimizer(self) -> None:
        inner = getattr(self.optimizer, "optimizer", self.optimizer)  # ZeRO wraps the client optimizer
        for state in inner.state.values():
            for k, v in state.items():
                if torch.is_tensor(v):
                    v.zero_()
                elif k == "step":
                    state[k] = 0

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()  # ZeRO: this rank's partition (and its fp32 master slice)

    def load_optimizer_state(self, sd: dict) -> None:
        # ZeRO takes every rank's state and reads its own (same world size): ours is the one we have
        self.optimizer.load_state_dict([sd if r == self.rank else None for r in range(self.world_size)],
                                       load_from_fp32_weights=True)


def make_backend(model: torch.nn.Module, cfg: LearnerConfig) -> Backend:
    if cfg.backend == "deepspeed":
        return DeepSpeedBackend(model, cfg)
    return TorchBackend(model, cfg)


def enable_activation_checkpointing(model: torch.nn.Module, fraction: float = 1.0) -> list[int]:
    """Recompute decoder layers in backward (transformers' gradient checkpointing): `fraction` of them,
    spread evenly over the depth; returns the recomputed layers' indices. It acts in train mode only; PPO
    needs a deterministic policy (π_old recomputed = πθ at the start of the step), so dropout is refused
    rather than silently switched on."""
    p = max([getattr(model.config, k, 0.0) or 0.0 for k in ("attention_dropout", "hidden_dropout", "dropout")]
            + [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)])
    if p > 0:
        raise ValueError(f"learner.activation_checkpointing needs the model in train mode, where its dropout "
                         f"({p}) would make the policy random: set the model's dropout to 0")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    layers = list(getattr(model.get_decoder(), "layers", None) or [])
    if fraction < 1 and not all(hasattr(layer, "gradient_checkpointing") for layer in layers):
        raise ValueError(f"learner.activation_checkpointing_fraction < 1: {type(model).__name__}'s decoder "
                         f"layers do not say whether they recompute (no gradient_checkpointing attribute)")
    kept = [i for i in range(len(layers)) if int((i + 1) * fraction) == int(i * fraction)]
    for i in kept:
        layers[i].gradient_checkpointing = False
    return [i for i in range(len(layers)) if i not in kept]
