"""A step's passes: every rank's micro-batches of each mini-batch. Samples sorted by length and cut into runs of at
most `learner.micro_batch_tokens` padded tokens (`micro_batches`), every rank given as many passes
(`even_out`), each pass carrying its weight in the mini-batch's token-mean loss (`Micro`, `RankShare`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Micro:
    """One forward/backward pass of one rank: its samples and its weight in the mini-batch's loss."""

    prompts: list[list[int]]
    completions: list[list[int]]
    behav: list[list[float]]
    """log μ of each completion token."""
    adv: list[float]
    """Â of each sample."""
    weight: float
    """world × (this pass's tokens, or sequences) / (the whole mini-batch's): the factor that makes the
    ranks' averaged, accumulated gradient the mini-batch's token-mean; 0 for a padding pass."""


@dataclass
class RankShare:
    """One rank's part of a step: for every mini-batch, its micro-batches (every rank has as many)."""

    minibatches: list[list[Micro]]
    skip: bool = False
    """The step changes nothing (non-finite advantages): only the step counter moves."""


def micro_batches(idx: list[int], seq_len: list[int], budget: int, group: list[int] | None = None,
                  prompt_len: list[int] | None = None) -> list[list[int]]:
    """`idx` sorted by sequence length (longest first) and cut greedily into runs of at most `budget`
    padded tokens (rows × the run's longest); a sample longer than the budget goes alone. 0: one run.
    With `group` (shared prompts): a run holds samples of one group only, and costs its prompt once plus
    rows × its longest completion (0: one run per group)."""
    if not idx:
        return []
    if group is None:
        def fits(run: list[int]) -> bool:
            return budget <= 0 or (len(run) + 1) * seq_len[run[0]] <= budget
        key = lambda i: (-seq_len[i], i)  # noqa: E731
    else:
        assert prompt_len is not None
        def fits(run: list[int]) -> bool:
            p = prompt_len[run[0]]
            return budget <= 0 or p + (len(run) + 1) * (seq_len[run[0]] - p) <= budget
        key = lambda i: (group[i], -seq_len[i], i)  # noqa: E731
    out: list[list[int]] = []
    for i in sorted(idx, key=key):
        if out and (group is None or group[out[-1][0]] == group[i]) and fits(out[-1]):
            out[-1].append(i)
        else:
            out.append([i])
    return out


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
