"""Code that runs inside vLLM's worker processes.

Importing this module registers the `brorl_gloo`, `brorl_nccl` and `brorl_ipc` weight-transfer engines with vLLM's
`WeightTransferEngineFactory`. vLLM imports it in every worker because the engine is started with
`worker_extension_cls="transport.vllm_ext.BrorlWorkerExtension"`, which happens before the worker
creates its weight-transfer engine (vLLM 0.26 and 0.32 both resolve the extension class first).

`GlooWeightTransferEngine` receives the learner's buckets over a gloo group of its own and loads them
through the model's `load_weights`: in place where every layer serves its weights as loaded (an unquantized
dense model on a GPU: `direct_reload`), otherwise inside vLLM's layerwise-reload lifecycle (the route vLLM's
own NCCL engine takes; it re-runs each layer's post-load processing, which the CPU backend's repacked
weights, quantized layers and MLA need, at the cost of materialising every layer again). It records the
version and checksum of what it loaded, which `BrorlWorkerExtension.brorl_weight_state` reports, and the
time split of its last update (`brorl_weight_timings`).
`NcclWeightTransferEngine` is the same over NCCL into device buffers. `IpcWeightTransferEngine`
(`transport.weight_backend = "ipc"`, learner and actors on one host) maps the learner's persistent
shared buffer once, at the rendezvous (transport/ipc.py); each update it waits on its gloo group for
"version v is in the buffer", loads the buckets from the buffer by the same layerwise-reload route, and
acknowledges once the reload is finished (the learner writes the buffer again only after every
acknowledgement).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from transport.ipc import SETTING as IPC_SETTING
from transport.ipc import OpenedBuffer, acknowledge, await_shared, read_shared
from transport.weights import (
    WeightPlan,
    open_group,
    receive_buckets,
    release_group,
    unpack_bucket,
)



@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    world_size: int
    group_name: str
    rank_offset: int = 1
    timeout_s: float = 120.0
    buffers: list[dict[str, Any]] = field(default_factory=list)
    """ipc: one handle to the learner's shared weight buffer per receiving rank (transport/ipc.py)."""


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    buckets: list[list[int]]
    version: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Bucketed, versioned, checksummed receive over a torch process group of our own (gloo here;
    `NcclWeightTransferEngine` below is the same over NCCL with device buffers)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    backend = "gloo"
    requires_buffer = False  # ipc's engine: only a group with a shared buffer may be joined

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.pg = None
        self._store = None
        self.shared: OpenedBuffer | None = None  # ipc: the learner's buffer, mapped here at the rendezvous
        self._unacknowledged: int | None = None  # ipc: the version read from it, acknowledged once loaded
        self.version = -1
        self.checksum = ""
        self.timeout_s = 120.0  # the group's (transport.weight_timeout_s), set when it is joined
        self.reload = "auto"  # "layerwise": always vLLM's layerwise reload (`brorl_set_reload`, benchmarks)
        self._layerwise = True  # this update's route, decided at its start
        self.timings: dict[str, Any] = {}  # the last update's split, `brorl_weight_timings`

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        pc = self.parallel_config
        dp_rank = getattr(pc, "data_parallel_index", getattr(pc, "data_parallel_rank", 0)) or 0
        rank = init_info.rank_offset + dp_rank * pc.world_size + pc.rank
        self.shutdown()
        if self.requires_buffer and not init_info.buffers:
            raise RuntimeError(f"this engine is set up for {IPC_SETTING} but the learner's weight group has no "
                               f"shared buffer: set the same transport.weight_backend for the learner and actors")
        if init_info.buffers:  # ipc: data through the shared buffer, the group only says when (gloo, small)
            self.shared = OpenedBuffer(init_info.buffers[rank - 1])
        self.pg, self._store = open_group(init_info.master_address, init_info.master_port, rank,
                                          init_info.world_size, init_info.group_name, init_info.timeout_s,
                                          "gloo" if init_info.buffers else self.backend)
        self.timeout_s = init_info.timeout_s

    def start_weight_update(self) -> None:
        t0 = time.perf_counter()
        why = "layerwise requested" if self.reload == "layerwise" else direct_reload(
            self.model, self.model_config, getattr(self, "vllm_config", None), self.device)
        self._layerwise = bool(why)
        if self._layerwise:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)
        self.timings = {"route": "layerwise" if why else "direct", "why": why, "start_s": time.perf_counter() - t0}

    def finish_weight_update(self) -> None:
        t0 = time.perf_counter()
        version, self._unacknowledged = self._unacknowledged, None
        try:
            if self._layerwise:
                from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

                finalize_layerwise_reload(self.model, self.model_config)
                reprepack_cpu_moe(self.model)
            if version is not None and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # every copy out of the shared buffer is done
        except BaseException:
            if version is not None:
                acknowledge(self.pg, version, False)
            raise
        if version is not None:  # the learner may write the shared buffer again
            acknowledge(self.pg, version, True)
        self.timings["finish_s"] = time.perf_counter() - t0

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.pg is None:
            raise RuntimeError("brorl_gloo: update before init_weight_transfer_engine")
        plan = WeightPlan(update_info.names, update_info.dtype_names, update_info.shapes, update_info.buckets)
        t0 = time.perf_counter()
        if self.shared is not None:
            self._receive_shared(plan, update_info.version)
        else:
            device = self.device if self.backend == "nccl" else "cpu"
            self.checksum = receive_buckets(self.pg, plan, device, lambda flat, a, b: self._load(plan, flat, a, b),
                                            self.timeout_s)
            self.version = update_info.version
        self.timings["receive_s"] = time.perf_counter() - t0

    def _load(self, plan: WeightPlan, flat: torch.Tensor, first: int, last: int) -> None:
        t0 = time.perf_counter()
        self.model.load_weights(unpack_bucket(flat, plan, first, last))
        self.timings["load_s"] = self.timings.get("load_s", 0.0) + time.perf_counter() - t0

    def _receive_shared(self, plan: WeightPlan, version: int) -> None:
        """ipc: wait for the learner's word, then load from the shared buffer; acknowledged in
        `finish_weight_update` once every copy out of the buffer (and any layerwise reload) is done (a failure
        here is acknowledged at once, so the learner need not wait out its timeout)."""
        self._unacknowledged = None
        t0 = time.perf_counter()
        await_shared(self.pg, version)
        self.timings["await_s"] = time.perf_counter() - t0
        try:
            self.checksum = read_shared(self.shared.tensor, plan, lambda flat, a, b: self._load(plan, flat, a, b))
        except BaseException:
            acknowledge(self.pg, version, False)
            raise
        self.version, self._unacknowledged = version, version

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # vLLM 0.32's base class synchronizes an accelerator afterwards; on CPU there is none to wait on.
        self.receive_weights(self.parse_update_info(update_info))

    def shutdown(self) -> None:
        release_group(self.pg)
        self.pg, self._store = None, None
        if self.shared is not None:
            self.shared.close()
            self.shared = None

    @classmethod
    def trainer_send_weights(cls, *args: Any, **kwargs: Any) -> None:
        """Abstract in vLLM 0.26's base class (absent in 0.32): our trainer side is
        `transport.weights.WeightBroadcaster`, so this engine never sends."""
        raise NotImplementedError("brorl learners send with transport.weights.WeightBroadcaster")


PLAIN_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
"""Layers whose post-load processing is nothing on a GPU: their weights serve as loaded."""


def direct_reload(model: torch.nn.Module, model_config: Any, vllm_config: Any, device: torch.device) -> str:
    """Why an update into `model` must take vLLM's layerwise reload ("" when `load_weights` may copy in place).

    Layerwise reload puts every layer back on the meta device, materialises it again, loads it and re-runs its
    post-load processing: needed where that processing changes the weights (the CPU backend repacks every linear
    layer; quantized layers quantize; MLA absorbs its projections; MoE kernels may shuffle experts; attention
    backends keep their own copy of attention sinks), wasted elsewhere. On a GPU an unquantized dense model's
    linear and embedding layers serve their weights as loaded, so the update is a copy into each parameter
    (vLLM's own in-place route for RL trainers)."""
    if torch.device(device).type != "cuda":
        return f"the {torch.device(device).type} backend repacks weights after loading"
    if getattr(model_config, "quantization", None):
        return f"quantized serving ({model_config.quantization})"
    if getattr(model_config, "use_mla", False):
        return "MLA attention processes its projections after loading"
    cache_dtype = getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto")
    if str(cache_dtype) != "auto":
        return f"kv_cache_dtype {cache_dtype} (scales are processed after loading)"
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None and type(method).__name__ not in PLAIN_METHODS:
            return f"{name or 'the model'} uses {type(method).__name__}, which processes weights after loading"
    for name, _ in model.named_parameters():
        if name.rpartition(".")[2] == "sinks":
            return f"attention sinks ({name}): attention backends serve a copy made after loading"
    return ""


def reprepack_cpu_moe(model: torch.nn.Module) -> int:
    """Put the CPU MoE kernels' expert weights back into their packed layout after a reload; returns the
    number of MoE layers repacked.

    vLLM's CPU experts prepack `w13_weight`/`w2_weight` into a grouped-gemm layout on the first load only: on a
    reload the unquantized MoE method copies the new, unpacked weights into the packed tensors' storage and skips
    the prepack, so the kernel would read plain weights as packed ones (a model that trains wrong, not one that
    fails). GPU kernels do not prepack; nothing to do there."""
    try:
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU MoE experts (the CUDA build keeps them elsewhere, unused on GPUs)
        return 0
    done = 0
    for layer in model.modules():
        kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
            continue
        if experts._padded_intermediate_size(experts.moe_config) != experts.moe_config.intermediate_size_per_partition:
            raise RuntimeError(f"{type(layer).__name__}: vLLM's CPU MoE pads this model's intermediate size, and an "
                               "in-place weight update cannot be repacked for it; use a GPU actor for this model")
        for name in ("w13_weight", "w2_weight"):
            param = getattr(layer, name)
            param.data.copy_(cpu_prepack_moe_weight(param.data.contiguous(), experts.isa))
        done += 1
    return done


class NcclWeightTransferEngine(GlooWeightTransferEngine):
    backend = "nccl"

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        torch.cuda.synchronize()


class IpcWeightTransferEngine(GlooWeightTransferEngine):
    """`transport.weight_backend = "ipc"`: the learner's shared buffer (CUDA IPC or POSIX shared memory) as the
    data plane, a gloo group of its own for "version v is in the buffer" and the acknowledgements."""

    requires_buffer = True

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def register() -> None:
    for name, cls in (("brorl_gloo", GlooWeightTransferEngine), ("brorl_nccl", NcclWeightTransferEngine),
                      ("brorl_ipc", IpcWeightTransferEngine)):
        try:
            WeightTransferEngineFactory.register_engine(name, cls)
        except ValueError:
            pass  # already registered in this process


register()


class _CountingRequests(dict):
    """The model runner's request table (`req_id -> CachedRequestState`), remembering how many tokens
    each request had generated when the runner dropped it (it finished): a group's completion that
    finished before a weight update is still counted at that update."""

    def __init__(self, table: dict):
        super().__init__(table)
        self.finished: dict[str, int] = {}

    def pop(self, key, *default):
        state = super().pop(key, *default)
        if state is not None and hasattr(state, "output_token_ids"):
            self.finished[key] = len(state.output_token_ids)
        return state

    def take_counts(self) -> dict[str, int]:
        """Tokens generated so far per request (those finished since the last call included)."""
        out = {**self.finished, **{k: len(v.output_token_ids) for k, v in self.items()}}
        self.finished = {}
        return out


class BrorlWorkerExtension:
    """Mixed into vLLM's worker class; methods are reachable through `collective_rpc`."""

    def brorl_track_requests(self) -> bool:
        """Start counting each request's generated tokens (`brorl_output_counts`); False where this vLLM's
        model runner keeps no request table we know."""
        runner = getattr(self, "model_runner", None)
        table = getattr(runner, "requests", None)
        if not isinstance(table, dict):
            return False
        if not isinstance(table, _CountingRequests):
            runner.requests = _CountingRequests(table)
        return True

    def brorl_output_counts(self) -> dict[str, int]:
        """Tokens each request has generated so far (engine request ids; a request that finished since the
        last call included). Read while the engine is paused, just before new weights load: exactly the
        tokens the outgoing weights sampled."""
        table = getattr(getattr(self, "model_runner", None), "requests", None)
        if not isinstance(table, _CountingRequests):
            raise RuntimeError("brorl_output_counts before brorl_track_requests (or the model runner replaced "
                               "its request table): the version of in-flight tokens cannot be known")
        return table.take_counts()

    def brorl_weight_timings(self) -> dict[str, Any]:
        """The last update's split on this worker: its route ("direct" or "layerwise", and why), seconds to
        start, to wait for the learner's word (ipc), to load (`load_weights`), to receive in all, to finish."""
        eng = getattr(self, "weight_transfer_engine", None)
        return dict(getattr(eng, "timings", {}))

    def brorl_set_reload(self, mode: str) -> None:
        """"auto" (in place where `direct_reload` allows) or "layerwise" (always): for benchmarks of both."""
        if mode not in ("auto", "layerwise"):
            raise ValueError(f"reload mode {mode!r}: expected auto or layerwise")
        self.weight_transfer_engine.reload = mode

    def brorl_weight_state(self) -> tuple[int, str]:
        eng = getattr(self, "weight_transfer_engine", None)
        if eng is None or not hasattr(eng, "version"):
            return -1, ""
        return int(eng.version), str(eng.checksum)
