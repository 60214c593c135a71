"""The actor role: a vLLM `AsyncLLM` kept busy generating groups for the learner.

    asks for work (credits) -> generates N completions per prompt (FINAL_ONLY: one output with all N)
    -> scores them in the verifier pool (off the event loop) -> sends the group (acked, re-sent if lost)

Named loops (inbox, control, work, weights, heartbeat) over collaborators: `WeightSync` (weights' version
and state, weight group, receive; `may_admit`), `EngineSupervisor` (engine creation, death, restart budget),
`verifiers.registry.Registry` (self-tested hot swaps) and `GroupPipeline` (one prompt: generate, score,
send). A dead engine is rebuilt in place; a restarted learner (a new epoch) is rejoined: the actor drops what
belonged to the old one and waits for the new one's weights. If a background task dies the actor stops with
its error. SIGTERM drains: no new work, in-flight groups finish and are acknowledged (bounded), then engine
and verifier pool end (before the learner answered the first hello: at once); nothing under the actor lives on."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid

from actors.engine import make_async_engine, offline_env
from actors.in_flight import InFlightPolicy, TokenVersions
from actors.pipeline import GroupPipeline
from actors.scoring import ScoringPool
from actors.stats import ActorStats, EngineLoad
from actors.supervisor import EngineSupervisor
from actors.tasks import TaskSet, unless
from actors.verifier_set import ActorRefused, ActorVerifiers
from actors.weight_sync import WeightSync
from config.schema import BrorlConfig
from transport import events, wire
from transport.weights import WeightReceiver
from transport.zmq_transport import ActorSockets, Endpoints, Security

log = logging.getLogger("brorl.actor")


class Actor:
    def __init__(self, cfg: BrorlConfig, actor_id: str, endpoints: Endpoints):
        self.cfg, self.actor_id, self.endpoints = cfg, actor_id, endpoints
        self.capacity = cfg.actor.prompts_per_request * 2
        self.paused = False
        self.stopping = asyncio.Event()
        self.stats = ActorStats()
        self.load = EngineLoad()
        self.checked = ActorVerifiers(cfg)
        self.verifiers = self.checked.registry
        self.last_error = ""
        self.inflight: dict[str, wire.PromptItem] = {}  # request id -> prompt
        self.returned: list[int] = []  # prompt ids to hand back with the next request
        self.tasks = TaskSet(actor_id)
        self.supervisor = EngineSupervisor(lambda: make_async_engine(cfg, self.stats.gauge), cfg.actor.max_engine_restarts,
                                           self.tasks.spawn, self._engine_down, self._engine_up)
        self.sync = WeightSync(actor_id, cfg.job.max_staleness, None, self.tasks.spawn)
        self.versions = TokenVersions()  # each in-flight request's token versions (in_flight_on_update "keep")
        self._assignments: asyncio.Queue[wire.WorkAssignment] = asyncio.Queue()
        self._learner_stopped = False
        self.learner_epoch = ""  # the learner process we work for (from its snapshots and control messages)

    async def run(self) -> int:
        offline_env()
        await self.checked.self_test()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        events.emit("phase", f"starting its vLLM engine ({self.cfg.model.path}: loads the model, compiles it and "
                             "captures CUDA graphs on a GPU)")
        t0 = time.monotonic()
        self.sync.receiver = WeightReceiver(self.supervisor.start(), is_async=True)
        events.emit("phase", f"engine ready in {time.monotonic() - t0:.0f} s")
        self.pool = ScoringPool(self.cfg.verifiers.workers, self.cfg.verifiers.timeout_s)
        self.in_flight_policy = InFlightPolicy(self.cfg, self.supervisor, self.sync, self.load, self.stats,
                                               self.versions, self._error)
        await self.in_flight_policy.track(self.supervisor.engine)
        self.pipeline = GroupPipeline(self.cfg, self.actor_id, self.supervisor, self.sync, self.load, self.pool,
                                      self.verifiers, self.stats, self.versions)
        t = self.cfg.transport
        self.sockets = ActorSockets(self.endpoints, self.actor_id, Security(t.curve, t.keys_dir),
                                    t.high_water_mark, max_unacked=64, resend_after_s=10.0)
        try:
            if (snap := await unless(self.stopping, self.sockets.sync(self.sync.version, timeout_s=120))) is None:
                return 0
            await asyncio.gather(*self.apply_snapshot(snap))
            self.load.start_clock()  # the idle clock starts with the job
            for name in ("inbox", "control", "work", "weights", "heartbeat"):
                self.tasks.spawn(getattr(self, f"_{name}_loop")(), name)
            watch = [self.tasks.spawn(self.stopping.wait(), "stop-signal"),
                     self.tasks.spawn(self.tasks.failed.wait(), "fatal-watch")]
            await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            if self.tasks.error is not None:
                raise self.tasks.error
            await self._drain()
            return 0
        finally:  # tasks, scoring workers and sockets; then the engine and whatever still runs under this process
            self.supervisor.end(first=(self.tasks.cancel_all, self.pool.close, self.sockets.close))

    async def _drain(self, timeout_s: float = 60.0) -> None:
        """No new work; wait for in-flight groups to be generated, sent and acknowledged (not long if the
        learner said stop: it acknowledges nothing more, and a resume regenerates them)."""
        self.paused = True
        deadline = time.monotonic() + (3.0 if self._learner_stopped else timeout_s)
        while (self.inflight or self.sockets.rollouts.unacked) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.inflight:
            await self._request(0, [i.prompt_id for i in self.inflight.values()])

    async def _engine_down(self, why: str) -> None:
        """The engine died: no generation, no weights, until the rebuilt one has the learner's weights."""
        self.last_error = why
        events.emit("error", why, "if it keeps dying, see the actor's log (actor.max_engine_restarts bounds this)")
        self.sync.engine_restarting()
        if self.inflight:  # their generate() calls fail fast; each hands its prompt back
            self.stats.aborted += len(self.inflight)
            try:
                await asyncio.wait_for(self.load.idle.wait(), 30)
            except asyncio.TimeoutError:
                pass

    async def _engine_up(self, engine) -> None:
        self.stats.engine_restarts = self.supervisor.restarts
        await self.in_flight_policy.track(engine)
        self.sync.engine_restarted(WeightReceiver(engine, is_async=True))
        await self._request(0, [])  # hand back what the dead engine had in flight
        await self.sockets.work.send(self.sockets.hello(self.sync.version))

    def _learner_restarted(self, epoch: str) -> None:
        """A new learner process (resumed): drop what was the old one's (weights, weight group, unacked and
        in-flight groups, prompts to hand back) and say hello, so the new one sends its state and weights."""
        self._error(f"learner restarted (epoch {self.learner_epoch} -> {epoch}); rejoining")
        self.sync.learner_restarted()
        self.pipeline.era += 1
        self.sockets.rollouts.forget_unacked()
        self.returned.clear()
        if self.inflight:
            self.tasks.spawn(self.supervisor.engine.abort(list(self.inflight)), "abort-old-epoch")
        self.tasks.spawn(self.sockets.work.send(self.sockets.hello(-1)), "rejoin-hello")

    def may_admit(self) -> bool:
        return not (self.paused or self.stopping.is_set()) and self.sync.may_admit()

    def _check_epoch(self, epoch: str) -> None:
        if self.learner_epoch and epoch != self.learner_epoch:
            self._learner_restarted(epoch)
        self.learner_epoch = epoch

    def apply_snapshot(self, snap: wire.Snapshot) -> list[asyncio.Task]:
        """Adopt the learner's control state; returns the verifier swaps it started (tasks)."""
        self._check_epoch(snap.epoch)
        self.sockets.control.adopt(snap)
        self.paused = snap.paused
        self.sync.on_snapshot(snap.version)
        swaps = [self.tasks.spawn(self.swap_verifier(name, path), f"swap-{name}")
                 for name, path in snap.verifiers.items() if self.verifiers.path(name) != path]
        if snap.weights:  # a rendezvous published while we were joining: it may be waiting for us
            self.sync.on_rendezvous(snap.weights)
        return swaps + [self.tasks.spawn(self.in_flight_policy.learner_computes(snap.computing), "compute")]

    async def swap_verifier(self, name: str, path: str) -> bool:
        """Replace (or add) a verifier (`ActorVerifiers.swap`), or keep the old one and say why (log, heartbeat)."""
        error = await self.checked.swap(name, path)
        return not (error and self._error(error))

    def _error(self, text: str) -> str:
        """An error worth the log and the learner's (the next heartbeat carries it)."""
        self.last_error = text
        log.error(text)
        return text

    async def _control_loop(self) -> None:
        while True:
            msg = await self.sockets.control.recv()
            if msg.kind != "sync_ack":
                self._check_epoch(msg.epoch)
            if msg.kind == "version":
                self.sync.on_version(int(msg.payload["version"]))
            elif msg.kind == "weights":
                self.sync.on_rendezvous(msg.payload)
            elif msg.kind == "swap":
                self.tasks.spawn(self.swap_verifier(msg.payload["name"], msg.payload["path"]), "swap")
            elif msg.kind in ("pause", "resume"):
                self.paused = msg.kind == "pause"
            elif msg.kind == "compute":  # in order with "version": a step's hold ends with its weights
                await self.in_flight_policy.learner_computes(int(msg.payload["step"]))
            elif msg.kind == "stop":  # the learner is finishing: nothing more will be acknowledged
                self._learner_stopped = True
                self.stopping.set()

    async def _weights_loop(self) -> None:
        while True:
            await self.in_flight_policy.apply(await self.sync.next_update(), self.inflight)

    async def _request(self, credits: int, returned: list[int]) -> None:
        returned, self.returned = self.returned + returned, []
        await self.sockets.work.send(wire.WorkRequest(self.actor_id, credits, self.sync.version, returned))

    async def _inbox_loop(self) -> None:
        while True:
            msg = await self.sockets.work.recv()
            if isinstance(msg, wire.WorkAssignment):
                await self._assignments.put(msg)
            elif isinstance(msg, wire.GroupAck):
                self.sockets.rollouts.ack(msg.group_ids)
                for gid, why in self.sockets.rollouts.reject(msg.rejected).items():  # dropped, never re-sent
                    self.stats.rejected += 1
                    self._error(f"group {gid} rejected by the learner: {why}")
            elif isinstance(msg, wire.Snapshot):
                self.apply_snapshot(msg)
                if msg.hello_needed:  # the learner forgot us (e.g. we were stopped for long): rejoin
                    await self.sockets.work.send(self.sockets.hello(self.sync.version))

    async def _work_loop(self) -> None:
        while not self.stopping.is_set():
            free = self.capacity - len(self.inflight)
            if not self.may_admit() or free < self.cfg.actor.prompts_per_request:
                t = time.monotonic()
                await asyncio.sleep(0.02)
                if self.load.generating == 0 and not self.paused and self.sync.gated_by_staleness():
                    self.stats.idle_weight_s += time.monotonic() - t  # gated by staleness, engine empty
                continue
            await self._request(free, [])
            try:
                assign = await asyncio.wait_for(self._assignments.get(), 5.0)
            except asyncio.TimeoutError:
                continue
            await asyncio.sleep(0 if assign.items else 0.1)
            for item in assign.items:
                rid = f"{self.actor_id}-{item.prompt_id}-{uuid.uuid4().hex[:8]}"
                self.inflight[rid] = item
                self.tasks.spawn(self._group(rid, item), f"group-{item.prompt_id}")

    async def _group(self, rid: str, item: wire.PromptItem) -> None:
        """One prompt end to end. Whatever fails, the prompt is either sent as a group or handed back."""
        try:
            await self.checked.ensure(item.verifier)  # a verifier first named by a file's prompt: self-tested now
            if not await self.pipeline.run(rid, item, self.sockets.rollouts):
                self.returned.append(item.prompt_id)
        except asyncio.CancelledError:
            raise
        except ActorRefused as e:  # this actor cannot score the job's tasks: it stops, loudly (EXIT_REFUSED)
            self.returned.append(item.prompt_id)
            self.tasks.fail(e)
        except Exception as e:
            if not self.supervisor.check(e):  # a dead engine is being rebuilt; anything else is logged
                self.last_error = f"prompt {item.prompt_id}: {type(e).__name__}: {e}"
                log.exception("group for prompt %d failed; handing the prompt back", item.prompt_id)
            self.returned.append(item.prompt_id)
        finally:
            self.inflight.pop(rid, None)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.transport.heartbeat_interval_s)
            if not self.supervisor.rebuilding:
                self.supervisor.check()  # an engine that died while idle is noticed here
            await self.sockets.rollouts.resend_stale()
            await self.sockets.resync_if_lost(self.sync.version)  # lost control messages: a new snapshot
            await self.sockets.work.send(wire.Heartbeat(
                self.actor_id, self.sync.version, len(self.inflight), len(self.sockets.rollouts.unacked),
                self.sync.checksum, self.verifiers.in_force(), self.last_error,
                self.stats.heartbeat(self.load.idle_s(), self.load.held_s()), self.sync.group))


def main(cfg: BrorlConfig, actor_id: str, endpoints: Endpoints) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(Actor(cfg, actor_id, endpoints).run())
