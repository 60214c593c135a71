"""A step's passes: every rank's micro-batches of each mini-batch. Samples sorted by length and cut into runs of at
most `learner.micro_batch_tokens` padded tokens where they compute the fewest positions (`micro_batches`; packed
sequences, `learner.packing`: filled to the budget, best fit), every rank given as many passes (`even_out`), each
pass carrying its weight in the mini-batch's token-mean loss (`Micro`, `RankShare`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from learner.batch import SampleTable


@dataclass
class Micro:
    """One forward/backward pass of one rank: its samples (rows of the rank's `SampleTable`) and its weight
    in the mini-batch's loss."""

    rows: np.ndarray
    """int64[S] — the pass's samples, in the order they are batched."""
    weight: float
    """world × (this pass's tokens, or sequences) / (the whole mini-batch's): the factor that makes the
    ranks' averaged, accumulated gradient the mini-batch's token-mean; 0 for a padding pass."""


@dataclass
class RankShare:
    """One rank's part of a step: for every mini-batch, its micro-batches (every rank has as many)."""

    minibatches: list[list[Micro]]
    skip: bool = False
    """The step changes nothing (non-finite advantages): only the step counter moves."""
    table: "SampleTable | None" = None
    """The samples the passes' rows point into."""


PASS_TOKENS = 2048
"""What one more pass costs beyond its positions, in positions' worth of compute (`micro_batches`): every layer's
kernels launched for the forward, π_old's forward and the backward, and the LM head's chunks."""


def micro_batches(idx: list[int], seq_len: list[int], budget: int, group: list[int] | None = None,
                  prompt_len: list[int] | None = None, *, multiple: int = 1, floor: int = 0,
                  pass_tokens: int = PASS_TOKENS, packed: bool = False) -> list[list[int]]:
    """`idx` sorted by sequence length (longest first) and cut into runs of at most `budget` padded tokens
    (rows × the run's longest; a sample longer than the budget goes alone; 0: one run), the cuts that compute
    the fewest positions: each run padded to its longest (rounded up to a `multiple`, and to at least `floor`
    tokens: the compiled learner's `PAD_MULTIPLE` and `min_tokens`), plus `pass_tokens` for each run (a dynamic
    programme over the sorted lengths: it pads less than filling each pass to the budget,
    `python -m bench.padding`). With `group` (shared prompts): a run holds samples of one group only, cut
    greedily, and costs its prompt once plus rows × its longest completion (0: one run per group). `packed`
    (`learner.packing`: a run costs the sum of its lengths, no padding): runs filled up to `budget` tokens,
    each sample (longest first) into the fullest run it fits (best fit decreasing: the fewest passes, each as
    full as it gets)."""
    if not idx:
        return []
    if packed and group is None:
        order = sorted(idx, key=lambda i: (-seq_len[i], i))
        return [order] if budget <= 0 else _best_fit(order, seq_len, budget)
    if group is None:
        order = sorted(idx, key=lambda i: (-seq_len[i], i))
        if budget <= 0:
            return [order]
        cuts = _cheapest_cuts([seq_len[i] for i in order], budget, multiple, floor, pass_tokens)
        return [order[a:b] for a, b in zip(cuts, cuts[1:])]
    assert prompt_len is not None

    def fits(run: list[int]) -> bool:
        p = prompt_len[run[0]]
        return budget <= 0 or p + (len(run) + 1) * (seq_len[run[0]] - p) <= budget
    out: list[list[int]] = []
    for i in sorted(idx, key=lambda i: (group[i], -seq_len[i], i)):
        if out and group[out[-1][0]] == group[i] and fits(out[-1]):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _best_fit(order: list[int], seq_len: list[int], budget: int) -> list[list[int]]:
    """`order` (longest first) into runs of at most `budget` tokens (a longer sample alone): each sample into
    the run with the least room that still fits it, a new run if none does."""
    runs: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (tokens left, run), sorted
    for i in order:
        n = seq_len[i]
        k = bisect.bisect_left(room, (n, -1))
        if k < len(room):
            left, r = room.pop(k)
            runs[r].append(i)
            left -= n
        else:
            r, left = len(runs), budget - n
            runs.append([i])
        if left > 0:
            bisect.insort(room, (left, r))
    return runs


def _cheapest_cuts(lengths: list[int], budget: int, multiple: int, floor: int, pass_tokens: int) -> list[int]:
    """Cut points 0 = c0 < c1 < … = len(lengths) of `lengths` (longest first) whose runs [c_k, c_k+1) each fit
    `budget` (rows × their first length; a single row always fits) at the least total cost: each run's rows ×
    its first length rounded up to `multiple`, at least `floor`, plus `pass_tokens`. Among equal costs, the
    fewest runs."""
    import numpy as np

    n = len(lengths)
    ln = np.asarray(lengths, dtype=np.int64)
    padded_len = -(-ln // multiple) * multiple
    best = np.zeros(n + 1)
    back = np.zeros(n + 1, dtype=np.int64)
    lo = 0  # the earliest start of a run that ends at j and fits: moves only forward as j grows
    for j in range(1, n + 1):
        while lo < j - 1 and (j - lo) * ln[lo] > budget:
            lo += 1
        starts = np.arange(lo, j)
        cost = best[lo:j] + np.maximum((j - starts) * padded_len[lo:j], floor) + pass_tokens
        k = int(np.argmin(cost))  # the first minimum: the longest run among equals
        best[j], back[j] = cost[k], lo + k
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(int(back[cuts[-1]]))
    return cuts[::-1]


def even_out(micro: list[list[int]], count: int) -> list[list[int] | None]:
    """Exactly `count` micro-batches (every rank runs as many passes, so collectives stay in step): split
    the largest ones in two while any has two samples; past that, None entries (a pass that weighs 0)."""
    micro = [list(m) for m in micro]
    while len(micro) < count:
        big = max((m for m in micro if len(m) > 1), key=len, default=None)
        if big is None:
            break
        micro.remove(big)
        micro += [big[: len(big) // 2], big[len(big) // 2:]]
    return micro + [None] * (count - len(micro))
