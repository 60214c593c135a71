"""transport.weight_backend = "ipc" on CUDA: the learner and a vLLM engine on one GPU, the engine's worker
mapping the learner's persistent buffer by CUDA IPC (keyed by the GPU's UUID) once, at the rendezvous."""

import asyncio
import copy
import time

import pytest
import torch

from config.loader import load_config


@pytest.mark.gpu
def test_vllm_cuda_ipc_weight_updates_on_a_shared_gpu(tiny_model_dir, monkeypatch):
    """Two updates through the same shared buffer land, copied in place (no layerwise reload): version, checksum,
    the engine samples from the new weights, then from the old ones again; a receiver that never loads is named in an error within the timeout."""
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    from actors.engine import engine_kwargs, offline_env, sampling_params
    from tests.support.vllm_weights import behaviour_gap
    from transport.ports import free_port
    from transport.weights import WeightBroadcaster, WeightReceiver, WeightSyncError

    offline_env()
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # CUDA may be up in this process already
    cfg = load_config("tiny-cpu", {"model.path": tiny_model_dir, "actor.gpu_memory_utilization": 0.3,
                                   "actor.kv_cache_gib": 0, "transport.weight_backend": "ipc"})
    llm = LLM(**engine_kwargs(cfg.model, cfg.actor, weight_backend="ipc"))
    dev = torch.device("cuda:0")  # the engine's GPU too
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(dev).eval()
    old = copy.deepcopy(model)

    def behaviour_error(m):
        gap = behaviour_gap(llm, m, ["3+4=", "12-5="], sampling_params(cfg.actor, n=8, max_tokens=8), dev)
        return gap.abs().max().item()

    async def updates():
        bc = WeightBroadcaster(lambda: model.state_dict().items(), bucket_mb=0.5, timeout_s=60, backend="ipc",
                               device=dev)
        rx = WeightReceiver(llm, is_async=False)
        info, offs = bc.rendezvous_info(free_port(), [1], names=["engine"])
        h = info["buffers"][0]
        assert h["kind"] == "cuda" and h["uuid"] == str(torch.cuda.get_device_properties(dev).uuid)
        await asyncio.gather(bc.open(info), rx.join(info, offs[0], bc.plan.to_dict()))
        errs = []
        for version, perturb in ((1, True), (2, False)):
            with torch.no_grad():
                for p, q in zip(model.parameters(), old.parameters()):
                    p.copy_(q + torch.randn_like(q) * 0.3 if perturb else q)
            t0 = time.perf_counter()
            sent, got = await asyncio.gather(bc.broadcast(version), rx.receive(version))
            print(f"ipc update {version}: {time.perf_counter() - t0:.3f} s, learner split {bc.last_split}")
            assert got == (version, sent)
            split = llm.collective_rpc("brorl_weight_timings")[0]
            assert split["route"] == "direct", split  # an unquantized dense model on a GPU: copied in place
            errs.append((behaviour_error(model), behaviour_error(old) if perturb else None))
        # an engine that is never told to load: the learner's wait ends within its timeout, naming it
        bc.timeout_s = 3.0
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"receivers engine .*did not acknowledge version 3"):
            await bc.broadcast(3)
        assert time.monotonic() - t0 < 15 and bc.buffer is None
        return errs

    torch.manual_seed(3)
    (new_err, old_err), (back_err, _) = asyncio.run(updates())
    assert new_err < 5e-2 and old_err > 10 * new_err, (new_err, old_err)  # it samples from the new weights
    assert back_err < 5e-2  # and from the old ones again, through the same buffer
