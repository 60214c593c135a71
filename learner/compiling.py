"""`learner.compile`: the decoder layers under torch.compile, and their compilation before the first step.

A compiled layer meets several variants in ordinary training (grad mode, a mask or none, one row or
more; packed rows, `learner.packing`: one sample or several), each compiled the first time it comes. Left to
chance, a new variant arrives mid-run (a step with a long completion alone in its micro-batch, or without
padding) and that step stalls on a GPU while the actors wait for the next weights. `Trainer.warm_up` compiles them all at the start on the tiny
synthetic micro-batches of `warm_up_batches`; `WarmUp` runs it on every rank at the start of the first step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from learner.batch import SampleTable, build
from learner.logprobs import pack

if TYPE_CHECKING:
    from learner.train_step import Trainer

log = logging.getLogger("brorl.learner")

COMPILE_VARIANTS = 32
"""How many compiled variants of a decoder layer's forward torch may keep (`torch._dynamo.config
.recompile_limit`, 8 by default). Ordinary training meets up to 16: grad mode on (training) or off (π_old),
the layer's input requiring grad or not, an attention mask or None (transformers drops the mask of a
micro-batch without padding) and one row or more (torch specialises a size of 1). At the default, one
step of a 2-rank learner reached the limit. Past the limit the learner fails loudly rather than let torch
run new variants uncompiled: a rank that runs a layer eagerly produces its gradients in another order than
a compiled rank, and ZeRO-2's bucketed gradient reduction assumes one order on every rank (a mismatch
hangs the all-reduce or sums the wrong gradients)."""


def compile_layers(model: torch.nn.Module) -> None:
    """torch.compile every decoder layer in place (`learner.compile`; dynamic shapes, since micro-batches
    differ in rows and length). Activation checkpointing, if on, recomputes the compiled layer."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not layers:
        raise ValueError(f"learner.compile: {type(model).__name__} has no decoder layers to compile")
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILE_VARIANTS)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    for layer in layers:
        layer.compile(dynamic=True)


def compiled_frames() -> int:
    """Frames torch has compiled in this process so far (a step's difference is its `compiled_frames` metric)."""
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


PAD_MULTIPLE = 8
"""The compiled learner pads every micro-batch to a length that is a multiple of this (`logprobs.pack`):
inductor specialises kernels on a length's alignment, so a batch whose length happened to be a multiple of 8
after a warm-up of other lengths would recompile every layer mid-run."""

WARM_UP_LENGTHS = ([29, 17, 23], [35, 35, 35], [29], [35])
"""Completion lengths of the warm-up's micro-batches (a 5-token prompt each, padded to 40): padded rows, rows
without padding (transformers then drops the mask), and a single row (torch specialises a size of 1) with
and without padding. No size equals another within a batch (torch assumes that sizes seen equal stay
equal). With a `min_tokens` floor the same four shapes are scaled up to it (`warm_up_lengths`).
Packed (`learner.packing`), the same samples make one row each: several samples and a padding tail (itself a
sample of the boundaries), several that fill the row, one sample and a tail, and one sample alone (boundaries
[0, L], its length the row's); the first row's length, boundary count and longest sample all differ, so the
variant compiled first is the general one."""


def min_tokens(model: torch.nn.Module, device: str | torch.device) -> int:
    """The fewest tokens (rows × padded length) a compiled micro-batch is given on a GPU; 0 elsewhere.

    Inductor's Triton backend fuses a layer's row and column reductions (the backward of a norm's weight)
    only for a large enough micro-batch, and decides it with guards on its size: rows × hidden ≥ 5 · 2^20,
    rows ≥ 2 × hidden and rows ≥ 4096 (`torch/_inductor/scheduler.py`, mix-order reductions). Each side of
    each threshold is a variant of every compiled layer, so a small last micro-batch of a step would
    recompile them mid-run. Padding every micro-batch up to the largest threshold leaves one regime, which
    the warm-up compiles."""
    import torch._inductor.config as inductor_config

    if torch.device(device).type != "cuda" or not getattr(inductor_config.triton, "mix_order_reduction", True):
        return 0
    hidden = model.get_input_embeddings().embedding_dim
    m = max(4096, 2 * hidden, -(-5 * 2**20 // hidden))
    return -(-m // PAD_MULTIPLE) * PAD_MULTIPLE


def warm_up_lengths(floor: int) -> tuple[list[int], ...]:
    """`WARM_UP_LENGTHS`, or with a `min_tokens` floor the same four shapes with every batch at least `floor`
    tokens: three rows of length L3 (padded ones, and ones that fill it exactly) and one row of L1, L3 and L1
    multiples of `PAD_MULTIPLE` (a 5-token prompt each). Their completions also span several of the
    log-prob chunks (`learner.logprob_chunk_mb`), as a real micro-batch's do: torch would otherwise first
    meet a single chunk and specialise on it."""
    if floor <= 0:
        return WARM_UP_LENGTHS
    l3 = -(-floor // (3 * PAD_MULTIPLE)) * PAD_MULTIPLE
    l1 = -(-floor // PAD_MULTIPLE) * PAD_MULTIPLE
    return ([l3 - 11, l3 - 23, l3 - 17], [l3 - 5] * 3, [l1 - 11], [l1 - 5])


def warm_up_batches(vocab: int, pad_id: int, device: str | torch.device, floor: int, packed: bool = False):
    """The warm-up's synthetic micro-batches (`warm_up_lengths` above `floor`), laid out as a compiled step lays
    out its own (padded rows, or `packed`: one packed row each, `learner.packing`), one at a time; token ids below
    `vocab`. `Trainer.warm_up` runs its passes on them."""
    ids = lambda n, k: [(7 * i + k) % vocab for i in range(n)]  # noqa: E731
    for lengths in warm_up_lengths(floor):
        prompts, comps = [ids(5, 1)] * len(lengths), [ids(n, 3) for n in lengths]
        if not packed:
            yield pack(prompts, comps, pad_id, device, multiple=PAD_MULTIPLE, min_tokens=floor)
            continue
        off = lambda seqs: np.cumsum([0] + [len(x) for x in seqs])  # noqa: E731
        table = SampleTable(prompts=np.concatenate(prompts), prompt_off=off(prompts), tokens=np.concatenate(comps),
                            behav=np.zeros(sum(lengths)), comp_off=off(comps), prompt_of=np.arange(len(lengths)),
                            adv=np.zeros(len(lengths)))
        yield build(table, np.arange(len(lengths)), pad_id=pad_id, layout="packed", multiple=PAD_MULTIPLE,
                    min_tokens=floor).to(device).packed


class WarmUp:
    """Every rank's warm-up, once, at the start of the first step (rank 0 tells the others by command).

    It runs in the thread that runs the step, on purpose: on 2 DeepSpeed ranks, a warm-up run in a thread
    of its own (while the first groups were generated) left the compiled steps training wrongly (other
    losses than the eager step, no recompilation); run in the step's own thread they matched
    (`tests/integration/test_train_step.py::test_deepspeed_matches_torch`, the compiled case)."""

    def __init__(self) -> None:
        self.done = False
        self.seconds = 0.0

    def ensure(self, trainer: "Trainer") -> None:
        """Without `learner.compile`, or once done, nothing to do; a failure raises (a model that cannot
        compile cannot train) and is tried again at the next step."""
        if self.done or not trainer.cfg.compile:
            return
        if trainer.ranks is not None:
            trainer.ranks.command("warm_up", [None] * trainer.world)
        self.seconds = trainer.warm_up()
        self.done = True
        log.info("learner.compile: compiled before the first step in %.1f s", self.seconds)
