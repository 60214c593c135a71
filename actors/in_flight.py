"""New weights while requests are in flight (`actor.in_flight_on_update`), and the version of every token.

    finish  no new prompt starts; the requests in flight finish under the old weights; then the update.
    abort   the requests in flight are aborted (their prompts go back to the learner); then the update.
    keep    the engine is paused with its requests frozen (vLLM `pause_generation(mode="keep",
            clear_cache=False)`), the weights are loaded, generation resumes: no GPU waits for the
            slowest sequence of a step. A request the update would leave more than `max_staleness`
            versions behind is aborted first (the learner would drop its group).

Pausing goes through `actors.timeshare.EngineGate`, which the learner's hold (`actor.share_gpu =
"timeshare"`) shares: a step's hold passes into that step's update and ends when its weights are in.

Under "keep" a completion can be sampled by several versions. Just before new weights load (the engine
paused), the workers report how many tokens each request holds (`WeightReceiver.output_counts`): exactly
the tokens the outgoing weights sampled. `TokenVersions` turns these marks into each token's version,
sent with the group (`RolloutGroup.versions`); the behaviour log-prob μ of each token is the one its
sampler used, so the truncated importance weight stays exact. The KV of a kept sequence's earlier tokens
stays as the older weights computed it (as in PipelineRL); the learner's π_old recomputes the whole
sequence under its weights, and the TIS weight π_old/μ accounts for the difference.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable

import numpy as np

from actors.timeshare import EngineGate
from transport.staleness import fresh
from transport.weights import WeightReceiver

log = logging.getLogger("brorl.actor")
_CHILD = re.compile(r"^(\d+)_(.+)$")  # vLLM's id of completion i of a request with n > 1: "<i>_<parent id>"


def by_request(counts: dict[str, int], rids) -> dict[str, dict[int, int]]:
    """Tokens per completion index of each of our requests `rids`, from the engine's request ids (vLLM
    makes them "<rid>" or "<rid>-<suffix>", and "<i>_<that>" for completion i when n > 1). One pass."""
    out: dict[str, dict[int, int]] = {}
    for key, n in counts.items():
        m = _CHILD.match(key)
        index, base = (int(m.group(1)), m.group(2)) if m else (0, key)
        rid = base if base in rids else base.rsplit("-", 1)[0]
        if rid in rids:
            out.setdefault(rid, {})[index] = n
    return out


class TokenVersions:
    """Per request in flight: the version it started under and, at each update it lived through, how many
    tokens each of its completions held (the marks)."""

    def __init__(self) -> None:
        self._start: dict[str, int] = {}
        self._marks: dict[str, list[tuple[int, dict[int, int | None]]]] = {}

    def begin(self, rid: str, version: int) -> None:
        self._start[rid], self._marks[rid] = version, []

    def started(self, rid: str) -> int | None:
        return self._start.get(rid)

    def too_stale(self, target: int, max_staleness: int) -> list[str]:
        """Requests that would hold tokens more than `max_staleness` versions older than `target`."""
        return [rid for rid, v in self._start.items() if not fresh(target, v, max_staleness)]

    def mark(self, version: int, counts: dict[str, int]) -> None:
        """Weights of `version` are about to replace the current ones; `counts` from the engine (every request
        its workers held since the last mark, those that finished included). A completion never reported
        has not started: 0 tokens, all of its tokens are newer. One reported before and missing now gives no
        boundary here (None): what it sampled after its last reported count is labelled with the version of
        that report, the oldest it can be, never newer than it is (if it had finished, there is none)."""
        mine = by_request(counts, self._marks.keys())
        for rid, marks in self._marks.items():
            now = mine.get(rid, {})
            seen = {i for _, at in marks for i in at}
            marks.append((version, {**dict.fromkeys(seen - set(now)), **now}))

    def end(self, rid: str, lengths: np.ndarray, indices: list[int] | None = None) -> np.ndarray:
        """The request is done: uint8 per token, its version as an offset from the start version (empty when
        no update happened during it). `lengths[j]`: completion j's, whose engine index is `indices[j]`."""
        start, marks = self._start.pop(rid, 0), self._marks.pop(rid, [])
        if not marks:
            return np.zeros(0, np.uint8)
        out = np.zeros(int(lengths.sum()), np.uint8)
        pos = 0
        for j, n in enumerate(lengths.tolist()):
            i = indices[j] if indices is not None else j
            for version, at in marks:  # tokens from the mark on were sampled by `version` (or later)
                if (count := at.get(i, 0)) is not None:  # None: not reported at this mark, no boundary known
                    out[pos + min(count, n):pos + n] = version - start
            pos += n
        return out

    def forget(self, rid: str) -> None:
        self._start.pop(rid, None)
        self._marks.pop(rid, None)


class InFlightPolicy:
    """`actor.in_flight_on_update`: how an announced weight update meets the requests in flight (keep them with
    per-token versions, let them finish first, or abort them), and applying the update to the engine so."""

    def __init__(self, cfg, supervisor, sync, load, stats, versions: TokenVersions, on_error: Callable[[str], Any],
                 gate: EngineGate | None = None):
        self.mode = cfg.actor.in_flight_on_update
        self.max_staleness = cfg.job.max_staleness
        self.supervisor, self.sync, self.load, self.stats = supervisor, sync, load, stats
        self.versions, self.on_error = versions, on_error
        self.gate = gate or EngineGate(lambda: supervisor.engine, load)  # pauses: updates, the learner's compute
        self.timeshare = cfg.actor.share_gpu == "timeshare"

    async def track(self, engine) -> None:
        """With in-flight updates the engine counts each request's tokens (their versions); a vLLM that
        cannot (or cannot pause keeping requests) falls back to "finish", loudly. A new engine is not paused."""
        self.gate.reset()
        if self.mode == "keep" and not (hasattr(engine, "pause_generation")
                                        and await WeightReceiver(engine).track_requests()):
            self.mode = "finish"
            self.on_error("actor.in_flight_on_update = \"keep\" is not possible with this vLLM (no pause keeping "
                          "requests, or no per-request token counts in its model runner; vLLM's V2 GPU model runner "
                          "has none: VLLM_USE_V2_MODEL_RUNNER=0): falling back to \"finish\"")

    async def learner_computes(self, step: int) -> None:
        """`actor.share_gpu = "timeshare"`: the learner computes `step` (0: nothing, it waits for groups), so the
        engine pauses, requests kept, until that step's weights are in or the learner says it is done."""
        if not self.timeshare:
            return
        try:
            if step:
                await self.gate.hold("learner", step)
            else:
                await self.gate.release("learner")
        except Exception as e:  # a dead engine is the supervisor's (a rebuilt one is not paused)
            if not self.supervisor.check(e):
                self.on_error(f"engine pause/resume for the learner's step {step} failed: {type(e).__name__}: {e}")

    async def apply(self, target: int, inflight: dict[str, Any]) -> None:
        engine = self.supervisor.engine
        t0 = time.monotonic()
        self.sync.begin_update()  # from here no new generation starts
        keep = self.mode == "keep" and self.load.generating > 0
        if not keep:  # the learner's hold (timeshare) ends: what is in flight finishes or is aborted running
            await _quietly(self.gate.release("learner"))
        if self.mode == "abort" and inflight:
            await engine.abort(list(inflight))
        if keep:
            stale = [r for r in self.versions.too_stale(target, self.max_staleness) if r in inflight]
            if stale:  # their groups would be dropped as too stale: give the prompts back now
                await engine.abort(stale)
                self.stats.aborted_stale += len(stale)
            await self.gate.hold("update")  # already paused if the learner holds it (timeshare): stays so
        else:
            await self.load.idle.wait()  # in-flight generation finished (or aborted)
        t_idle = time.monotonic()  # from here the engine has nothing to do until the weights are in
        try:
            counts = await self.sync.receiver.output_counts() if keep else {}
            await self.sync.receive(target)
        except Exception as e:  # the learner's side failed or timed out: wait for a new rendezvous
            self.supervisor.check(e)
            self.on_error(self.sync.error or f"weight update to version {target} failed: {e}")
            if keep and inflight:  # what is frozen would go on under weights now unknown
                await _quietly(engine.abort(list(inflight)))
        else:
            if keep:
                self.versions.mark(self.sync.version, counts)
                self.stats.kept_updates += 1
            else:
                await engine.reset_prefix_cache()
            await _quietly(self.gate.release("learner", upto=self.sync.version))  # that step's weights are in
        finally:
            if keep:
                await _quietly(self.gate.release("update"))
        self.stats.updates += 1
        self.stats.idle_weight_s += time.monotonic() - t_idle
        self.stats.update_s += time.monotonic() - t0


async def _quietly(coro) -> None:
    """An engine call on the way out of a failed update: a dead engine is the supervisor's to notice."""
    try:
        await coro
    except Exception as e:
        log.warning("engine call after a failed weight update: %s", e)
