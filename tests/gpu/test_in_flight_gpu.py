"""In-flight weight updates on GPUs: an NCCL broadcast into a vLLM engine paused with its requests frozen
(`actor.in_flight_on_update = "keep"`); the kept completions continue and carry both versions, and the
tokens labelled with the old version are the old weights' samples."""

import os

import numpy as np
import pytest
import torch

from config.placement import visible_env
from tests.e2e.test_actor import actor_cfg, start_actor, stop_actor
from tests.e2e.test_in_flight import logprobs_under, perturbed, push_until_mixed, split_versions
from tests.support.fake_learner import FakeLearner


@pytest.mark.gpu
async def test_nccl_update_into_a_keep_paused_engine_labels_every_token(tiny_model_dir, tmp_path, monkeypatch):
    assert torch.cuda.device_count() >= 2, "this test needs 2 GPUs (the actor on GPU 0, the learner's rank on 1)"
    torch.cuda.set_device(1)
    m0 = perturbed(tiny_model_dir, 0).to("cuda:1")  # not the disk weights: version 1 is pushed first
    fl = FakeLearner(m0, backend="nccl")
    cfg = actor_cfg(tiny_model_dir, 16, **{"actor.in_flight_on_update": "keep", "actor.max_tokens": 192,
                                           "actor.max_model_len": 256, "job.max_staleness": 8,
                                           "transport.weight_backend": "nccl", "model.dtype": "float32",
                                           "actor.gpu_memory_utilization": 0.3, "actor.kv_cache_gib": 0})
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible_env([0], parent))  # the actor process sees GPU 0 only
    proc = start_actor(cfg, tmp_path, fl.work_url, "a0")
    monkeypatch.undo()
    try:
        # the engine first (on a GPU it takes longer to start than the weight group waits for a member)
        await fl.wait_hello("a0")
        await fl.push_weights(["a0"], version=1)
        await fl.wait_groups(2, timeout_s=300, where=lambda g: g.policy_version == 1)
        # a group begun under the disk weights (version 0) may have been in flight when version 1 landed
        models = {0: perturbed(tiny_model_dir, None), 1: m0}
        mixed = await push_until_mixed(fl, tiny_model_dir, models, device="cuda:1")
        g = mixed[0]
        v_old = int(g.token_versions().min())
        ref_lp = logprobs_under(models[v_old].to("cpu"), g)
        for mu, vs, ref in zip(g.completion_logprobs(), split_versions(g), ref_lp):
            old = vs == v_old
            np.testing.assert_allclose(mu[old], ref[old], atol=2e-2)  # CUDA kernels: a few 1e-3 per token
    finally:
        await stop_actor(proc, fl)
