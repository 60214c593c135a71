"""Typed configuration of a brorl job.

Every field carries a docstring (pydantic reads it as the field's description, so `brorl config show
--explain` prints it) with its unit and, where the paper gives one, the paper's value. Models forbid
unknown keys, so a typo in a TOML preset or a `--section.key` override fails at load with the
offending path. Cross-field rules live in `BrorlConfig._check_consistency` and name the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from config.section import Section

from config.data import DataConfig
from config.job import MOVED_TO_JOB, JobConfig
from config.consistency import check_consistency
from config.run import RunConfig
from config.transport import TransportConfig

#: vLLM captures CUDA graphs for decode batches up to this many sequences by default; above it the
#: engine falls back to eager kernels, which generate more slowly.
VLLM_DEFAULT_MAX_CAPTURE_SIZE = 512


class ModelConfig(Section):
    path: str = "runs/tiny-model"
    """Hugging Face folder of the policy (config, tokenizer, safetensors). Relative paths are taken
    from the working directory. `brorl make-tiny-model` writes the default one."""

    dtype: Literal["float32", "bfloat16"] = "float32"
    """The actors' dtype and the learner's compute dtype (its forward and backward passes run under
    autocast in it; its parameters and AdamW state stay float32 master weights, checkpointed as float32,
    and are sent to the actors in this dtype). float32 on CPU; the paper's runs use bfloat16 on GPUs.
    float16 is not offered: it would need loss scaling."""

    tiny_seed: int = 0
    """Seed for `brorl make-tiny-model` (tokenizer corpus and initial weights)."""


class ActorConfig(Section):
    num_actors: int = Field(1, ge=1)
    """Number of actor processes (one vLLM engine each) that `brorl run` starts."""

    prompts_per_request: int = Field(2, ge=1)
    """Prompts an actor asks the learner for at a time (its credit window)."""

    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature. Paper (training): 1.0; evaluation: 0.6."""

    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass of the actors' rollouts: must be 1.0 (below it μ is the nucleus-renormalised
    distribution while the learner's π_old is the full softmax, which biases every importance weight).
    Evaluation samples with its own top_p (0.95)."""

    max_tokens: int = Field(16, ge=1)
    """Maximum completion length, tokens. Paper: 16,384 context."""

    length_dist: Literal["fixed", "lognormal"] = "fixed"
    """Completion budget per request (one group): "fixed" = `max_tokens`; "lognormal" = drawn per prompt
    from a log-normal with median `length_median` and log-σ `length_sigma`, capped at `max_tokens` (a long
    tail of stragglers, as real completion lengths have, for throughput measurements)."""

    length_median: int = Field(0, ge=0)
    """Median completion budget of `length_dist = "lognormal"`, tokens (0: `max_tokens` / 4)."""

    length_sigma: float = Field(1.0, gt=0.0, le=4.0)
    """Log-σ of `length_dist = "lognormal"` (1.0: the 99th percentile ~10 × the median)."""

    stop: list[str] = Field(default_factory=list)
    """Extra stop strings; the tokenizer's end-of-sequence token always stops. Without stop strings the
    actor asks vLLM for no text and decodes each completion once, at its end; stop strings need vLLM's
    per-step detokenizer, which costs the actor's process time at every step."""

    max_num_seqs: int = Field(256, ge=1)
    """vLLM `max_num_seqs`: sequences decoded concurrently. Must not exceed
    `cuda_graph_max_capture_size`, or vLLM falls to slow eager kernels on GPUs."""

    cuda_graph_max_capture_size: int = Field(VLLM_DEFAULT_MAX_CAPTURE_SIZE, ge=1)
    """Largest decode batch vLLM captures as a CUDA graph (vLLM's default: 512)."""

    max_model_len: int = Field(256, ge=8)
    """Context length the engine reserves per sequence, tokens (prompt + completion)."""

    gpu_memory_utilization: float = Field(0.2, gt=0.0, le=0.95)
    """Share of device memory vLLM reserves (on the CPU backend: share of host RAM; keep ≤ 0.3)."""

    kv_cache_gib: float = Field(0.0, ge=0.0)
    """The KV cache's size in GiB (vLLM `kv_cache_memory_bytes`) instead of what `gpu_memory_utilization`
    leaves for it (0: that share). The CPU preset sets 1: the default share of host RAM gives a cache far larger
    than a small job fills, and allocating it slows every engine start."""

    enable_prefix_caching: bool = True
    """Reuse the prompt's KV cache across the N completions of a group."""

    prefix_cache_per_version: bool = True
    """Salt each request's prefix-cache keys with the weight version it starts under (vLLM's `cache_salt`): a
    request reuses only prompt KV that requests of its own version computed. Under `in_flight_on_update =
    "keep"` the cache outlives updates (finish and abort reset it at each one), so without the salt a new
    request could start from KV an older version computed. False: reuse across versions (to measure what
    that costs: `mismatch_kl`)."""

    in_flight_on_update: Literal["finish", "abort", "keep"] = "finish"
    """What happens to requests in flight when new weights arrive: "finish" them under the old weights
    (no new prompt starts meanwhile), "abort" them and return their prompts to the learner, or "keep"
    them: the engine pauses with them frozen, loads the weights and resumes, so nothing waits for the
    slowest sequence; every token then carries the version that sampled it (the GPU presets' choice;
    a request the update would leave more than `job.max_staleness` behind is aborted)."""

    share_gpu: Literal["corun", "timeshare"] = "corun"
    """How an actor's engine shares the GPU with the learner (one card for both, `config/placement.py`; on
    separate GPUs "corun"): "corun" generates while the learner trains; "timeshare" pauses generation (requests
    kept, vLLM `pause_generation`) while the learner computes a step and resumes when that step's weights are
    loaded (or the learner ends the step with no weights to send): each then runs at its standalone speed.
    The learner tells the actors (control kind "compute"); per-token versions are as with any update."""

    quantization: Literal["none", "fp8"] = "none"
    """The engine's weights: "fp8" has vLLM quantize the bf16 weights to FP8 (per tensor) as it loads them, and
    again at every update (vLLM's layerwise reload re-runs the quantization after the update's bf16 tensors
    land; the checksum is of the bytes received). Faster generation on GPUs with FP8 units
    (docs/benchmarks/actor.md); the learner trains in full precision
    and truncated IS weighs the difference (`mismatch_kl` in the metrics). GPU actors only."""

    enforce_eager: bool = False
    """Disable CUDA graphs / compilation: slower generation on a GPU (debugging there). The CPU preset turns
    it on: a tiny model's engine generates as fast eager, and starts (and restarts) sooner."""

    logprobs_at_end: bool = True
    """Have the engine send each completion's behaviour log-probs once, with its final output
    (`actors/vllm_scheduler.py`), instead of vLLM's per-request arrays at every decoding step (which cost
    much of the generation throughput at many running sequences). The values are the same."""

    tensor_parallel_size: int = Field(1, ge=1, le=16)
    """GPUs per actor engine (vLLM tensor parallelism); `brorl run` gives each actor this many GPUs."""

    gpus: list[int] = Field(default_factory=list)
    """GPUs of the actors, as `brorl run` sees them: actor i takes `tensor_parallel_size` consecutive
    entries. Empty: the GPUs after the learner's, in order. Ignored where no GPU is visible."""

    max_engine_restarts: int = Field(3, ge=0)
    """Times an actor rebuilds a dead vLLM engine in place (in-flight prompts go back to the learner, the
    actor rejoins the weight group); one death more stops the actor with the error, for its supervisor
    (`brorl run`, Ray, Docker) to restart."""


class LearnerConfig(Section):
    steps: int = Field(20, ge=1)
    """RL steps (policy versions) to train."""

    num_minibatches: int = Field(2, ge=1)
    """PPO mini-batches per step, fixed whatever N is (paper 4.2: larger N means larger mini-batches)."""

    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower PPO clip ε_low (ratio floor 1−ε_low). ProRL: 0.2."""

    eps_high: float = Field(0.28, ge=0.0)
    """Upper PPO clip ε_high (clip-higher, ≥ ε_low). DAPO: 0.28; ProRL: 0.4."""

    tis_cap: float = Field(2.0, ge=1.0)
    """C, cap on the truncated importance weight min(π_old/μ, C)."""

    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the k3 KL penalty to the reference policy; 0 disables the reference model."""

    ref_reset_interval: int = Field(0, ge=0)
    """Reset the reference policy to the current policy every this many steps; 0 never (ProRL resets
    periodically)."""

    reset_optimizer_on_ref_reset: bool = False
    """Also clear the AdamW state at a reference reset (ProRL's hard reset)."""

    loss_agg: Literal["token-mean", "seq-mean"] = "token-mean"
    """Loss aggregation over a mini-batch: mean over all response tokens, or mean of per-sample means."""

    lr: float = Field(1e-4, gt=0.0)
    """η0, base learning rate at `lr_base_samples` samples per step. ProRL (1.5B): 2e-6."""

    lr_base_samples: int = Field(0, ge=0)
    """B0, samples per step at which `lr` applies; the step's rate is η0·sqrt(B_samples/B0)
    (paper 4.2). 0 means: the configured step's own size, i.e. no scaling."""

    weight_decay: float = Field(0.01, ge=0.0)
    """AdamW weight decay."""

    grad_clip: float = Field(1.0, gt=0.0)
    """Global gradient-norm clip."""

    micro_batch_tokens: int = Field(0, ge=0)
    """Token budget of one forward/backward pass: a rank's part of each mini-batch is sorted by length and
    cut into micro-batches of at most this many padded tokens (rows × longest prompt + completion; a
    longer single sample goes alone), where they compute the fewest positions; their gradients accumulate
    into one optimizer step whose loss is exactly the whole mini-batch's. 0: each mini-batch in one pass."""

    packing: bool = False
    """Packed sequences: a micro-batch's samples concatenated into one row without any padding, position ids
    restarting at each sample and attention kept within each (on CUDA torch's variable-length flash attention,
    elsewhere an exact block-diagonal mask); micro-batches filled up to `micro_batch_tokens` tokens. The same
    loss and gradients as padded rows (tested). With `compile` the layers are compiled for packed rows (the
    warm-up compiles them: one sample or several, with and without gradients). Off by default; not with
    `share_prompt`."""

    share_prompt: bool = False
    """Compute each group's prompt once per micro-batch: the decoder runs on the prompt, then on the
    group's completions against its keys and values (exactly the unshared result, gradients included).
    Micro-batches then hold one group each, and the token budget counts the prompt once."""

    activation_checkpointing: bool = False
    """Recompute the decoder layers' activations in backward instead of keeping them (less memory, about
    a third more compute)."""

    activation_checkpointing_fraction: float = Field(1.0, gt=0.0, le=1.0)
    """With `activation_checkpointing`: the share of decoder layers recomputed, spread evenly over the
    depth; the others keep their activations. Below 1 trades memory for speed: each layer kept saves
    its recomputation (a forward of that layer) and costs its activations for a whole micro-batch."""

    compile: bool = False
    """Compile each decoder layer and the log-prob chunk with `torch.compile` (dynamic shapes): the norms,
    rotary embedding, activation and log-softmax run as fused kernels instead of one pass over memory
    each. A warm-up before the first step compiles every variant the steps meet (padded rows, or packed ones
    with `packing`). Not with `share_prompt` or ZeRO-3, whose per-layer caches and parameter hooks the
    compiler would have to trace."""

    logprob_chunk_mb: float = Field(256.0, gt=0.0)
    """MiB of float32 logits materialised at once when computing log-probs: response tokens go
    through the LM head in chunks of ⌊budget / (4 · vocabulary)⌋ rows, so peak memory stays flat as
    vocabulary × batch grows."""

    logprob_recompute: bool = True
    """Recompute each chunk's LM-head logits in backward (only one chunk of logits is ever held). False: keep
    what backward needs of every chunk of a micro-batch instead — 2 to 4 bytes × vocabulary per response token
    (bf16 to float32: 9 to 18 GB for 30k response tokens at Qwen2's 151,936) — and skip the LM head's second
    forward and its log-softmax over the vocabulary (docs/benchmarks/learner.md). The same numbers either
    way."""

    logprob_kernel: Literal["chunked", "liger", "off"] = "chunked"
    """How the LM head and the log-softmax run (`learner/kernels.py`). "chunked": our fused head + log-prob in
    torch, CPU or GPU — a chunk of `logprob_chunk_mb` logits at a time, recomputed in backward, which turns them
    into the gradients of the hidden states and the head's weight in one pass. "liger": Liger-Kernel's fused
    linear cross-entropy (Triton; CUDA with liger-kernel installed, else "chunked" runs, logged; no entropy
    metric). "off": the head module on checkpointed chunks. A ZeRO-3 learner runs "off" (its head's weight is
    partitioned between passes); `logprob_recompute = false` runs "off" with the logits kept."""

    liger_kernels: bool = False
    """Liger-Kernel's fused RMSNorm, SwiGLU and RoPE kernels patched into the model's layers, for uncompiled
    layers (refused with `compile`, which cannot trace Liger's RMSNorm: the two are alternatives). CUDA only,
    with liger-kernel installed, for the model families Liger patches (Qwen2/2.5, Qwen3, Llama, Mistral, Gemma,
    Phi-3, ...): refused elsewhere."""

    overlong_filter: bool = False
    """Mask completions cut at `actor.max_tokens` (finish reason "length") out of the loss (DAPO's overlong
    filtering); they still count in their group's baseline. The paper names none: its presets leave it off."""

    overlong_buffer: int = Field(0, ge=0)
    """DAPO's soft overlong punishment: a completion within this many tokens of `actor.max_tokens` loses
    reward linearly, `overlong_penalty` at the limit (added to the verifier's reward before the advantages;
    dynamic sampling reads the verifier's reward or correctness, without it). 0: off."""

    overlong_penalty: float = Field(1.0, ge=0.0)
    """The reward a completion of `actor.max_tokens` tokens loses under `overlong_buffer`."""

    dynamic_sampling: bool = True
    """Drop groups that carry no learning signal (DAPO), as `dynamic_sampling_metric` says; needs N ≥ 2. The
    learner's batcher decides once per group as it arrives; the training step trains what it is given."""

    dynamic_sampling_metric: Literal["reward", "correct"] = "reward"
    """What dynamic sampling reads: "reward" keeps a group whose verifier rewards are not all equal (partial
    credit — code, IFEval — keeps an all-incorrect group scored 0.2 and 0.8; for binary rewards, 1.0 iff
    correct, the same groups as "correct"); "correct" keeps one with 0 < #correct < N. The verifier's
    reward, before `overlong_buffer`'s penalty."""

    advantage_whitening: Literal["samples", "tokens"] = "samples"
    """Over what REINFORCE++-baseline's Â = (A − mean) / std takes its mean and std: the step's trained
    samples, each counting once (the paper's), or their response tokens, each sample weighted by its length
    (OpenRLHF's REINFORCE++). Either way over the samples that train: completions masked by
    `overlong_filter` or empty stay in their group's baseline but out of the statistics."""

    dual_clip_c: float = Field(0.0, ge=0.0)
    """Dual-clip PPO's c (> 1; verl's 3): for a negative advantage the clipped objective is bounded below by
    c·Â, so a token whose ratio ran past c adds no gradient. 0: off (the paper's recipe has none; truncated
    IS already caps the weight of stale tokens)."""

    lora_rank: int = Field(0, ge=0)
    """LoRA (`learner/lora.py`): train rank-r adapters on `lora_targets` instead of the whole model; the base
    stays frozen in `model.dtype` on a GPU (float32 on a CPU), the adapters and their AdamW state float32, and
    the actors receive the merged weights W + (alpha / r)·B·A under the model's own names (no LoRA in the
    engine). 0: off, full fine-tuning. Not with DeepSpeed, `kl_coef` > 0 or `init_from`."""

    lora_alpha: float = Field(16.0, gt=0.0)
    """LoRA's alpha: the adapters' update is scaled by alpha / `lora_rank`."""

    lora_targets: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"])
    """Names (last component) of the linear layers that get adapters: by default the attention and MLP
    projections of Llama/Qwen/Mistral-style decoders. The embeddings and the LM head cannot be targets (the
    log-prob kernels read the head's weight directly)."""

    backend: Literal["torch", "deepspeed"] = "torch"
    """Training backend: plain torch (CPU or one GPU) or DeepSpeed ZeRO (several GPUs)."""

    zero_stage: Literal[2, 3] = 2
    """DeepSpeed ZeRO stage when `backend = "deepspeed"`: 2 shards gradients and optimizer state; 3 also the
    parameters (gathered layer by layer in each pass, bucket by bucket for the weight broadcast)."""

    device: str = "cpu"
    """Torch device of the learner ("cpu", "cuda", "cuda:1"). With `devices` > 1: "cuda" (rank r on
    cuda:r of the GPUs the learner sees) or "cpu" (gloo ranks)."""

    devices: int = Field(1, ge=1, le=64)
    """Learner ranks on this host, one per GPU: `brorl learner` starts this many processes; rank 0 runs
    the service and hands each rank its micro-batches; DeepSpeed ZeRO (`backend = "deepspeed"`) shards
    gradients and optimizer state over them."""

    gpus: list[int] = Field(default_factory=list)
    """GPUs of the learner's ranks for `brorl run` (rank r on the r-th), with `device = "cuda"`. Empty: the
    first `devices` GPUs, or the one `device = "cuda:k"` names. Each role sees only its own GPUs."""

    no_progress_s: float = Field(60.0, gt=0.0)
    """When no step has completed for this long, the learner logs why no batch is forming (and again
    every as long), and counts it in the next step's `no_progress_warnings`."""

    lease_timeout_s: float = Field(0.0, ge=0.0)
    """Seconds a granted prompt (a lease) may go unanswered before it goes back to the queue and is granted
    to whoever asks next; its holder then holds at most one prompt until it delivers a group (a late group
    still counts if its prompt was not granted again). 0: automatic, 3 × the longest of the last 256
    leases answered (grant to group), at least 30 s, and no deadline before the first group: it follows
    the job's own group times, so slow actors at large N are not robbed. Each actor holds at most its
    share of the freshness bound (the bound / the live actors) either way."""

    max_nonfinite_steps: int = Field(3, ge=1)
    """A step whose every mini-batch had a non-finite loss or gradient norm changes nothing (skipped,
    counted in `step_skipped`); this many such steps in a row stop the job with the error, after a
    checkpoint of the (unchanged, last good) weights."""

    checkpoint_interval: int = Field(10, ge=1)
    """Write a checkpoint every this many steps, at the last step (the trained model) and on SIGTERM."""

    checkpoint_keep: int = Field(3, ge=1)
    """Checkpoints kept by rotation (the newest ones); a checkpoint folder holding a file named KEEP is
    never removed."""

    init_from: str = ""
    """A checkpoint folder of another run (`<run_dir>/checkpoints/step-000440`) this run starts from: its
    model and its AdamW state (moments and update count), so a new phase continues the optimizer of the one
    before; the step, data cursor and learning rate are this run's own. `model.path` must be that folder's
    `model` (the actors start from the same weights). "": a fresh optimizer. A resumed run ignores it."""

    seed: int = 0
    """Seed of the learner's RNGs (data order, dropout)."""


class VerifierConfig(Section):
    task: str = "synthetic"
    """The procedural task, used when `data.train` names no file: synthetic, reasoning_gym:<dataset>, or
    throughput:<pass rate>[:<prompt chars>] (any model, trained or not, passes at that rate: for measuring
    the system with random-weight models). "" : none (the job must name `data.train`)."""

    difficulty: int = Field(1, ge=1)
    """Difficulty knob of the synthetic task (digits per operand)."""

    timeout_s: float = Field(5.0, gt=0.0)
    """Wall-clock limit for scoring one completion, seconds."""

    workers: int = Field(1, ge=1)
    """Verifier worker processes per actor, and for a held-out evaluation (the learner's, `brorl eval`)."""

    on_error: Literal["zero", "drop"] = "zero"
    """A verifier that raises, hangs or crashes: reward 0 with a reason, or drop the group."""

    allowed_modules: list[str] = Field(default_factory=lambda: ["verifiers.*"])
    """Module patterns (fnmatch) a verifier swap may load, e.g. "mylab.verifiers.*". Anything else is
    refused before it is imported, by the learner and by every actor."""

    check_timeout_s: float = Field(60.0, gt=0.0)
    """Time limit for importing a verifier and running its self-test (in a separate process), when an
    actor starts and on every swap; past it the verifier is rejected and the previous one stays."""

    sandbox_unsafe: bool = False
    """UNSAFE: where the code sandbox cannot contain programs (no bubblewrap, user namespaces denied), run
    them anyway with rlimits and a wall-clock kill only. Off: an actor of a code task refuses to start."""


class BrorlConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy model."""

    job: JobConfig = Field(default_factory=JobConfig)
    """N, B and K: what every role reads."""

    actor: ActorConfig = Field(default_factory=ActorConfig)
    """Generation (vLLM actors)."""

    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    """The BroRL update."""

    transport: TransportConfig = Field(default_factory=TransportConfig)
    """Sockets and weight broadcast."""

    verifiers: VerifierConfig = Field(default_factory=VerifierConfig)
    """Tasks and rewards."""

    data: DataConfig = Field(default_factory=DataConfig)
    """The user's task files, prompt rendering and answer reading."""

    run: RunConfig = Field(default_factory=RunConfig)
    """Run folder, seeds, evaluation."""

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data):
        """A key of the old layout is refused with the place it moved to (nothing is guessed)."""
        if isinstance(data, dict):
            moved = [f"{sec}.{key}" for sec, key in sorted(MOVED_TO_JOB)
                     if isinstance(data.get(sec), dict) and key in data[sec]]
            if moved:
                raise ValueError(", ".join(f"{m} moved to job.{m.split('.')[1]}" for m in moved) +
                                 ": N, B and K are job-wide, in the [job] section (docs/configuration.md)")
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> "BrorlConfig":
        check_consistency(self)
        return self

    @property
    def samples_per_step(self) -> int:
        """B_samples: kept groups per step × N."""
        return self.job.prompts_per_step * self.job.n_samples
