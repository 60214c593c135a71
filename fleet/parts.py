"""The fleet simulator's pieces of state (`fleet/sim.py`): the dispatcher's task stream, a group as the
learner's admission reads it, an actor."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np


class Tasks:
    """The dispatcher's task stream: prompts are ids only here."""

    def __getitem__(self, i: int):
        return SimpleNamespace(prompt="", reference="", verifier="sim", task_id=str(i), source=""), []


@dataclass
class Group:
    """What `Admission` reads of a wire group."""
    gid: int
    pid: int
    actor: int
    policy_version: int
    n: int
    n_tokens: int
    versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    settled: bool | None = None
    """Adaptive rollouts (`Fleet.first_wave`): its first wave all agreed (dropped); None: fixed N."""
    rest: list[int] = field(default_factory=list)
    """Adaptive rollouts: the lengths of the second wave, still to come after the first (n counts the first)."""

    @property
    def oldest_version(self) -> int:
        return self.policy_version

    @property
    def tokens(self) -> range:
        return range(self.n_tokens)


@dataclass
class Actor:
    version: int = 0
    up: bool = True
    inflight: dict[int, list] = field(default_factory=dict)  # gid -> [end time, group]
    draining: bool = False  # an update is announced: no new prompt until it is loaded
    idle_since: float | None = 0.0
    idle_s: float = 0.0
    waiting: bool = False  # a request retry is scheduled
