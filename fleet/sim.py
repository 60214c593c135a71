"""A discrete-event model of one brorl job: actors, the learner, grants, admission and weight updates.

What is modelled (one event queue, simulated seconds):
  - Actors (engines). A group of N completions starts when the learner grants its prompt; its N lengths
    are drawn (log-normal around `mean_tokens`, capped at `max_tokens`). An engine's decode throughput
    grows with the sequences it holds, R(S) = `gen_tokens_per_s` · S / (S + `gen_half_seqs`), shared
    equally, so a group lasts (its longest completion) / (R(S) / S), S taken when it starts. Then it is
    scored and sent. An actor asks for work while it has room (`prompts_per_request` of its
    2 × `prompts_per_request` credits free) and its weights are at most K versions behind.
  - The learner. Arriving groups go through the learner's own rules (`learner.batching`): the lease
    (`Dispatcher.claim`), dynamic sampling (each kept with probability `keep_rate`; with adaptive
    rollouts a share `settled_first` of the prompts stop after their first wave and are dropped, the others
    take both waves one after the other and are kept; the dispatcher's running keep rate follows), admission by staleness (`Admission.admit`, `check_batch`), and grants
    bounded by freshness (`Dispatcher.grant`). With B kept groups it trains (`train_s_per_token` per token
    on one GPU, divided over `learner_gpus` at `scale_efficiency` per doubling, plus `train_s_fixed`),
    then broadcasts: under "finish" every member first drains what it has in flight (stops admitting, its
    groups finish under the old weights); under "keep" it pauses at once. The transfer takes
    `sync_s_fixed` + `sync_s_per_gb` × `model_gb` + `sync_s_per_member` × members, then each member
    loads (`load_s`) and goes on.
  - Shared cores (`contention` > 0, roles on one host, as in our CPU validation): while the learner trains
    and an actor generates, both go `1 + contention` times slower (running groups and the step are
    re-timed whenever that changes). Roles on their own GPUs: 0.
  - Failures: each actor fails after an exponential time of mean `mtbf_s`; its prompts go back to the
    queue (`Dispatcher.retire`), it leaves the weight group, and returns `restart_s` later with the
    current weights (one transfer and load).

Not modelled: the network (groups arrive when scored), the per-token version mix of kept requests (a
group's staleness is its start version's), prefill, and speed changes of a running group when other
groups start or end on its engine.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from types import SimpleNamespace

import numpy as np

from fleet.model import Fleet, Result
from fleet.parts import Actor, Group, Tasks
from learner.batching import Admission, Dispatcher
from transport.staleness import fresh, staleness


class Sim:
    STALL_S = 36_000.0  # no step for this long (simulated): the model is stuck, which is an error

    def __init__(self, fleet: Fleet):
        self.f, self.r = fleet, fleet.rates
        self.rng = random.Random(fleet.seed)
        cfg = SimpleNamespace(job=SimpleNamespace(prompts_per_step=fleet.prompts_per_step, max_staleness=fleet.max_staleness),
                              run=SimpleNamespace(reproducible=False), learner=SimpleNamespace(lease_timeout_s=0.0))
        self.dispatcher = Dispatcher(cfg, tasks=Tasks())
        self.admission = Admission(fleet.max_staleness)
        self.actors = [Actor() for _ in range(fleet.actors)]
        self.events: list = []
        self._seq = itertools.count()
        self._gid = itertools.count()
        self.now = 0.0
        self.version = 0
        self.kept: list[Group] = []
        self.settled: list[int] = []  # prompts dropped by dynamic sampling, committed with the next step
        self.training = self.updating = False
        self.ready: set[int] = set()  # members ready for the announced update
        self.wait_s, self._wait_since = 0.0, 0.0
        self.generated = self.trained = 0
        self.staleness: Counter[int] = Counter()
        self.lags: list[int] = []
        self.failures = 0
        self.received = 0  # groups received since the last step (the keep-rate estimate)
        self.hungry: set[int] = set()  # actors that asked and got nothing
        self.train_total = self.sync_total = 0.0
        self._phase_start = 0.0
        self._sending = False
        self._slow = (1.0, 1.0)  # (learner, actors): how much longer work takes now (shared cores)
        self._train = [0.0, 0, []]  # the step under way: [end, token, prompts consumed]

    # ------------------------------------------------------------------ the event queue
    def at(self, t: float, fn, *args) -> None:
        heapq.heappush(self.events, (t, next(self._seq), fn, args))

    def run(self) -> Result:
        for i in range(self.f.actors):
            self.at(0.0, self.request, i)
            if math.isfinite(self.f.mtbf_s):
                self.at(self.rng.expovariate(1 / self.f.mtbf_s), self.fail, i)
        progress = (0, 0.0)  # (version, when it was reached)
        while self.events and self.version < self.f.steps:
            self.now, _, fn, args = heapq.heappop(self.events)
            fn(*args)
            if self.version != progress[0]:
                progress = (self.version, self.now)
            elif self.now - progress[1] > self.STALL_S:
                self._stalled(f"no step for {self.STALL_S:.0f} simulated s")
        if self.version < self.f.steps:
            self._stalled("nothing left to happen")
        for a in self.actors:
            self._busy(a)
        total = max(self.now, 1e-9)
        hist_n = sum(self.staleness.values()) or 1
        return Result(
            samples_per_s=self.generated / total, trained_samples_per_s=self.trained / total,
            learner_wait_share=self.wait_s / total,
            actor_idle_share=sum(a.idle_s for a in self.actors) / (total * len(self.actors)),
            staleness_mean=sum(k * v for k, v in self.staleness.items()) / hist_n,
            staleness_hist={str(k): v / hist_n for k, v in sorted(self.staleness.items())},
            lag_mean=float(np.mean(self.lags)) if self.lags else 0.0, learner_train_share=self.train_total / total,
            learner_sync_share=self.sync_total / total, steps=self.version, sim_s=self.now,
            failures=self.failures)

    def _stalled(self, why: str) -> None:
        raise RuntimeError(f"the simulated job stalled at step {self.version} ({why}): kept {len(self.kept)}, "
                           f"pending {len(self.dispatcher.pending)}, actors "
                           f"{[(a.version, a.up, len(a.inflight)) for a in self.actors]}")

    # ------------------------------------------------------------------ actors
    def _busy(self, a: Actor) -> None:
        if a.idle_since is not None:
            a.idle_s += self.now - a.idle_since
            a.idle_since = None

    def _maybe_idle(self, a: Actor) -> None:
        if not a.inflight and a.idle_since is None:
            a.idle_since = self.now

    def _may_admit(self, a: Actor) -> bool:
        return a.up and not a.draining and fresh(self.version, a.version, self.f.max_staleness)

    def request(self, i: int) -> None:
        a = self.actors[i]
        a.waiting = False
        credits = 2 * self.f.prompts_per_request - len(a.inflight)
        if not self._may_admit(a) or credits < self.f.prompts_per_request:
            return  # asked again when a group ends or weights arrive
        room = max(0, 2 * self.f.prompts_per_step - len(self.kept))
        items = self.dispatcher.grant(str(i), credits, room, step=self.version, actor_version=a.version,
                                      settled=len(self.settled))
        for item in items:
            self._start(i, item.prompt_id)
        if not items:  # asked again when the learner's bounds move (a step, prompts back in the queue)
            a.waiting = True
            self.hungry.add(i)

    def _wake(self) -> None:
        """Grants may be possible again: every actor that got nothing asks again (the real ones poll)."""
        hungry, self.hungry = self.hungry, set()
        for i in sorted(hungry):
            self.at(self.now, self.request, i)

    def _lengths(self) -> list[int]:
        f = self.f
        if f.lengths not in ("completion", "prompt"):
            raise ValueError(f"Fleet.lengths = {f.lengths!r}: expected 'completion' or 'prompt'")
        out = []
        for _ in range(f.n if f.lengths == "completion" else 1):
            x = f.mean_tokens * (math.exp(self.rng.gauss(0, f.length_sigma)) if f.length_sigma > 0 else 1.0)
            out.append(max(1, min(f.max_tokens or math.inf, round(x))))
        return out if f.lengths == "completion" else out * f.n

    def _start(self, i: int, pid: int) -> None:
        a, f = self.actors[i], self.f
        self._busy(a)
        lengths, settled, rest = self._lengths(), None, []
        if f.first_wave:  # adaptive: a first wave; a settled one stops, a mixed one is followed by the rest of N
            settled = self.rng.random() < f.settled_first
            lengths, rest = lengths[:f.first_wave], ([] if settled else lengths[f.first_wave:])
        g = Group(next(self._gid), pid, i, a.version, len(lengths), sum(lengths), settled=settled, rest=rest)
        self.lags.append(self.version - a.version)
        self._generate(a, i, g, lengths)

    def _generate(self, a, i: int, g: Group, lengths: list[int]) -> None:
        """A request of `lengths` for group g on actor i's engine: it lasts its longest completion at the
        per-sequence rate of the sequences the engine then holds."""
        seqs = sum(e[1].n for e in a.inflight.values() if e[1] is not g) + len(lengths)
        per_seq = self.r.gen_tokens_per_s / (seqs + self.r.gen_half_seqs)  # R(S) / S
        end = self.now + max(lengths) / per_seq * self._slow[1]
        a.inflight[g.gid] = [end, g]
        self.at(end, self.group_done, i, g.gid)
        self._contend()

    def group_done(self, i: int, gid: int) -> None:
        a = self.actors[i]
        entry = a.inflight.get(gid)
        if entry is None or entry[0] > self.now + 1e-12:
            return  # lost in a failure, or postponed by a pause (a later event is queued)
        g = entry[1]
        if g.rest:  # adaptive: the first wave was mixed, the rest of N follows on the same engine
            rest, g.rest = g.rest, []
            g.n, g.n_tokens = g.n + len(rest), g.n_tokens + sum(rest)
            self._generate(a, i, g, rest)
            return
        del a.inflight[gid]
        self._contend()
        self.generated += entry[1].n
        self.at(self.now + self.r.score_s_per_group, self.arrive, entry[1])
        self._maybe_idle(a)
        if a.draining and not a.inflight and self.updating:
            self._member_ready(i)
        if not a.waiting:
            self.request(i)

    def fail(self, i: int) -> None:
        a = self.actors[i]
        if not a.up:
            return
        self.failures += 1
        a.up, a.draining = False, False
        a.inflight.clear()
        self._contend()
        self._maybe_idle(a)
        self.dispatcher.retire(str(i))
        self._wake()
        if self.updating:
            self.ready.discard(i)
            self._maybe_transfer()
        self.at(self.now + self.f.restart_s, self.restart, i)

    def restart(self, i: int) -> None:
        a, r = self.actors[i], self.r
        a.version = -1  # gets the current weights before it takes work
        self.at(self.now + self._transfer_s(1) + r.load_s, self._rejoined, i)

    def _rejoined(self, i: int) -> None:
        a = self.actors[i]
        a.up, a.version, a.draining = True, self.version, self.updating
        if self.updating:
            self._member_ready(i)
        self.at(self.now, self.request, i)
        if math.isfinite(self.f.mtbf_s):
            self.at(self.now + self.rng.expovariate(1 / self.f.mtbf_s), self.fail, i)

    # ------------------------------------------------------------------ the learner
    def arrive(self, g: Group) -> None:
        d = self.dispatcher
        if not d.claim(g.pid, str(g.actor)):
            return  # its lease went elsewhere (the actor failed): generated, never trained
        kept = not g.settled if g.settled is not None else self.rng.random() < self.f.keep_rate
        self.received += 1
        if not kept:
            self.settled.append(g.pid)
            self._wake()  # no longer in play: the freshness bound has room again
        elif not self.admission.admit(g, self.version):
            d.give_back([g.pid])
            self._wake()
        else:
            self.kept.append(g)
        self._try_train()

    def _try_train(self) -> None:
        B = self.f.prompts_per_step
        if self.training or self.updating:
            return
        while True:  # B groups that are still fresh at this step, or wait for more
            if len(self.kept) < B:
                return
            keep, stale = self.admission.check_batch(self.kept[:B], self.version)
            self.dispatcher.give_back([g.pid for g in stale])
            self.kept = keep + self.kept[B:]
            if len(keep) == B:
                self.kept = self.kept[B:]
                break
        self.wait_s += self.now - self._wait_since
        self.dispatcher.observe_keep_rate(len(keep), self.received)  # as the service does, once a step
        self.received = 0
        self.training = True
        r, f = self.r, self.f
        gpus = max(1, f.learner_gpus)
        speedup = gpus * r.scale_efficiency ** math.log2(gpus)
        tokens = sum(g.n_tokens for g in keep)
        s = tokens * r.train_s_per_token / speedup + r.train_s_fixed
        if r.train_s_spread:
            s *= self.rng.choice(r.train_s_spread)
        for g in keep:
            self.staleness[staleness(self.version, g.policy_version)] += g.n
        self.trained += sum(g.n for g in keep)
        consumed = [g.pid for g in keep] + self.settled
        self.settled = []
        self._phase_start = self.now
        self._train = [self.now + s * self._slow[0], self._train[1] + 1, consumed]
        self.at(self._train[0], self.trained_step, self._train[1])
        self._contend()  # the actors slow down while it trains (shared cores), and it with them
        self._wake()  # room in the batcher again

    def _contend(self) -> None:
        """Shared cores: re-time the step and the running groups when who slows whom changes."""
        c = self.r.contention
        if c <= 0:
            return
        busy = any(a.inflight for a in self.actors if a.up)
        slow = (1.0 + c if busy else 1.0, 1.0 + c if self.training else 1.0)
        old, self._slow = self._slow, slow
        if self.training and slow[0] != old[0]:
            self._train[0] = self.now + (self._train[0] - self.now) * slow[0] / old[0]
            self._train[1] += 1
            self.at(self._train[0], self.trained_step, self._train[1])
        if slow[1] != old[1]:
            for i, a in enumerate(self.actors):
                for gid, entry in a.inflight.items():
                    entry[0] = self.now + (entry[0] - self.now) * slow[1] / old[1]
                    self.at(entry[0], self.group_done, i, gid)

    def trained_step(self, token: int) -> None:
        if token != self._train[1]:
            return  # re-timed: a later event ends the step
        consumed = self._train[2]
        self.train_total += self.now - self._phase_start
        self._phase_start = self.now
        self.dispatcher.commit(consumed)
        self._wake()
        self.training, self.updating = False, True
        self._contend()
        self.version += 1
        self.ready = set()
        for i, a in enumerate(self.actors):
            if not a.up:
                continue
            a.draining = True
            if self.f.in_flight == "keep":  # requests this update leaves too far behind are aborted
                stale = [gid for gid, (_, g) in a.inflight.items()
                         if not fresh(self.version, g.policy_version, self.f.max_staleness)]
                for gid in stale:
                    self.dispatcher.give_back([a.inflight.pop(gid)[1].pid])
                    self._wake()
                self._maybe_idle(a)
            if self.f.in_flight == "keep" or not a.inflight:
                self._member_ready(i)
        self._contend()  # the aborted requests no longer load the shared cores
        self._maybe_transfer()

    def _member_ready(self, i: int) -> None:
        self.ready.add(i)
        self._maybe_transfer()

    def _maybe_transfer(self) -> None:
        members = [i for i, a in enumerate(self.actors) if a.up]
        if not self.updating or any(i not in self.ready for i in members) or self._sending:
            return
        self._sending = True
        transfer = self._transfer_s(len(members))
        self.at(self.now + transfer, self._transferred, members, transfer)

    def _transfer_s(self, members: int) -> float:
        r = self.r
        return r.sync_s_fixed + r.sync_s_per_gb * self.f.model_gb + r.sync_s_per_member * members

    def _transferred(self, members: list[int], transfer: float) -> None:
        self._sending = False
        self.updating = False
        self._wait_since = self.now
        self.sync_total += self.now - self._phase_start
        for i in members:
            a = self.actors[i]
            if not a.up:
                continue
            pause = self.r.load_s + transfer  # kept requests were frozen from the announcement on
            for gid, entry in a.inflight.items():  # kept requests wait out the pause
                entry[0] += pause
                self.at(entry[0], self.group_done, i, gid)
            self.at(self.now + self.r.load_s, self._loaded, i)
        self._try_train()

    def _loaded(self, i: int) -> None:
        a = self.actors[i]
        if not a.up:
            return
        a.version, a.draining = self.version, False
        if not a.waiting:
            self.request(i)


def simulate(fleet: Fleet) -> Result:
    return Sim(fleet).run()
