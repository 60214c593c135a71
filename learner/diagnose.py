"""The learner's no-progress diagnosis: why no batch is forming, in words, with the state it judged by."""

from __future__ import annotations

import collections


# kinds of `cause` that are the job at work, only slow (a long step, long generations, actors starting their
# engines: one that cannot reach the learner says so itself): no stall to report
BUSY = ("busy", "generating", "none-joined")


def cause(dispatcher, batcher, members, version: int) -> tuple[str, str, str]:
    """(kind, why, fix): why no batch is forming — `kind` a short name of the reason, `fix` what to do about it
    ("" where the job is only slow: `BUSY`)."""
    d, b, m = dispatcher, batcher, members
    alive = m.alive()
    held = collections.Counter(d.outstanding.values())
    in_play = len(d.pending) - len(d.requeue) - len(b.consumed_ids)
    st = b.stats
    dropped = st["drop_all_correct"] + st["drop_all_wrong"] + st["drop_equal_reward"]
    if not b.waiting:
        return "busy", "the learner is not waiting for data: it is in a weight sync, a training step or a checkpoint", ""
    if st["groups_received"] >= b.B and dropped == st["groups_received"] and not b.kept and not b._gathered:
        which = "all-wrong" if st["drop_all_wrong"] == dropped else "all-correct" if st["drop_all_correct"] == dropped \
            else "all-correct or all-wrong"
        why, fix = {
            "all-wrong": ("the task is too hard for the model, or no answer is ever scored",
                          "use easier tasks or a stronger model; check that data.reasoning_end matches how the model "
                          "closes its reasoning and that the verifier reads its answer format (`brorl data preview`)"),
            "all-correct": ("the task is too easy for the model, or the verifier accepts anything",
                            "use harder tasks; check the verifier and the data (`brorl data preview`)"),
        }.get(which, ("each task is too easy or too hard for the model",
                      "mix in tasks of middling difficulty; check the verifier and the data (`brorl data preview`)"))
        return which, (f"every one of the {dropped} groups received since the last step was {which}, and dynamic "
                       f"sampling drops such groups: {why}"), fix
    if not alive and not m.ever_joined:
        return ("none-joined", "no actor has joined yet (an actor's engine start takes ~20-60 s on a CPU, minutes "
                "for a large model)", "")
    if not alive:
        return ("no-actor", "no actor is alive (none heard from within transport.heartbeat_timeout_s)",
                "see the actors' logs (logs/actor-*.log in the run folder); check that they reach the learner's ports")
    if m.needs_sync(version):
        return ("weights-not-synced", f"the weights of version {version} have not reached every member yet",
                "see the actors' logs for weight-sync errors; check transport.weight_backend and weight_timeout_s")
    if all(m.versions.get(a, -1) < 0 for a in alive):
        return ("no-weights", "every actor is without weights (waiting for a broadcast)",
                "see the learner's and actors' logs for weight-sync errors")
    if in_play >= max(d.allowed_pending(version, version), 1) and not held:
        return "freshness-full", "the freshness bound is full of prompts nobody holds", "see the learner's log"
    if held:
        return "generating", f"waiting for groups of the prompts actors hold ({dict(held)})", ""
    return "not-granted", "actors are asking for work but none is granted", "see the learner's log"


def why_no_batch(dispatcher, batcher, members, version: int) -> str:
    d, b, m = dispatcher, batcher, members
    alive = m.alive()
    kind, why, fix = cause(d, b, m, version)
    why = f"{why} ({fix})" if kind.startswith("all-") else why  # the others: the state below is the clue
    return (f"{why}; kept {len(b.kept)} + gathered {len(b._gathered)} of B={b.B}, pending {len(d.pending)} "
            f"(requeued {len(d.requeue)}, dropped-uncommitted {len(b.consumed_ids)}), next prompt {d.next_id}, "
            f"alive {alive}, weight group {m.group}, synced version {m.synced_version}, actor versions "
            f"{m.versions}, actors {{id: (inflight, unacked)}} "
            f"{ {a: (s.get('inflight'), s.get('unacked')) for a, s in m.actor_stats.items()} }, since last "
            f"step: received {b.stats['groups_received']} groups, dropped all-correct "
            f"{b.stats['drop_all_correct']} all-wrong {b.stats['drop_all_wrong']} unleased {b.stats['drop_unleased']}")
