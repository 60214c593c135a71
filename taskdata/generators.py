"""Procedural task streams (`verifiers.task`), with train/eval splits that never overlap.

    synthetic                              integer arithmetic the tiny model learns (verifiers/synthetic.py)
    reasoning_gym:<dataset>                any reasoning-gym dataset, generated with a seed
    throughput:<pass rate>[:<chars>]       any model passes at a set rate (verifiers/throughput.py)

Splits: a task's split is a pure function of its content (a hash of the prompt, or for generators of
the problem itself), so train and eval never share a task whatever the seeds. The user's files are
`taskdata.sources`'.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Iterator, Literal

from verifiers.base import Task

Split = Literal["train", "eval"]
EVAL_SHARE = 0.1


class DatasetError(ValueError):
    """A task spec is invalid."""


def split_of(text: str, share: float = EVAL_SHARE) -> Split:
    """"eval" for a `share` of all texts (by a hash of the text), else "train"."""
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    return "eval" if (h % 1000) < share * 1000 else "train"


def reasoning_gym_tasks(name: str, seed: int, split: Split, size: int = 1000) -> Iterator[Task]:
    """Entries of a seeded reasoning-gym dataset whose question falls in `split`, cycling forever."""
    from verifiers.reasoning_gym import dataset, reference_for

    ds = dataset(name, seed, size)
    picked = [i for i in range(size) if split_of(ds[i]["question"]) == split]
    if not picked:
        raise DatasetError(f"reasoning_gym:{name} (seed {seed}, size {size}) has no {split} entries")
    for i in itertools.cycle(picked):
        yield Task(ds[i]["question"], reference_for(name, seed, size, i), "reasoning_gym", f"{name}:{seed}:{i}")


def task_source(spec: str, seed: int, split: Split, difficulty: int = 1) -> Iterator[Task]:
    """`synthetic`, `reasoning_gym:<dataset>` or `throughput:<pass rate>[:<prompt chars>]` -> an endless task
    stream of one split."""
    kind, _, arg = spec.partition(":")
    if kind == "synthetic":
        from verifiers import synthetic

        return synthetic.generate(seed, difficulty, split)
    if kind == "reasoning_gym" and arg:
        return reasoning_gym_tasks(arg, seed, split)
    if kind == "throughput" and arg:
        from verifiers import throughput

        try:
            rate, chars = throughput.parse_spec(arg)
        except ValueError as e:
            raise DatasetError(str(e)) from None
        return throughput.generate(seed, rate, chars, split)
    hint = " (files go in data.train: --data.train FILE)" if kind in ("jsonl", "math", "code", "science") else ""
    raise DatasetError(f"unknown task spec {spec!r}: use synthetic, reasoning_gym:<dataset> or "
                       f"throughput:<pass rate>[:<prompt chars>]{hint}")


def generated_verifiers(spec: str, seed: int, difficulty: int = 1, sample: int = 256) -> set[str]:
    """The verifiers the first `sample` training tasks of a generator name."""
    return {t.verifier for t in itertools.islice(task_source(spec, seed, "train", difficulty), sample)}
