"""The learner's compile warm-up around the compiler (`learner.compiling.WarmUp`): it runs once, at the first
step, tells every other rank to compile too, and a failure is raised (and tried again at the next step).
The compilation itself, on a real model and on DeepSpeed ranks, is tested in
tests/integration/test_train_step.py."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from learner.compiling import PAD_MULTIPLE, WarmUp, min_tokens, warm_up_batches, warm_up_lengths
from learner.logprobs import pack


class FakeRanks:
    def __init__(self):
        self.sent = []

    def command(self, name, per_rank):
        self.sent.append((name, per_rank))
        return per_rank[0]


def trainer(compile=True, fails=0, world=3):
    t = SimpleNamespace(cfg=SimpleNamespace(compile=compile), ranks=FakeRanks(), world=world, calls=0)

    def warm_up():
        t.calls += 1
        if t.calls <= fails:
            raise RuntimeError("inductor: no C++ compiler")
        return 1.5
    t.warm_up = warm_up
    return t


def test_every_rank_warms_up_once():
    t, w = trainer(), WarmUp()
    w.ensure(t)
    w.ensure(t)  # the next steps: nothing more
    assert t.ranks.sent == [("warm_up", [None, None, None])]  # the other ranks compile too, told once
    assert t.calls == 1 and w.seconds == 1.5 and w.done


def test_without_compile_nothing_happens_and_a_failure_is_raised_then_tried_again():
    t, w = trainer(compile=False), WarmUp()
    w.ensure(t)
    assert t.ranks.sent == [] and t.calls == 0 and not w.done
    t, w = trainer(fails=1), WarmUp()
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        w.ensure(t)
    assert not w.done
    w.ensure(t)
    assert w.done and t.calls == 2


class Embedded(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.emb = torch.nn.Embedding(4, hidden)

    def get_input_embeddings(self):
        return self.emb


@pytest.mark.parametrize("hidden,floor", [(1536, 4096), (4096, 8192), (896, 5856), (3584, 7168)])
def test_a_gpu_micro_batch_floor_lies_past_every_size_threshold_of_the_compiler(hidden, floor):
    """Inductor's mix-order reductions switch on rows × hidden ≥ 5 · 2^20, rows ≥ 2 × hidden and rows ≥ 4096
    (each side a compiled variant); the floor is past all three, a multiple of PAD_MULTIPLE, on a GPU only,
    and none when that fusion is off (no such guards then)."""
    import torch._inductor.config as inductor_config

    m = min_tokens(Embedded(hidden), "cuda:0")
    assert m == floor and m % PAD_MULTIPLE == 0
    assert m * hidden >= 5 * 2**20 and m >= 2 * hidden and m >= 4096
    assert min_tokens(Embedded(hidden), "cpu") == 0
    with inductor_config.patch({"triton.mix_order_reduction": False}):
        assert min_tokens(Embedded(hidden), "cuda") == 0


@pytest.mark.parametrize("floor", [0, 4096, 5856, 8192])
def test_the_warm_up_meets_every_variant_at_the_floor(floor):
    """The warm-up's four micro-batches keep their variants (padded rows, rows without padding, one padded
    row, one row without) and each reaches the floor, so the regime a step meets is the one compiled."""
    kinds = []
    for lengths in warm_up_lengths(floor):
        b = pack([[1] * 5] * len(lengths), [[2] * n for n in lengths], multiple=PAD_MULTIPLE, min_tokens=floor)
        S, L = b.input_ids.shape
        assert S * L >= floor and L % PAD_MULTIPLE == 0
        assert len(set(lengths)) in (1, len(lengths))  # distinct, or all equal (the unpadded batch)
        kinds.append((S > 1, bool((b.attention_mask == 0).any())))
    assert kinds == [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("floor", [0, 4096, 5856, 8192])
def test_the_packed_warm_up_meets_every_variant_at_the_floor(floor):
    """`learner.packing`: the warm-up's micro-batches are packed rows, as a packed step's are — one row of at least
    the floor, a multiple of PAD_MULTIPLE — of several samples and a padding tail, several that fill the row, one
    sample and a tail, one sample alone; the first (the one compiled first) has no two sizes equal (the row's
    length, the boundaries' and the longest sample's), so its variant is the general one."""
    kinds = []
    for b in warm_up_batches(vocab=50, pad_id=0, device="cpu", floor=floor, packed=True):
        L, cu = b.input_ids.shape[1], b.cu_seqlens.tolist()
        assert b.input_ids.shape[0] == 1 and L >= floor and L % PAD_MULTIPLE == 0 and b.attention_mask is None
        assert cu[0] == 0 and cu[-1] == L and b.max_len == max(np.diff(cu))
        samples, tail = b.mask.shape[0], L > b.real_tokens
        assert int(b.mask.sum()) == b.real_tokens - 5 * samples  # the completions (5-token prompts)
        assert len(cu) - 1 == samples + tail and int(b.input_ids.max()) < 50
        kinds.append((samples > 1, tail))
        if len(kinds) == 1:
            assert len({L, len(cu), b.max_len}) == 3
    assert kinds == [(True, True), (True, False), (False, True), (False, False)]
