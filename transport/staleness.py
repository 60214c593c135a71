"""The staleness rule, in one place. A token sampled by weights version v and trained at learner step s is
s − v versions stale; it may be trained iff s − v ≤ K (`job.max_staleness`). Every part that bounds
staleness asks this module: the learner's dispatcher (how many more steps a prompt started now stays
trainable: its grants), admission (a group is admitted while its oldest token is fresh), the actor's gate (a
prompt starts only on weights within K of the learner's latest), in-flight updates (a kept request the update
would leave too old is aborted) and the fleet simulator. (Here because both roles need it, and neither may
import the other.)"""

from __future__ import annotations


def staleness(step, version):
    """How many versions behind `step` a token of `version` is (numbers or numpy arrays alike)."""
    return step - version


def fresh(step: int, version: int, max_staleness: int) -> bool:
    """May a token sampled by `version` be trained at `step` (or a prompt start on `version` weights while the
    learner is at `step`)?"""
    return staleness(step, version) <= max_staleness


def steps_left(step: int, version: int, max_staleness: int) -> int:
    """The steps, `step` included, at which a token of `version` can still be trained (0 or less: none)."""
    return max_staleness - staleness(step, version) + 1
