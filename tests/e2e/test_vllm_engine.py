"""One real vLLM engine (CPU backend, shared by the module): its behaviour log-probs against a transformers
recompute, and weight broadcasts into the running engine through its weight-transfer API."""

import asyncio

import pytest
import torch

from transport.weights import WeightBroadcaster, WeightReceiver, free_port, weights_checksum

# vLLM and transformers both run the tiny model in float32 on CPU but with different kernels
# (vLLM's CPU attention and fused RMSNorm/SiLU vs torch eager), so per-token log-probs differ only by
# float32 rounding accumulated over 4 layers: ~1e-6 relative, ~1e-5 absolute on log-probs near -5.
# We allow 1e-3 absolute per token: 100x the observed error, and still 3 orders of magnitude below
# what a real disagreement (a different token distribution, a wrong position or temperature) gives.
LOGPROB_ATOL = 1e-3


@pytest.mark.vllm
def test_vllm_logprobs_match_transformers(vllm_engine, tiny_cfg, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from actors.engine import sampling_params
    from learner.logprobs import pack, token_logprobs

    prompts = ["3+4=", "25-7=", "9+9="]
    outs = vllm_engine.generate(prompts, sampling_params(tiny_cfg.actor, n=8, max_tokens=8))
    P, C, B = [], [], []
    for o in outs:
        assert len(o.outputs) == 8
        for c in o.outputs:
            assert len(c.logprobs) == len(c.token_ids) > 0
            P.append(list(o.prompt_token_ids))
            C.append(list(c.token_ids))
            B.append([step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    batch = pack(P, C)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch, temperature=tiny_cfg.actor.temperature)
    behav = torch.zeros_like(logp).masked_scatter(batch.mask, torch.tensor([x for b in B for x in b]))
    err = (logp - behav).abs()[batch.mask]
    assert torch.isfinite(err).all()
    assert err.max().item() < LOGPROB_ATOL, f"max |Δlogp| = {err.max().item():.2e}"
    # the comparison is sharp: scoring under another temperature is far outside the tolerance
    with torch.no_grad():
        hot, _ = token_logprobs(model, batch, temperature=2.0)
    assert (hot - behav).abs()[batch.mask].max().item() > 100 * LOGPROB_ATOL


@pytest.mark.vllm
async def test_broadcast_into_running_vllm_engine(vllm_engine, tiny_cfg, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from actors.engine import sampling_params

    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    greedy = sampling_params(tiny_cfg.actor, n=1, temperature=0.0, max_tokens=8)
    prompts = ["3+4=", "12-5=", "7+7="]

    def hf_greedy(m):
        out = []
        for o in vllm_engine.generate(prompts, greedy, use_tqdm=False):
            ids = torch.tensor([o.prompt_token_ids])
            out.append(m.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8,
                                  eos_token_id=None)[0, ids.shape[1]:].tolist()[: len(o.outputs[0].token_ids)])
        return out

    def vllm_greedy():
        return [list(o.outputs[0].token_ids) for o in vllm_engine.generate(prompts, greedy, use_tqdm=False)]

    before = vllm_greedy()
    rx = WeightReceiver(vllm_engine, is_async=False)
    try:
        for version, m in ((1, model), (2, original)):  # new weights, then the originals back
            bc = WeightBroadcaster(lambda: m.state_dict().items(), bucket_mb=0.25, timeout_s=30)
            info, offs = bc.rendezvous_info(free_port(), [1])
            await asyncio.gather(bc.open(info), rx.join(info, offs[0], bc.plan.to_dict()))
            sent, (got_version, got_checksum) = await asyncio.gather(bc.broadcast(), rx.receive(version))
            assert (got_version, got_checksum) == (version, sent)
            assert sent == weights_checksum(m.state_dict().items(), bc.plan)
            now = vllm_greedy()
            assert now == hf_greedy(m)
            if version == 1:
                assert now != before  # the update really changed the engine's weights
        assert vllm_greedy() == before
    finally:
        rx.plan = None
