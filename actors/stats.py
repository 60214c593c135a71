"""An actor's counters (reported in its heartbeat) and the engine-load gauge they are measured with."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field


class EngineGauge:
    """How full the engine was, engine step by engine step: vLLM hands each step's scheduler stats to this
    (`actors.engine.make_async_engine(cfg, gauge)` registers it as a stat logger), and it sums the sequences
    running, those waiting and the KV cache's use. Their mean over the steps of a stretch is the difference of
    two readings over the steps between: whether the loop gives the engine as much work at once as a raw
    run of it has (issue: the whole loop at the speed of its engines)."""

    def __init__(self) -> None:
        self.steps = 0
        self.running = 0
        self.waiting = 0
        self.kv_use = 0.0
        self.max_running = 0
        self.prefill_steps = 0
        self.gen_tokens = 0
        self.timeline: list[tuple[float, int, int]] | None = None
        """Set to a list to keep (time, running sequences, tokens generated) per engine step (`full_rate`)."""

    def record(self, scheduler_stats, iteration_stats=None) -> None:
        """One engine step's `vllm.v1.metrics.stats.SchedulerStats` (None: a batch of outputs without stats)
        and, where vLLM passes it, its `IterationStats`: the tokens the step generated, and whether a prompt
        finished its prefill in it (a step that mixes prefill with decoding runs slower than a pure decode step)."""
        if scheduler_stats is None:
            return
        self.steps += 1
        self.running += scheduler_stats.num_running_reqs
        self.waiting += scheduler_stats.num_waiting_reqs
        self.kv_use += scheduler_stats.kv_cache_usage
        self.max_running = max(self.max_running, scheduler_stats.num_running_reqs)
        gen = getattr(iteration_stats, "num_generation_tokens", 0) if iteration_stats is not None else 0
        if iteration_stats is not None:
            self.prefill_steps += getattr(iteration_stats, "num_prompt_tokens", 0) > 0
            self.gen_tokens += gen
        if self.timeline is not None:
            self.timeline.append((time.monotonic(), scheduler_stats.num_running_reqs, gen))

    def counters(self) -> dict[str, float]:
        """Cumulative: engine steps; the sums over them of running sequences, waiting ones, KV-cache use and
        generated tokens; the steps in which a prompt was prefilled."""
        return {"engine_steps": self.steps, "running_seqs": self.running, "waiting_seqs": self.waiting,
                "kv_use": self.kv_use, "prefill_steps": self.prefill_steps, "gen_tokens": self.gen_tokens}

    @staticmethod
    def means(before: dict, after: dict, prefix: str = "") -> dict[str, float]:
        """Per-step means between two readings of `counters()` (keys with `prefix`, e.g. the learner's
        `actor_`): running and waiting sequences, KV-cache use (0–1), the share of steps with a prefill and
        the tokens generated per step; 0 where no step ran."""
        steps = after.get(f"{prefix}engine_steps", 0) - before.get(f"{prefix}engine_steps", 0)
        return {f"mean_{k}": (after.get(f"{prefix}{k}", 0) - before.get(f"{prefix}{k}", 0)) / steps if steps else 0.0
                for k in GAUGED}


def full_rate(timeline: list[tuple[float, int, int]], frac: float = 0.9) -> dict[str, float]:
    """The engine's rate while it was full, from a `timeline` of (time, running sequences, tokens generated) per
    step: over the steps from the first to the last that ran at least `frac` of the most sequences it ever ran
    at once. A batch handed to an engine at once ends in a drain to its longest completion, with ever fewer
    sequences running; its overall rate counts that tail, the full rate does not."""
    if len(timeline) < 2:
        return {"full_tokens_per_s": 0.0, "full_s": 0.0, "full_running_seqs": 0.0}
    top = max(r for _, r, _ in timeline)
    full = [i for i, (_, r, _) in enumerate(timeline) if r >= frac * top]
    a, b = full[0], full[-1]
    secs = timeline[b][0] - timeline[a][0]
    window = timeline[a + 1: b + 1]  # each step's tokens came in the time since the step before
    return {"full_tokens_per_s": sum(g for _, _, g in window) / secs if secs > 0 else 0.0, "full_s": secs,
            "full_running_seqs": sum(r for _, r, _ in window) / len(window) if window else 0.0}


GAUGED = ("running_seqs", "waiting_seqs", "kv_use", "prefill_steps", "gen_tokens")
"""The gauge's per-step sums (`EngineGauge.counters`, besides the step count): their means are `mean_<name>`."""


@dataclass
class ActorStats:
    groups_sent: int = 0
    samples: int = 0
    tokens: int = 0
    aborted: int = 0
    updates: int = 0
    idle_weight_s: float = 0.0
    """Seconds the engine had nothing to do because of weights: loading an update (after in-flight work
    finished) or gated by max_staleness while waiting for the next one."""
    update_s: float = 0.0
    """Seconds spent receiving and loading weight updates."""
    score_s: float = 0.0
    """Seconds groups spent in the verifier pool (overlaps generation: other requests run meanwhile)."""
    kept_updates: int = 0
    """Updates applied with requests kept in flight (`actor.in_flight_on_update = "keep"`)."""
    aborted_stale: int = 0
    """Requests aborted at an update because it would have left them more than max_staleness behind."""
    engine_restarts: int = 0
    capped_waves: int = 0
    """Second waves not started because they would have passed `job.step_sample_budget` (the prompt's first
    wave was sent as its group)."""
    rejected: int = 0
    """Groups the learner rejected (NACKed with a reason): dropped, never re-sent."""
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=100))
    """The latest errors worth keeping (bounded: a long job with a flaky verifier must not grow without end)."""

    gauge: EngineGauge = field(default_factory=EngineGauge)
    """What the engine ran, step by step (vLLM's scheduler stats)."""

    def heartbeat(self, idle_s: float, held_s: float = 0.0) -> dict[str, float]:
        """The counters a heartbeat carries (`wire.Heartbeat.stats`)."""
        return {**self.gauge.counters(), "samples": self.samples, "tokens": self.tokens, "groups_sent": self.groups_sent,
                "aborted": self.aborted, "updates": self.updates, "engine_restarts": self.engine_restarts,
                "rejected_groups": self.rejected, "idle_s": idle_s, "idle_weight_s": self.idle_weight_s,
                "kept_updates": self.kept_updates, "aborted_stale": self.aborted_stale, "capped_waves": self.capped_waves,
                "update_s": self.update_s, "score_s": self.score_s, "held_s": held_s}


class WaveBudget:
    """An actor's samples under the current weight version against `job.step_sample_budget` (0: none): every
    wave is charged when it starts; a second wave starts only if it fits. A new version starts a new count."""

    def __init__(self, cap: int) -> None:
        self.cap, self.version, self.used = cap, None, 0

    def _at(self, version: int) -> None:
        if version != self.version:
            self.version, self.used = version, 0

    def charge(self, version: int, n: int) -> None:
        self._at(version)
        self.used += n

    def fits(self, version: int, n: int) -> bool:
        self._at(version)
        return not self.cap or self.used + n <= self.cap


class EngineLoad:
    """How many generate() calls are running, an event set while none is, and from `start_clock()` on the
    engine's idle seconds (no request at all, any reason) and held seconds (paused for the learner's compute,
    `actor.share_gpu = "timeshare"`, requests or not): the two never overlap."""

    def __init__(self):
        self.generating = 0
        self.held = False
        self.idle = asyncio.Event()
        self.idle.set()
        self._idle_s = 0.0
        self._held_s = 0.0
        self._since: float | None = None  # start of the current stretch; None: the clock has not started

    def _count(self) -> None:
        """The stretch since the last change, to the seconds of the state it was in."""
        if self._since is None:
            return
        now = time.monotonic()
        if self.held:
            self._held_s += now - self._since
        elif self.generating == 0:
            self._idle_s += now - self._since
        self._since = now

    def start_clock(self) -> None:
        self._since = time.monotonic()

    def begin(self) -> None:
        self._count()
        self.generating += 1
        self.idle.clear()

    def end(self) -> None:
        self._count()
        self.generating -= 1
        if self.generating == 0:
            self.idle.set()

    def hold(self, on: bool) -> None:
        """The engine is paused for the learner's compute (`on`), or no longer."""
        self._count()
        self.held = on

    def idle_s(self) -> float:
        """Idle seconds so far, the current idle stretch included."""
        self._count()
        return self._idle_s

    def held_s(self) -> float:
        """Held seconds so far, the current stretch included."""
        self._count()
        return self._held_s
