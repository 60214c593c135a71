"""One real vLLM engine (CPU backend, shared by the module): its behaviour log-probs against a transformers
recompute, and weight broadcasts into the running engine through its weight-transfer API."""

import asyncio

import pytest
import torch

from tests.support.weights_check import weights_checksum
from transport.weights import WeightBroadcaster, WeightReceiver

from transport.ports import free_port

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


@pytest.mark.vllm
async def test_ipc_update_into_running_vllm_engine(vllm_engine, tiny_model_dir):
    """transport.weight_backend = "ipc" on CPU: the engine's worker maps the learner's shared buffer once, at
    the rendezvous; two updates through it (new weights, then the originals) each load by the layerwise
    reload route, report the learner's checksum, and change what the engine generates."""
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=8)
    prompts = ["3+4=", "12-5=", "7+7="]

    def vllm_greedy():
        return [list(o.outputs[0].token_ids) for o in vllm_engine.generate(prompts, greedy, use_tqdm=False)]

    def hf_greedy():
        out = []
        for o in vllm_engine.generate(prompts, greedy, use_tqdm=False):
            ids = torch.tensor([o.prompt_token_ids])
            out.append(model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8, eos_token_id=None)
                       [0, ids.shape[1]:].tolist()[: len(o.outputs[0].token_ids)])
        return out

    before = vllm_greedy()
    rx = WeightReceiver(vllm_engine, is_async=False)
    bc = WeightBroadcaster(lambda: model.state_dict().items(), bucket_mb=0.25, timeout_s=30, backend="ipc")
    info, offs = bc.rendezvous_info(free_port(), [1], names=["engine"])
    await asyncio.gather(bc.open(info), rx.join(info, offs[0], bc.plan.to_dict()))  # the handle, once
    try:
        torch.manual_seed(3)
        for version in (1, 2):
            with torch.no_grad():
                for k, p in model.state_dict().items():
                    p.copy_(original[k] + torch.randn_like(p) * 0.5 if version == 1 else original[k])
            sent, got = await asyncio.gather(bc.broadcast(version), rx.receive(version))
            assert got == (version, sent) and sent == weights_checksum(model.state_dict().items(), bc.plan)
            now = vllm_greedy()
            assert now == hf_greedy()
            assert (now != before) if version == 1 else (now == before)
    finally:
        rx.plan = None
        bc.buffer.close()


@pytest.mark.vllm
async def test_logprobs_sent_at_the_end_equal_vllms_per_step(tiny_cfg):
    """The actor's engine sends a FINAL_ONLY request's log-probs once, at its end (actors/vllm_scheduler.py):
    the same tokens and log-probs as vLLM's per-step delivery; a request with stop strings (which the
    front end ends itself) and a streaming one still get every token's log-prob."""
    import numpy as np
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from actors.engine import FINAL_LOGPROBS_SCHEDULER, completion_arrays, engine_kwargs, offline_env, sampling_params
    from actors.vllm_scheduler import PER_STEP

    offline_env()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(tiny_cfg.model, tiny_cfg.actor)))
    try:
        assert engine.vllm_config.scheduler_config.scheduler_cls == FINAL_LOGPROBS_SCHEDULER
        prompt = {"prompt_token_ids": engine.tokenizer.encode("12+7=")}

        async def final(rid, **over):
            """Each completion's last output (a streamed request's outputs may each hold only some)."""
            sp = sampling_params(tiny_cfg.actor, n=4, max_tokens=12, seed=7, ignore_eos=True, **over)
            last = {}
            async for out in engine.generate(prompt, sp, rid):
                last.update({o.index: o for o in out.outputs})
            return [last[i] for i in sorted(last)]

        fin = RequestOutputKind.FINAL_ONLY
        end = await final("end", output_kind=fin)
        step = await final("step", output_kind=fin, extra_args={PER_STEP: True})
        stream = await final("stream", output_kind=RequestOutputKind.CUMULATIVE)
        ref = completion_arrays(step)
        assert ref[0].sum() == 4 * 12
        for got in (end, stream):
            arrays = completion_arrays(got)
            for a, b, name in zip(arrays, ref, ("lengths", "tokens", "log-probs")):
                assert np.array_equal(a, b), name
        # a stop string the same seed will meet after a few tokens: the front end ends that request
        first = step[0]
        stop_at = engine.tokenizer.decode(first.token_ids[3:5])
        stopped = await final("stop", output_kind=fin, stop=[stop_at])
        o = stopped[0]
        assert o.finish_reason == "stop" and len(o.token_ids) < 12, (o.finish_reason, o.token_ids)
        assert all(len(c.logprobs) == len(c.token_ids) for c in stopped)
        assert np.isfinite(completion_arrays(stopped)[2]).all()
    finally:
        engine.shutdown()


@pytest.mark.vllm
def test_completion_texts_decoded_at_the_end_equal_vllms_detokenizer(vllm_engine, tiny_cfg, tiny_model_dir):
    """The actor asks vLLM for no text (`detokenize=False`) and decodes each completion once, at its end
    (`CompletionTexts`): the verifiers must see exactly the text vLLM's incremental detokenizer gives,
    for completions ended by the length budget and by the end-of-sequence token alike."""
    from actors.engine import CompletionTexts, sampling_params

    prompts = ["3+4=", "25-7=", "9+9=", "100-1=", "7+"]
    outs = vllm_engine.generate(prompts, sampling_params(tiny_cfg.actor, n=16, max_tokens=40, seed=5))
    done = [c for o in outs for c in o.outputs]
    reasons = {c.finish_reason for c in done}
    assert reasons == {"stop", "length"}, reasons  # both endings are exercised
    assert CompletionTexts(tiny_model_dir, tiny_cfg.actor)(done) == [c.text for c in done]
    assert any(c.text for c in done)
    # and the engine, asked for no text, gives none: the decoder is what the verifiers get
    bare = vllm_engine.generate(prompts[:1], sampling_params(tiny_cfg.actor, n=4, max_tokens=8, detokenize=False))
    assert all(c.text == "" and c.token_ids for c in bare[0].outputs)
