"""Task data: where prompts come from and how the model sees them — used alike by the learner (its data
stream), the actors (reading completions back), evaluation and `brorl data preview`.

Lives here: the user's files (`files.py`: JSONL, Parquet, `datasets` folders; `layouts.py`: the field maps
of verl, OpenRLHF and the common layouts, and data source -> verifier; `sources.py`: checking, splitting,
mixing), the procedural generators (`generators.py`) and prompt rendering (`render.py`: the chat template,
the system prompt, the reasoning block of a completion).
Must not import: `learner`, `actors`, `evaluation`, `tinymodel`, `cli` (it sits below them), nor vLLM.

    train_tasks(cfg)     the endless training stream (files if `data.train`, else `verifiers.task`)
    heldout_tasks(cfg)   the held-out tasks (`data.eval`, else the held-out share or split)
"""

from __future__ import annotations

import itertools
from typing import Iterator

from config.schema import BrorlConfig
from taskdata.files import DataError
from taskdata.generators import DatasetError, generated_verifiers, split_of, task_source
from taskdata.render import PromptRenderer, Rendered, RenderError, answer_region
from taskdata.sources import Loaded, load_all, mixture
from verifiers.base import Task

__all__ = ["DataError", "DatasetError", "Loaded", "PromptRenderer", "RenderError", "Rendered", "Task",
           "answer_region", "heldout_tasks", "split_of", "task_source", "train_tasks", "uses_files", "verifier_names"]


def uses_files(cfg: BrorlConfig) -> bool:
    return bool(cfg.data.train)


def train_tasks(cfg: BrorlConfig, seed: int | None = None) -> Iterator[Task]:
    seed = cfg.run.seed if seed is None else seed
    if uses_files(cfg):
        return mixture([(lo.tasks, lo.source.weight) for lo in load_all(cfg.data, "train")], seed)
    return task_source(cfg.verifiers.task, seed, "train", cfg.verifiers.difficulty)


def heldout_tasks(cfg: BrorlConfig, n: int | None = None, seed: int | None = None) -> list[Task]:
    """`data.eval`'s rows (every one); else the first `n` (default `run.eval_prompts`) held-out rows of the
    training files; else of the generator's eval split (for `seed`, default `run.seed`)."""
    n = n or cfg.run.eval_prompts
    if cfg.data.eval:
        return [t for lo in load_all(cfg.data, "eval") for t in lo.tasks]
    if uses_files(cfg):
        held = [t for lo in load_all(cfg.data, "heldout") for t in lo.tasks]
        if not held:
            raise DataError("no held-out row in data.train (data.heldout_share): name held-out files in data.eval")
        return held[:n]
    src = task_source(cfg.verifiers.task, cfg.run.seed if seed is None else seed, "eval", cfg.verifiers.difficulty)
    return list(itertools.islice(src, n))


def verifier_names(cfg: BrorlConfig) -> set[str]:
    """Every verifier the job's tasks name (files: every row of train and eval; a generator: a sample)."""
    if uses_files(cfg):
        return {t.verifier for role in ("train", "eval") for lo in load_all(cfg.data, role) for t in lo.tasks}
    return generated_verifiers(cfg.verifiers.task, cfg.run.seed, cfg.verifiers.difficulty)
