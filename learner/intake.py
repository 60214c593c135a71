"""The learner's intake: what actors send, judged by who sent it.

Work messages (hello, work request, heartbeat, admin) on the work socket and groups on the rollout socket;
identity, validation, acknowledgements and NACKs, prompts taken back, restarted and silent actors.
`Intake` is a collaborator of `LearnerService`, given what it works with: the sockets, the membership and
its weight sync, the dispatcher, batcher, admission, validator, admin desk, the held-out estimate's clock,
the ledger's `record`, and the current policy version.

Every action is keyed by the authenticated sender, never by what a message claims: with CURVE, the actor
whose key the connection holds; without, the actor id a connection first spoke for, from the address it
said hello from. Replies to an actor go to the connection its last authenticated message came on
(`Membership.routes`); the ROUTER names connections itself, so no peer can take another's over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

from learner.batching import NothingRenders
from learner.validation import identity_problem
from transport import wire
from transport.zmq_transport import Peer

if TYPE_CHECKING:
    from learner.admin import AdminDesk
    from learner.batching import Admission, Batcher, Dispatcher
    from learner.heldout import HeldoutEstimate
    from learner.membership import Membership, WeightSync
    from learner.validation import GroupValidator
    from transport.zmq_transport import LearnerSockets

log = logging.getLogger("brorl.learner")


class Intake:
    def __init__(self, *, sockets: "LearnerSockets", members: "Membership", weights: "WeightSync",
                 dispatcher: "Dispatcher", batcher: "Batcher", admission: "Admission", validator: "GroupValidator",
                 desk: "AdminDesk", heldout: "HeldoutEstimate", record: Callable[[dict], None],
                 version: Callable[[], int], curve: bool):
        self.sockets, self.members, self.weights = sockets, members, weights
        self.dispatcher, self.batcher, self.admission = dispatcher, batcher, admission
        self.validator, self.desk, self.heldout = validator, desk, heldout
        self.record = record  # a ledger row
        self._version = version  # the learner's policy version now
        self.curve = curve  # transport.curve: connections are authenticated by their keys
        self._admin_tasks: set[asyncio.Task] = set()

    @property
    def version(self) -> int:
        return self._version()

    async def serve_work(self) -> None:
        """The work socket's loop (the learner's task "learner:dispatcher")."""
        while True:
            ident, msg = await self.sockets.work.recv()
            try:  # nothing a peer sends may end the learner
                await self.on_work_message(ident, msg, self.sockets.work.last_peer)
            except NothingRenders:  # no peer's doing: no task can ever be granted, so the learner stops
                raise
            except Exception as e:
                self.validator.count("?", "-", f"internal_error: {type(e).__name__}: {e} (work message)")
                log.exception("work message %s failed", type(msg).__name__)

    async def on_work_message(self, ident: bytes, msg, peer: Peer) -> None:
        if isinstance(msg, wire.Admin):  # answered by a task: a verifier check must not stall heartbeats
            if len(self._admin_tasks) >= 4:
                return await self.sockets.work.send(ident, wire.AdminReply(False, "busy: 4 admin commands running"))
            t = asyncio.create_task(self._answer_admin(ident, msg, peer), name="learner:admin")
            self._admin_tasks.add(t)
            t.add_done_callback(self._admin_tasks.discard)
            return
        actor = getattr(msg, "actor_id", None)
        if not isinstance(msg, (wire.Hello, wire.WorkRequest, wire.Heartbeat)):
            return  # not a message an actor sends to the learner
        why = self.work_identity_problem(ident, actor, peer, hello=isinstance(msg, wire.Hello))
        if why:
            self.validator.count(actor[:64], "-", f"identity: {type(msg).__name__} {why}")
            return
        if isinstance(msg, wire.Hello):
            if not self.members.may_hello(actor):
                self.validator.count(actor[:64], "-", f"hello_refused: {len(self.members.incarnations)} actor ids "
                                                      f"tracked (transport.max_actors)")
                return
            left_group, retired = self.members.hello(actor, msg.incarnation, peer.address)
            self.members.bind_route(actor, ident)
            if left_group:
                self.weights.drop_group()  # stale for it: the next rendezvous forms a new group
            if retired is not None:
                self.retire_incarnation(actor, retired)
            await self.sockets.answer_hello(ident, msg)
            self.batcher.wake()  # a (re)joining actor may need the current weights
        elif not self.members.said_hello(actor):
            # an actor of an earlier learner process (we restarted) or one we forgot: our snapshot tells it
            # to say hello before it gets work (a heartbeat or request of it counts for nothing until then)
            if self.members.may_remind(actor):
                await self.sockets.work.send(ident, self.sockets.control.snapshot(hello_needed=True))
        elif isinstance(msg, wire.WorkRequest):
            self.members.bind_route(actor, ident)
            if self.members.seen(actor):
                self.batcher.wake()
            self.take_back(msg.returned, actor, "handed_back")  # aborted (too stale) or failed there
            if msg.version > self.version:  # weights the learner never published: it would be granted a hoard
                self.validator.count(actor[:64], "-", f"version_from_future: work request at version {msg.version}, "
                                                      f"the learner is at {self.version}")
                return await self.sockets.work.send(ident, wire.WorkAssignment([]))
            items = self.dispatcher.grant(actor, msg.credits, self.batcher.room(), step=self.version,
                                          actor_version=msg.version, settled=len(self.batcher.consumed_ids),
                                          kept=len(self.batcher.kept) if self.batcher.waiting else self.batcher.B,
                                          actors=self.members.active())
            if items:
                self.record({"granted": [i.prompt_id for i in items], "actor": actor, "sources": [i.source for i in items],
                             "incarnation": self.members.incarnations.get(actor, "")})
            await self.sockets.work.send(ident, wire.WorkAssignment(items))
        else:
            self.members.bind_route(actor, ident)
            new = self.members.heartbeat(msg)
            if self.members.resync:  # an actor holds weights that failed their checksum
                self.members.resync = False
                self.weights.drop_group()
            if new or not self.members.group:
                self.batcher.wake()  # a new member, or a regroup: broadcast first

    def work_identity_problem(self, ident: bytes, actor: str, peer: Peer, hello: bool) -> str:
        """Why a work-socket message claiming to come from `actor` is not believed ("" if it is)."""
        if not actor or len(actor) > 128:
            return f"actor id of {len(actor)} characters (1 to 128 allowed)"
        owner = self.members.route_owner.get(ident)
        if owner is not None and owner != actor:  # one connection speaks for one actor
            return f"its connection speaks for actor {owner[:64]!r}"
        address = None if hello else self.members.addresses.get(actor)  # a hello may come from a new host
        return identity_problem(actor, peer, address, self.curve)

    def take_back(self, pids: list[int], actor: str | None, reason: str, holder: bool = True) -> None:
        """Prompts back to the queue (with `holder`, those `actor` holds) and a ledger row saying why."""
        if back := self.dispatcher.give_back(pids, actor if holder else None):
            self.record({"returned": back, "actor": actor, "reason": reason})

    async def _answer_admin(self, ident: bytes, msg: wire.Admin, peer: Peer) -> None:
        try:
            reply = await self.desk.handle(msg, peer)
        except Exception as e:
            log.exception("admin command %r failed", msg.command)
            reply = wire.AdminReply(False, f"failed: {type(e).__name__}: {e}")
        await self.sockets.work.send(ident, reply)

    async def serve_rollouts(self) -> None:
        """The rollout socket's loop (the learner's task "learner:rollouts")."""
        while True:
            g = await self.sockets.rollouts.recv()
            await self.send_nacks()
            await self.ack_duplicates()
            try:  # nothing a peer sends may end the learner
                await self.on_group(g, self.sockets.rollouts.last_peer)
            except Exception as e:
                why = f"internal_error: {type(e).__name__}: {e}"
                self.validator.count(g.actor_id[:64], g.group_id[:200], why)
                log.exception("group %s failed", g.group_id[:200])
                await self.send_to(g.actor_id, wire.GroupAck([], {g.group_id: why}))

    async def send_to(self, actor: str, msg) -> None:
        """To the connection `actor`'s last authenticated message came on (none yet: nothing is sent; an
        actor that has not said hello to this learner process hears of it in reply to its next request)."""
        if (route := self.members.routes.get(actor)) is not None:
            await self.sockets.work.send(route, msg)

    async def ack_duplicates(self) -> None:
        """Acknowledge groups received again, each to its own (authenticated) sender; a prompt the sender
        still holds goes back to the queue (the group that answered it was used, refused or dropped)."""
        for actor, dups in self.sockets.rollouts.take_duplicate_ids().items():
            await self.send_to(actor, wire.GroupAck([gid for gid, _, _ in dups]))
            self.take_back([pid for _, pid, peer in dups if not identity_problem(
                actor, peer, self.members.addresses.get(actor), self.curve)], actor, "duplicate")

    async def send_nacks(self) -> None:
        """NACK groups that did not decode but named their sender and id (so it stops re-sending them); the
        prompt goes back to the queue if the sender, authenticated as itself, holds it. (A prompt id that
        cannot be read — not an integer nor a string of digits — returns nothing: that lease goes back at its
        deadline, `Dispatcher.expire`.)"""
        for n in self.sockets.rollouts.take_nacks():
            self.validator.count(n.actor_id[:64], n.group_id[:200], n.why)
            await self.send_to(n.actor_id, wire.GroupAck([], {n.group_id: n.why}))
            if n.prompt_id is not None and not identity_problem(n.actor_id, n.peer, self.members.addresses.get(
                    n.actor_id), self.curve):
                self.take_back([n.prompt_id], n.actor_id, "invalid")

    async def on_group(self, g: wire.RolloutGroup, peer: Peer) -> None:
        """Check the sender, validate, acknowledge (or NACK), then use or drop a group by the lease and
        staleness rules."""
        if self.heldout.t_first is None:
            self.heldout.t_first = time.monotonic()
        why = identity_problem(g.actor_id, peer, self.members.addresses.get(g.actor_id), self.curve)
        if why:  # not who it claims to be: counted, and nothing done in the claimed actor's name
            self.validator.count(g.actor_id[:64], g.group_id[:200], f"identity: {why}")
            return
        problem = self.validate(g)
        if problem:
            self.validator.count(g.actor_id[:64], g.group_id[:200], problem)
            self.take_back([g.prompt_id], g.actor_id, "invalid")  # if it held the prompt: granted again
            await self.send_to(g.actor_id, wire.GroupAck([], {g.group_id: problem}))
            return
        await self.send_to(g.actor_id, wire.GroupAck([g.group_id]))
        if not self.members.said_hello(g.actor_id) or g.actor_id in self.members.bad_weights:
            self.batcher.count_unleased(g)  # made for an earlier learner process, or with weights that failed
            self.take_back([g.prompt_id], g.actor_id, "unleased")  # their checksum
        elif not self.dispatcher.claim(g.prompt_id, g.actor_id):
            self.batcher.count_unleased(g)  # answered already, or granted to another actor meanwhile
        elif self.admission.admit(g, self.version):
            self.batcher.add(g)
        else:
            self.batcher.count_stale(g)
            self.take_back([g.prompt_id], g.actor_id, "stale", holder=False)

    def validate(self, g: wire.RolloutGroup) -> str:
        """"" if the group of an authenticated sender may be used, else the reason (`learner.validation`)."""
        if not self.members.said_hello(g.actor_id):
            return ""  # of an earlier learner process: acknowledged and dropped, not judged
        try:
            task, ids = self.dispatcher.tasks[g.prompt_id] if g.prompt_id in self.dispatcher.pending else (None, None)
        except KeyError:
            task, ids = None, None
        return self.validator.check(g, version=self.version, next_prompt=self.dispatcher.next_id, prompt_ids=ids,
                                    task_verifier=getattr(task, "verifier", None),
                                    reward_range=self.desk.reward_range(g.verifier))

    def retire_incarnation(self, actor: str, incarnation: str) -> None:
        """A new process took over `actor`: the old one's prompts go back to the queue and its duplicate
        table goes (its late groups still count if their prompt is still unanswered)."""
        back = self.dispatcher.retire(actor)
        self.sockets.rollouts.forget(f"{actor}:{incarnation}")
        self.record({"returned": back, "actor": actor, "reason": "restarted"})
        log.warning("actor %s restarted (incarnation %s retired); %d prompts it held go back to the queue",
                    actor, incarnation, len(back))

    def expire_leases(self) -> None:
        """Leases unanswered past their deadline go back to the queue (`Dispatcher.expire`): a holder that
        does not deliver loses its prompts to the others without being evicted first."""
        for actor, back in self.dispatcher.expire().items():
            self.record({"returned": back, "actor": actor, "reason": "expired"})
            log.warning("actor %s held %d prompts past the lease deadline (%.0f s, learner.lease_timeout_s): they "
                        "go back to the queue; it holds at most one until it delivers a group", actor, len(back),
                        self.dispatcher.lease_deadline())

    def evict_silent(self, within_s: float | None = None) -> None:
        """Actors silent for `transport.heartbeat_timeout_s` (or `within_s`) leave the membership (the next
        broadcast regroups without them) and the prompts they hold go back to the queue."""
        for actor in self.members.drop_silent(within_s):
            back = self.dispatcher.retire(actor)
            self.record({"returned": back, "actor": actor, "reason": "evicted"})
            log.warning("actor %s silent for %.1f s: evicted; %d prompts it held go back to the queue", actor,
                        within_s or self.members.timeout_s, len(back))
            self.batcher.wake()
