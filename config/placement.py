"""Which GPUs each role of a one-host job uses (`brorl run`; the Ray launcher places roles the same way).

The learner takes `learner.gpus`, or by default the first `learner.devices` GPUs (the one GPU `cuda:k`
names, if `learner.device` names one); each actor takes `actor.tensor_parallel_size` consecutive GPUs of
`actor.gpus`, or by default of the GPUs the learner does not use. Each role's process is then started
seeing only its own GPUs (`CUDA_VISIBLE_DEVICES`), so inside it they are cuda:0, cuda:1, ...

On the CPU (no GPU placed), several actors on one host would each let vLLM bind its engine's threads
automatically, and its automatic binding takes the same first core for every engine: the engines then
share one core while the others idle. `cpu_cores` splits this host's cores between the actors instead
(vLLM's `VLLM_CPU_OMP_THREADS_BIND`); a single actor keeps vLLM's own binding.

A GPU may be shared by the learner and an actor (a one-GPU machine: `learner.gpus = [0]`, `actor.gpus = [0]`)
when the job is set up for it: weights go from the learner's shared buffer on the card into the engine
(`transport.weight_backend = "ipc"`; gloo also works, through host memory; NCCL refuses two ranks of one group on one GPU), the
engine's KV cache has a fixed size (`actor.kv_cache_gib`: vLLM sizes it by profiling the GPU's free memory at
start, which the learner's allocations change under it) and `actor.gpu_memory_utilization` ≤ 0.5 (vLLM checks
that much is free when it starts; the learner needs the rest). A GPU listed for both roles without that
setup is refused, naming what to set.

`check_fields` runs when a config loads (what needs no hardware: double booking, counts); `place` when a
job starts, with the number of GPUs this host shows (too few GPUs, ordinals that do not exist). Both
raise `ValueError` naming the fields to change. With no GPU visible nothing is placed: the CPU engines
and a CPU learner run as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from config.schema import BrorlConfig


@dataclass(frozen=True)
class Placement:
    learner: list[int] = field(default_factory=list)
    """GPU ordinals of the learner's ranks (rank r on learner[r]); empty: the learner runs on the CPU."""
    actors: list[list[int]] = field(default_factory=list)
    """GPU ordinals of actor i (`actor.tensor_parallel_size` of them); empty: the actors run on the CPU."""

    def describe(self) -> str:
        parts = [f"learner GPU{'s' * (len(self.learner) > 1)} {_ids(self.learner)}" if self.learner
                 else "learner on CPU"]
        parts += [f"actor-{i} GPU{'s' * (len(g) > 1)} {_ids(g)}" + " (shared with the learner)" * bool(set(g) & set(self.learner))
                  for i, g in enumerate(self.actors)] or ["actors on CPU"]
        return ", ".join(parts)


def _ids(gpus: list[int]) -> str:
    return ",".join(map(str, gpus))


def _learner_on_gpu(cfg: BrorlConfig) -> bool:
    return cfg.learner.device.startswith("cuda")


def check_fields(cfg: BrorlConfig) -> None:
    """What can be checked without the hardware; raises ValueError naming the fields."""
    lrn, act = cfg.learner, cfg.actor
    for name, gpus in (("learner.gpus", lrn.gpus), ("actor.gpus", act.gpus)):
        if len(set(gpus)) != len(gpus):
            twice = sorted({g for g in gpus if gpus.count(g) > 1})
            raise ValueError(f"{name} {gpus} books GPU {_ids(twice)} twice")
    if lrn.gpus:
        if not _learner_on_gpu(cfg):
            raise ValueError(f"learner.gpus {lrn.gpus} is set but learner.device = {lrn.device!r}: set "
                             f"learner.device = \"cuda\" to train on them")
        if lrn.device != "cuda":
            raise ValueError(f"learner.device = {lrn.device!r} and learner.gpus {lrn.gpus} both choose the "
                             f"learner's GPU: set learner.device = \"cuda\" and list the GPUs in learner.gpus")
        if len(lrn.gpus) != lrn.devices:
            raise ValueError(f"learner.gpus {lrn.gpus} lists {len(lrn.gpus)} GPU(s) for learner.devices = "
                             f"{lrn.devices} ranks: one GPU per rank")
    need = act.num_actors * act.tensor_parallel_size
    if act.gpus and len(act.gpus) != need:
        raise ValueError(f"actor.gpus {act.gpus} lists {len(act.gpus)} GPU(s); actor.num_actors ({act.num_actors}) "
                         f"× actor.tensor_parallel_size ({act.tensor_parallel_size}) needs {need}")
    both = sorted(set(lrn.gpus) & set(act.gpus))
    if both and (why := _unshareable(cfg)):
        raise ValueError(f"GPU {_ids(both)} is booked twice: in learner.gpus {lrn.gpus} and in actor.gpus {act.gpus}; "
                         f"to share it between the learner and an actor, {why}")


SHARE_UTILIZATION = 0.5
"""The most of a shared GPU's memory an actor's engine may reserve (`actor.gpu_memory_utilization`)."""

ONE_GPU: dict[str, Any] = {
    "learner.gpus": [0], "actor.gpus": [0], "actor.num_actors": 1, "learner.devices": 1, "learner.device": "cuda",
    "transport.weight_backend": "ipc", "actor.kv_cache_gib": 24, "actor.gpu_memory_utilization": 0.45,
    "actor.share_gpu": "corun", "learner.backend": "torch", "learner.activation_checkpointing": False,
    "learner.micro_batch_tokens": 16384, "learner.packing": True,
}
"""`brorl run --one-gpu` (and `bench.e2e --share-gpu`): the learner and one actor on GPU 0, as measured fastest
on one card for a 1.5B model — weights over CUDA IPC, generation beside training (`corun`), and a plain-torch
learner without recomputation (ZeRO shards nothing on one rank; the card has the memory recomputation saves)
on packed sequences (no padding: 1.7 × the compiled padded passes' tokens/s on spread lengths).
Sized for a 141 GB card: on a smaller one lower `actor.kv_cache_gib` and `learner.micro_batch_tokens`."""


def _unshareable(cfg: BrorlConfig) -> str:
    """What keeps the learner and an actor from sharing a GPU under this config ("" when nothing does)."""
    act = cfg.actor
    need = [f"set transport.weight_backend = \"ipc\" (it is {cfg.transport.weight_backend!r}: NCCL refuses two ranks "
            f"on one GPU; ipc hands the engine the learner's weights on the card)"] * (cfg.transport.weight_backend == "nccl")
    need += ["set actor.kv_cache_gib (the engine's KV cache in GiB: vLLM cannot size it by profiling while the "
             "learner allocates on the same GPU)"] * (not act.kv_cache_gib)
    need += [f"set actor.gpu_memory_utilization ≤ {SHARE_UTILIZATION} (it is {act.gpu_memory_utilization}: the learner "
             f"needs the rest)"] * (act.gpu_memory_utilization > SHARE_UTILIZATION)
    return "; ".join(need)


def place(cfg: BrorlConfig, visible: int) -> Placement:
    """Each role's GPUs on a host that shows `visible` GPUs; raises ValueError naming the fields when
    they do not fit."""
    check_fields(cfg)
    lrn, act = cfg.learner, cfg.actor
    tp, need = act.tensor_parallel_size, act.num_actors * act.tensor_parallel_size
    if visible == 0:
        if _learner_on_gpu(cfg):
            raise ValueError(f"learner.device = {lrn.device!r} but this host shows no GPU: set "
                             f"learner.device = \"cpu\" or run where CUDA is visible")
        if act.gpus or tp > 1:
            raise ValueError(f"actor.gpus {act.gpus} / actor.tensor_parallel_size = {tp} need GPUs, and this "
                             f"host shows none")
        if act.quantization != "none":
            raise ValueError(f"actor.quantization = {act.quantization!r} needs GPU actors (vLLM's FP8 kernels), and "
                             f"this host shows no GPU: set actor.quantization = \"none\"")
        return Placement()
    if not _learner_on_gpu(cfg):
        learner: list[int] = []
    elif lrn.gpus:
        learner = list(lrn.gpus)
    elif lrn.device.startswith("cuda:"):
        learner = [int(lrn.device.split(":", 1)[1])]
    else:
        learner = list(range(lrn.devices))
    missing = [g for g in learner if g >= visible]
    if missing:
        raise ValueError(f"the learner's GPU {_ids(missing)} (learner.gpus / learner.device / learner.devices) does "
                         f"not exist: this host shows {visible} GPU(s), 0 to {visible - 1}")
    if act.gpus:
        pool = list(act.gpus)
        missing = [g for g in pool if g >= visible]
        if missing:
            raise ValueError(f"actor.gpus names GPU {_ids(missing)}: this host shows {visible} GPU(s), 0 to "
                             f"{visible - 1}")
        both = sorted(set(pool) & set(learner))
        if both and (why := _unshareable(cfg)):
            raise ValueError(f"GPU {_ids(both)} is booked twice: the learner's (learner.device = {lrn.device!r}) "
                             f"and in actor.gpus {act.gpus}; to share it between the learner and an actor, {why}")
    else:
        pool = [g for g in range(visible) if g not in learner]
        if len(pool) < need:
            raise ValueError(f"too few GPUs: actor.num_actors ({act.num_actors}) × actor.tensor_parallel_size "
                             f"({tp}) = {need} actor GPUs after the learner's {len(learner)} "
                             f"(learner.devices = {lrn.devices}), and this host shows {visible}: lower "
                             f"actor.num_actors, or place the roles with learner.gpus / actor.gpus (the learner "
                             f"and an actor may share a GPU: docs/configuration.md, \"GPU placement\")")
        pool = pool[:need]
    apart = sorted(set(pool[:need]) - set(learner))
    if cfg.transport.weight_backend == "ipc" and learner and apart:  # a role sees only its own GPUs
        raise ValueError(f"transport.weight_backend = \"ipc\" maps the learner's GPU memory into the actors' engines, "
                         f"but actors are placed on GPU {_ids(apart)}, which they alone see: set "
                         f"transport.weight_backend = \"nccl\", or share the learner's GPU (actor.gpus)")
    return Placement(learner, [pool[i * tp:(i + 1) * tp] for i in range(act.num_actors)])


def cpu_cores(actor: int, num_actors: int, allowed: list[int]) -> str | None:
    """The cores that actor `actor` of `num_actors` CPU actors on this host binds its
    engine's threads to ("0,1"): an even, contiguous share of `allowed` (this process's cores), at least one core each
    (with more actors than cores, they share round the cores). None for a single actor: vLLM's own binding."""
    if num_actors < 2 or not allowed:
        return None
    cores = sorted(allowed)
    share = max(1, len(cores) // num_actors)
    first = (actor * share) % len(cores)
    return ",".join(map(str, cores[first:first + share]))


def visible_env(gpus: list[int], parent: str | None) -> str:
    """`CUDA_VISIBLE_DEVICES` for a child that is to see `gpus` (ordinals as this process sees them),
    given this process's own `CUDA_VISIBLE_DEVICES` (`parent`; None: it sees every GPU)."""
    if parent is None or parent.strip() == "":
        return _ids(gpus)
    mine = [x.strip() for x in parent.split(",") if x.strip()]
    return ",".join(mine[g] for g in gpus)
