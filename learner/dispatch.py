"""Which prompts go out, to whom, and when they come back: the data cursor and its leases.

TaskStream  random access into the seeded train-task stream, each task rendered for the model.
Dispatcher  grants prompts within the freshness bound (each actor its share), holds each granted prompt
            as a lease of one actor, takes prompts back (handed back, refused, stale, expired, the actor
            gone) and grants them again first; its cursor and pending set are checkpoint state.
(How groups become batches: `learner.batching`, which re-exports both.)
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Iterator

from config.schema import BrorlConfig
from transport import wire
from transport.staleness import steps_left

log = logging.getLogger("brorl.learner")
LEASE_FLOOR_S = 30.0  # the automatic lease deadline is never shorter
LEASE_FACTOR = 3.0  # ... and is this many times the longest lease answered lately


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
        self.lease_timeout_s = cfg.learner.lease_timeout_s  # 0: automatic (`lease_deadline`)
        self.leased_at: dict[int, float] = {}  # outstanding prompt id -> when it was granted
        self.answered_in: collections.deque[float] = collections.deque(maxlen=256)  # recent leases' durations
        self.lapsed: dict[str, None] = {}  # actors whose lease expired since they last delivered a group
        self.held: collections.Counter[str] = collections.Counter()  # actor -> prompts it holds

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
              actor_version: int | None = None, settled: int = 0, kept: int = 0,
              actors: int = 1) -> list[wire.PromptItem]:
        """`settled`: pending prompts already dropped by dynamic sampling (committed with the next step);
        they will never be trained, so they do not count against the freshness bound. `kept`: groups of this
        step kept so far (the waves of `run.reproducible`). `actors`: the live actors, who share the bound:
        one holds at most ceil(bound / actors) prompts (one while its lease lapsed), so no actor key can
        hold every prompt the bound allows."""
        if self.ordered:
            return self._items(actor_id, self._wave(credits, step, actor_version, kept))
        n = min(credits, room)
        if step is not None and actor_version is not None:
            # prompts waiting in the requeue are pending but in nobody's hands: they take a place again
            # when re-granted, so they must not block their own re-grant (else a deadlock once every pending
            # prompt has come back, e.g. from groups dropped as stale)
            in_play = len(self.pending) - len(self.requeue) - settled
            bound = self.allowed_pending(step, actor_version)
            share = 1 if actor_id in self.lapsed else math.ceil(bound / max(1, actors))
            n = min(n, bound - in_play, share - self.held[actor_id])
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
            self.held[actor_id] += 1
            self.leased_at[pid] = time.monotonic()
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
            self.answered_in.append(time.monotonic() - self.leased_at.get(pid, time.monotonic()))
            self._release(pid)
            self.lapsed.pop(actor_id, None)
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
            self._release(pid)
            self.requeue.append(pid)
            back.append(pid)
        return back

    def retire(self, actor_id: str) -> list[int]:
        """An actor is gone: every prompt it holds goes back to the queue; returns them."""
        return self.give_back([pid for pid, a in self.outstanding.items() if a == actor_id], actor_id)

    def lease_deadline(self) -> float | None:
        """Seconds a lease may go unanswered: `learner.lease_timeout_s`, or when that is 0, LEASE_FACTOR × the
        longest of the last 256 leases answered (grant to group), at least LEASE_FLOOR_S — so it follows the
        job's own group times (large N, long completions, slow actors). None (no deadline) until a first
        lease is answered."""
        if self.lease_timeout_s > 0:
            return self.lease_timeout_s
        if not self.answered_in:
            return None
        return max(LEASE_FLOOR_S, LEASE_FACTOR * max(self.answered_in))

    def expire(self, now: float | None = None) -> dict[str, list[int]]:
        """Leases past their deadline go back to the queue (granted again first); their holders hold at most
        one prompt until they deliver a group. Returns them by holder."""
        deadline = self.lease_deadline()
        if deadline is None:
            return {}
        now = time.monotonic() if now is None else now
        late: dict[str, list[int]] = {}
        for pid, t in self.leased_at.items():
            if now - t > deadline and pid in self.outstanding:
                late.setdefault(self.outstanding[pid], []).append(pid)
        for actor, pids in late.items():
            self.give_back(pids, actor)
            self.lapsed[actor] = None
            while len(self.lapsed) > 4096:  # bounded, whatever ids come and go: the oldest is forgiven
                self.lapsed.pop(next(iter(self.lapsed)))
        return late

    def _release(self, pid: int) -> None:
        """`pid` is no longer anyone's lease."""
        self.leased_at.pop(pid, None)
        if (actor := self.outstanding.pop(pid, None)) is not None:
            self.held[actor] -= 1
            if self.held[actor] <= 0:
                del self.held[actor]

    def commit(self, consumed: list[int]) -> None:
        for pid in consumed:
            self.pending.discard(pid)
            self._release(pid)
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
        self.leased_at = {}
        self.held.clear()
        self.requeue = collections.deque(sorted(int(p) for p in st["pending"]))
        self.pending = set(self.requeue)
