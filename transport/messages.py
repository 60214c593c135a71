"""The messages that cross between actors and learner, as Python objects; `transport/wire.py` encodes and
validates them (and re-exports them: callers write `wire.Hello`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class PromptItem:
    prompt_id: int
    """Learner's index of this prompt in its data stream (the data cursor)."""
    prompt: str
    """Prompt text."""
    reference: str
    """Reference the verifier compares against."""
    verifier: str
    """Verifier name."""
    task_id: str = ""
    """Dataset task id."""
    prompt_token_ids: list[int] = field(default_factory=list)
    """The rendered prompt's token ids (chat template applied, `taskdata.render`): what the engine generates
    from, and what the learner checks the group's `prompt_ids` against. Empty: the engine tokenizes `prompt`."""
    source: str = ""
    """The task's data source (per-source metrics)."""


@dataclass
class WorkRequest:
    actor_id: str
    """Sender."""
    credits: int
    """Prompts the actor can take now (its free capacity)."""
    version: int
    """Policy version of the actor's weights."""
    returned: list[int] = field(default_factory=list)
    """Prompt ids handed back unanswered (aborted at a weight update); the learner re-issues them."""


@dataclass
class Hello:
    actor_id: str
    """Sender."""
    version: int
    """Policy version of the actor's weights (-1 before any)."""
    sync_token: str = ""
    """Echoed back on the control channel (Control kind "sync_ack") to prove the SUB socket is live."""
    incarnation: str = ""
    """Nonce of this actor process. A hello with a new incarnation for a known actor id means the actor
    restarted: the learner retires the old incarnation's grants and duplicate table."""


@dataclass
class Heartbeat:
    actor_id: str
    """Sender."""
    version: int
    """Policy version of the actor's weights."""
    inflight: int
    """Prompts accepted and not yet sent back."""
    unacked: int
    """Groups sent and not yet acknowledged."""
    checksum: str = ""
    """Checksum of the weights loaded for `version` (transport/weights.py), "" before any update."""
    verifiers: dict[str, str] = field(default_factory=dict)
    """Verifier name -> "path@version" in force on this actor (acknowledges hot swaps)."""
    error: str = ""
    """Last error worth the learner's log (e.g. a rejected verifier swap), else empty."""
    stats: dict[str, float] = field(default_factory=dict)
    """Cumulative actor counters (name -> number): samples, tokens, groups_sent, aborted, updates,
    engine_restarts, idle_s (seconds the engine had no request, any reason), idle_weight_s (the part
    spent loading weights or gated by max_staleness), held_s (paused for the learner's compute, `actor.share_gpu
    = "timeshare"`; never counted in idle_s), update_s (receiving and loading weights) and score_s (groups in the
    verifier pool)."""
    group: str = ""
    """The weight group (rendezvous name) the actor has joined or is joining, "" if none: the learner
    leaves a member that never names the group it was called to out of the next one."""


@dataclass
class Admin:
    command: str
    """Operator command: "swap" (args: name, path) or "status"."""
    args: dict[str, Any] = field(default_factory=dict)
    """Command arguments."""


@dataclass
class AdminReply:
    ok: bool
    """Whether the command was carried out."""
    message: str
    """What happened (or why not)."""


@dataclass
class WorkAssignment:
    items: list[PromptItem]
    """Granted prompts (at most the request's credits)."""


@dataclass
class GroupAck:
    group_ids: list[str]
    """Groups the learner has received (accepted or dropped as duplicate)."""
    rejected: dict[str, str] = field(default_factory=dict)
    """Groups the learner refused, group id -> reason (a NACK): the actor drops them and does not re-send."""


@dataclass
class Snapshot:
    control_seq: int
    """Sequence number of the last control message the state includes."""
    version: int
    """Latest policy version."""
    verifiers: dict[str, str]
    """Verifier name -> dotted path currently in force."""
    paused: bool = False
    """Whether generation is paused."""
    weights: dict[str, Any] = field(default_factory=dict)
    """Payload of the latest "weights" rendezvous (empty if none): a joining actor named in it joins."""
    epoch: str = ""
    """Nonce of the learner process: a different one than before means the learner restarted."""
    hello_needed: bool = False
    """The learner does not know this actor (any more): it must say hello before its messages count."""
    computing: int = 0
    """The step the learner is computing now (`actor.share_gpu = "timeshare"`: engines on its GPU pause until
    it ends), 0 while it waits for groups."""


@dataclass
class Control:
    seq: int
    """Monotonic sequence number (per learner run)."""
    kind: str
    """One of CONTROL_KINDS."""
    payload: dict[str, Any] = field(default_factory=dict)
    """Kind-specific: version {version}; swap {name, path}; sync_ack {token}; weights {rendezvous}; compute
    {step}: the learner starts computing step `step` (0: it ended and waits for groups)."""
    epoch: str = ""
    """Nonce of the learner process that published it (seq counts per epoch)."""


@dataclass
class RolloutGroup:
    """One prompt and its N completions. Arrays (shape; meaning):"""

    group_id: str
    """Unique: "<actor_id>:<incarnation>:<seq>" (seq counts per actor process); duplicates are detected by it."""
    prompt_id: int
    """The PromptItem it answers."""
    actor_id: str
    """Generating actor."""
    policy_version: int
    """Version of the weights that generated every completion of the group."""
    verifier: str
    """Verifier name that scored it."""
    verifier_version: str
    """Verifier version that scored it."""
    prompt_ids: np.ndarray
    """int32[P] — prompt token ids."""
    lengths: np.ndarray
    """int32[N] — completion lengths in tokens; sum(lengths) = T."""
    tokens: np.ndarray
    """int32[T] — the N completions' token ids, concatenated."""
    logprobs: np.ndarray
    """float32[T] — behaviour log-prob of each sampled token (after temperature/top-p)."""
    rewards: np.ndarray
    """float32[N] — reward of each completion."""
    correct: np.ndarray
    """uint8[N] — 1 if the completion is correct."""
    finish: np.ndarray
    """uint8[N] — index into FINISH_REASONS."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: e.g. {"generate": ..., "score": ...}."""
    reasons: list[str] = field(default_factory=list)
    """Optional per-completion verifier reasons (empty, or N strings)."""
    versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    """uint8[T] or uint8[0] — per token, the version that sampled it, as an offset from `policy_version`
    (non-decreasing within a completion: weights updated in flight, `actor.in_flight_on_update = "keep"`).
    Empty: every token is of `policy_version`."""

    @property
    def n(self) -> int:
        return int(self.lengths.shape[0])

    def token_versions(self) -> np.ndarray:
        """int64[T] — the version that sampled each token."""
        if len(self.versions):
            return self.policy_version + self.versions.astype(np.int64)
        return np.full(len(self.tokens), self.policy_version, np.int64)

    @property
    def oldest_version(self) -> int:
        """The version of the group's oldest token (a completion begun before a weight update in flight
        may have none of `policy_version` when it had not started)."""
        return self.policy_version + (int(self.versions.min()) if len(self.versions) else 0)

    @property
    def newest_version(self) -> int:
        return self.policy_version + (int(self.versions.max()) if len(self.versions) else 0)

    def completions(self) -> list[np.ndarray]:
        return np.split(self.tokens, np.cumsum(self.lengths)[:-1]) if self.n else []

    def completion_logprobs(self) -> list[np.ndarray]:
        return np.split(self.logprobs, np.cumsum(self.lengths)[:-1]) if self.n else []
