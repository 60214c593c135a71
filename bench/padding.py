"""Padding of the learner's passes for long-tailed completion lengths: `python -m bench.padding` (CPU, seconds).

A BroRL step of 4 groups × N = 512, 256-token prompts and completion lengths drawn from a long tail
(log-normal, median 1,024 tokens, clipped to 64 … 16,384), cut into 4 PPO mini-batches as the trainer
cuts them. Each way of forming the forward/backward passes of a mini-batch is scored by the share of the
positions it computes that are padding (`padding_frac` in the step metrics):
  one pass        the whole mini-batch padded to its longest sample
  fixed rows      passes of 16 samples in the mini-batch's (shuffled) order, each padded to its longest
  token budget    `learner.micro_batch_tokens = 65,536`: sorted by length, cut greedily (the default)
  shared prompt   `learner.share_prompt`: one group per pass, its prompt once (positions counted as computed)
Writes bench/results/padding.json.
"""

from __future__ import annotations

import random

from bench.common import table, write_json


def main() -> None:
    from learner.logprobs import pack
    from learner.microbatch import micro_batches

    rng = random.Random(0)
    groups, n, prompt_len, budget = 4, 512, 256, 65_536
    lens = [min(16_384, max(64, int(rng.lognormvariate(6.93, 0.9)))) for _ in range(groups * n)]
    group = [i // n for i in range(groups * n)]
    prompts = [[1 + g] * prompt_len for g in range(groups)]
    seq = [prompt_len + c for c in lens]
    order = list(range(groups * n))
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
    for name, cut, shared in (
        ("one pass", lambda mb: [mb], False),
        ("fixed rows (16)", lambda mb: [mb[i:i + 16] for i in range(0, len(mb), 16)], False),
        ("token budget", lambda mb: micro_batches(mb, seq, budget), False),
        ("shared prompt", lambda mb: micro_batches(mb, seq, budget, group, [prompt_len] * len(seq)), True),
    ):
        runs = [r for mb in minibatches for r in cut(mb)]
        frac, padded, longest = padding(runs, shared)
        rows.append({"passes": name, "count": len(runs), "padding_frac": frac, "positions": padded,
                     "longest_pass": longest})
    print(f"{groups} groups × N = {n}, {prompt_len}-token prompts, completions median "
          f"{sorted(lens)[len(lens) // 2]} (max {max(lens)}), 4 mini-batches")
    print(table(rows, ["passes", "count", "padding_frac", "positions", "longest_pass"]))
    write_json("padding", {"rows": rows, "lengths": {"median": sorted(lens)[len(lens) // 2], "max": max(lens)}})


if __name__ == "__main__":
    main()
