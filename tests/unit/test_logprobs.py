import pytest
import torch
from transformers import AutoModelForCausalLM

from learner.logprobs import pack, rows_per_chunk, token_logprobs


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_matches_naive_full_logits(model):
    prompts = [[5, 6, 7], [8], [9, 10]]
    comps = [[11, 12], [13, 14, 15, 16], []]
    b = pack(prompts, comps)
    lp, ent = token_logprobs(model, b, temperature=0.7, chunk_mb=0.002)  # ~3 rows per chunk
    for s, (p, c) in enumerate(zip(prompts, comps)):
        if not c:
            assert not b.mask[s].any()
            continue
        logits = model(torch.tensor([p + c])).logits[0].float() / 0.7
        ref = torch.log_softmax(logits, -1)
        for t, tok in enumerate(c):
            assert lp[s, t].item() == pytest.approx(ref[len(p) - 1 + t, tok].item(), abs=1e-5)
            probs = ref[len(p) - 1 + t].exp()
            assert ent[s, t].item() == pytest.approx(-(probs * ref[len(p) - 1 + t]).sum().item(), abs=1e-4)
    assert (lp[~b.mask] == 0).all()


def test_chunked_gradients_equal_unchunked(model):
    b = pack([[1, 2, 3]] * 4, [[4, 5, 6, 7], [8], [9, 10], [11, 12, 13]])
    grads = []
    for chunk in (0.001, None):
        model.zero_grad()
        lp, _ = token_logprobs(model, b, chunk_mb=chunk)
        (lp * torch.arange(1, 5)[:, None]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        # chunking changes float32 summation order: elements near zero differ by ~2e-6 (seen here, depends
        # on the BLAS thread count); a chunking bug (a dropped or doubled row) moves whole gradients
        scale = grads[1][n].abs().max().item()
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-5 * max(scale, 1.0))


def test_keeping_the_chunks_logits_for_backward_gives_the_same_gradients_with_one_head_pass_fewer(model):
    """`learner.logprob_recompute = False`: no chunk is recomputed in backward (the LM head runs once per chunk,
    not twice) and the log-probs and every gradient are bit-for-bit those of the recomputing pass."""
    b = pack([[1, 2, 3]] * 4, [[4, 5, 6, 7], [8], [9, 10], [11, 12, 13]])
    head = model.get_output_embeddings()
    runs = []
    for recompute in (True, False):
        calls = []
        hook = head.register_forward_hook(lambda *_: calls.append(1))
        model.zero_grad()
        try:
            lp, _ = token_logprobs(model, b, chunk_mb=0.001, recompute=recompute)  # 1 row per chunk: 10 chunks
            (lp * torch.arange(1, 5)[:, None]).sum().backward()
        finally:
            hook.remove()
        runs.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, len(calls)))
    (lp_re, g_re, heads_re), (lp_kept, g_kept, heads_kept) = runs
    assert (heads_re, heads_kept) == (20, 10)
    assert torch.equal(lp_re, lp_kept)
    assert all(torch.equal(g_re[n], g_kept[n]) for n in g_re), [n for n in g_re if not torch.equal(g_re[n], g_kept[n])]


def test_rows_per_chunk_and_bad_input(model):
    assert rows_per_chunk(1, 2**18) == 1 and rows_per_chunk(256, 151_936) == 441
    with pytest.raises(ValueError, match="prompts"):
        pack([[]], [[1]])
    with pytest.raises(ValueError, match="empty"):
        pack([], [])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, pack([[1]], [[2]]), temperature=0)


@pytest.mark.parametrize("grad", [False, True])
def test_a_scoring_pass_builds_no_kv_cache(model, grad):
    """Without activation checkpointing transformers builds a KV cache by default; the learner never reads one,
    and under `learner.compile` each layer guarded on its own cache slot (a recompile per layer on an H200)."""
    seen = []
    hook = model.get_decoder().layers[0].register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs.get("past_key_values")), with_kwargs=True)
    try:
        with torch.set_grad_enabled(grad):
            token_logprobs(model, pack([[1, 2, 3]] * 2, [[4, 5], [6]]))
    finally:
        hook.remove()
    assert seen == [None]


def test_a_token_floor_pads_the_batch_and_changes_no_log_prob(model):
    """`pack(min_tokens=...)` (the compiled learner on a GPU: one size regime, `learner.compiling.min_tokens`)
    pads the length until rows × length reaches the floor; the padded positions are masked out, so every
    completion token's log-prob is what it was."""
    prompts, comps = [[5, 6, 7], [8]], [[11, 12], [13, 14, 15, 16]]
    plain = pack(prompts, comps, multiple=8)
    floored = pack(prompts, comps, multiple=8, min_tokens=37)
    assert plain.input_ids.shape == (2, 8) and floored.input_ids.shape == (2, 24)  # ceil(37 / 2) = 19 → 24
    assert torch.equal(floored.input_ids[:, :8], plain.input_ids) and not floored.attention_mask[:, 8:].any()
    assert torch.equal(floored.mask, plain.mask)
    a, _ = token_logprobs(model, plain)
    b, _ = token_logprobs(model, floored)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert pack(prompts, comps, multiple=8, min_tokens=10).input_ids.shape == (2, 8)  # already over the floor
