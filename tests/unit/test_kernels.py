"""`learner.logprob_kernel = "chunked"` (learner/kernels.py) against the head module on checkpointed chunks ("off"):
the same per-token log-probs and entropies, the same PPO loss, the same gradients of every parameter (the
hidden states' through the decoder, the LM head's, a tied embedding's sum of both), in float32 and under
bf16 autocast; Liger's paths refused or replaced, with a log line, where they cannot run."""

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from learner.algorithm import policy_loss
from learner.kernels import apply_liger_kernels, linear_logprob, resolve
from learner.logprobs import pack, token_logprobs

SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=97, max_position_embeddings=64)


def _model(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    if tied:  # Qwen2 as tinymodel builds it: tied embeddings, q/k/v biases
        return Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True)).float()
    return LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=False)).float()


def _run(model, batch, kernel: str, dtype: torch.dtype):
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        lp, ent = token_logprobs(model, batch, temperature=0.8, chunk_mb=0.0015, kernel=kernel)  # 4 rows a chunk
        g = torch.Generator().manual_seed(1)
        old = (lp.detach() + 0.05 * torch.randn(lp.shape, generator=g)) * batch.mask
        adv = torch.tensor([1.0, -0.5, 0.7])
        loss, _ = policy_loss(lp, old, old - 0.1, adv, batch.mask, eps_low=0.2, eps_high=0.28, tis_cap=2.0,
                              kl_coef=0.1, ref_logp=old)
    loss.backward()
    return lp.detach(), ent, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied, dtype", [(True, torch.float32), (True, torch.bfloat16), (False, torch.bfloat16)])
def test_chunked_kernel_matches_the_head_module_path(tied, dtype):
    model = _model(tied)
    batch = pack([[1, 2, 3], [4], [5, 6]], [[7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19, 20, 21]])
    ref, new = _run(model, batch, "off", dtype), _run(model, batch, "chunked", dtype)
    # float32: summation order only; bf16: the same bf16 matmuls, gradients accumulated in another order
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(new[0], ref[0], **tol)
    torch.testing.assert_close(new[1], ref[1], **tol)
    torch.testing.assert_close(new[2], ref[2], **tol)
    assert new[0].dtype == ref[0].dtype == torch.float32 and (new[0][~batch.mask] == 0).all()
    for name, g in ref[3].items():
        scale = g.abs().max().item()
        torch.testing.assert_close(new[3][name], g, rtol=tol["rtol"], atol=tol["atol"] * max(scale, 1.0), msg=name)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    assert new[3][head].abs().sum() > 0


def test_chunked_function_gradients_of_rows_weight_and_bias_in_float64():
    """The autograd Function alone, against autograd through full logits: float64 leaves its gradients exact
    to rounding (gradcheck-grade), with a bias and a chunk size that does not divide the rows."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(11, 6, dtype=torch.float64, generator=g, requires_grad=True)
    head = torch.nn.Linear(6, 13, bias=True).double()
    tgt = torch.randint(0, 13, (11,), generator=g)
    w = torch.randn(11, dtype=torch.float64, generator=g)
    lp, ent = linear_logprob(h, head, tgt, 0.6, kernel="chunked", rows=4)
    gh, gw, gb = torch.autograd.grad((lp * w).sum(), [h, head.weight, head.bias])
    z = torch.log_softmax(head(h) / 0.6, -1)
    lp_ref = z.gather(-1, tgt[:, None])[:, 0]
    rh, rw, rb = torch.autograd.grad((lp_ref * w).sum(), [h, head.weight, head.bias])
    torch.testing.assert_close(lp, lp_ref)
    torch.testing.assert_close(ent, -(z.exp() * z).sum(-1))
    for a, b in ((gh, rh), (gw, rw), (gb, rb)):
        torch.testing.assert_close(a, b)


def test_paths_that_cannot_run_are_replaced_or_refused_with_a_line(caplog):
    head = torch.nn.Linear(4, 5, bias=False)
    h = torch.zeros(2, 4)
    with caplog.at_level(logging.INFO, logger="brorl.learner"):
        assert resolve("liger", h, head) == "chunked"  # a CPU tensor: Liger's Triton kernels cannot run
    assert "learner.logprob_kernel = liger: the chunked log-prob path runs" in caplog.text
    head.weight.ds_id = 3  # a ZeRO-3 parameter: empty between passes, only the module's own forward gathers it
    assert resolve("chunked", h, head) == "off"
    with pytest.raises(ValueError, match="logprob_kernel must be one of"):
        resolve("fast", h, head)
    with pytest.raises(ValueError, match="learner.liger_kernels needs a CUDA device"):
        apply_liger_kernels(torch.nn.Linear(2, 2), "cpu")
