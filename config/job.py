"""The `[job]` section: N, B and K, the shape of a step, which every role reads (`brorl config show --explain`)."""

from __future__ import annotations

from pydantic import Field

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


MOVED_TO_JOB = {("actor", "n_samples"), ("learner", "prompts_per_step"), ("learner", "max_staleness")}
"""Keys that lived in a role's section before N, B and K became job-wide (`[job]`)."""
