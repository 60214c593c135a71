"""`learner.logprob_kernel` "chunked" and "liger" and `learner.liger_kernels` on CUDA against the head module on
checkpointed chunks ("off"), under bf16 autocast as the learner trains: the same log-probs, loss and gradients
of every parameter (a tied embedding included), within bf16 tolerances; Liger actually runs (no fallback)."""

import logging

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from learner.algorithm import policy_loss
from learner.kernels import apply_liger_kernels, resolve
from learner.logprobs import pack, token_logprobs

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=32_000, max_position_embeddings=1024, tie_word_embeddings=True)


def _model(liger: bool = False):
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).float()
    if liger:
        apply_liger_kernels(m, "cuda")
    return m.cuda()


def _run(model, batch, kernel: str):
    model.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lp, ent = token_logprobs(model, batch, temperature=0.9, chunk_mb=16.0, kernel=kernel)  # 131 rows a chunk
        old = (lp.detach() + 0.05) * batch.mask
        adv = torch.linspace(-1, 1, batch.mask.shape[0], device="cuda")
        loss, _ = policy_loss(lp, old, old - 0.1, adv, batch.mask, eps_low=0.2, eps_high=0.28, tis_cap=2.0)
    loss.backward()
    torch.cuda.synchronize()
    return lp.detach(), ent, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _close(new, ref, what: str):
    torch.testing.assert_close(new[0], ref[0], rtol=2e-2, atol=2e-2, msg=f"{what}: log-probs")
    torch.testing.assert_close(new[2], ref[2], rtol=2e-2, atol=2e-3, msg=f"{what}: loss")
    for name, g in ref[3].items():
        scale = g.abs().max().item()
        torch.testing.assert_close(new[3][name], g, rtol=5e-2, atol=2e-2 * max(scale, 1e-6), msg=f"{what}: {name}")


@pytest.mark.gpu
def test_fused_logprob_kernels_match_the_head_module_path_on_cuda(caplog):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 32_000, (n,), generator=g).tolist() for n in (17, 40, 5, 64)]
    comps = [torch.randint(0, 32_000, (n,), generator=g).tolist() for n in (300, 120, 451, 77)]
    batch = pack(prompts, comps, device="cuda")
    model = _model()
    ref = _run(model, batch, "off")
    with caplog.at_level(logging.INFO, logger="brorl.learner"):
        assert resolve("liger", torch.zeros(1, device="cuda"), model.get_output_embeddings()) == "liger", caplog.text
    for kernel in ("chunked", "liger"):
        new = _run(model, batch, kernel)
        _close(new, ref, kernel)
        if kernel == "chunked":
            torch.testing.assert_close(new[1], ref[1], rtol=2e-2, atol=2e-2)
        else:
            assert new[1] is None  # Liger returns no entropy
    from transformers.models.qwen2 import modeling_qwen2

    saved = dict(vars(modeling_qwen2))  # Liger patches the module's classes and rope for the whole process
    try:
        patched = _run(_model(liger=True), batch, "chunked")  # Liger's RMSNorm, SwiGLU and RoPE in the layers
    finally:
        for k, v in saved.items():
            setattr(modeling_qwen2, k, v)
    _close(patched, ref, "liger_kernels")
