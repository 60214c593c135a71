"""FP8 rollouts (`actor.quantization = "fp8"`) on one GPU: vLLM quantizes the weights as it loads them and again
after each update that arrives in bf16 (its layerwise reload), so the engine samples from the new weights; the
behaviour log-probs it reports are the FP8 policy's, near the learner's full-precision ones (the gap is printed:
truncated IS corrects it, `mismatch_kl` reports it)."""

import copy
from pathlib import Path

import pytest
import torch

from config.loader import load_config


@pytest.mark.gpu
def test_an_fp8_engine_takes_each_weight_update_and_samples_from_it(tiny_model_dir, monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    from actors.engine import engine_kwargs, offline_env, sampling_params
    from tests.support.vllm_weights import behaviour_gap, broadcast_into

    offline_env()
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # CUDA is up in this process already
    cfg = load_config("tiny-cpu", {"model.path": tiny_model_dir, "model.dtype": "bfloat16",  # FP8 GEMMs give bf16
                                   "actor.gpu_memory_utilization": 0.3, "actor.kv_cache_gib": 0,
                                   "actor.quantization": "fp8"})
    kw = engine_kwargs(cfg.model, cfg.actor, weight_backend="gloo")
    assert kw["quantization"] == "fp8"
    llm = LLM(**kw)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()  # the learner, on CPU

    def gap(m, llm=llm):
        """(mean |log π − log μ|, mean (log μ − log π)) over the engine's sampled tokens, π = `m` in fp32."""
        d = behaviour_gap(llm, m, ["3+4=", "12-5=", "7*6="], sampling_params(cfg.actor, n=16, max_tokens=8))
        return d.abs().mean().item(), d.mean().item()

    before = gap(model)
    old = copy.deepcopy(model)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)

    sent, (version, checksum) = broadcast_into(llm, model, "gloo", dtype=torch.bfloat16)
    assert (version, checksum) == (1, sent)
    new, stale = gap(model), gap(old)
    # the same weights loaded by a fresh FP8 engine: what FP8 itself costs these weights
    import shutil

    model.to(torch.bfloat16).save_pretrained(tmp_path / "new")
    for f in Path(tiny_model_dir).glob("tok*"):
        shutil.copy(f, tmp_path / "new")
    fresh_cfg = cfg.model.model_copy(update={"path": str(tmp_path / "new")})
    fresh = gap(model.float(), LLM(**engine_kwargs(fresh_cfg, cfg.actor, weight_backend="gloo")))
    print({"fp8 gap before update (mean |Δ|, KL est.)": before, "after, to the new weights": new,
           "after, to the old weights": stale, "a fresh FP8 engine of the new weights": fresh})
    assert stale[0] > 3 * new[0], (new, stale)  # it samples from the new weights, quantized
    assert new[0] < 2 * fresh[0] + 0.05, (new, fresh)  # re-quantized at the update as at a load
