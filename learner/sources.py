"""Rollouts per data source, per step: what a job's data mix does while it trains.

For every data source (a file's `data_source`; a generator's verifier) over the groups received since the
last step: `rollout_reward/<source>`, `rollout_accuracy/<source>`, `kept/<source>` (the share of its
samples dynamic sampling kept), `truncated/<source>` (cut at `actor.max_tokens`), `samples/<source>`; and
for sources scored by the code verifier `programs_run/`, `programs_passed/` (every test) and
`programs_timed_out/<source>` (a test hit its time limit), read from the verifier's reasons.
"""

from __future__ import annotations

from transport import wire

_LENGTH = wire.FINISH_REASONS.index("length")
_KEYS = ("samples", "reward", "correct", "kept", "truncated", "code", "programs", "passed", "timed_out")


class SourceStats:
    def __init__(self):
        self.by_source: dict[str, dict[str, float]] = {}

    def add(self, g: wire.RolloutGroup, source: str, kept: bool) -> None:
        c = self.by_source.setdefault(source or g.verifier, dict.fromkeys(_KEYS, 0.0))
        c["samples"] += g.n
        c["reward"] += float(g.rewards.sum())
        c["correct"] += float(g.correct.sum())
        c["kept"] += g.n if kept else 0
        c["truncated"] += float((g.finish == _LENGTH).sum())
        if g.verifier == "code":  # a completion without a program, or that the verifier failed on, ran nothing
            c["code"] = 1.0
            ran = [r for r in g.reasons if r != "no program" and not r.startswith("error")]
            c["programs"] += len(ran)
            c["passed"] += sum(r == "all tests passed" for r in ran)
            c["timed_out"] += sum("timeout" in r for r in ran)

    def take(self) -> dict[str, float]:
        """The metrics since the last `take`, and start afresh."""
        out: dict[str, float] = {}
        for name, c in sorted(self.by_source.items()):
            n = max(c["samples"], 1.0)
            out |= {f"rollout_reward/{name}": c["reward"] / n, f"rollout_accuracy/{name}": c["correct"] / n,
                    f"kept/{name}": c["kept"] / n, f"truncated/{name}": c["truncated"] / n,
                    f"samples/{name}": c["samples"]}
            if c["code"]:
                out |= {f"programs_run/{name}": c["programs"], f"programs_passed/{name}": c["passed"],
                        f"programs_timed_out/{name}": c["timed_out"]}
        self.by_source = {}
        return out
