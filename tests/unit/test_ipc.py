"""transport.weight_backend = "ipc": the shared buffer's handles, its refusals, and the protocol's bookkeeping."""

import json
from pathlib import Path

import pytest
import torch

from transport.ipc import IpcError, OpenedBuffer, SharedBuffer, bucket_offsets, remote_learner
from transport.weights import WeightBroadcaster, make_plan


def test_a_cpu_buffer_is_shared_memory_a_worker_maps_by_its_json_handle_and_closing_unlinks_it():
    buf = SharedBuffer(1000, "cpu")
    h = json.loads(json.dumps(buf.handle()))  # it travels in a control message: plain JSON
    assert h["kind"] == "shm" and h["nbytes"] == 1000
    seen = OpenedBuffer(h)
    buf.tensor[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert seen.tensor[:4].tolist() == [1, 2, 3, 4]  # one memory, not a copy
    seen.close()
    assert Path("/dev/shm", h["name"]).exists()  # a worker letting go leaves the learner's segment alone
    buf.close()
    assert not Path("/dev/shm", h["name"]).exists()
    with pytest.raises(IpcError, match=r'transport.weight_backend = "ipc": the learner\'s shared weight buffer .* does '
                                       r'not exist here'):
        OpenedBuffer(h)


def test_a_worker_maps_the_segment_without_multiprocessings_resource_tracker(monkeypatch):
    """On Python 3.11/3.12 a SharedMemory attach registers the segment with the attaching process's resource
    tracker, which unlinks it when that process exits: the learner's buffer would vanish with a worker."""
    from multiprocessing import resource_tracker

    buf = SharedBuffer(64, "cpu")
    calls = []
    monkeypatch.setattr(resource_tracker, "register", lambda *a: calls.append(a))
    OpenedBuffer(buf.handle()).close()
    buf.close()
    assert calls == []


def test_a_handle_from_another_host_is_refused_naming_the_setting():
    buf = SharedBuffer(64, "cpu")
    try:
        with pytest.raises(IpcError, match=r'transport.weight_backend = "ipc" needs the learner and its actors on one '
                                           r'host; this worker runs on another: set transport.weight_backend to "nccl"'):
            OpenedBuffer({**buf.handle(), "boot_id": "another-machine"})
    finally:
        buf.close()


def test_an_actor_whose_learner_is_on_another_host_is_refused_at_start_only_with_ipc():
    assert remote_learner("ipc", "127.0.0.1") == "" and remote_learner("ipc", "localhost") == ""
    assert remote_learner("gloo", "192.0.2.1") == ""  # TEST-NET-1: never this machine's
    why = remote_learner("ipc", "192.0.2.1")
    assert why.startswith('transport.weight_backend = "ipc" needs the learner on this host') and "\n" not in why


def test_the_rendezvous_hands_each_worker_a_handle_to_one_persistent_buffer_and_names_them():
    params = {"a": torch.randn(100, 10), "b": torch.randn(7), "c": torch.randn(300)}
    bc = WeightBroadcaster(lambda: params.items(), bucket_mb=0.002, backend="ipc", dtype=torch.bfloat16)
    plan = bc.plan
    assert len(plan.buckets) >= 2 and bucket_offsets(plan) == [sum(n for *_, n in plan.buckets[:i])
                                                               for i in range(len(plan.buckets))]
    info, offs = bc.rendezvous_info(12345, [2, 1], names=["actor-0", "actor-1"])
    assert offs == [1, 3] and info["world_size"] == 4 and len(info["buffers"]) == 3
    assert bc.rank_names == {1: "actor-0 (worker 0)", 2: "actor-0 (worker 1)", 3: "actor-1"}
    # the serving dtype's bytes of every bucket, laid end to end: the buffer's whole cost
    assert bc.buffer.nbytes == sum(n for *_, n in plan.buckets) == sum(n for *_, n in make_plan(
        params.items(), 0.002, torch.bfloat16).buckets)
    first = bc.buffer
    info2, _ = bc.rendezvous_info(12346, [1])  # a later rendezvous (a joiner): the same buffer, handed out again
    assert bc.buffer is first and info2["buffers"][0]["name"] == info["buffers"][0]["name"]
    assert WeightBroadcaster(lambda: params.items()).rendezvous_info(1, [1])[0].get("buffers") is None  # gloo: none
    first.close()


def test_ipc_reaches_vllm_as_our_engine():
    from actors.engine import WEIGHT_ENGINES

    assert WEIGHT_ENGINES["ipc"] == "brorl_ipc"


def test_an_update_loads_in_place_only_where_every_layer_serves_its_weights_as_loaded():
    """`direct_reload`: on a GPU an unquantized dense model skips vLLM's layerwise reload; the CPU backend, a
    quantized model, MLA, a quantized KV cache, attention sinks and any layer whose method processes weights (an
    MoE's) keep it, each with its reason."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    from transport.vllm_ext import direct_reload

    def layer(method):
        m = torch.nn.Linear(2, 2)
        m.quant_method = method
        return m

    model = torch.nn.Sequential(layer(UnquantizedEmbeddingMethod()), layer(UnquantizedLinearMethod()),
                                torch.nn.LayerNorm(2))
    mc = SimpleNamespace(quantization=None, use_mla=False)
    vc = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"))
    cuda = torch.device("cuda", 0)  # only compared: nothing is allocated there
    assert direct_reload(model, mc, vc, cuda) == ""
    assert direct_reload(model, mc, None, cuda) == ""  # a vLLM whose engine keeps no vllm_config
    assert "cpu backend repacks" in direct_reload(model, mc, vc, torch.device("cpu"))
    assert "quantized serving (fp8)" in direct_reload(model, SimpleNamespace(quantization="fp8", use_mla=False), vc,
                                                      cuda)
    assert "MLA" in direct_reload(model, SimpleNamespace(quantization=None, use_mla=True), vc, cuda)
    assert "kv_cache_dtype fp8" in direct_reload(
        model, mc, SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="fp8")), cuda)
    sinks = torch.nn.Sequential(model, torch.nn.Module())
    sinks[1].sinks = torch.nn.Parameter(torch.zeros(2))
    assert direct_reload(sinks, mc, vc, cuda).startswith("attention sinks (1.sinks)")
    moe = torch.nn.Sequential(model, layer(UnquantizedFusedMoEMethod.__new__(UnquantizedFusedMoEMethod)))
    assert direct_reload(moe, mc, vc, cuda) == "1 uses UnquantizedFusedMoEMethod, which processes weights after loading"
