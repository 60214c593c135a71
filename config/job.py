"""The `[job]` section: N, B and K, the shape of a step, which every role reads (`brorl config show --explain`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from config.section import Section


class JobConfig(Section):
    """N, B and K: the shape of a step, which every role reads (the actors sample N per prompt and gate on K,
    the learner validates N, assembles B groups, admits and aborts by K, scales the rate by B × N)."""

    n_samples: int = Field(8, ge=1)
    """N, completions sampled per prompt (one group). Paper: 16 (ProRL) and 512 (BroRL)."""

    prompts_per_step: int = Field(8, ge=1)
    """B, kept groups (prompts) per step after dynamic sampling. Paper: 512 (ProRL), 128 (BroRL)."""

    max_staleness: int = Field(1, ge=0)
    """K: largest (training step − generating policy version) admitted (`transport/staleness.py`). 0 is
    on-policy."""


    rollouts: Literal["fixed", "adaptive"] = "fixed"
    """"fixed": every prompt gets N completions at once. "adaptive": a first wave of `first_wave`; a prompt
    whose first wave all agree (all right or all wrong, so dynamic sampling would drop it) stops there and
    its group of `first_wave` is sent as such; the others get the rest of their N in a second wave, over the
    prompt's cached prefix (`next_wave_size`; the estimator's bias: docs/architecture.md, "Adaptive
    rollouts")."""

    first_wave: int = Field(16, ge=1)
    """With `rollouts = "adaptive"`: the completions of a prompt's first wave (fewer than N)."""

    step_sample_budget: int = Field(0, ge=0)
    """With `rollouts = "adaptive"`: the samples an actor generates under one weight version (one learner
    step) at most, so that a step's generation stays predictable: a mixed prompt whose second wave would pass
    it is not extended, and its first wave is sent as its group (mixed, so kept and trained at `first_wave`).
    First waves are granted by the learner and always run. 0: no budget."""

    def first_wave_size(self) -> int:
        """Completions in a prompt's first request (with fixed rollouts: its only one)."""
        return self.first_wave if self.rollouts == "adaptive" else self.n_samples

    def next_wave_size(self, correct: list[bool]) -> int:
        """The adaptive rule: how many completions a prompt's next wave asks for, given the correctness of all
        it has so far; 0: the group is complete. A first wave that all agree stops (dynamic sampling would
        drop the group; more samples would rarely change its verdict); a mixed one gets the rest of N. What
        that does to the gradient: docs/architecture.md, "Adaptive rollouts"."""
        n, k = len(correct), sum(map(bool, correct))
        if self.rollouts != "adaptive" or n >= self.n_samples or k in (0, n):
            return 0
        return self.n_samples - n

    def group_sizes(self) -> frozenset[int]:
        """The sizes a group can have (what the learner accepts): N, and with adaptive rollouts the first wave's."""
        return frozenset({self.first_wave_size(), self.n_samples})

    @model_validator(mode="after")
    def _waves(self) -> "JobConfig":
        if self.step_sample_budget and self.rollouts != "adaptive":
            raise ValueError(f"job.step_sample_budget = {self.step_sample_budget} caps adaptive rollouts' second "
                             "waves: set job.rollouts = \"adaptive\" or leave it 0 (fixed N's samples per step "
                             "are job.prompts_per_step x job.n_samples already)")
        if self.rollouts == "adaptive" and self.first_wave >= self.n_samples:
            raise ValueError(f"job.first_wave = {self.first_wave} must be below job.n_samples = {self.n_samples} "
                             "with job.rollouts = \"adaptive\" (else every prompt gets N at once: \"fixed\")")
        return self


MOVED_TO_JOB = {("actor", "n_samples"), ("learner", "prompts_per_step"), ("learner", "max_staleness")}
"""Keys that lived in a role's section before N, B and K became job-wide (`[job]`)."""
