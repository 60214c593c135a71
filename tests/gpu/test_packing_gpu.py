"""Packed sequences on CUDA (`learner.packing`): torch's variable-length flash attention over one packed row
gives the padded batch's log-probs and gradients (bf16 autocast: within bf16 noise), a packed step on
CUDA equals the padded one (float32: the exact masked path), and compiled (`learner.compile`) the flash attention
runs inside the compiled layers, compiled once by the warm-up for steps of any packing."""

import functools

import numpy as np
import pytest
import torch

from learner.batch import SampleTable, build
from learner.logprobs import token_logprobs
from learner.packing import use_packed_attention


def _table(vocab: int, lengths: list[tuple[int, int]], seed: int = 0) -> SampleTable:
    g = np.random.default_rng(seed)
    prompts = [g.integers(0, vocab, p) for p, _ in lengths]
    comps = [g.integers(0, vocab, c) for _, c in lengths]
    return SampleTable(prompts=np.concatenate(prompts), prompt_off=np.cumsum([0] + [p for p, _ in lengths]),
                       tokens=np.concatenate(comps), behav=np.full(sum(c for _, c in lengths), -2.0),
                       comp_off=np.cumsum([0] + [c for _, c in lengths]), prompt_of=np.arange(len(lengths)),
                       adv=np.ones(len(lengths)))


def _run(model, mb):
    model.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lp, _ = token_logprobs(model, mb.packed)
    (lp * mb.packed.mask).sum().backward()
    return lp.float().cpu(), torch.cat([p.grad.flatten().float().cpu() for p in model.parameters()])


@pytest.mark.gpu
def test_varlen_attention_on_cuda_gives_the_padded_log_probs_and_gradients(tiny_model_dir, monkeypatch):
    import torch.nn.attention.varlen as varlen_mod
    from transformers import AutoModelForCausalLM

    calls = [0]
    real = varlen_mod.varlen_attn

    @functools.wraps(real)
    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(varlen_mod, "varlen_attn", counted)
    padded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda()
    packed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda()
    use_packed_attention(packed)
    vocab = padded.get_input_embeddings().num_embeddings
    t = _table(vocab, [(37, 150), (5, 3), (60, 190), (64, 1), (9, 200), (100, 77)])
    rows = list(range(6))
    lp0, g0 = _run(padded, build(t, rows).to("cuda"))
    lp1, g1 = _run(packed, build(t, rows, layout="packed", multiple=8).to("cuda"))
    assert calls[0] > 0  # the flash varlen kernel ran
    mask = build(t, rows).packed.mask
    assert (lp0 - lp1)[mask].abs().max().item() < 0.05
    assert torch.nn.functional.cosine_similarity(g0, g1, dim=0).item() > 0.999
    # attention across the boundaries (one causal row) would be another computation: the test can fail
    crossing = build(t, rows, layout="packed")
    crossing.packed.cu_seqlens = torch.tensor([0, crossing.packed.input_ids.shape[1]], dtype=torch.int32)
    crossing.packed.max_len = crossing.packed.input_ids.shape[1]
    lp2, _ = _run(packed, crossing.to("cuda"))
    assert (lp0 - lp2)[mask].abs().max().item() > 0.2


@pytest.mark.gpu
def test_a_packed_step_on_cuda_equals_the_padded_step(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from config.schema import JobConfig, LearnerConfig
    from learner.train_step import Trainer
    from tests.support.train_fixtures import fixed_groups

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    groups, eos = fixed_groups(tiny_model_dir)
    out = []
    for packing in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        cfg = LearnerConfig(num_minibatches=2, lr=1e-3, device="cuda", micro_batch_tokens=64, packing=packing)
        tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos)
        out.append((tr.step(groups)["loss"], {k: v.detach().cpu() for k, v in tr.model.state_dict().items()}))
    assert out[1][0] == pytest.approx(out[0][0], rel=1e-4, abs=1e-6)
    for k, v in out[0][1].items():
        torch.testing.assert_close(out[1][1][k], v, rtol=1e-3, atol=1e-4, msg=k)


@pytest.mark.gpu
def test_compiled_packed_steps_on_cuda_give_the_eager_ones_and_compile_nothing_after_the_warm_up(tiny_model_dir):
    """`learner.compile` with `learner.packing` on CUDA in bf16: torch's varlen flash attention (forward and
    backward) runs in the compiled layers; the warm-up's packed rows leave steps of other packings (passes of many
    samples, of one each, of a whole mini-batch) nothing to compile; each compiled step's loss and gradients are
    the eager packed step's, within bf16 noise."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from config.schema import JobConfig, LearnerConfig
    from learner.train_step import Trainer
    from tests.support.train_fixtures import fixed_groups

    groups, eos = fixed_groups(tiny_model_dir)
    for g in groups:  # completions of several lengths
        g.completion_ids = [c + [eos] * (i % 5) for i, c in enumerate(g.completion_ids)]
        g.behav_logp = [b + [-1.5] * (i % 5) for i, b in enumerate(g.behav_logp)]
    longest = max(len(g.prompt_ids) + len(c) for g in groups for c in g.completion_ids)
    runs = []
    for compile in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        cfg = LearnerConfig(num_minibatches=2, lr=1e-3, device="cuda", packing=True, compile=compile)
        tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos,
                     compute_dtype=torch.bfloat16)
        tr.compiling.ensure(tr)
        grads, step = [], tr.backend.step

        def recording_step(tr=tr, grads=grads, step=step):
            grads.append(torch.cat([p.grad.flatten().float().cpu() for p in tr.model.parameters()]))
            return step()
        tr.backend.step = recording_step
        metrics = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for budget in (2 * longest - 1, 1, 0):
                tr.cfg.micro_batch_tokens = budget
                metrics.append(tr.step(groups))
        runs.append((metrics, grads, {e.key for e in prof.key_averages()}))
    (ref, ref_g, ref_ops), (got, g, ops) = runs
    varlen = lambda keys: {k.split("::")[-1] for k in keys if "varlen_attn" in k}  # noqa: E731  (torch's ops)
    assert {"_varlen_attn", "_varlen_attn_backward"} <= varlen(ops) & varlen(ref_ops)  # flash, both ways, both runs
    assert [m["compiled_frames"] for m in got] == [0.0, 0.0, 0.0]  # the warm-up compiled every variant
    assert ref[1]["micro_batches"] == 32 > ref[0]["micro_batches"] > ref[2]["micro_batches"] == 2
    for m, r in zip(got, ref):
        assert m["micro_batches"] == r["micro_batches"] and m["loss"] == pytest.approx(r["loss"], rel=0.02, abs=1e-3)
    assert len(g) == len(ref_g) == 6
    for mine, theirs in zip(g, ref_g):
        assert torch.nn.functional.cosine_similarity(mine, theirs, dim=0).item() > 0.995
