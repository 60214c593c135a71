"""The learner's bookkeeping between sockets and training step, each piece small and socket-free.

Dispatcher  owns the data cursor: prompt ids are positions in the seeded train-task stream. It grants
            up to the requested credits, bounded by the room the batcher leaves and by freshness: an actor
            whose weights are version v gets a prompt only if the prompts already pending (granted, not
            yet consumed) can be trained before step v + max_staleness, i.e. pending < (v + K − step + 1)
            · B / keep_rate, with keep_rate the dynamic-sampling keep rate (running estimate). So what an
            actor generates is trained, not dropped as stale, and K sets how far generation may run
            ahead of training. A granted prompt is a lease held by one actor: its group is used only if it
            comes from that actor (`claim`), and the prompts of an actor that is gone go back to the queue
            (`retire`). It re-issues prompts that come back unanswered, and knows which granted
            prompts are not yet consumed (trained on or dropped by dynamic sampling) — that set and the
            next fresh id are its checkpoint state, so a resumed run hands out exactly the prompts the
            interrupted one had not consumed, then carries on.
Admission   drops groups older than `max_staleness` versions (counted, prompt re-issued).
Batcher     dynamic sampling with backfill: drops all-correct / all-wrong groups as they arrive (counted
            by reason); `await next_batch(step, interrupted)` returns B kept groups that pass admission as
            soon as they are there (woken by each arriving group, no polling), or None when `interrupted()`
            turns true (checked on every `wake()`), keeping what it has gathered for the next call.
`run.reproducible` orders both: the dispatcher grants in waves sized by what the run has seen, the batcher
            forms a batch of the lowest-numbered kept groups once a wave is answered (docs/configuration.md).
(Which actors are alive and in the weight group: `learner.membership`.)
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from config.schema import BrorlConfig
from transport import wire
from transport.staleness import fresh, staleness, steps_left

log = logging.getLogger("brorl.learner")


class NothingRenders(RuntimeError):
    """The task stream yields no task this model can take: the learner cannot go on (it stops with this)."""

    fix = "check data.*, the tokenizer's chat template and actor.max_model_len with `brorl data preview`"


class TaskStream:
    """Random access into the deterministic train-task stream (extended lazily), each task rendered for the
    model (`taskdata.render`: chat template, token ids) with `renderer`. A task that cannot be rendered (too
    long for `actor.max_model_len`, chat messages without a template) is skipped, logged and counted. Only
    tasks at or after `forget_before`'s id are kept, so a long job holds the prompts still in play."""

    def __init__(self, cfg: BrorlConfig, renderer=None):
        from taskdata import train_tasks

        self._it: Iterator = train_tasks(cfg)
        self.renderer = renderer
        self._cache: dict[int, tuple[object, list[int]]] = {}
        self._next = 0  # id of the next task the iterator yields
        self.unrenderable = 0  # tasks skipped since the last take_stats
        self.give_up_after = 1000  # unrenderable tasks in a row that stop the learner (NothingRenders)

    def __getitem__(self, i: int):
        """(task, prompt token ids): ids are empty without a renderer (the engine tokenizes the text)."""
        while self._next <= i:
            self._cache[self._next] = self._render_next()
            self._next += 1
        if i not in self._cache:
            raise KeyError(f"task {i} was forgotten (no longer in play)")
        return self._cache[i]

    def _render_next(self) -> tuple[object, list[int]]:
        from taskdata import RenderError

        for _ in range(self.give_up_after):
            t = next(self._it)
            if self.renderer is None:
                return t, []
            try:
                return t, self.renderer.render(t).ids
            except RenderError as e:
                self.unrenderable += 1
                log.warning("task left out: %s", e)
                last = e
        raise NothingRenders(f"{self.give_up_after} tasks in a row could not be rendered; the last: {last}")

    def forget_before(self, i: int) -> None:
        for k in [k for k in self._cache if k < i]:
            del self._cache[k]

    def __len__(self) -> int:
        return len(self._cache)


class Dispatcher:
    def __init__(self, cfg: BrorlConfig, tasks: TaskStream | None = None):
        self.tasks = tasks if tasks is not None else TaskStream(cfg)  # (an empty stream is falsy: it has a len)
        self.next_id = 0
        self.requeue: collections.deque[int] = collections.deque()
        self.outstanding: dict[int, str] = {}  # granted, not yet answered: prompt id -> the actor holding it
        self.pending: set[int] = set()  # granted, not yet consumed (includes outstanding and buffered)
        self.B = cfg.job.prompts_per_step
        self.max_staleness = cfg.job.max_staleness
        self.keep_rate = 1.0  # kept groups / received groups, running estimate (dynamic sampling)
        self.ordered = cfg.run.reproducible
        self.wave_left = 0  # ordered: prompts of the current wave not yet granted

    @property
    def cursor(self) -> int:
        return self.next_id

    def allowed_pending(self, step: int, actor_version: int) -> int:
        """Prompts that may be pending for an actor at `actor_version` while the learner is at `step`."""
        steps_fresh = steps_left(step, actor_version, self.max_staleness)
        return max(0, math.ceil(steps_fresh * self.B / self.keep_rate))

    def observe_keep_rate(self, kept: int, received: int) -> None:
        if received > 0:
            self.keep_rate = min(1.0, max(0.25, 0.7 * self.keep_rate + 0.3 * kept / received))

    def grant(self, actor_id: str, credits: int, room: int, *, step: int | None = None,
              actor_version: int | None = None, settled: int = 0, kept: int = 0) -> list[wire.PromptItem]:
        """`settled`: pending prompts already dropped by dynamic sampling (committed with the next step);
        they will never be trained, so they do not count against the freshness bound. `kept`: groups of this
        step kept so far (the waves of `run.reproducible`)."""
        if self.ordered:
            return self._items(actor_id, self._wave(credits, step, actor_version, kept))
        n = min(credits, room)
        if step is not None and actor_version is not None:
            # prompts waiting in the requeue are pending but in nobody's hands: they take a place again
            # when re-granted, so they must not block their own re-grant (a deadlock once every pending
            # prompt had come back, e.g. from groups dropped as stale)
            in_play = len(self.pending) - len(self.requeue) - settled
            n = min(n, self.allowed_pending(step, actor_version) - in_play)
        return self._items(actor_id, max(0, n))

    def _wave(self, credits: int, step: int | None, actor_version: int | None, kept: int) -> int:
        """`run.reproducible`: prompts go out in waves. A wave starts only once the one before is answered,
        for an actor holding the current weights, and is as large as the step still needs, ceil((B − kept) /
        keep_rate): its size depends on what the run has seen, never on when the actor asked."""
        if (self.wave_left == 0 and not self.outstanding and step is not None and actor_version is not None
                and steps_left(step, actor_version, self.max_staleness) > 0):  # the actor's weights are fresh
            self.wave_left = max(0, math.ceil((self.B - kept) / self.keep_rate))
        n = min(credits, self.wave_left)
        self.wave_left -= n
        return n

    def wave_done(self) -> bool:
        """Every prompt of the current wave granted and answered."""
        return self.wave_left == 0 and not self.outstanding

    def _items(self, actor_id: str, n: int) -> list[wire.PromptItem]:
        items = []
        for _ in range(n):
            pid = self.requeue.popleft() if self.requeue else self._fresh()
            t, ids = self.tasks[pid]
            items.append(wire.PromptItem(pid, t.prompt, t.reference, t.verifier, t.task_id, ids, t.source))
            self.outstanding[pid] = actor_id
            self.pending.add(pid)
        return items

    def _fresh(self) -> int:
        pid = self.next_id
        self.next_id += 1
        return pid

    def claim(self, pid: int, actor_id: str) -> bool:
        """A group for `pid` arrived from `actor_id`: may it be used? Yes if that actor holds the prompt, or
        if the prompt came back and waits to be granted again (it is taken off the queue). No otherwise —
        the prompt was answered already, or now belongs to another actor — so no prompt is trained twice."""
        if self.outstanding.get(pid) == actor_id:
            del self.outstanding[pid]
            return True
        if pid in self.pending and pid not in self.outstanding and pid in self.requeue:
            self.requeue.remove(pid)
            return True
        return False

    def give_back(self, pids: list[int], actor_id: str | None = None) -> list[int]:
        """Prompts back to the queue (granted again first); with `actor_id`, only those that actor holds."""
        back = []
        for pid in pids:
            if pid not in self.pending or pid in self.requeue:
                continue
            if actor_id is not None and self.outstanding.get(pid) != actor_id:
                continue
            self.outstanding.pop(pid, None)
            self.requeue.append(pid)
            back.append(pid)
        return back

    def retire(self, actor_id: str) -> list[int]:
        """An actor is gone: every prompt it holds goes back to the queue; returns them."""
        return self.give_back([pid for pid, a in self.outstanding.items() if a == actor_id], actor_id)

    def commit(self, consumed: list[int]) -> None:
        for pid in consumed:
            self.pending.discard(pid)
            self.outstanding.pop(pid, None)
        forget = getattr(self.tasks, "forget_before", None)
        if forget is not None:
            forget(min(self.pending, default=self.next_id))

    def state(self) -> dict:
        return {"next_id": self.next_id, "pending": sorted(self.pending)}

    def load_state(self, st: dict) -> None:
        """What `state` saved: the prompts pending then wait in the queue, and stay pending (so a checkpoint
        taken before they are all granted again still holds them, and they count against freshness)."""
        self.next_id = int(st["next_id"])
        self.outstanding = {}
        self.requeue = collections.deque(sorted(int(p) for p in st["pending"]))
        self.pending = set(self.requeue)


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
                 wave_done: Callable[[], bool] | None = None):
        self.B = groups_per_step
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
                    return Batch(groups, self.take_stats())
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
        return Batch(groups, self.take_stats())

    def _reset(self) -> None:
        self.stats = {"generated": 0, "kept_samples": 0, "kept_groups": 0, "received_samples": 0, "tokens": 0,
                      "reward_sum": 0.0, "correct_sum": 0.0,
                      "drop_all_correct": 0, "drop_all_wrong": 0, "drop_unleased": 0, "groups_received": 0}
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
        n_correct = int(g.correct.sum())
        if self.dynamic_sampling and n_correct == g.n:
            s["drop_all_correct"] += 1
            self.consumed_ids.append(g.prompt_id)
        elif self.dynamic_sampling and n_correct == 0:
            s["drop_all_wrong"] += 1
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

    def take_stats(self) -> dict:
        s = self.stats
        gen = max(s["generated"], 1)
        out = {
            "generated": float(s["generated"]), "tokens": float(s["tokens"]),
            "rollout_reward": s["reward_sum"] / gen, "rollout_accuracy": s["correct_sum"] / gen,
            "pass_rate": s["kept_samples"] / gen, "drop_all_correct": float(s["drop_all_correct"]),
            "drop_all_wrong": float(s["drop_all_wrong"]), "drop_unleased": float(s["drop_unleased"]),
            "groups_received": float(s["groups_received"]),
            # mean N of the groups received (below N with adaptive rollouts), and the samples generated per
            # group kept: what a unit of training signal cost
            "samples_per_group": s["received_samples"] / max(s["groups_received"], 1),
            "samples_per_kept_group": s["generated"] / max(s["kept_groups"], 1),
            "consumed_ids": list(self.consumed_ids),
        }
        self._reset()
        return out
