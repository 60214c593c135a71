"""Admission validation: every group that decoded is checked against the job and the model before anything
uses it. A bad group gets a named reason — counted per reason in the metrics (`rejected_<reason>`) and
NACKed to its actor — and the learner goes on.

    identity            actor id ≠ the group id's actor ≠ the connection's (the CURVE key's actor with
                        CURVE; the address the actor said hello from without)
    prompt_not_granted  a prompt id the learner never handed out
    verifier            not the verifier of the prompt's task
    n_samples           N ≠ job.n_samples
    completion_too_long a completion longer than actor.max_tokens
    too_long            prompt + completion longer than actor.max_model_len
    token_id            a token id ≥ the model's vocabulary
    prompt              prompt tokens other than the granted prompt's (as rendered: `taskdata.render`)
    reward_range        a reward outside the verifier's declared range (`REWARD_RANGE`, default [0, 1])
    version_from_future a policy version the learner has not published yet

(Decoding already refused non-finite rewards, log-probs > 0 or not finite, inconsistent shapes.)
"""

from __future__ import annotations

import collections
import logging
import time

import numpy as np

from config.schema import BrorlConfig
from transport import wire
from transport.zmq_transport import Peer

log = logging.getLogger("brorl.learner")
REASONS = ("identity", "prompt_not_granted", "verifier", "n_samples", "completion_too_long", "too_long",
           "token_id", "prompt", "reward_range", "version_from_future", "internal_error")


def actor_of(group_id: str) -> str:
    """The actor named by a group id "<actor>:<incarnation>:<seq>"."""
    return group_id.rsplit(":", 2)[0] if group_id.count(":") >= 2 else ""


def identity_problem(claimed: str, peer: Peer, hello_address: str | None, curve: bool) -> str:
    """Why a message claiming to come from actor `claimed` is not believed ("" if it is): with CURVE the
    connection's key must be that actor's; without, it must come from the address that actor said hello
    from (`hello_address`; None: no hello yet, nothing to compare)."""
    if curve:
        return "" if peer.user == f"actor:{claimed}" else f"connection key is {peer.user or 'unknown'!r}"
    if hello_address is not None and peer.address and peer.address != hello_address:
        return f"sent from {peer.address}, the actor said hello from {hello_address}"
    return ""


class GroupValidator:
    def __init__(self, cfg: BrorlConfig, vocab_size: int):
        a = cfg.actor
        self.n, self.max_tokens, self.max_len = cfg.job.n_samples, a.max_tokens, a.max_model_len
        self.sizes = cfg.job.group_sizes()  # N, or with adaptive rollouts also the first wave's size
        self.vocab = vocab_size
        self.reward_ranges: dict[str, tuple[float, float]] = {}  # verifier name -> declared range
        self.counts: collections.Counter[str] = collections.Counter()  # since the last take_stats
        self._logged: dict[str, float] = {}

    def check(self, g: wire.RolloutGroup, *, version: int, next_prompt: int, task_verifier: str | None,
              reward_range: tuple[float, float], prompt_ids: list[int] | None = None) -> str:
        """"" if the group may be used, else "<reason>: <details>". `task_verifier` and `prompt_ids`: the
        verifier and rendered token ids of the prompt's task (None if the prompt is not in play any more;
        ids empty where the engine tokenized the text itself)."""
        if actor_of(g.group_id) != g.actor_id:
            return f"identity: group id {g.group_id!r} is not actor {g.actor_id!r}'s"
        if not 0 <= g.prompt_id < next_prompt:
            return f"prompt_not_granted: prompt {g.prompt_id} was never handed out (next is {next_prompt})"
        if task_verifier is not None and g.verifier != task_verifier:
            return f"verifier: scored by {g.verifier!r}, the task's verifier is {task_verifier!r}"
        if g.n not in self.sizes:
            return (f"n_samples: N = {g.n}, the job's N (job.n_samples) is {self.n}" if len(self.sizes) == 1 else
                    f"n_samples: a group of {g.n}; adaptive rollouts make groups of {sorted(self.sizes)} "
                    "(job.first_wave, job.n_samples)")
        longest = int(g.lengths.max())
        if longest > self.max_tokens:
            return f"completion_too_long: a completion of {longest} tokens > actor.max_tokens = {self.max_tokens}"
        if len(g.prompt_ids) + longest > self.max_len:
            return (f"too_long: prompt {len(g.prompt_ids)} + completion {longest} tokens > actor.max_model_len "
                    f"= {self.max_len}")
        top = max(int(g.prompt_ids.max()), int(g.tokens.max()) if len(g.tokens) else 0)
        if top >= self.vocab:
            return f"token_id: token id {top} >= vocabulary size {self.vocab}"
        if prompt_ids and (len(g.prompt_ids) != len(prompt_ids) or g.prompt_ids.tolist() != prompt_ids):
            return (f"prompt: the group's prompt ({len(g.prompt_ids)} tokens) is not the granted prompt "
                    f"({len(prompt_ids)} tokens)")
        lo, hi = reward_range
        if not bool(np.all((g.rewards >= lo) & (g.rewards <= hi))):
            bad = float(g.rewards[(g.rewards < lo) | (g.rewards > hi)][0])
            return f"reward_range: reward {bad:g} outside [{lo:g}, {hi:g}] declared by verifier {g.verifier!r}"
        if g.newest_version > version:
            return f"version_from_future: policy version {g.newest_version} > the learner's {version}"
        return ""

    def count(self, actor: str, group_id: str, problem: str) -> str:
        """Count a rejection by its reason and log it (once a second per reason); returns the reason."""
        reason = problem.partition(":")[0]
        self.counts[reason] += 1
        now = time.monotonic()
        if now - self._logged.get(reason, 0.0) > 1.0:
            self._logged[reason] = now
            log.warning("rejected group %s from %s (%d %s so far this step): %s", group_id, actor,
                        self.counts[reason], reason, problem)
        return reason

    def take_stats(self) -> dict[str, float]:
        out = {f"rejected_{r}": float(n) for r, n in sorted(self.counts.items())}
        self.counts.clear()
        return out
