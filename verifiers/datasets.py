"""Task datasets: JSONL files and procedural generators, with train/eval splits that never overlap.

JSONL: one task per line, an object with
    prompt     (str, required)   text given to the model
    reference  (str or object)   reference answer, or tests for `code` (an object is JSON-encoded)
    verifier   (str, required)   registered verifier name
    id         (str, optional)   task id (default: "<file>:<line>")
    split      (str, optional)   "train" or "eval" (default: decided by a hash of the prompt)
    metadata   (object, optional)
A malformed line is reported with its line number and either skipped (counted) or fatal, by `on_error`;
it is never accepted silently.

Splits: a task's split is a pure function of its content (a hash of the prompt, or for generators of
the problem itself), so train and eval never share a task whatever the seeds.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal

from verifiers.base import Task

Split = Literal["train", "eval"]
EVAL_SHARE = 0.1


class DatasetError(ValueError):
    """A task file or spec is invalid."""


@dataclass
class LoadReport:
    tasks: list[Task] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """"file:line: reason" for every skipped line."""


def split_of(text: str) -> Split:
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    return "eval" if (h % 1000) < EVAL_SHARE * 1000 else "train"


def load_jsonl(path: str | Path, split: Split | None = None,
               on_error: Literal["skip", "fatal"] = "skip") -> LoadReport:
    path = Path(path)
    rep = LoadReport()
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task, task_split = _parse_line(line, f"{path.name}:{lineno}")
            except DatasetError as e:
                msg = f"{path}:{lineno}: {e}"
                if on_error == "fatal":
                    raise DatasetError(msg) from None
                rep.errors.append(msg)
                continue
            if split is None or task_split == split:
                rep.tasks.append(task)
    return rep


def _parse_line(line: str, default_id: str) -> tuple[Task, Split]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DatasetError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"expected an object, got {type(obj).__name__}")
    for key in ("prompt", "verifier"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise DatasetError(f"field {key!r} must be a non-empty string")
    if "reference" not in obj:
        raise DatasetError("field 'reference' is missing")
    ref = obj["reference"]
    ref = ref if isinstance(ref, str) else json.dumps(ref)
    sp = obj.get("split", split_of(obj["prompt"]))
    if sp not in ("train", "eval"):
        raise DatasetError(f"field 'split' must be 'train' or 'eval', got {sp!r}")
    unknown = set(obj) - {"prompt", "reference", "verifier", "id", "split", "metadata"}
    if unknown:
        raise DatasetError(f"unknown field(s) {sorted(unknown)}")
    return Task(obj["prompt"], ref, obj["verifier"], str(obj.get("id", default_id))), sp


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
    """`synthetic`, `reasoning_gym:<dataset>`, `throughput:<pass rate>[:<prompt chars>]` (verifiers/throughput.py)
    or `jsonl:<path>` -> endless task stream of one split."""
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
    if kind == "jsonl" and arg:
        tasks = load_jsonl(arg, split).tasks
        if not tasks:
            raise DatasetError(f"{arg} has no {split} tasks")
        return itertools.cycle(tasks)
    raise DatasetError(f"unknown task spec {spec!r}: use synthetic, reasoning_gym:<dataset>, "
                       f"throughput:<pass rate>[:<prompt chars>] or jsonl:<path>")


def verifier_names(spec: str, seed: int, difficulty: int = 1, sample: int = 256) -> set[str]:
    """The verifiers a task spec's tasks name: every task of a JSONL file (both splits), else the first
    `sample` training tasks of the stream."""
    kind, _, arg = spec.partition(":")
    if kind == "jsonl" and arg:
        return {t.verifier for t in load_jsonl(arg).tasks}
    return {t.verifier for t in itertools.islice(task_source(spec, seed, "train", difficulty), sample)}
