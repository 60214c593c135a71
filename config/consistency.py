"""The rules a configuration must keep across its sections (clip-higher's order, N against dynamic sampling,
CURVE for a remote host, GPU placement's double booking, ...): each failure names the fields to change."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from config.placement import check_fields

if TYPE_CHECKING:
    from config.schema import BrorlConfig


def check_consistency(cfg: "BrorlConfig") -> None:
    """Rules across sections (each names the fields to change); raises ValueError. Runs when a config loads."""
    lrn, act, tr, job = cfg.learner, cfg.actor, cfg.transport, cfg.job
    if lrn.eps_high < lrn.eps_low:
        raise ValueError(
            f"learner.eps_high ({lrn.eps_high}) must be >= learner.eps_low ({lrn.eps_low}): "
            "clip-higher widens the upper clip, it never narrows it"
        )
    if lrn.dynamic_sampling and job.n_samples < 2:
        raise ValueError(
            f"job.n_samples ({job.n_samples}) must be >= 2 when learner.dynamic_sampling is on: "
            "a group of one is always all-correct or all-wrong and would always be dropped"
        )
    if lrn.dual_clip_c and lrn.dual_clip_c <= 1:
        raise ValueError(f"learner.dual_clip_c ({lrn.dual_clip_c}) must be > 1 (verl uses 3), or 0 to turn dual-clip off")
    if act.max_num_seqs > act.cuda_graph_max_capture_size:
        raise ValueError(
            f"actor.max_num_seqs ({act.max_num_seqs}) exceeds actor.cuda_graph_max_capture_size "
            f"({act.cuda_graph_max_capture_size}): vLLM would decode the excess on slow eager paths"
        )
    if lrn.num_minibatches > job.prompts_per_step * job.n_samples:
        raise ValueError(
            f"learner.num_minibatches ({lrn.num_minibatches}) exceeds the samples per step "
            f"({job.prompts_per_step} × {job.n_samples})"
        )
    if not tr.curve and not tr.allow_insecure_remote and not _is_loopback(tr.host):
        raise ValueError(
            f"transport.curve must be true for the non-loopback transport.host {tr.host!r} "
            "(or set transport.allow_insecure_remote = true to waive it)"
        )
    if tr.heartbeat_timeout_s < 2 * tr.heartbeat_interval_s:
        raise ValueError(
            f"transport.heartbeat_timeout_s ({tr.heartbeat_timeout_s}) must be at least twice "
            f"transport.heartbeat_interval_s ({tr.heartbeat_interval_s}): one late heartbeat must not evict"
        )
    if act.top_p < 1.0:
        raise ValueError(
            f"actor.top_p ({act.top_p}) must be 1.0 for training: with nucleus sampling the behaviour "
            "log-probs are of the renormalised nucleus while the learner's π_old is the full softmax, so "
            "the truncated importance weights would be biased"
        )
    if lrn.devices > 1 and lrn.backend != "deepspeed":
        raise ValueError(f"learner.devices = {lrn.devices} needs learner.backend = \"deepspeed\" (the torch "
                         f"backend is one process)")
    if lrn.devices > 1 and lrn.device not in ("cpu", "cuda"):
        raise ValueError(f"learner.device {lrn.device!r} names one device but learner.devices = {lrn.devices}: "
                         f"use \"cuda\" (rank r takes cuda:r) or \"cpu\"")
    if lrn.backend == "deepspeed" and lrn.zero_stage == 3 and cfg.run.eval_interval:
        raise ValueError(f"run.eval_interval = {cfg.run.eval_interval} with learner.zero_stage = 3: the learner's "
                         f"held-out evaluation samples on rank 0 alone, which ZeRO-3 parameters (gathered by every "
                         f"rank, layer by layer) do not allow. Set run.eval_interval = 0 and evaluate checkpoints "
                         f"with `brorl eval`, or use zero_stage = 2")
    if lrn.devices > 1 and lrn.num_minibatches * lrn.devices > job.prompts_per_step * job.n_samples:
        raise ValueError(f"learner.devices ({lrn.devices}) × learner.num_minibatches ({lrn.num_minibatches}) "
                         f"exceeds the samples per step ({job.prompts_per_step} × {job.n_samples}): a rank "
                         f"would get no sample of a mini-batch")
    if act.in_flight_on_update == "keep" and job.max_staleness > 255:
        raise ValueError(f"job.max_staleness ({job.max_staleness}) above 255 with actor.in_flight_on_update "
                         f"= \"keep\": a token's version travels as an offset of at most 255")
    if act.length_median > act.max_tokens:
        raise ValueError(f"actor.length_median ({act.length_median}) exceeds actor.max_tokens ({act.max_tokens}), "
                         f"the cap of every completion")
    if lrn.compile and (lrn.share_prompt or (lrn.backend == "deepspeed" and lrn.zero_stage == 3)):
        raise ValueError("learner.compile works with neither learner.share_prompt nor learner.zero_stage = 3 "
                         "(the shared prompt's key/value cache and ZeRO-3's parameter hooks are not traced)")
    if lrn.liger_kernels and lrn.compile:
        raise ValueError("learner.liger_kernels with learner.compile: torch.compile cannot trace Liger's fused "
                         "RMSNorm (its autograd Function fails in dynamo); turn one off (compiled layers are "
                         "the faster of the two on a GPU)")
    if lrn.packing and lrn.share_prompt:
        raise ValueError("learner.packing with learner.share_prompt: a packed row has no one prompt to compute "
                         "once (its samples are of several groups); turn one off")
    if lrn.activation_checkpointing_fraction < 1 and not lrn.activation_checkpointing:
        raise ValueError(f"learner.activation_checkpointing_fraction = {lrn.activation_checkpointing_fraction} "
                         f"with learner.activation_checkpointing off: nothing is recomputed; turn it on")
    if not cfg.data.train and not cfg.verifiers.task:
        raise ValueError("data.train is empty and verifiers.task is unset: this job trains on your files; name "
                         "them, e.g. --data.train train.parquet (check them first: brorl data preview)")
    if lrn.overlong_buffer >= act.max_tokens:
        raise ValueError(f"learner.overlong_buffer ({lrn.overlong_buffer}) must be below actor.max_tokens "
                         f"({act.max_tokens}): the penalty ramps up over the last tokens before the limit")
    if cfg.run.reproducible and (act.num_actors != 1 or job.max_staleness != 0 or lrn.devices != 1):
        raise ValueError(f"run.reproducible needs actor.num_actors = 1 (is {act.num_actors}), job.max_staleness "
                         f"= 0 (is {job.max_staleness}) and learner.devices = 1 (is {lrn.devices}): several "
                         f"actors, generation ahead of training or several ranks make the order of arrivals "
                         f"and sums differ from run to run")
    if cfg.run.reproducible and job.step_sample_budget:
        raise ValueError(f"run.reproducible with job.step_sample_budget = {job.step_sample_budget}: which second "
                         f"waves fit the budget depends on when first waves finish; leave it 0 for a "
                         f"reproducible run")
    if lrn.init_from and Path(cfg.model.path).resolve() != (Path(lrn.init_from) / "model").resolve():
        raise ValueError(f"learner.init_from {lrn.init_from!r} with model.path {cfg.model.path!r}: set model.path "
                         f"to {str(Path(lrn.init_from) / 'model')!r}, so the actors start from the weights "
                         f"whose optimizer state the learner continues")
    if lrn.lora_rank:
        _check_lora(cfg)
    check_fields(cfg)  # GPU placement: double booking, counts (the hardware is checked at launch)
    if lrn.backend == "deepspeed" and lrn.kl_coef > 0 and lrn.zero_stage == 3:
        raise ValueError("learner.zero_stage 3 with learner.kl_coef > 0 is not supported: use stage 2")


def _check_lora(cfg: "BrorlConfig") -> None:
    """What LoRA (`learner.lora_rank` > 0) does not support, each refused in one line."""
    lrn = cfg.learner
    if lrn.backend == "deepspeed":
        raise ValueError("learner.lora_rank with learner.backend = \"deepspeed\": LoRA trains on one device with the "
                         "torch backend")
    if lrn.kl_coef > 0:
        raise ValueError("learner.lora_rank with learner.kl_coef > 0: the reference policy would copy the whole base "
                         "model; set kl_coef = 0")
    if lrn.init_from:
        raise ValueError("learner.lora_rank with learner.init_from: another run's AdamW state is not of these "
                         "adapters; resume a LoRA run with --resume instead")
    if not lrn.lora_targets:
        raise ValueError("learner.lora_rank with empty learner.lora_targets: name the linear layers to adapt")
    bad = sorted(set(lrn.lora_targets) & {"lm_head", "embed_tokens"})
    if bad:
        raise ValueError(f"learner.lora_targets {bad}: only the decoder's linear layers can take adapters (the "
                         f"log-prob kernels read the LM head's weight directly)")


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
