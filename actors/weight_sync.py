"""What an actor knows about its weights, as one state machine.

    NO_WEIGHTS ──(learner at version 0, or a broadcast received)──> READY ──(version announced to our group)──> UPDATING
        ^                                                             ^                                          │
        │                                                             └────────────(received, checksummed)───────┘
        └───(engine rebuilt: disk weights)── RESTARTING <──(engine died, from any state)
    A failed receive leaves the engine's weights unknown: NO_WEIGHTS until the learner's next broadcast; so
    does a restarted learner (its checkpoint's weights are not the ones the actor holds).

`WeightSync` owns the version and checksum of the loaded weights, the learner's latest version, the
weight group the actor is in (or joining), and the receive itself (through a `WeightReceiver`). It decides
whether a new prompt may start (`may_admit`): only in READY, and only while the weights are at most
`max_staleness` versions behind the learner. It knows nothing of vLLM beyond the receiver it is given,
so its rules are unit-tested without an engine.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Any, Callable, Coroutine

from transport.staleness import fresh

log = logging.getLogger("brorl.actor")


class SyncState(enum.Enum):
    NO_WEIGHTS = "no weights"
    """The engine's weights are not (or no longer) known to be the learner's: take no work."""
    READY = "ready"
    """Weights of `version` are loaded; prompts may start (subject to the staleness bound)."""
    UPDATING = "updating"
    """A broadcast is being received: no prompt starts until it is in."""
    RESTARTING = "restarting"
    """The engine died and is being rebuilt."""


class WeightSync:
    def __init__(self, actor_id: str, max_staleness: int, receiver,
                 spawn: Callable[[Coroutine, str], asyncio.Task]):
        self.actor_id = actor_id
        self.max_staleness = max_staleness
        self.receiver = receiver
        self._spawn = spawn
        self.state = SyncState.NO_WEIGHTS
        self.version = -1
        """Version of the loaded weights; -1 while unknown."""
        self.latest = 0
        """The learner's latest announced version."""
        self.checksum = ""
        self.error = ""
        """The last join or receive failure, for the heartbeat."""
        self._group: str | None = None  # the weight group joined (or being joined)
        self._in_group = False
        self._joining: asyncio.Task | None = None
        self._target: int | None = None
        self._announced = asyncio.Event()
        self._engine_up = asyncio.Event()  # cleared while the engine is rebuilt: joins wait for the new one
        self._engine_up.set()

    # ------------------------------------------------------------------ what the learner says
    def on_snapshot(self, version: int) -> None:
        self.latest = version
        if version == 0 and self.state is SyncState.NO_WEIGHTS:
            self._ready(0)  # the learner has not trained yet: the weights on disk are version 0

    def on_version(self, version: int) -> None:
        self.latest = version
        if self._in_group or self._joining is not None:  # the learner broadcasts to our group
            self._target = version
            self._announced.set()

    def on_rendezvous(self, payload: dict[str, Any]) -> None:
        """A new weight group: join it if we are named in it (once per group)."""
        offsets = payload.get("offsets", {})
        group = payload.get("rendezvous", {}).get("group_name")
        if group is not None and group == self._group:
            return
        self._in_group = False
        if self.actor_id in offsets:
            self._group = group
            self._joining = self._spawn(self._join(payload["rendezvous"], int(offsets[self.actor_id]),
                                                   payload["plan"]), "weights-join")

    # ------------------------------------------------------------------ questions
    @property
    def group(self) -> str:
        """The weight group we were named in and joined or are joining ("" before any): in heartbeats."""
        return self._group or ""

    def may_admit(self) -> bool:
        """May a new prompt start now? Only with known weights not more than max_staleness behind."""
        return self.state is SyncState.READY and fresh(self.latest, self.version, self.max_staleness)

    def has_weights(self) -> bool:
        """Known weights loaded and no update running: a prompt already admitted may generate."""
        return self.state is SyncState.READY

    def gated_by_staleness(self) -> bool:
        """Ready, but too far behind the learner to start anything: waiting for a broadcast."""
        return self.state is SyncState.READY and not fresh(self.latest, self.version, self.max_staleness)

    # ------------------------------------------------------------------ updates
    async def next_update(self) -> int:
        """Wait for a version announced to our group; the caller then runs `receive`."""
        await self._announced.wait()
        self._announced.clear()
        return self._target

    async def receive(self, target: int) -> None:
        """Load the broadcast of `target` (the state is UPDATING meanwhile). Raises on failure, leaving the
        weights unknown (NO_WEIGHTS), unless the engine is being restarted (RESTARTING stays)."""
        if self.state is SyncState.RESTARTING:
            self.error = f"weight update to version {target} skipped: the engine is being restarted"
            raise RuntimeError(self.error)
        self.state = SyncState.UPDATING
        if self._joining is not None:  # the version may arrive before our join call returned
            await asyncio.wait([self._joining])  # (never raises, even if a restart cancelled it)
        try:
            if self.state is SyncState.RESTARTING:
                raise RuntimeError("the engine is being restarted")
            version, checksum = await self.receiver.receive(target)
        except BaseException as e:
            self._in_group = False
            if self.state is not SyncState.RESTARTING:
                self.state, self.version = SyncState.NO_WEIGHTS, -1
            self.error = f"weight update to version {target} failed: {type(e).__name__}: {e}"
            raise
        self.checksum = checksum
        self._ready(version)

    def begin_update(self) -> None:
        """From now no new prompt starts (called before in-flight work drains)."""
        if self.state is SyncState.READY:
            self.state = SyncState.UPDATING

    async def _join(self, info: dict, offset: int, plan: dict) -> None:
        """A failed join is reported, not fatal: the learner's side of the same rendezvous fails too, and
        it regroups with a fresh rendezvous."""
        try:
            await self._engine_up.wait()  # join with the new engine, not the dead one
            await self.receiver.join(info, offset, plan)
            self._in_group = True
        except Exception as e:
            self.error = f"joining weight group {info.get('group_name')} failed: {type(e).__name__}: {e}"
            log.error(self.error)
        finally:
            if self._joining is asyncio.current_task():
                self._joining = None

    # ------------------------------------------------------------------ the engine's life
    def engine_restarting(self) -> None:
        """The engine died: whatever it held is gone, and so is our place in the weight group. The group's
        name stays known, so a snapshot that still carries its rendezvous is not re-joined."""
        self.state, self.version = SyncState.RESTARTING, -1
        self._in_group = False
        self._engine_up.clear()
        if self._joining is not None:
            self._joining.cancel()
            self._joining = None

    def learner_restarted(self) -> None:
        """A new learner process (resumed from a checkpoint): our weights and version belong to the old one,
        and so does our weight group. No work until the new learner's broadcast."""
        self.state, self.version, self.checksum = (
            SyncState.RESTARTING if self.state is SyncState.RESTARTING else SyncState.NO_WEIGHTS), -1, ""
        self.latest = 0
        self._group, self._in_group = None, False
        if self._joining is not None:
            self._joining.cancel()
            self._joining = None

    def engine_restarted(self, receiver) -> None:
        """A new engine with the weights on disk: no work until the learner's broadcast (or its version 0)."""
        self.receiver = receiver
        self.state = SyncState.NO_WEIGHTS
        self._engine_up.set()

    def _ready(self, version: int) -> None:
        self.version = version
        self.state = SyncState.READY
