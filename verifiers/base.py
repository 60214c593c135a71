"""The verifier protocol: score one completion against a task's reference.

A verifier is a small pure function `(completion: str, reference: str) -> VerifierResult`. It never
raises for bad model output (unparseable text is `correct=False` with a reason); it raises only for a
bad *reference*, which is a dataset bug.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VerifierResult:
    reward: float
    """Scalar reward of the completion (1.0 / 0.0 for binary tasks; a fraction for partial credit)."""
    correct: bool
    """Whether the completion counts as correct (dynamic sampling and pass@k use this)."""
    reason: str = ""
    """Why: "match", "mismatch", "no answer", "timeout", "error: ..."; logged and counted."""


@dataclass(frozen=True, slots=True)
class Task:
    prompt: str
    """Text given to the model."""
    reference: str
    """Reference answer (or serialized tests) the verifier compares against."""
    verifier: str
    """Registered verifier name that scores this task."""
    task_id: str
    """Stable identifier (unique within a dataset split)."""
    source: str = ""
    """The data source it came from (a file's `data_source` column, or the file): picks the verifier, labels
    per-source metrics and evaluation rows. Generators leave it empty (their verifier's name stands for it)."""
    messages: tuple[tuple[str, str], ...] = ()
    """The prompt as chat messages ((role, content), ...) when the data gave it so; then `prompt` is the
    last user message's text (for display and the held-out split) and the messages are what is rendered."""
