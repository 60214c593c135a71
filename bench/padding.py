"""Padding of the learner's passes for long-tailed completion lengths: `python -m bench.padding` (CPU, seconds).

Two steps, each cut into 4 PPO mini-batches as the trainer cuts them:
  BroRL   4 groups × N = 512, 256-token prompts, completion lengths log-normal (median 1,024 tokens, clipped to
          64 … 16,384), `learner.micro_batch_tokens = 65,536`
  N = 16  32 groups × N = 16 (`bench.e2e`'s 512-sample step), 60–200-token prompts, one budget per prompt that
          all its completions run to (log-normal, median 256, σ = 1, capped at 1,024: a random-weight model),
          `micro_batch_tokens = 32,768`
Each way of forming the forward/backward passes of a mini-batch is scored by the share of the positions it
computes that are padding (`padding_frac` in the step metrics):
  one pass        the whole mini-batch padded to its longest sample
  fixed rows      passes of 16 samples in the mini-batch's (shuffled) order, each padded to its longest
  greedy          sorted by length, a pass grown until the next sample would exceed the budget (before 2026-11-30)
  token budget    sorted by length, cut where the passes compute the fewest positions (`learner.microbatch`)
  shared prompt   `learner.share_prompt`: one group per pass, its prompt once (positions counted as computed)
Writes bench/results/padding.json.
"""

from __future__ import annotations

import random

from bench.common import table, write_json


def greedy_cuts(idx: list[int], seq: list[int], budget: int) -> list[list[int]]:
    """The cuts before 2026-11-30: longest first, a pass grown until the next sample would exceed the budget."""
    out: list[list[int]] = []
    for i in sorted(idx, key=lambda i: (-seq[i], i)):
        if out and (len(out[-1]) + 1) * seq[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _step(rng: random.Random, name: str) -> tuple[list[list[int]], list[int], list[int], int, list[int]]:
    """(prompts of each group, completion lengths, each sample's group, the token budget, prompt lengths)."""
    if name == "brorl":
        groups, n, budget = 4, 512, 65_536
        lens = [min(16_384, max(64, int(rng.lognormvariate(6.93, 0.9)))) for _ in range(groups * n)]
        prompts = [[1 + g] * 256 for g in range(groups)]
    else:
        groups, n, budget = 32, 16, 32_768
        per_prompt = [min(1024, max(1, int(rng.lognormvariate(5.545, 1.0)))) for _ in range(groups)]
        lens = [per_prompt[i // n] for i in range(groups * n)]
        prompts = [[1 + g] * rng.randint(60, 200) for g in range(groups)]
    group = [i // n for i in range(groups * n)]
    return prompts, lens, group, budget, [len(prompts[g]) for g in group]


def rows_of(name: str, seed: int = 0) -> tuple[list[dict], dict]:
    from learner.logprobs import pack
    from learner.microbatch import micro_batches

    rng = random.Random(seed)
    prompts, lens, group, budget, plen = _step(rng, name)
    seq = [p + c for p, c in zip(plen, lens)]
    order = list(range(len(lens)))
    rng.shuffle(order)
    minibatches = [sorted(order[i::4]) for i in range(4)]

    def padding(runs: list[list[int]], shared: bool = False) -> tuple[float, int, int]:
        padded = real = longest = 0
        for r in runs:
            b = pack([prompts[group[i]] for i in r], [[0] * lens[i] for i in r], share_prompt=shared)
            p, q = b.token_counts()
            padded, real, longest = padded + p, real + q, max(longest, p)
        return 1 - real / padded, padded, longest

    rows = []
    for case, cut, shared in (
        ("one pass", lambda mb: [mb], False),
        ("fixed rows (16)", lambda mb: [mb[i:i + 16] for i in range(0, len(mb), 16)], False),
        ("greedy", lambda mb: greedy_cuts(mb, seq, budget), False),
        ("token budget", lambda mb: micro_batches(mb, seq, budget), False),
        ("shared prompt", lambda mb: micro_batches(mb, seq, budget, group, plen), True),
    ):
        runs = [r for mb in minibatches for r in cut(mb)]
        frac, padded, longest = padding(runs, shared)
        rows.append({"passes": case, "count": len(runs), "padding_frac": frac, "positions": padded,
                     "longest_pass": longest})
    s = sorted(lens)
    return rows, {"median": s[len(s) // 2], "max": max(lens), "budget": budget, "samples": len(lens)}


def main() -> None:
    out = {}
    for name, title in (("brorl", "4 groups × N = 512"), ("n16", "32 groups × N = 16")):
        rows, lengths = rows_of(name)
        print(f"\n{title}, completions median {lengths['median']} (max {lengths['max']}), 4 mini-batches, "
              f"a budget of {lengths['budget']:,} tokens a pass")
        print(table(rows, ["passes", "count", "padding_frac", "positions", "longest_pass"]))
        out["rows" if name == "brorl" else "rows_n16"] = rows
        out["lengths" if name == "brorl" else "lengths_n16"] = lengths
    write_json("padding", out)


if __name__ == "__main__":
    main()
