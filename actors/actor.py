"""The actor role: a vLLM `AsyncLLM` kept busy generating groups for the learner.

    asks for work (credits) -> generates N completions per prompt (FINAL_ONLY: one output with all N)
    -> scores them in the verifier pool (off the event loop) -> sends the group (acked, re-sent if lost)

Behaviour log-probs: `logprobs=0` returns the sampled token's log-prob, and the engine runs with
`logprobs_mode="processed_logprobs"`, i.e. after temperature and top-p — the distribution the token was
actually drawn from (μ). The learner scores tokens under softmax(logits / temperature) (top-p stays 1.0
in training), so μ and π_old are compared like for like.

Staleness: the actor never starts a prompt while (latest announced version − own weights version) >
`max_staleness`, and a fresh actor takes no work until its weights are the learner's (version 0 is the
model on disk). On a new version it stops admitting prompts, finishes or aborts what is in flight
(`actor.in_flight_on_update`; aborted prompts go back to the learner), receives the weights, resets the
prefix cache and resumes. Every group carries the version that generated it.

Engine death (the EngineCore process crashed or was killed): the actor rebuilds the engine in place, up
to `actor.max_engine_restarts` times, and reports it (log and heartbeat error): prompts in flight go back
to the learner, the new engine starts from the weights on disk, so the actor says hello again and takes no
work until the learner's next rendezvous has given it the current weights. One death beyond the limit
stops the actor with the error, for its supervisor to restart.

Every background task is named; if one dies the actor stops with its error. SIGTERM drains: no new
work, in-flight groups finish and are acknowledged (bounded), then the engine and the verifier pool shut
down and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from actors.engine import completion_arrays, engine_kwargs, offline_env, sampling_params
from actors.scoring import ScoringPool
from config.schema import BrorlConfig
from transport import wire
from transport.weights import WeightReceiver
from transport.zmq_transport import ActorSockets, Endpoints, Security
from verifiers.registry import BUILTINS, VerifierLoadError, load, run_self_test

log = logging.getLogger("brorl.actor")
FINISH_CODES = {r: i for i, r in enumerate(wire.FINISH_REASONS)}


def endpoints_from(cfg: BrorlConfig, learner_addr: str | None) -> Endpoints:
    """`tcp://HOST:PORT` names the work port; the rollout and control ports follow it (+1, +2)."""
    t = cfg.transport
    if not learner_addr:
        return Endpoints(t.host, t.work_port, t.rollout_port, t.control_port)
    rest = learner_addr.removeprefix("tcp://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--learner must look like tcp://HOST:PORT, got {learner_addr!r}")
    p = int(port)
    return Endpoints(host, p, p + 1, p + 2)


@dataclass
class ActorStats:
    groups_sent: int = 0
    samples: int = 0
    tokens: int = 0
    aborted: int = 0
    updates: int = 0
    idle_weight_s: float = 0.0
    """Seconds the engine had nothing to do because of weights: loading an update (after in-flight work
    finished) or gated by max_staleness while waiting for the next one."""
    update_s: float = 0.0
    idle_s: float = 0.0
    """Seconds the engine had no request at all (any reason: weights, the staleness gate, no work granted
    because the learner's freshness bound was reached, paused), counted from the first weights on."""
    engine_restarts: int = 0
    errors: list[str] = field(default_factory=list)


class Actor:
    def __init__(self, cfg: BrorlConfig, actor_id: str, learner_addr: str | None = None):
        self.cfg = cfg
        self.actor_id = actor_id
        self.endpoints = endpoints_from(cfg, learner_addr)
        self.capacity = cfg.actor.prompts_per_request * 2
        self.version = -1  # weights version; 0 once the learner says its version is 0 (disk weights)
        self.latest = 0
        self.checksum = ""
        self.paused = False
        self.stopping = asyncio.Event()
        self.stats = ActorStats()
        self.paths = dict(BUILTINS)
        self.versions: dict[str, str] = {}
        self.last_error = ""
        self.inflight: dict[str, wire.PromptItem] = {}
        self.generating = 0
        self.returned: list[int] = []
        self._admit = asyncio.Event()
        self._gen_idle = asyncio.Event()
        self._gen_idle.set()
        self._assignments: asyncio.Queue = asyncio.Queue()
        self._update_target: int | None = None
        self._update_event = asyncio.Event()
        self._in_group = False
        self._joining: asyncio.Task | None = None
        self._group_name: str | None = None
        self._learner_stopped = False
        self._fatal: BaseException | None = None
        self._fatal_event = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._restarting: asyncio.Task | None = None
        self._idle_since: float | None = None  # engine without requests since (None: busy or not started)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        offline_env()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.engine = self._make_engine()
        self.receiver = WeightReceiver(self.engine, is_async=True)
        self.pool = ScoringPool(self.cfg.verifiers.workers, self.cfg.verifiers.timeout_s)
        t = self.cfg.transport
        self.sockets = ActorSockets(self.endpoints, self.actor_id, Security(t.curve, t.keys_dir),
                                    t.high_water_mark, max_unacked=64, resend_after_s=10.0)
        try:
            snap = await self.sockets.sync(self.version, timeout_s=120)
            self._apply_snapshot(snap)
            self._idle_since = time.monotonic()  # the idle clock starts with the job
            workers = [self._spawn(c, n) for c, n in (
                (self._inbox_loop(), "inbox"), (self._control_loop(), "control"),
                (self._work_loop(), "work"), (self._weights_loop(), "weights"),
                (self._heartbeat_loop(), "heartbeat"))]
            stop = asyncio.create_task(self.stopping.wait(), name="stop-signal")
            fatal = asyncio.create_task(self._fatal_event.wait(), name="fatal-watch")
            await asyncio.wait([stop, fatal, *workers], return_when=asyncio.FIRST_COMPLETED)
            if self._fatal is not None:
                raise self._fatal
            await self._drain()
            return 0
        finally:
            for task in list(self._tasks):
                task.cancel()
            self.pool.close()
            self.sockets.close()
            self.engine.shutdown()

    def _make_engine(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kw = engine_kwargs(self.cfg.model, self.cfg.actor, seed=self.cfg.run.seed,
                           weight_backend=self.cfg.transport.weight_backend)
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))

    def _engine_dead(self, err: BaseException | None = None) -> bool:
        """True if the engine is gone (and starts its restart, once)."""
        dead = (err is not None and "EngineDead" in type(err).__name__) or bool(getattr(self.engine, "errored", False))
        if dead and self._restarting is None:
            why = f"{type(err).__name__}: {err}" if err is not None else "engine reported errored"
            self._restarting = self._spawn(self._restart_engine(why[:300]), "engine-restart")
        return dead

    async def _restart_engine(self, why: str) -> None:
        """Rebuild a dead engine in place; see the module docstring."""
        limit = self.cfg.actor.max_engine_restarts
        self.stats.engine_restarts += 1
        if self.stats.engine_restarts > limit:
            raise RuntimeError(f"vLLM engine died {self.stats.engine_restarts} times (limit "
                               f"actor.max_engine_restarts = {limit}); last: {why}")
        self.last_error = f"vLLM engine died ({why}); restarting it ({self.stats.engine_restarts}/{limit})"
        log.error(self.last_error)
        self.updating = True  # no generation starts, no weight update runs
        self.version = -1  # the new engine holds the disk weights: no work until the learner's broadcast
        self._in_group = False
        if self._joining is not None:
            self._joining.cancel()
            self._joining = None
        # the weights group we were in (self._group_name) stays "seen", so a snapshot that still carries its
        # rendezvous is not re-joined; the learner forms a new group once it sees our hello
        if self.inflight:
            self.stats.aborted += len(self.inflight)
            try:
                await asyncio.wait_for(self._gen_idle.wait(), 30)  # their generate() calls fail fast
            except asyncio.TimeoutError:
                pass
        try:
            self.engine.shutdown()
        except Exception as e:  # a dead engine may not shut down cleanly; its processes are gone anyway
            log.warning("shutting down the dead engine: %s", e)
        t0 = time.monotonic()
        self.engine = await asyncio.to_thread(self._make_engine)
        self.receiver = WeightReceiver(self.engine, is_async=True)
        returned, self.returned = self.returned, []
        await self.sockets.work.send(wire.WorkRequest(self.actor_id, 0, self.version, returned))
        await self.sockets.work.send(wire.Hello(self.actor_id, self.version, uuid.uuid4().hex))
        self.updating = False
        self._restarting = None
        log.info("vLLM engine restarted in %.1f s; waiting for the current weights", time.monotonic() - t0)

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=f"{self.actor_id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._fatal is None:
            self._fatal = RuntimeError(f"task {task.get_name()} died: {task.exception()!r}")
            self._fatal.__cause__ = task.exception()
            self._fatal_event.set()

    async def _drain(self, timeout_s: float = 60.0) -> None:
        """No new work; wait for in-flight groups to be generated, sent and acknowledged."""
        self.paused = True
        if self._learner_stopped:
            timeout_s = 3.0  # unacknowledged groups are regenerated after a resume: don't wait for acks
        deadline = time.monotonic() + timeout_s
        while (self.inflight or self.sockets.rollouts.unacked) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if self.inflight:
            await self.sockets.work.send(wire.WorkRequest(self.actor_id, 0, self.version,
                                                          [i.prompt_id for i in self.inflight.values()]))

    # ------------------------------------------------------------------ control
    def _apply_snapshot(self, snap: wire.Snapshot) -> None:
        self.latest = snap.version
        self.paused = snap.paused
        if snap.version == 0 and self.version < 0:
            self.version = 0  # the learner has not trained yet: the weights on disk are version 0
        for name, path in snap.verifiers.items():
            self._swap(name, path)
        if snap.weights:  # a rendezvous published while we were joining: it may be waiting for us
            self._on_weights(snap.weights)

    def _on_weights(self, payload: dict) -> None:
        offsets = payload.get("offsets", {})
        group = payload.get("rendezvous", {}).get("group_name")
        if group is not None and group == self._group_name:
            return  # already joined (or joining) this group
        self._in_group = False
        if self.actor_id in offsets:
            self._group_name = group
            self._joining = self._spawn(self._join(payload["rendezvous"], int(offsets[self.actor_id]),
                                                   payload["plan"]), "weights-join")

    def _swap(self, name: str, path: str) -> None:
        try:
            v = load(path)
            run_self_test(v)
        except VerifierLoadError as e:
            self.last_error = f"swap {name} -> {path} rejected: {e}"
            log.error(self.last_error)
            return
        self.paths[name] = path
        self.versions[name] = v.version
        log.info("verifier %s is now %s (version %s)", name, path, v.version)

    def verifier_version(self, name: str) -> str:
        if name not in self.versions:
            self.versions[name] = load(self.paths[name]).version
        return self.versions[name]

    async def _control_loop(self) -> None:
        while True:
            msg = await self.sockets.control.recv()
            if msg.kind == "version":
                self.latest = int(msg.payload["version"])
                if self._in_group or self._joining is not None:  # the learner broadcasts to our group
                    self._update_target = self.latest
                    self._update_event.set()
            elif msg.kind == "weights":
                self._on_weights(msg.payload)
            elif msg.kind == "swap":
                self._swap(msg.payload["name"], msg.payload["path"])
            elif msg.kind in ("pause", "resume"):
                self.paused = msg.kind == "pause"
            elif msg.kind == "stop":  # the learner is finishing: nothing more will be acknowledged
                self._learner_stopped = True
                self.stopping.set()

    async def _join(self, info: dict, offset: int, plan: dict) -> None:
        """Join a weight group. A failed join is reported, not fatal: the learner's side of the same
        rendezvous fails too, and it regroups with a fresh rendezvous."""
        try:
            if self._restarting is not None:  # join with the new engine, not the dead one
                await asyncio.wait([self._restarting])
            await self.receiver.join(info, offset, plan)
            self._in_group = True
        except Exception as e:
            self.last_error = f"joining weight group {info.get('group_name')} failed: {type(e).__name__}: {e}"
            log.error(self.last_error)
            self._engine_dead(e)
        finally:
            if self._joining is asyncio.current_task():
                self._joining = None

    async def _weights_loop(self) -> None:
        while True:
            await self._update_event.wait()
            self._update_event.clear()
            target = self._update_target
            t0 = time.monotonic()
            self.updating = True  # from here no new generation starts (see _group)
            if self._joining is not None:  # the version may arrive before our join call returned
                await asyncio.wait([self._joining])  # (never raises, even if a restart cancelled it)
            if self.cfg.actor.in_flight_on_update == "abort":
                ids = [rid for rid in self.inflight]
                if ids:
                    await self.engine.abort(ids)
            await self._gen_idle.wait()  # in-flight generation finished (or aborted)
            t_idle = time.monotonic()  # from here the engine has nothing to do until the weights are in
            try:
                if self._restarting is not None:
                    raise RuntimeError("the engine is being restarted")
                self.version, self.checksum = await self.receiver.receive(target)
            except Exception as e:  # the learner's side failed or timed out: wait for a new rendezvous
                self._engine_dead(e)
                self.last_error = f"weight update to version {target} failed: {type(e).__name__}: {e}"
                log.error(self.last_error)
                self._in_group = False
            else:
                await self.engine.reset_prefix_cache()
            if self._restarting is None:
                self.updating = False
            self.stats.updates += 1
            self.stats.idle_weight_s += time.monotonic() - t_idle
            self.stats.update_s += time.monotonic() - t0

    updating = False

    def _may_admit(self) -> bool:
        if self.paused or self.updating or self.stopping.is_set() or self.version < 0:
            return False
        return self.latest - self.version <= self.cfg.learner.max_staleness

    # ------------------------------------------------------------------ work
    async def _inbox_loop(self) -> None:
        while True:
            msg = await self.sockets.work.recv()
            if isinstance(msg, wire.WorkAssignment):
                await self._assignments.put(msg)
            elif isinstance(msg, wire.GroupAck):
                self.sockets.rollouts.ack(msg.group_ids)
            elif isinstance(msg, wire.Snapshot):
                self._apply_snapshot(msg)

    async def _work_loop(self) -> None:
        while not self.stopping.is_set():
            free = self.capacity - len(self.inflight)
            if not self._may_admit() or free < self.cfg.actor.prompts_per_request:
                t = time.monotonic()
                await asyncio.sleep(0.02)
                if self.generating == 0 and not self.updating and self.version >= 0 and not self.paused and \
                        self.latest - self.version > self.cfg.learner.max_staleness:
                    self.stats.idle_weight_s += time.monotonic() - t  # gated by staleness, engine empty
                continue
            returned, self.returned = self.returned, []
            await self.sockets.work.send(wire.WorkRequest(self.actor_id, free, self.version, returned))
            try:
                assign = await asyncio.wait_for(self._assignments.get(), 5.0)
            except asyncio.TimeoutError:
                continue
            if not assign.items:
                await asyncio.sleep(0.1)
            for item in assign.items:
                rid = f"{self.actor_id}-{item.prompt_id}-{uuid.uuid4().hex[:8]}"
                self.inflight[rid] = item
                self._spawn(self._group(rid, item), f"group-{item.prompt_id}")

    async def _group(self, rid: str, item: wire.PromptItem) -> None:
        """One prompt end to end. Whatever fails, the prompt is either sent as a group or handed back."""
        try:
            await self._generate_score_send(rid, item)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self._engine_dead(e):  # the engine is gone: it is being rebuilt; the prompt goes back
                self.returned.append(item.prompt_id)
                return
            self.last_error = f"prompt {item.prompt_id}: {type(e).__name__}: {e}"
            log.exception("group for prompt %d failed; handing the prompt back", item.prompt_id)
            self.returned.append(item.prompt_id)
        finally:
            self.inflight.pop(rid, None)

    async def _generate_score_send(self, rid: str, item: wire.PromptItem) -> None:
        from vllm.sampling_params import RequestOutputKind

        a = self.cfg.actor
        while self.updating or self.version < 0:  # never generate while weights are being loaded (or
            await asyncio.sleep(0.01)  # before a rebuilt engine has the learner's weights)
        version = self.version  # no await between this check and generating += 1: atomic in asyncio
        t0 = time.monotonic()
        if self.generating == 0 and self._idle_since is not None:
            self.stats.idle_s += t0 - self._idle_since
            self._idle_since = None
        self.generating += 1
        self._gen_idle.clear()
        final = None
        try:
            sp = sampling_params(a, output_kind=RequestOutputKind.FINAL_ONLY)
            async for out in self.engine.generate(item.prompt, sp, rid):
                final = out
        finally:
            self.generating -= 1
            if self.generating == 0:
                self._gen_idle.set()
                self._idle_since = time.monotonic()
        outs = final.outputs if final is not None else []
        if len(outs) != a.n_samples or any(o.finish_reason == "abort" for o in outs):
            self.stats.aborted += 1
            self.returned.append(item.prompt_id)  # back to the learner, not lost
            self.inflight.pop(rid, None)
            return
        t1 = time.monotonic()
        path = self.paths.get(item.verifier)
        if path is None:
            scored = None
        else:
            scored = await self.pool.score(path, self.verifier_version(item.verifier), [o.text for o in outs],
                                           item.reference)
        if scored is None or (self.cfg.verifiers.on_error == "drop"
                              and any(s.result.reason in ("timeout", "worker crashed") or
                                      s.result.reason.startswith("error") for s in scored)):
            self.stats.errors.append(f"prompt {item.prompt_id}: verifier failure, group dropped")
            self.inflight.pop(rid, None)
            return
        lengths, tokens, logps = completion_arrays(outs)
        group = wire.RolloutGroup(
            group_id=self.sockets.rollouts.next_group_id(), prompt_id=item.prompt_id, actor_id=self.actor_id,
            policy_version=version, verifier=item.verifier, verifier_version=scored[0].version,
            prompt_ids=np.asarray(final.prompt_token_ids, dtype=np.int32), lengths=lengths, tokens=tokens,
            logprobs=logps, rewards=np.array([s.result.reward for s in scored], np.float32),
            correct=np.array([s.result.correct for s in scored], np.uint8),
            finish=np.array([FINISH_CODES.get(o.finish_reason or "stop", 0) for o in outs], np.uint8),
            timings={"generate": t1 - t0, "score": time.monotonic() - t1},
            reasons=[s.result.reason for s in scored],
        )
        await self.sockets.rollouts.send(group)
        self.inflight.pop(rid, None)
        self.stats.groups_sent += 1
        self.stats.samples += group.n
        self.stats.tokens += int(lengths.sum())

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self._restarting is None:
                self._engine_dead()  # an engine that died while idle is noticed here
            await self.sockets.rollouts.resend_stale()
            st = self.stats
            await self.sockets.work.send(wire.Heartbeat(
                self.actor_id, self.version, len(self.inflight), len(self.sockets.rollouts.unacked),
                self.checksum, {n: f"{self.paths[n]}@{v}" for n, v in self.versions.items()}, self.last_error,
                {"samples": st.samples, "tokens": st.tokens, "groups_sent": st.groups_sent, "aborted": st.aborted,
                 "updates": st.updates, "engine_restarts": st.engine_restarts, "idle_s": self.idle_s(),
                 "idle_weight_s": st.idle_weight_s}))

    def idle_s(self) -> float:
        """Engine idle seconds so far, the current idle stretch included."""
        now = time.monotonic()
        return self.stats.idle_s + (now - self._idle_since if self._idle_since is not None and self.generating == 0 else 0.0)


def main(cfg: BrorlConfig, actor_id: str, learner_addr: str | None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(Actor(cfg, actor_id, learner_addr).run())
