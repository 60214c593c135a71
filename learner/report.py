"""One training step's report: where its wall time went and what it measured, written as one metrics row.

The loop calls `lap(phase)` after each phase (waiting for data, training, broadcasting); the time since the
previous lap is added to that phase, so a step's phases add up to its wall time, including rounds of the
loop that only brought a new member up to date. Throughput is computed here, once.
"""

from __future__ import annotations

import time

PHASES = ("wait_s", "train_s", "broadcast_s")


class StepReport:
    def __init__(self):
        self._t = time.monotonic()
        self.times = dict.fromkeys(PHASES, 0.0)
        self.values: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.times[phase] += now - self._t
        self._t = now

    def update(self, values: dict) -> None:
        """Add measurements; a later one of the same name replaces an earlier one."""
        self.values.update(values)

    def row(self) -> dict:
        """The metrics row: every value, the phase times, samples/s and tokens/s over the step's wall time."""
        wall = max(sum(self.times.values()), 1e-9)
        return {**self.values, **self.times,
                "samples_per_s": self.values.get("generated", 0.0) / wall,
                "tokens_per_s": self.values.get("tokens", 0.0) / wall}
