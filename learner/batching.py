"""The learner's bookkeeping between sockets and training step, each piece small and socket-free.

Dispatcher  (`learner.dispatch`) owns the data cursor: prompt ids are positions in the seeded train-task stream. It grants
            up to the requested credits, bounded by the room the batcher leaves and by freshness: an actor
            whose weights are version v gets a prompt only if the prompts already pending (granted, not
            yet consumed) can be trained before step v + max_staleness, i.e. pending < (v + K − step + 1)
            · B / keep_rate, with keep_rate the dynamic-sampling keep rate (running estimate). So what an
            actor generates is trained, not dropped as stale, and K sets how far generation may run
            ahead of training. A granted prompt is a lease held by one actor: its group is used only if it
            comes from that actor (`claim`), and the prompts of an actor that is gone go back to the queue
            (`retire`). One actor holds at most its share of the freshness bound (the bound / the live
            actors), and a lease not answered within its deadline (`learner.lease_timeout_s`) goes back to
            the queue (`expire`); its holder then holds at most one prompt until it delivers a group. It re-issues prompts that come back unanswered, and knows which granted
            prompts are not yet consumed (trained on or dropped by dynamic sampling) — that set and the
            next fresh id are its checkpoint state, so a resumed run hands out exactly the prompts the
            interrupted one had not consumed, then carries on.
Admission   drops groups older than `max_staleness` versions (counted, prompt re-issued).
Batcher     dynamic sampling with backfill, the one place groups are filtered: drops groups without signal
            as they arrive (`learner.dynamic_sampling_metric`: equal rewards, or all correct / all wrong;
            counted by reason); `await next_batch(step, interrupted)` returns B kept groups that pass admission as
            soon as they are there (woken by each arriving group, no polling), or None when `interrupted()`
            turns true (checked on every `wake()`), keeping what it has gathered for the next call.
`run.reproducible` orders both: the dispatcher grants in waves sized by what the run has seen, the batcher
            forms a batch of the lowest-numbered kept groups once a wave is answered (docs/configuration.md).
(Which actors are alive and in the weight group: `learner.membership`.)
"""


from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Callable

import numpy as np

from learner.algorithm import drop_reason
from learner.dispatch import Dispatcher, NothingRenders, TaskStream
from learner.sources import SourceStats
from transport import wire
from transport.staleness import fresh, staleness

__all__ = ["TaskStream", "NothingRenders", "Dispatcher", "Admission", "Batch", "Batcher"]


class Admission:
    """Staleness = the step at which a token is trained − the version that sampled it. A group is admitted
    while its oldest token is at most `max_staleness` old: checked when it arrives (already too old:
    dropped) and again when its batch is trained (`check_batch`), which is also where the per-token
    histogram is recorded."""

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self.staleness: collections.Counter[int] = collections.Counter()
        self.dropped_stale = 0

    def admit(self, g: wire.RolloutGroup, step: int) -> bool:
        if not fresh(step, g.oldest_version, self.max_staleness):
            self.dropped_stale += 1
            return False
        return True

    def check_batch(self, groups: list[wire.RolloutGroup], step: int) -> tuple[list, list]:
        """-> (groups to train, groups too stale to train: one of whose tokens is). Records the staleness of
        every trained token (weights updated in flight give a completion tokens of several versions)."""
        keep, stale = [], []
        for g in groups:
            if not fresh(step, g.oldest_version, self.max_staleness):
                stale.append(g)
                self.dropped_stale += 1
            else:
                keep.append(g)
                if len(g.versions):
                    for s, n in enumerate(np.bincount(np.maximum(staleness(step, g.token_versions()), 0))):
                        self.staleness[s] += int(n)
                else:
                    self.staleness[max(staleness(step, g.policy_version), 0)] += len(g.tokens)
        return keep, stale

    def take_stats(self) -> dict:
        hist = {f"staleness_{k}": float(v) for k, v in sorted(self.staleness.items())}
        total = sum(self.staleness.values())
        out = {**hist, "staleness_mean": sum(k * v for k, v in self.staleness.items()) / total if total else 0.0,
               "drop_stale": float(self.dropped_stale)}
        self.staleness.clear()
        self.dropped_stale = 0
        return out


@dataclass
class Batch:
    groups: list[wire.RolloutGroup]
    """B kept groups, admitted for the step they are trained at."""
    stats: dict
    """What arrived since the previous batch (`Batcher.take_stats`), taken when the batch was released."""


class Batcher:
    def __init__(self, groups_per_step: int, dynamic_sampling: bool = True, admission: Admission | None = None,
                 give_back: Callable[[list[int]], None] = lambda pids: None,
                 wave_done: Callable[[], bool] | None = None, source_of: Callable[[int], str] | None = None,
                 metric: str = "reward"):
        self.B = groups_per_step
        self.metric = metric  # `learner.dynamic_sampling_metric`
        self.source_of = source_of  # prompt id -> its data source (the per-source metrics); None: the verifier
        self.wave_done = wave_done  # `run.reproducible`: a batch forms only when the dispatcher's wave is answered
        self.dynamic_sampling = dynamic_sampling
        self.admission = admission or Admission(max_staleness=1 << 30)
        self.give_back = give_back  # prompts of groups found too stale when a batch is assembled
        self.kept: list[wire.RolloutGroup] = []
        self._gathered: list[wire.RolloutGroup] = []  # admitted for the batch being assembled
        self._changed = asyncio.Event()
        self.waiting = False  # inside next_batch, waiting for groups
        self._reset()

    def wake(self) -> None:
        """Make a waiting `next_batch` look again (and check its `interrupted`)."""
        self._changed.set()

    async def next_batch(self, step: int, interrupted: Callable[[], bool]) -> Batch | None:
        """B kept groups admitted at `step`, oldest first, once they are there; None when `interrupted()`."""
        while not interrupted():
            if self.wave_done is not None:
                if self.wave_done() and len(self.kept) >= self.B and (batch := self._ordered_batch(step)):
                    return batch
            else:
                keep, stale = self.admission.check_batch(self.pop(self.B - len(self._gathered)), step)
                if stale:
                    self.give_back([g.prompt_id for g in stale])
                self._gathered += keep
                if len(self._gathered) == self.B:
                    groups, self._gathered = self._gathered, []
                    return Batch(groups, self.take_stats(groups))
                if self.kept:  # what was popped was too stale: look at the rest before waiting for more
                    continue
            self._changed.clear()
            self.waiting = True
            try:
                await self._changed.wait()
            finally:
                self.waiting = False
        return None

    def _ordered_batch(self, step: int) -> Batch | None:
        """`run.reproducible`: the B kept groups of the lowest prompt ids, in that order; the rest (generated
        with this step's weights, stale for the next at K = 0) go back to the queue in order. None if too
        few are fresh (those that are not go back too)."""
        ok, stale = [], []
        for g in sorted(self.kept, key=lambda g: g.prompt_id):
            (ok if self.admission.admit(g, step) else stale).append(g)  # counts the stale
        groups, rest = ok[:self.B], ok[self.B:]
        self.kept = groups if len(groups) < self.B else []
        if rest or stale:
            self.give_back(sorted(g.prompt_id for g in rest + stale))
        if len(groups) < self.B:
            return None
        self.admission.check_batch(groups, step)  # the trained tokens' staleness histogram
        return Batch(groups, self.take_stats(groups))

    def _reset(self) -> None:
        self.stats = {"generated": 0, "kept_samples": 0, "kept_groups": 0, "received_samples": 0, "tokens": 0,
                      "reward_sum": 0.0, "correct_sum": 0.0,
                      "drop_all_correct": 0, "drop_all_wrong": 0, "drop_equal_reward": 0, "drop_unleased": 0,
                      "groups_received": 0}
        self.sources = SourceStats()
        self.consumed_ids: list[int] = []

    def room(self) -> int:
        return max(0, 2 * self.B - len(self.kept))

    def count_unleased(self, g: wire.RolloutGroup) -> None:
        """A group for a prompt its actor no longer holds: generated all the same, never trained."""
        self.stats["generated"] += g.n
        self.stats["tokens"] += int(g.lengths.sum())
        self.stats["drop_unleased"] += 1

    def count_stale(self, g: wire.RolloutGroup) -> None:
        """A group dropped as too stale on arrival: generated all the same (throughput counts it)."""
        self.stats["generated"] += g.n
        self.stats["tokens"] += int(g.lengths.sum())

    def add(self, g: wire.RolloutGroup) -> None:
        s = self.stats
        s["generated"] += g.n
        s["groups_received"] += 1
        s["received_samples"] += g.n
        s["tokens"] += int(g.lengths.sum())
        s["reward_sum"] += float(g.rewards.sum())
        s["correct_sum"] += float(g.correct.sum())
        why = drop_reason(g.rewards, g.correct.astype(bool), self.metric) if self.dynamic_sampling else ""
        self.sources.add(g, self.source_of(g.prompt_id) if self.source_of else "", not why)
        if why:
            s[f"drop_{why}"] += 1
            self.consumed_ids.append(g.prompt_id)
        else:
            self.kept.append(g)
            s["kept_samples"] += g.n
            s["kept_groups"] += 1
            self.wake()
        if self.wave_done is not None:
            self.wake()  # a dropped group may answer the wave's last prompt

    def pop(self, n: int) -> list[wire.RolloutGroup]:
        """Up to n kept groups, oldest first."""
        out, self.kept = self.kept[:n], self.kept[n:]
        return out

    def take_stats(self, batch: list[wire.RolloutGroup] | None = None) -> dict:
        """What arrived since the last call; `batch`: the groups the step trains. `pass_rate` is dynamic
        sampling's own (samples it kept / generated); `train_pass_rate` = the batch's samples / generated:
        below it by what admission dropped as stale after dynamic sampling kept it (and by kept groups
        that wait for a later batch, which count in that one)."""
        s = self.stats
        gen = max(s["generated"], 1)
        out = {
            "generated": float(s["generated"]), "tokens": float(s["tokens"]),
            "rollout_reward": s["reward_sum"] / gen, "rollout_accuracy": s["correct_sum"] / gen,
            "pass_rate": s["kept_samples"] / gen, "drop_all_correct": float(s["drop_all_correct"]),
            "drop_all_wrong": float(s["drop_all_wrong"]), "drop_equal_reward": float(s["drop_equal_reward"]),
            "drop_unleased": float(s["drop_unleased"]),
            "train_pass_rate": sum(g.n for g in batch or []) / gen,
            "groups_received": float(s["groups_received"]),
            # mean N of the groups received (below N with adaptive rollouts), and the samples generated per
            # group kept: what a unit of training signal cost
            "samples_per_group": s["received_samples"] / max(s["groups_received"], 1),
            "samples_per_kept_group": s["generated"] / max(s["kept_groups"], 1),
            "consumed_ids": list(self.consumed_ids),
            **self.sources.take(),  # per data source (`learner.sources`)
        }
        self._reset()
        return out
