"""Who the learner's actors are: hellos and incarnations, signs of life and roll calls, weight-group
membership (who joined, who never does), checksums of the weights they report, and where replies to each
go (the connection its last authenticated message came on) — `Membership`; and the learner's side of weight
sync that acts on it: when to regroup, each version's broadcast, and what a failed one costs whom —
`WeightSync`."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Callable

from transport import wire
from transport.control import ControlPublisher
from transport.ports import free_port
from transport.weights import WeightBroadcaster, WeightSyncError

log = logging.getLogger("brorl.learner")


class Membership:
    def __init__(self, timeout_s: float = 15.0, max_actors: int = 256, backoff_s: float = 120.0):
        self.timeout_s = timeout_s
        self.max_actors = max_actors
        self.backoff_s = backoff_s  # a left-out member's first back-off (the weight timeout it cost), doubling
        self.last_seen: dict[str, float] = {}
        self.addresses: dict[str, str] = {}  # actor id -> the address its last hello came from
        self.routes: dict[str, bytes] = {}  # actor id -> the connection its last authenticated message came on
        self.route_owner: dict[bytes, str] = {}  # and back: one connection speaks for one actor
        self._heard: dict[str, float] = {}  # actor id -> last message of any kind (hello included)
        self.group: list[str] = []
        self.synced_version = -1
        self.expected: dict[int, str] = {}
        self.checksum_ok = 0
        self.checksum_mismatch = 0
        self.versions: dict[str, int] = {}
        self.actor_stats: dict[str, dict[str, float]] = {}
        self.incarnations: dict[str, str] = {}  # actor id -> the incarnation that said hello last
        self.last_error: dict[str, str] = {}
        self.suspects: set[str] = set()  # missed a roll call: not alive until heard from again
        self.joining: dict[str, tuple[str, float]] = {}  # actor id -> (weight group its last heartbeat named, when)
        # never named a weight group it was called to: left out until it says hello again, and its back-off
        # (doubling per failed rendezvous, per key: strikes survive hellos, restarts and pruning) is over
        self.shunned: dict[str, float] = {}  # actor id -> when its back-off ends
        self.strikes: dict[str, int] = {}  # actor id -> failed rendezvous it was absent from, since it last joined
        self.rejoining: set[str] = set()  # left out, and said hello since: back in once its back-off ends
        # named a weight group that never formed: who is to blame is learnt from who forms a group without whom
        self.proven: set[str] = set()  # in a group that formed, since its hello and its last failed rendezvous
        self.probation: dict[str, float] = {}  # actor id -> until: left out, blamed for a failed rendezvous
        self.waiting: dict[str, float] = {}  # actor id -> until: left out of the next rendezvous only (a test)
        self.hello_at: dict[str, float] = {}  # actor id -> when its incarnation said its first hello
        self.bad_weights: dict[str, int] = {}  # actor -> version whose weights it reported with a wrong checksum
        self.resync = False
        self._reminded: dict[str, float] = {}
        self.ever_joined = False  # an actor has said hello (before: actors may still be starting their engines)

    def may_hello(self, actor_id: str) -> bool:
        """Is there room for this actor id? Known ids always; a new one only while fewer than `max_actors`
        ids are tracked (silent ones are pruned first): a flood of forged ids cannot grow the tables."""
        if actor_id in self.incarnations:
            return True
        if len(self.incarnations) >= self.max_actors:
            self.prune()
        return len(self.incarnations) < self.max_actors

    def prune(self) -> None:
        """Forget every actor id not heard from for `timeout_s` (it says hello again if it comes back)."""
        now = time.monotonic()
        for a in [a for a, t in self._heard.items() if now - t >= self.timeout_s]:
            for table in (self._heard, self.incarnations, self.addresses, self.last_seen, self.versions,
                          self.actor_stats, self.last_error, self.bad_weights, self.joining, self.hello_at,
                          self.waiting):
                table.pop(a, None)
            self.proven.discard(a)
            self.route_owner.pop(self.routes.pop(a, b""), None)
            self.suspects.discard(a)

    def hello(self, actor_id: str, incarnation: str, address: str = "") -> tuple[bool, str | None]:
        """Record a hello (not yet a sign of life: an actor is alive from its first heartbeat or request, so
        hellos alone — forged ones included — never start a rendezvous). Returns (left_group, retired):
        left_group is True if it comes from a member of the current weight group — the actor (or its
        engine) restarted, that group is gone for it and its rendezvous must not be handed out again;
        retired is the actor's previous incarnation when this hello comes from a new process under the
        same actor id (else None). A member left out of weight groups (`shun_absent`) stays out until its
        back-off is over, whatever its incarnation."""
        self._heard[actor_id] = time.monotonic()
        self.ever_joined = True
        self.addresses[actor_id] = address
        if actor_id in self.shunned:  # it may take part in weight groups again, once its back-off is over
            self.rejoining.add(actor_id)
        old = self.incarnations.get(actor_id)
        self.incarnations[actor_id] = incarnation
        self.proven.discard(actor_id)  # a new process, or one the learner forgot: it proves itself again
        if old != incarnation or actor_id not in self.hello_at:
            self.hello_at[actor_id] = time.monotonic()
            self.joining.pop(actor_id, None)  # the group the old process named is not this one's
        left = actor_id in self.group
        if left:
            self.group = []
        return left, (old if old is not None and old != incarnation else None)

    def bind_route(self, actor_id: str, route: bytes) -> None:
        """`actor_id` (authenticated) spoke on connection `route`: replies to it go there from now on."""
        old = self.routes.get(actor_id)
        if old != route:
            self.route_owner.pop(old, None)
            self.routes[actor_id] = route
            self.route_owner[route] = actor_id

    def said_hello(self, actor_id: str) -> bool:
        """Has this actor said hello to this learner process? (An actor that worked for a learner before it
        restarted has not, until it learns of the restart.)"""
        return actor_id in self.incarnations

    def may_remind(self, actor_id: str, every_s: float = 1.0) -> bool:
        """Rate limit for telling an actor that has not said hello to do so: at most once per `every_s`."""
        now = time.monotonic()
        if now - self._reminded.get(actor_id, -math.inf) < every_s:
            return False
        if len(self._reminded) >= 1024:  # forget old reminders: the table stays small whatever peers send
            self._reminded = {a: t for a, t in self._reminded.items() if now - t < every_s}
            if len(self._reminded) >= 1024:  # a flood of unknown ids: remind nobody new for now
                return False
        self._reminded[actor_id] = now
        return True

    def seen(self, actor_id: str) -> bool:
        """Record a sign of life; True if the actor was not alive a moment ago (a new member), or was a
        suspect (it did not answer a roll call) and has now shown it lives."""
        now = time.monotonic()
        new = now - self.last_seen.get(actor_id, -math.inf) >= self.timeout_s or actor_id in self.suspects
        self.suspects.discard(actor_id)
        self.last_seen[actor_id] = self._heard[actor_id] = now
        return new

    async def roll_call(self, candidates: list[str], within_s: float) -> list[str]:
        """Before a rendezvous, which candidates show a sign of life (a heartbeat: one every heartbeat
        interval) within `within_s` from now? The rest become suspects — not alive — until they do: a rendezvous
        that named an actor that died a moment ago would wait a whole weight timeout for it."""
        t0 = time.monotonic()
        while True:
            answered = [a for a in candidates if self.last_seen.get(a, -math.inf) > t0]
            if len(answered) == len(candidates) or time.monotonic() - t0 > within_s:
                break
            await asyncio.sleep(0.05)
        missing = set(candidates) - set(answered)
        if missing:
            log.warning("no heartbeat from %s within %.1f s: left out of the weight group until they send one",
                        sorted(missing), within_s)
        self.suspects |= missing
        return sorted(answered)

    def expect(self, version: int, checksum: str, keep: int = 16) -> None:
        """The checksum actors must report for `version` (only the last `keep` versions are kept)."""
        self.expected[version] = checksum
        for v in [v for v in self.expected if v <= version - keep]:
            del self.expected[v]

    def heartbeat(self, hb: wire.Heartbeat) -> bool:
        """Record a heartbeat (weights checksum, counters, error); True if it comes from a new member."""
        new = self.seen(hb.actor_id)
        if hb.checksum and hb.version in self.expected:
            if hb.checksum == self.expected[hb.version]:
                if self.versions.get(hb.actor_id) != hb.version or hb.actor_id in self.bad_weights:
                    self.checksum_ok += 1
                self.bad_weights.pop(hb.actor_id, None)
            elif self.bad_weights.get(hb.actor_id) != hb.version:
                self.checksum_mismatch += 1
                self.bad_weights[hb.actor_id] = hb.version
                self.resync = True  # the owner regroups: the next broadcast sends everyone the weights again
                log.error("actor %s reports weights %s for version %d, expected %s: its groups are refused until "
                          "it holds the right weights; re-broadcasting", hb.actor_id, hb.checksum, hb.version,
                          self.expected[hb.version])
        self.versions[hb.actor_id] = hb.version
        self.joining[hb.actor_id] = (hb.group, time.monotonic())
        self.actor_stats[hb.actor_id] = {**hb.stats, "inflight": hb.inflight, "unacked": hb.unacked}
        if hb.error and self.last_error.get(hb.actor_id) != hb.error:  # each new error once, not every second
            log.warning("actor %s: %s", hb.actor_id, hb.error)
        self.last_error[hb.actor_id] = hb.error
        return new

    def alive(self) -> list[str]:
        now = time.monotonic()
        return sorted(a for a, t in self.last_seen.items()
                      if now - t < self.timeout_s and a not in self.suspects and not self.left_out(a, now))

    def active(self) -> int:
        """Actors that showed a sign of life within `timeout_s` (weight groups or not): who may ask for work."""
        now = time.monotonic()
        return sum(1 for t in self.last_seen.values() if now - t < self.timeout_s)

    def left_out(self, actor_id: str, now: float | None = None) -> bool:
        """Is this actor kept out of weight groups (it failed one and has not both said hello again and
        waited out its back-off)?"""
        now = time.monotonic() if now is None else now
        if now < self.probation.get(actor_id, -math.inf) or now < self.waiting.get(actor_id, -math.inf):
            return True
        if actor_id not in self.shunned:
            return False
        return actor_id not in self.rejoining or now < self.shunned[actor_id]

    def _strike(self, a: str, now: float) -> float:
        """One more failed rendezvous blamed on `a`; returns its back-off (`backoff_s`, doubling, up to 64×)."""
        if a not in self.strikes and len(self.strikes) >= 4 * self.max_actors:  # bounded: oldest goes
            old = next(iter(self.strikes))
            self.strikes.pop(old)
            self.shunned.pop(old, None)
            self.probation.pop(old, None)
            self.rejoining.discard(old)
        k = self.strikes[a] = self.strikes.get(a, 0) + 1
        return now + self.backoff_s * 2 ** min(k - 1, 6)

    def shun_absent(self, group: list[str], name: str, since: float) -> list[str]:
        """After the rendezvous of weight group `name` of `group` failed: the members that showed they live
        after `since` (time enough to have been told of it) but whose heartbeats never named it are left out
        of weight groups — they live and do not join — until they say hello again and a back-off is over:
        `backoff_s` after the first such failure, doubling with each further one (up to 64×), counted per
        actor id until it joins a group that forms (a hello, or a new incarnation, does not reset it). Silent
        ones (dead, stopped) are not left out: the heartbeat timeout evicts them. Returns those left out."""
        absent = sorted(a for a in group if self.last_seen.get(a, -math.inf) > since
                        and self.joining.get(a, ("", 0.0))[0] != name)
        now = time.monotonic()
        for a in absent:
            self.shunned[a] = self._strike(a, now)
            self.rejoining.discard(a)
        return absent

    def hold_out_namers(self, group: list[str], name: str) -> tuple[list[str], list[str]]:
        """After the rendezvous of weight group `name` of `group` failed, its members that still live and named
        it (one of them joined it in name only, or was too slow): which to leave out of the next groups, so
        that such a member does not cost a weight timeout per rendezvous while an honest one is not starved.
        Only when every member named it (none died, stopped or stayed away: that would explain the failure).
        A member is proven by a group that formed with it (since its hello). Among proven and unproven namers
        the unproven are blamed. When none is proven, a lone namer is blamed, and of several the newer half
        (the fewer strikes and the older hello stay) waits out the next rendezvous: if it forms without them
        they come straight back, and the one who fails it with proven members is then blamed. When all are
        proven the failure is forgiven once: they must prove themselves again. A blamed member is left out
        for `backoff_s` (doubling per failure, up to 64×, forgiven when it joins a group that forms) and then
        comes back by itself (no hello needed: an honest slow member keeps heartbeating, never says hello).
        Returns (blamed, waiting)."""
        now = time.monotonic()
        namers = sorted(a for a in group if a in self.last_seen and not self.left_out(a, now)
                        and self.joining.get(a, ("", 0.0))[0] == name)
        if len(namers) < len(group):  # a member that died, stopped or never named it explains the failure
            self.waiting = {}
            return [], []
        unproven = [a for a in namers if a not in self.proven]
        blamed, waiting = [], []
        if unproven and len(unproven) < len(namers):
            blamed = unproven
        elif len(namers) == 1 and unproven:
            blamed = namers
        elif len(namers) > 1 and unproven:
            order = sorted(namers, key=lambda a: (self.strikes.get(a, 0), self.hello_at.get(a, 0.0), a))
            waiting = order[(len(order) + 1) // 2:]
        self.proven -= set(namers)
        self.waiting = {a: now + self.backoff_s for a in waiting}  # a test for one rendezvous, a time bound at most
        for a in blamed:
            self.probation[a] = self._strike(a, now)
        return blamed, waiting

    def joined(self, group: list[str]) -> None:
        """Weight group `group` formed: its members proved they join; their strikes are forgiven."""
        self.group = group
        self.proven |= set(group)
        self.waiting = {}  # the test is over: those held out of it are called again
        for a in group:
            self.shunned.pop(a, None)
            self.strikes.pop(a, None)
            self.probation.pop(a, None)
            self.rejoining.discard(a)

    def drop_silent(self, within_s: float | None = None) -> list[str]:
        """Forget actors silent for `timeout_s` (or `within_s`) or longer (no longer members); returns them."""
        now = time.monotonic()
        limit = self.timeout_s if within_s is None else within_s
        gone = [a for a, t in self.last_seen.items() if now - t >= limit]
        for a in gone:
            del self.last_seen[a]
            self.versions.pop(a, None)
            self.actor_stats.pop(a, None)
            self.last_error.pop(a, None)
            self.suspects.discard(a)
            self.bad_weights.pop(a, None)
            self.joining.pop(a, None)
        return gone

    def needs_sync(self, version: int) -> bool:
        return version > 0 and (self.synced_version < version or self.group != self.alive())


class WeightSync:
    """The learner's side of weight sync, over `members`: announce each version and broadcast it to the live
    actors, regrouping first (a roll call, then a rendezvous) when the membership changed. A failed
    broadcast regroups next time; who failed it is judged here (`Membership.shun_absent`,
    `hold_out_namers`) and the silent are evicted through `evict(within_s)`."""

    def __init__(self, members: Membership, broadcaster: WeightBroadcaster, control: ControlPublisher, *,
                 host: str, heartbeat_s: float, tensor_parallel: int, evict: Callable[[float], None]):
        self.members, self.broadcaster, self.control = members, broadcaster, control
        self.host = host  # where a rendezvous's port is taken
        self.heartbeat_s = heartbeat_s  # transport.heartbeat_interval_s: the roll call's and the failure's clock
        self.tensor_parallel = tensor_parallel  # each worker of a TP engine is a rank of the group (vllm_ext)
        self.evict = evict

    def needed(self, version: int) -> bool:
        """Does a member lack `version`, or has the membership changed since the group formed?"""
        return self.members.needs_sync(version)

    async def publish(self, version: int) -> None:
        """Announce `version` and broadcast it to the live actors, regrouping first if membership changed.
        Nothing to do when every member already has it. A failed broadcast regroups next time."""
        members = self.members
        if not members.needs_sync(version):
            return
        alive = members.alive()
        if alive and members.group != alive:  # a new group: only of actors that show they live
            called, alive = alive, await members.roll_call(alive, 2.5 * self.heartbeat_s)
            log.info("weight group for version %d: %s; missed the roll call: %s", version, alive,
                     sorted(set(called) - set(alive)))
        if not alive:  # nobody to send to: the version is announced, the next member gets it on joining
            self.drop_group()
            members.synced_version = version
            await self.control.publish("version", version=version)
            return
        forming = None  # (group name, when actors were told) while a new group's rendezvous is open
        try:
            if members.group != alive:
                info, offsets = self.broadcaster.rendezvous_info(free_port(self.host),
                                                                 [self.tensor_parallel] * len(alive), names=alive)
                await self.control.publish("weights", rendezvous=info, plan=self.broadcaster.plan.to_dict(),
                                           offsets=dict(zip(alive, offsets)))
                forming = (info["group_name"], time.monotonic())
                await self.broadcaster.open(info)
                forming = None
                members.joined(alive)
            await self.control.publish("version", version=version)
            members.expect(version, await self.broadcaster.broadcast(version))
            members.synced_version = version
        except WeightSyncError as e:
            log.error("weight sync for version %d failed: %s; regrouping with live actors", version, e)
            await self._judge_failure(alive, forming)

    async def _judge_failure(self, alive: list[str], forming: tuple[str, float] | None) -> None:
        """After a failed sync of group `alive` (`forming`: the rendezvous that never formed, if one was
        open): who is left out of the next groups, and the dead evicted; the next broadcast regroups."""
        members, beat = self.members, self.heartbeat_s
        # the group never formed: a member that kept heartbeating without naming it is why (a zombie)
        if forming and (absent := members.shun_absent(alive, forming[0], forming[1] + 2 * beat)):
            log.error("actors %s heartbeat but never named weight group %s: left out of weight groups until "
                      "they say hello again after a back-off (%s)", absent, forming[0],
                      ", ".join(f"{a}: {members.shunned[a] - time.monotonic():.0f} s" for a in absent))
        self.drop_group()
        # a member that died is why it failed: give the living two heartbeats to show themselves and
        # evict the rest now, so the next rendezvous does not wait a whole weight timeout for the dead
        await asyncio.sleep(2 * beat)
        self.evict(1.5 * beat)
        # every member lives and named the group, yet it never formed: one joined in name only (or was slow)
        if forming:
            blamed, waiting = members.hold_out_namers(alive, forming[0])
            if blamed or waiting:
                log.error("weight group %s never formed though every member named it: %s left out of weight "
                          "groups for a back-off (%s), %s out of the next rendezvous only", forming[0],
                          blamed, ", ".join(f"{a}: {members.probation[a] - time.monotonic():.0f} s"
                                            for a in blamed), waiting)

    def drop_group(self) -> None:
        """No weight group any more: the next broadcast forms a new one; nobody is handed the old rendezvous."""
        self.members.group = []
        self.control.weights = {}
