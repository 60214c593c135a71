"""Packed sequences and the array data path: a micro-batch built from a rank's flat arrays is the batch `pack`
builds from lists; packed rows give the padded rows' log-probs and gradients; a rank's share survives its
byte encoding; the planner packs within the budget."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from learner.batch import SampleTable, build
from learner.logprobs import pack, token_logprobs
from learner.microbatch import micro_batches
from learner.packing import use_packed_attention

PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12]]
SAMPLES = [(0, [11, 12]), (1, [13, 14, 15, 16, 17]), (2, [18]), (0, [19, 20, 21]), (2, [22, 23, 24, 25, 26, 27])]


def table() -> SampleTable:
    comps = [c for _, c in SAMPLES]
    return SampleTable(prompts=np.concatenate(PROMPTS), prompt_off=np.cumsum([0] + [len(p) for p in PROMPTS]),
                       tokens=np.concatenate(comps), behav=-np.arange(sum(map(len, comps))) / 10,
                       comp_off=np.cumsum([0] + [len(c) for c in comps]), prompt_of=[g for g, _ in SAMPLES],
                       adv=np.arange(len(SAMPLES)) - 2.0)


def test_a_batch_built_from_the_arrays_is_the_one_pack_builds_from_lists():
    t, rows = table(), [4, 1, 0, 2]
    for multiple, floor in ((1, 0), (8, 50)):
        mb = build(t, rows, pad_id=3, multiple=multiple, min_tokens=floor)
        ref = pack([PROMPTS[SAMPLES[i][0]] for i in rows], [SAMPLES[i][1] for i in rows], 3, multiple=multiple,
                   min_tokens=floor)
        for k in ("input_ids", "attention_mask", "target_pos", "targets", "mask"):
            assert torch.equal(getattr(mb.packed, k), getattr(ref, k)), k
    assert mb.behav[1, :5].tolist() == pytest.approx([-0.2, -0.3, -0.4, -0.5, -0.6])  # sample 1's log μ
    assert mb.behav[~mb.packed.mask].eq(0).all() and mb.adv.tolist() == [2.0, -1.0, -2.0, 0.0]
    shared = build(t, [3, 0], layout="shared")
    ref = pack([PROMPTS[0]] * 2, [SAMPLES[3][1], SAMPLES[0][1]], share_prompt=True)
    for k in ("input_ids", "attention_mask", "targets", "mask", "prompt"):
        assert torch.equal(getattr(shared.packed, k), getattr(ref, k)), k
    with pytest.raises(ValueError, match="one prompt"):
        build(t, [0, 1], layout="shared")
    packed = build(t, rows, layout="packed", multiple=8).packed
    assert packed.input_ids.shape == (1, 32) and packed.attention_mask is None
    assert packed.cu_seqlens.tolist() == [0, 10, 16, 21, 26, 32]  # the tail to a multiple of 8: a sample of its own
    assert packed.position_ids[0, 10:16].tolist() == list(range(6)) and packed.token_counts() == (32, 26)


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    padded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    packed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    use_packed_attention(packed)
    return padded, packed


def test_packed_rows_give_the_padded_log_probs_and_gradients(models):
    """One row, positions restarting per sample, attention within each: the padded batch's log-probs and every
    parameter's gradient (float32, the tiny model: grouped-query attention), also with a compiled length's
    tail; and the model, switched to the packed attention, still computes padded batches as before."""
    t, rows = table(), [4, 1, 0, 2, 3]
    out = []
    for model, layout, multiple in ((models[0], "padded", 1), (models[1], "packed", 8), (models[1], "padded", 1)):
        mb = build(t, rows, layout=layout, multiple=multiple)
        model.zero_grad()
        lp, ent = token_logprobs(model, mb.packed, temperature=0.7)
        (lp * torch.arange(1.0, 6.0)[:, None]).sum().backward()
        out.append((lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}))
    for lp, ent, grads in out[1:]:
        torch.testing.assert_close(lp, out[0][0], rtol=0, atol=2e-6)
        torch.testing.assert_close(ent, out[0][1], rtol=0, atol=2e-5)
        for n, g in grads.items():  # float32 summation order alone moves an element by a few 1e-6
            torch.testing.assert_close(g, out[0][2][n], rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert out[0][0].abs().sum() > 1 and out[0][2]["model.embed_tokens.weight"].abs().sum() > 0


def test_a_packed_step_equals_the_padded_step(tiny_model_dir):
    """`learner.packing` on a step of token-budget micro-batches: the same loss and weights."""
    from config.schema import JobConfig, LearnerConfig
    from learner.train_step import Trainer, TrainGroup

    rng = np.random.default_rng(0)
    groups = []
    for g in range(2):
        comps = [rng.integers(3, 100, int(n)).tolist() for n in rng.integers(1, 12, 6)]
        groups.append(TrainGroup(rng.integers(3, 100, 3 + 2 * g).tolist(), comps, [[-2.0] * len(c) for c in comps],
                                 [float(i % 2) for i in range(6)], [i % 2 == 1 for i in range(6)]))
    res, init = [], None
    for packing in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        init = init or {k: v.clone() for k, v in model.state_dict().items()}
        cfg = LearnerConfig(num_minibatches=2, lr=1e-3, micro_batch_tokens=40, packing=packing)
        tr = Trainer(model, cfg, JobConfig(n_samples=6, prompts_per_step=2), pad_id=0)
        m = tr.step(groups)
        res.append((m, {k: v.clone() for k, v in model.state_dict().items()}))
    (m0, w0), (m1, w1) = res
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-5, abs=1e-7)
    assert m1["padding_frac"] == 0 < m0["padding_frac"] and m1["decoder_tokens"] < m0["decoder_tokens"]
    diff = update = 0.0
    for k in w0:  # Adam scales a near-zero gradient's float32 noise up to a few % of its ~1e-3 step
        torch.testing.assert_close(w1[k], w0[k], rtol=1e-4, atol=1e-4)
        diff += (w1[k] - w0[k]).pow(2).sum().item()
        update += (w0[k] - init[k]).pow(2).sum().item()
    assert update > 0 and (diff / update) ** 0.5 < 1e-3  # the same update (a wrong one differs by tens of %)
    with pytest.raises(ValueError, match="learner.packing"):
        Trainer(model, LearnerConfig(packing=True, share_prompt=True), JobConfig(n_samples=6, prompts_per_step=2))


def test_packed_micro_batches_fill_the_budget():
    rng = np.random.default_rng(0)
    seq_len = rng.integers(1, 60, 200).tolist() + [150]
    runs = micro_batches(list(range(201)), seq_len, 100, packed=True)
    assert sorted(i for r in runs for i in r) == list(range(201))
    assert all(sum(seq_len[i] for i in r) <= 100 or len(r) == 1 for r in runs) and [200] in runs
    assert len(runs) <= -(-sum(seq_len) // 100) + 2  # best fit: within a run or two of the bound
    assert len(runs) < len(micro_batches(list(range(201)), seq_len, 100))  # padded runs hold fewer tokens


def test_every_rank_receives_the_batches_the_list_path_gave():
    """The plan from the wire's arrays, each rank's share through its byte encoding (what rank 0 sends), gives
    every pass exactly the batch, log μ, advantages and weight that the list path (before the arrays; kept in
    `bench.prep`) gave."""
    from bench.prep import _before_plan, _cfg, _plan_args
    from learner.planning import FlatGroup, plan_step
    from learner.ranks import decode_share, encode_share
    from transport.wire import RolloutGroup

    rng = np.random.default_rng(1)
    groups = []
    for g in range(3):
        lens = rng.integers(1, 40, 8).astype(np.int32)
        correct = (np.arange(8) % 2).astype(np.uint8)
        groups.append(RolloutGroup(f"a:0:{g}", g, "a", 0, "v", "1", rng.integers(0, 99, 3 + g, dtype=np.int32), lens,
                                   rng.integers(0, 99, lens.sum(), dtype=np.int32), -rng.random(lens.sum(), np.float32),
                                   correct.astype(np.float32), correct, np.zeros(8, np.uint8)))
    cfg = _cfg(False).model_copy(update={"micro_batch_tokens": 120})
    before = _before_plan(groups, cfg, 2, _plan_args(2)["generator"], None)
    _, shares = plan_step([FlatGroup.from_wire(g) for g in groups], cfg, **_plan_args(2))
    assert sum(len(mb) for mb in before[0]) > 4  # several passes a mini-batch
    for r, share in enumerate(shares):
        got = decode_share(*encode_share(share))
        assert [len(mb) for mb in got.minibatches] == [len(mb) for mb in before[r]]
        for mb, old_mb in zip(got.minibatches, before[r]):
            for m, (prompts, comps, behav, adv, weight) in zip(mb, old_mb):
                new, ref = build(got.table, m.rows), pack(prompts, comps)
                for k in ("input_ids", "attention_mask", "target_pos", "targets", "mask"):
                    assert torch.equal(getattr(new.packed, k), getattr(ref, k)), k
                assert new.behav[ref.mask].tolist() == [x for lp in behav for x in lp]
                assert new.adv.tolist() == pytest.approx(adv) and m.weight == pytest.approx(weight)


def test_the_varlen_call_matches_the_masked_reference_whatever_the_torch_signature():
    """`_flash` (the CUDA path) hands varlen_attn its layout, and does by hand what an older signature lacks
    (grouped-query heads, the scale, the window): a stand-in kernel computing exactly that gives the masked
    reference's output."""
    from learner.packing import _flash, _masked

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 23, 8, generator=g) for h in (4, 2, 2))
    cu = torch.tensor([0, 5, 6, 17, 23], dtype=torch.int32)

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, window_size=(-1, 0), is_causal=None, enable_gqa=False):
        assert q.shape == (23, 4, 8) and max_q == max_k == 11 and torch.equal(cu_q, cu)
        assert enable_gqa or k.shape[1] == 4
        w = window_size[0] + 1 if window_size[0] >= 0 else None
        return _masked(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], cu_q, scale, w)[0]
    for takes in ({"window_size", "enable_gqa", "scale"}, {"is_causal"}):
        for scaling, window in ((None, None), (0.3, None), (0.3, 4)):
            if window and "window_size" not in takes:
                continue
            out = _flash(kernel, takes, q, k, v, cu, 11, scaling, window, torch.float32)
            torch.testing.assert_close(out, _masked(q, k, v, cu, scaling, window), rtol=1e-5, atol=1e-6)


def test_the_prep_bench_times_both_paths():
    """`python -m bench.prep`'s case at a small size: both paths build every pass and report their host time
    against the step's estimated GPU time."""
    from bench.prep import case

    rows = [case(path, 128, 2, packing, n=64) for path, packing in (("now", True), ("now", False), ("before", False))]
    for r in rows:
        assert r["passes"] > 8 and 0 < r["host_s"] < r["gpu_s_estimate"] and r["seq_tokens"] > 128 * 256
    assert rows[0]["seq_tokens"] == rows[2]["seq_tokens"]  # the same step both ways


def _cpu_flash(torch_attn):
    """CPU kernels for torch's varlen attention ops (`torch_attn::_varlen_attn` and its backward, whose flash
    kernels are CUDA's), computed from the block-diagonal causal mask: what the flash kernels compute, so that
    the CUDA path's call of the real op (its fake kernel, its autograd formula) runs on a CPU."""
    from learner.packing import _segments

    def probs(q, k, cu, scale):  # [T, H, D] -> softmax [H, T, T] and the masked logits
        T, g = q.shape[0], q.shape[1] // k.shape[1]
        seg, pos = _segments(cu, T), torch.arange(T)
        allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
        s = torch.einsum("thd,shd->hts", q, k.repeat_interleave(g, 1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        s = s.masked_fill(~allowed, float("-inf"))
        return s.softmax(-1), s

    def forward(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, window, *_):
        assert max_q == max_k == int((cu_q[1:] - cu_q[:-1]).max()) and window in (None, [-1, 0])
        p, s = probs(q, k, cu_q, scale)
        out = torch.einsum("hts,shd->thd", p, v.repeat_interleave(q.shape[1] // v.shape[1], 1))
        return out.contiguous(), s.logsumexp(-1), torch.zeros(2, dtype=torch.uint64)

    def backward(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, is_causal, rng, scale=None, window=None):
        (T, H, D), Hk = q.shape, k.shape[1]
        p, _ = probs(q, k, cu_q, scale)
        sc = D ** -0.5 if scale is None else scale
        dv = torch.einsum("hts,thd->shd", p, do)
        ds = p * (torch.einsum("thd,shd->hts", do, v.repeat_interleave(H // Hk, 1)) - (do * out).sum(-1).T[:, :, None])
        dq = torch.einsum("hts,shd->thd", ds, k.repeat_interleave(H // Hk, 1)) * sc
        dk = torch.einsum("hts,thd->shd", ds, q) * sc
        fold = lambda x: x.reshape(T, Hk, H // Hk, D).sum(2)  # noqa: E731  (grouped query heads share a key head)
        return dq.contiguous(), fold(dk), fold(dv)
    torch_attn.impl("_varlen_attn", forward, "CPU")
    torch_attn.impl("_varlen_attn_backward", backward, "CPU")


def test_the_flash_path_compiles_once_for_rows_of_any_packing(monkeypatch):
    """The CUDA path under torch.compile as a compiled layer runs it (dynamic shapes): torch's varlen_attn — its
    real custom op, fake kernel and autograd formula; CPU kernels stand in for the flash ones — traced into one
    graph (no break, nothing read from the host), compiled once per grad mode for rows of any length, any number
    of samples, any longest sample; and the masked reference's output and gradients."""
    import torch.nn.attention.varlen  # noqa: F401  (registers torch's ops)
    from torch._dynamo.utils import counters

    import learner.packing as packing

    monkeypatch.setattr(packing, "_VARLEN", packing._varlen())
    monkeypatch.setattr(packing, "_flash_runs", lambda query, dtype: True)  # a CPU tensor takes the CUDA path
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]  # reset() leaves the counters: graphs other tests compiled count
    g = torch.Generator().manual_seed(0)
    fn = torch.compile(packing.packed_attention, dynamic=True, fullgraph=True, backend="aot_eager")
    with torch.library._scoped_library("torch_attn", "IMPL") as lib:
        _cpu_flash(lib)
        for lens in ([34, 22, 28, 4], [40, 40, 40], [34, 6], [40], [47, 15, 2], [64], [11, 6, 15, 55, 1], [3] * 20 + [9]):
            cu = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
            q, k, v = (torch.randn(1, h, sum(lens), 8, generator=g, requires_grad=True) for h in (4, 2, 2))
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    out, _ = fn(None, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                max_length_q=max(lens), max_length_k=max(lens))
                    ref = packing._masked(q, k, v, cu, 0.3, None)
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
            w = torch.randn(out.shape, generator=g)
            for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v))):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] - before == 2  # without and with gradients: nothing else specialised
