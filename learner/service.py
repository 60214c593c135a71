"""The learner service (asyncio): the diagram of shared design as a loop.

    dispatcher (data cursor, credits) ─┐
    rollout receiver ── admit (staleness) → dynamic sampling → batch of B groups
                                     → advantages → PPO + TIS → version + 1 → broadcast → checkpoint

`LearnerService.train` is the top-level loop. The policy version is the trainer's step (one source of
truth). The dispatcher (work socket) and the rollout receiver are named background tasks; if either dies,
`run` stops with its error instead of hanging. `state_dict` / `load_state_dict` are what a checkpoint
holds; the `Checkpointer` only writes and reads the files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path

from config.schema import BrorlConfig
from learner.admin import AdminDesk
from learner.batching import Admission, Batch, Batcher, Dispatcher, Membership, TaskStream
from learner.diagnose import why_no_batch
from learner.heldout import HeldoutEstimate
from learner.checkpoint import Checkpointer, rng_state, set_rng_state
from learner.metrics import ACTOR_COUNTERS, MetricsWriter, open_append
from learner.ranks import Ranks, build_trainer, follow, join_ranks
from learner.report import StepReport
from learner.train_step import TrainGroup
from learner.validation import GroupValidator, identity_problem
from taskdata import PromptRenderer
from transport import wire
from transport.weights import WeightBroadcaster, WeightSyncError, free_port
from transport.zmq_transport import Endpoints, LearnerSockets, Peer, Security

log = logging.getLogger("brorl.learner")


class NonFiniteTraining(RuntimeError):
    """`learner.max_nonfinite_steps` steps in a row changed nothing because of non-finite values."""


def main(cfg: BrorlConfig, resume: bool) -> int:
    """One learner rank: rank 0 (or the only one) serves; with `learner.devices` > 1 the others follow."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg, ranks = join_ranks(cfg)
    code = asyncio.run(LearnerService(cfg, resume=resume, ranks=ranks).run()) if ranks.rank == 0 else follow(cfg, ranks)
    ranks.close()
    return code


class LearnerService:
    def __init__(self, cfg: BrorlConfig, *, resume: bool = False, ranks: Ranks | None = None):
        self.cfg, self.ranks = cfg, ranks or Ranks()
        self.ckpt = Checkpointer(cfg.run.run_dir, keep=cfg.learner.checkpoint_keep)
        self.ckpt.clean_leftovers()
        saved = self.ckpt.latest() if resume else None
        if saved is not None and int(saved.meta.get("ranks", 1)) != self.ranks.world:
            raise ValueError(f"checkpoint {saved.path} was written by {saved.meta.get('ranks', 1)} learner ranks; "
                             f"resume it with learner.devices = {saved.meta.get('ranks', 1)} (now "
                             f"{self.ranks.world}): the optimizer state is sharded by rank")
        self.ranks.command("start", [(str(saved.path), saved.step) if saved else ("", 0)] * self.ranks.world)
        self.trainer, self.tokenizer = build_trainer(cfg, saved.model_dir if saved else cfg.model.path, self.ranks)
        model = self.trainer.model
        self.serving_dtype = self.trainer.compute_dtype  # model.dtype: what the actors serve
        self.renderer = PromptRenderer(self.tokenizer, cfg.data, max_prompt_tokens=cfg.actor.max_model_len - 1)
        self.dispatcher = Dispatcher(cfg, TaskStream(cfg, self.renderer))  # prompts rendered: chat template, ids
        self.admission = Admission(cfg.learner.max_staleness)
        self.batcher = Batcher(cfg.learner.prompts_per_step, cfg.learner.dynamic_sampling, self.admission,
                               lambda pids: self.take_back(pids, None, "stale", holder=False))
        t = cfg.transport
        self.members = Membership(t.heartbeat_timeout_s, t.max_actors)
        self.validator = GroupValidator(cfg, model.get_input_embeddings().num_embeddings)
        self._admin_tasks: set[asyncio.Task] = set()
        if saved is not None:
            self.load_state_dict(self.ckpt.load(saved))
            log.info("resumed from %s: step %d, version %d, cursor %d", saved.path, self.trainer.state.step,
                     self.version, self.dispatcher.cursor)
        a = cfg.actor
        self.sockets = LearnerSockets(self.endpoints_of(cfg), Security(t.curve, t.keys_dir), t.high_water_mark,
                                      wire.max_frame_bytes(a.n_samples, a.max_tokens, a.max_model_len))
        self.sockets.control.version = self.version
        self.desk = AdminDesk(cfg, self.sockets.control,
                              lambda: f"step {self.version}, version {self.version}, actors {self.members.alive()}")
        self.broadcaster = WeightBroadcaster(lambda: self.ranks.shapes(self.trainer), dtype=self.serving_dtype,
                                             bucket_mb=t.weight_bucket_mb, timeout_s=t.weight_timeout_s,
                                             backend=t.weight_backend, host=t.host,
                                             bucket_tensors=lambda a, b: self.ranks.entries(self.trainer, a, b))
        self.metrics = MetricsWriter(cfg.run.run_dir, cfg.run.wandb_project or None, cfg.run.wandb_mode)
        # every grant and every trained prompt, in order: the audit trail that exact resume is checked on
        self.ledger = open_append(Path(cfg.run.run_dir) / "ledger.jsonl")
        self.stop = asyncio.Event()
        self.heldout = HeldoutEstimate(cfg, self.renderer)
        self.generated_total = 0  # samples generated since this process started (resume: counts afresh)
        self._bad_steps = 0  # consecutive steps skipped for non-finite values
        self._no_progress = 0  # "no step for a while" warnings since the last step

    @staticmethod
    def endpoints_of(cfg: BrorlConfig) -> Endpoints:
        t = cfg.transport
        return Endpoints(t.host, t.work_port, t.rollout_port, t.control_port)

    @property
    def version(self) -> int:
        """The policy version: the number of training steps taken."""
        return self.trainer.state.step

    # ------------------------------------------------------------------ the loop
    async def train(self) -> None:
        """Await a batch, train, publish, commit, checkpoint, evaluate, report — until the last step."""
        if self.version == 0:
            await self.evaluate_if_due()                  # held-out pass@1 before the first step
        report = StepReport()
        while self.version < self.cfg.learner.steps and not self.stop.is_set():
            batch = await self.batcher.next_batch(self.version, self._interrupted)  # admit → dyn. sampling → B groups
            report.lap("wait_s")
            if batch is not None:
                await self.train_on(batch, report)        # advantages → PPO + TIS → version + 1
            report.lap("train_s")
            await self.publish_weights()                  # broadcast: to every member that lacks this version
            report.lap("broadcast_s")
            if batch is None:
                continue                                  # a member joined (and got the weights), or stop
            self.commit(batch, report)                    # data cursor and ledger
            await self.checkpoint_if_due()
            await self.evaluate_if_due(report)
            self.metrics.write(self.version, report.row())
            await self.stop_if_numerics_failed()
            report = StepReport()

    def _interrupted(self) -> bool:
        """Stop waiting for a batch: stopping, or a member needs the current weights first."""
        return self.stop.is_set() or self.members.needs_sync(self.version)

    async def train_on(self, batch: Batch, report: StepReport) -> None:
        self.dispatcher.observe_keep_rate(len(batch.groups), int(batch.stats["groups_received"]))
        try:
            m = await asyncio.to_thread(self.trainer.step, [TrainGroup.from_wire(g) for g in batch.groups])
        except Exception:
            if getattr(self.trainer, "updates_in_step", 1) == 0:  # nothing applied: the state is step `version`'s
                path = await asyncio.to_thread(self.save_checkpoint)
                log.exception("training step %d failed before changing anything; checkpoint %s written",
                              self.version + 1, path)
            else:
                log.exception("training step %d failed after %d optimizer updates: no checkpoint of this state; "
                              "resume from the last one", self.version + 1, self.trainer.updates_in_step)
            raise
        report.update(m)
        self._bad_steps = self._bad_steps + 1 if m.get("step_skipped") else 0
        if self._bad_steps:
            log.error("step %d: every mini-batch had a non-finite loss or gradient; nothing was applied (%d in a "
                      "row, limit learner.max_nonfinite_steps = %d)", self.version, self._bad_steps,
                      self.cfg.learner.max_nonfinite_steps)

    async def stop_if_numerics_failed(self) -> None:
        """`learner.max_nonfinite_steps` skipped steps in a row: checkpoint (the weights are the last good
        ones: nothing was applied since) and stop the job with the error."""
        if self._bad_steps >= self.cfg.learner.max_nonfinite_steps:
            await self.checkpoint_if_due(force=True)
            raise NonFiniteTraining(f"{self._bad_steps} steps in a row with non-finite loss or gradients "
                                    f"(up to step {self.version}); checkpoint of the last good weights written")

    def commit(self, batch: Batch, report: StepReport) -> None:
        """The batch's prompts (trained, or dropped by dynamic sampling) leave the data cursor's pending set."""
        stats = dict(batch.stats)
        dropped = stats.pop("consumed_ids")
        trained = [g.prompt_id for g in batch.groups]
        self.dispatcher.commit(trained + dropped)
        self._record({"step": self.version, "trained": trained, "dropped": dropped})
        self.generated_total += stats["generated"]
        actors = self.members.actor_stats.values()
        report.update({**stats, **self.admission.take_stats(), **self.validator.take_stats(), "version": self.version,
                       "no_progress_warnings": float(self._no_progress),  # then actors' cumulative heartbeat counters
                       **{f"actor_{k}": sum(a.get(k, 0.0) for a in actors) for k in ACTOR_COUNTERS},
                       "actor_engine_restarts": sum(a.get("engine_restarts", 0) for a in actors)})
        self._no_progress = 0  # (after the report: the warnings of this step's wait are counted in it)

    async def publish_weights(self) -> None:
        """Announce the current version and broadcast it to the live actors, regrouping first if membership
        changed. Nothing to do when every member already has it. A failed broadcast regroups next time."""
        if not self.members.needs_sync(self.version):
            return
        alive = self.members.alive()
        if alive and self.members.group != alive:  # a new group: only of actors that show they live
            called, alive = alive, await self.members.roll_call(alive, 2.5 * self.cfg.transport.heartbeat_interval_s)
            log.info("weight group for version %d: %s; missed the roll call: %s", self.version, alive,
                     sorted(set(called) - set(alive)))
        if not alive:  # nobody to send to: the version is announced, the next member gets it on joining
            self._drop_group()
            self.members.synced_version = self.version
            await self.sockets.control.publish("version", version=self.version)
            return
        try:
            if self.members.group != alive:
                tp = self.cfg.actor.tensor_parallel_size  # each worker of a TP engine is a rank (vllm_ext)
                info, offsets = self.broadcaster.rendezvous_info(free_port(self.cfg.transport.host), [tp] * len(alive))
                await self.sockets.control.publish("weights", rendezvous=info, plan=self.broadcaster.plan.to_dict(),
                                                   offsets=dict(zip(alive, offsets)))
                await self.broadcaster.open(info)
                self.members.group = alive
            await self.sockets.control.publish("version", version=self.version)
            self.members.expect(self.version, await self.broadcaster.broadcast())
            self.members.synced_version = self.version
        except WeightSyncError as e:
            log.error("weight sync for version %d failed: %s; regrouping with live actors", self.version, e)
            self._drop_group()
            # a member that died is why it failed: give the living two heartbeats to show themselves and
            # evict the rest now, so the next rendezvous does not wait a whole weight timeout for the dead
            beat = self.cfg.transport.heartbeat_interval_s
            await asyncio.sleep(2 * beat)
            self.evict_silent(within_s=1.5 * beat)

    def _drop_group(self) -> None:
        """No weight group any more: the next broadcast forms a new one; nobody is handed the old rendezvous."""
        self.members.group = []
        self.sockets.control.weights = {}

    async def checkpoint_if_due(self, force: bool = False) -> None:
        """Every `learner.checkpoint_interval` steps, and at the job's last step (its trained model)."""
        lrn = self.cfg.learner
        if force or self.version % lrn.checkpoint_interval == 0 or self.version == lrn.steps:
            await asyncio.to_thread(self.save_checkpoint)

    def save_checkpoint(self) -> Path:
        def write_model(d: Path) -> None:
            with self.ranks.entries(self.trainer):  # ZeRO-3: the whole model, gathered while it is written
                self.trainer.model.save_pretrained(d, safe_serialization=True)
            self.tokenizer.save_pretrained(d)

        def write_shards(d: Path) -> None:  # every other rank writes its optimizer shard into the folder
            self.ranks.command("save", [str(d)] * self.ranks.world)
            self.ranks.barrier()

        return self.ckpt.save(self.state_dict(), write_model, write_shards if self.ranks.world > 1 else None)

    def state_dict(self) -> dict:
        """Everything but the model weights that an exact resume needs (the model is saved beside it)."""
        t = self.trainer.state_dict()
        meta = {"step": t["step"], "version": self.version, "ranks": self.ranks.world,
                "dispatcher": self.dispatcher.state(),
                "rng": {**rng_state(), "trainer": t["generator"].tolist()}}
        return {"meta": meta, "optimizer": t["optimizer"]}

    def load_state_dict(self, state: dict) -> None:
        import torch

        meta = state["meta"]
        if int(meta["version"]) != int(meta["step"]):
            raise ValueError(f"checkpoint says version {meta['version']} at step {meta['step']}; they must agree")
        self.trainer.load_state_dict({"step": meta["step"], "optimizer": state["optimizer"],
                                      "generator": torch.tensor(meta["rng"]["trainer"], dtype=torch.uint8)})
        self.dispatcher.load_state(meta["dispatcher"])
        set_rng_state(meta["rng"])

    async def evaluate_if_due(self, report: StepReport | None = None) -> None:
        """The learner's held-out estimate, when `run.eval_interval` makes it due (`learner.heldout`)."""
        if self.heldout.due(self.version):
            m = await self.heldout.run(self.trainer.model, self.tokenizer, self.version, self.generated_total)
            if report is not None:
                report.update(m)

    # ------------------------------------------------------------------ background tasks
    async def _work_task(self) -> None:
        while True:
            ident, msg = await self.sockets.work.recv()
            try:  # nothing a peer sends may end the learner
                await self.on_work_message(ident, msg, self.sockets.work.last_peer)
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
            if left_group:
                self._drop_group()  # stale for it: the next rendezvous forms a new group
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
            if self.members.seen(actor):
                self.batcher.wake()
            self.take_back(msg.returned, actor, "handed_back")  # aborted (too stale) or failed there
            items = self.dispatcher.grant(actor, msg.credits, self.batcher.room(), step=self.version,
                                          actor_version=msg.version, settled=len(self.batcher.consumed_ids))
            if items:
                self._record({"granted": [i.prompt_id for i in items], "actor": actor, "sources": [i.source for i in items],
                              "incarnation": self.members.incarnations.get(actor, "")})
            await self.sockets.work.send(ident, wire.WorkAssignment(items))
        else:
            new = self.members.heartbeat(msg)
            if self.members.resync:  # an actor holds weights that failed their checksum
                self.members.resync = False
                self._drop_group()
            if new or not self.members.group:
                self.batcher.wake()  # a new member, or a regroup: broadcast first

    def work_identity_problem(self, ident: bytes, actor: str, peer: Peer, hello: bool) -> str:
        """Why a work-socket message claiming to come from `actor` is not believed ("" if it is)."""
        if not actor or len(actor) > 128:
            return f"actor id of {len(actor)} characters (1 to 128 allowed)"
        if ident != actor.encode():
            return f"routing identity {ident[:64]!r} is not actor {actor!r}"
        address = None if hello else self.members.addresses.get(actor)  # a hello may come from a new host
        return identity_problem(actor, peer, address, self.cfg.transport.curve)

    def take_back(self, pids: list[int], actor: str | None, reason: str, holder: bool = True) -> None:
        """Prompts back to the queue (with `holder`, those `actor` holds) and a ledger row saying why."""
        if back := self.dispatcher.give_back(pids, actor if holder else None):
            self._record({"returned": back, "actor": actor, "reason": reason})

    def _record(self, row: dict) -> None:
        self.ledger.write(json.dumps(row) + "\n")
        self.ledger.flush()

    async def _answer_admin(self, ident: bytes, msg: wire.Admin, peer: Peer) -> None:
        try:
            reply = await self.desk.handle(msg, peer)
        except Exception as e:
            log.exception("admin command %r failed", msg.command)
            reply = wire.AdminReply(False, f"failed: {type(e).__name__}: {e}")
        await self.sockets.work.send(ident, reply)

    async def _rollout_task(self) -> None:
        while True:
            g = await self.sockets.rollouts.recv()
            await self.send_nacks()
            try:  # nothing a peer sends may end the learner
                await self.on_group(g, self.sockets.rollouts.last_peer)
            except Exception as e:
                why = f"internal_error: {type(e).__name__}: {e}"
                self.validator.count(g.actor_id[:64], g.group_id[:200], why)
                log.exception("group %s failed", g.group_id[:200])
                await self.sockets.work.send(g.actor_id.encode(), wire.GroupAck([], {g.group_id: why}))

    async def send_nacks(self) -> None:
        """NACK groups that did not decode but named their sender and id (so it stops re-sending them); the
        prompt goes back to the queue if the sender, authenticated as itself, holds it."""
        for n in self.sockets.rollouts.take_nacks():
            self.validator.count(n.actor_id[:64], n.group_id[:200], n.why)
            await self.sockets.work.send(n.actor_id.encode(), wire.GroupAck([], {n.group_id: n.why}))
            if n.prompt_id is not None and not identity_problem(n.actor_id, n.peer, self.members.addresses.get(
                    n.actor_id), self.cfg.transport.curve):
                self.take_back([n.prompt_id], n.actor_id, "invalid")

    async def on_group(self, g: wire.RolloutGroup, peer: Peer) -> None:
        """Validate, acknowledge (or NACK), then use or drop a group by the lease and staleness rules."""
        if self.heldout.t_first is None:
            self.heldout.t_first = time.monotonic()
        dups = self.sockets.rollouts.take_duplicate_ids()
        problem = self.validate(g, peer)
        if problem:
            self.validator.count(g.actor_id[:64], g.group_id[:200], problem)
            self.take_back([g.prompt_id], g.actor_id, "invalid")  # if it held the prompt: granted again
            await self.sockets.work.send(g.actor_id.encode(), wire.GroupAck(dups, {g.group_id: problem}))
            return
        await self.sockets.work.send(g.actor_id.encode(), wire.GroupAck([g.group_id] + dups))
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

    def validate(self, g: wire.RolloutGroup, peer: Peer) -> str:
        """"" if the group may be used, else the reason (`learner.validation`)."""
        why = identity_problem(g.actor_id, peer, self.members.addresses.get(g.actor_id), self.cfg.transport.curve)
        if why:
            return f"identity: {why}"
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
        self._record({"returned": back, "actor": actor, "reason": "restarted"})
        log.warning("actor %s restarted (incarnation %s retired); %d prompts it held go back to the queue",
                    actor, incarnation, len(back))

    def evict_silent(self, within_s: float | None = None) -> None:
        """Actors silent for `transport.heartbeat_timeout_s` (or `within_s`) leave the membership (the next
        broadcast regroups without them) and the prompts they hold go back to the queue."""
        for actor in self.members.drop_silent(within_s):
            back = self.dispatcher.retire(actor)
            self._record({"returned": back, "actor": actor, "reason": "evicted"})
            log.warning("actor %s silent for %.1f s: evicted; %d prompts it held go back to the queue", actor,
                        within_s or self.members.timeout_s, len(back))
            self.batcher.wake()

    async def _watchdog_task(self) -> None:
        """Evicts silent actors; and when no step has completed for `learner.no_progress_s`, says in the log
        (and the next step's `no_progress_warnings`) why no batch is forming."""
        last_step, since, warned = self.version, time.monotonic(), 0.0
        while True:
            await asyncio.sleep(min(1.0, self.members.timeout_s / 4))
            self.evict_silent()
            await self.send_nacks()
            now = time.monotonic()
            if self.version != last_step:
                last_step, since, warned = self.version, now, 0.0
            elif now - since > self.cfg.learner.no_progress_s and now - warned > self.cfg.learner.no_progress_s:
                warned = now
                self._no_progress += 1
                log.warning("no step for %.0f s (at step %d): %s", now - since, self.version, self.diagnose())

    def diagnose(self) -> str:
        """Why no batch is forming, as far as the learner can tell, and the state it judged by."""
        return why_no_batch(self.dispatcher, self.batcher, self.members, self.version)

    def _on_signal(self) -> None:
        self.stop.set()
        self.batcher.wake()  # a step in hand finishes; a wait for data ends now

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        self._record({"start": self.version, "epoch": self.sockets.control.epoch, **self.dispatcher.state()})
        tasks = [asyncio.create_task(self._work_task(), name="learner:dispatcher"),
                 asyncio.create_task(self._rollout_task(), name="learner:rollouts"),
                 asyncio.create_task(self._watchdog_task(), name="learner:watchdog"),
                 asyncio.create_task(self.train(), name="learner:train")]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t.exception() is not None:
                    raise RuntimeError(f"task {t.get_name()} died") from t.exception()
            if self.stop.is_set():
                await self.checkpoint_if_due(force=True)
            self._record({"end": self.version, "pending": sorted(self.dispatcher.pending)})
            await self.sockets.control.publish("stop")
            self.ranks.stop_followers()  # only here: after an error a step may still be running in its thread
            return 0
        finally:
            for t in tasks:
                t.cancel()
            self.metrics.close()
            self.ledger.close()
            self.sockets.close()
