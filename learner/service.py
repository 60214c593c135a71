"""The learner service (asyncio): the diagram of shared design as a loop.

    dispatcher (data cursor, credits) ─┐
    rollout receiver ── admit (staleness) → dynamic sampling → batch of B groups
                                     → advantages → PPO + TIS → version + 1 → broadcast → checkpoint

`LearnerService.train` is the top-level loop. The policy version is the trainer's step (one source of
truth). Its collaborators: the `Intake` (what actors send: the work socket's loop, "dispatcher", and the
rollout receiver's, both named background tasks; if either dies, `run` stops with its error instead of
hanging) and the `WeightSync` beside the membership (regroup, broadcast). `state_dict` / `load_state_dict`
are what a checkpoint holds; the `Checkpointer` only writes and reads the files.
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
from learner.batching import Admission, Batch, Batcher, Dispatcher, TaskStream
from learner.membership import Membership, WeightSync
from learner.diagnose import BUSY, cause, why_no_batch
from learner.heldout import HeldoutEstimate
from learner.intake import Intake
from learner.lora import save_adapters
from learner.checkpoint import Checkpointer, rng_state, set_rng_state
from learner.metrics import ACTOR_COUNTERS, MetricsWriter, cut_after, fsync_path, open_append
from learner.ranks import Ranks, build_trainer, follow, join_ranks
from learner.report import StepReport
from learner.planning import TrainGroup
from learner.validation import GroupValidator
from taskdata import PromptRenderer
from transport import events, wire
from transport.weights import WeightBroadcaster
from transport.zmq_transport import Endpoints, LearnerSockets, Security

log = logging.getLogger("brorl.learner")
MAX_FAILED_SAVES = 3  # scheduled checkpoint saves failing in a row (disk full, read-only) that stop the job


class TaskDied(RuntimeError):
    """A background task of the service ended with an error (its `__cause__`)."""

    wraps = True  # the console tells the cause (transport.events.describe)


class NonFiniteTraining(RuntimeError):
    """`learner.max_nonfinite_steps` steps in a row changed nothing because of non-finite values."""

    fix = "lower learner.lr (or check the data for degenerate groups), then continue with --resume"


def main(cfg: BrorlConfig, resume: bool) -> int:
    """One learner rank: rank 0 (or the only one) serves; with `learner.devices` > 1 the others follow."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg, ranks = join_ranks(cfg)
    if ranks.rank != 0:
        code = follow(cfg, ranks)
    else:
        events.emit("phase", f"loading {'the latest checkpoint' if resume else cfg.learner.init_from or cfg.model.path}"
                             " for training")
        t0 = time.monotonic()
        service = LearnerService(cfg, resume=resume, ranks=ranks)
        events.emit("phase", f"ready in {time.monotonic() - t0:.0f} s at step {service.version}; waiting for actors "
                             f"on {cfg.transport.host}:{service.sockets.work.port}")
        code = asyncio.run(service.run())
    ranks.close()
    return code


class LearnerService:
    def __init__(self, cfg: BrorlConfig, *, resume: bool = False, ranks: Ranks | None = None):
        self.cfg, self.ranks = cfg, ranks or Ranks()
        self.ckpt = Checkpointer(cfg.run.run_dir, keep=cfg.learner.checkpoint_keep)
        self.ckpt.clean_leftovers()
        saved = self.ckpt.latest() if resume else None
        # where the model and optimizer come from: this run's checkpoint (resume), another run's
        # (learner.init_from: its weights and AdamW state, this run's step 0), or model.path
        start = saved or (Checkpointer.read(cfg.learner.init_from) if cfg.learner.init_from else None)
        if start is not None and int(start.meta.get("ranks", 1)) != self.ranks.world:
            raise ValueError(f"checkpoint {start.path} was written by {start.meta.get('ranks', 1)} learner ranks; "
                             f"start from it with learner.devices = {start.meta.get('ranks', 1)} (now "
                             f"{self.ranks.world}): the optimizer state is sharded by rank")
        self.ranks.command("start", [(str(start.path), saved.step if saved else 0) if start else ("", 0)]
                           * self.ranks.world)
        if cfg.learner.lora_rank:  # the base from model.path again, the adapters from the checkpoint
            self.trainer, self.tokenizer = build_trainer(cfg, cfg.model.path, self.ranks,
                                                         adapters=start.path if start else None)
        else:
            self.trainer, self.tokenizer = build_trainer(cfg, start.model_dir if start else cfg.model.path, self.ranks)
        if start is not None and saved is None:
            self.trainer.backend.load_optimizer_state(Checkpointer.load_optimizer(start.path, 0))
            self.trainer.backend.set_lr(self.trainer.lr)
            log.info("started from %s: its weights and optimizer state, at step 0 of this run", start.path)
        model = self.trainer.model
        self.serving_dtype = self.trainer.compute_dtype  # model.dtype: what the actors serve
        self.renderer = PromptRenderer(self.tokenizer, cfg.data, max_prompt_tokens=cfg.actor.max_model_len - 1)
        self.dispatcher = Dispatcher(cfg, TaskStream(cfg, self.renderer))  # prompts rendered: chat template, ids
        if saved is None:
            self.dispatcher.tasks[0]  # the first task rendered now: a model that can take none stops before actors wait
        self.admission = Admission(cfg.job.max_staleness)
        self.batcher = Batcher(cfg.job.prompts_per_step, cfg.learner.dynamic_sampling, self.admission,
                               lambda pids: self.intake.take_back(pids, None, "stale", holder=False),
                               self.dispatcher.wave_done if cfg.run.reproducible else None, self.source_of,
                               cfg.learner.dynamic_sampling_metric)
        t = cfg.transport
        self.members = Membership(t.heartbeat_timeout_s, t.max_actors, backoff_s=t.weight_timeout_s)
        self.validator = GroupValidator(cfg, model.get_input_embeddings().num_embeddings)
        if saved is not None:
            self.load_state_dict(self.ckpt.load(saved))
            log.info("resumed from %s: step %d, version %d, cursor %d", saved.path, self.trainer.state.step,
                     self.version, self.dispatcher.cursor)

        a = cfg.actor
        self.sockets = LearnerSockets(self.endpoints_of(cfg), Security(t.curve, t.keys_dir), t.high_water_mark,
                                      wire.max_frame_bytes(cfg.job.n_samples, a.max_tokens, a.max_model_len))
        self.sockets.control.version = self.version
        self.desk = AdminDesk(cfg, self.sockets.control,
                              lambda: f"step {self.version}, version {self.version}, actors {self.members.alive()}")
        broadcaster = WeightBroadcaster(lambda: self.ranks.shapes(self.trainer), dtype=self.serving_dtype,
                                        bucket_mb=t.weight_bucket_mb, timeout_s=t.weight_timeout_s,
                                        backend=t.weight_backend, host=t.host,
                                        bucket_tensors=lambda a, b: self.ranks.entries(self.trainer, a, b),
                                        device=next(self.trainer.model.parameters()).device)
        self.weights = WeightSync(self.members, broadcaster, self.sockets.control, host=t.host,
                                  heartbeat_s=t.heartbeat_interval_s, tensor_parallel=a.tensor_parallel_size,
                                  evict=lambda within_s: self.intake.evict_silent(within_s))
        # a resume (from a checkpoint, or from step 0 where none was written yet) trains the steps after it
        # again: their rows of the dead learner go, and its held-out rows past them (step 0's, redone at 0)
        self.metrics = MetricsWriter(cfg.run.run_dir, cfg.run.wandb_project or None, cfg.run.wandb_mode,
                                     resume_step=self.version if resume else None)
        if resume:
            cut_after(Path(cfg.run.run_dir) / "heldout.jsonl", self.version if self.version else -1)
        # every grant and every trained prompt, in order: the audit trail that exact resume is checked on
        self.ledger = open_append(Path(cfg.run.run_dir) / "ledger.jsonl")
        self.stop = asyncio.Event()
        self.heldout = HeldoutEstimate(cfg, self.renderer)
        self.intake = Intake(sockets=self.sockets, members=self.members, weights=self.weights,
                             dispatcher=self.dispatcher, batcher=self.batcher, admission=self.admission,
                             validator=self.validator, desk=self.desk, heldout=self.heldout, record=self.record,
                             version=lambda: self.version, curve=t.curve)
        self.generated_total = 0  # samples generated since this process started (resume: counts afresh)
        self._bad_steps = 0  # consecutive steps skipped for non-finite values
        self._failed_saves = 0  # consecutive scheduled checkpoint saves that failed
        self._no_progress = 0  # "no step for a while" warnings since the last step

    def source_of(self, pid: int) -> str:
        """The data source of a prompt in play (the per-source metrics); "" if it is not known."""
        try:
            t = self.dispatcher.tasks[pid][0]
        except (KeyError, IndexError):
            return ""
        return t.source or t.verifier

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
                await self.computing(self.version + 1)    # actor.share_gpu "timeshare": engines pause
                await self.train_on(batch, report)        # advantages → PPO + TIS → version + 1
            report.lap("train_s")
            await self.weights.publish(self.version)      # broadcast: to every member that lacks this version
            await self.computing(0)                       # (a step's pause ends with its weights, at the latest here)
            report.lap("broadcast_s")
            if batch is None:
                continue                                  # a member joined (and got the weights), or stop
            self.commit(batch, report)                    # data cursor and ledger
            await self.evaluate_if_due(report)
            self.metrics.write(self.version, report.row())  # before the checkpoint: a kill between them loses no row
            await self.checkpoint_if_due()
            await self.stop_if_numerics_failed()
            report = StepReport()

    async def computing(self, step: int) -> None:
        """`actor.share_gpu = "timeshare"`: tell the actors the learner computes `step` now (0: it waits for
        groups again), so engines on its GPU pause meanwhile and each side runs at its standalone speed."""
        if self.cfg.actor.share_gpu == "timeshare" and self.sockets.control.computing != step:
            await self.sockets.control.publish("compute", step=step)

    def _interrupted(self) -> bool:
        """Stop waiting for a batch: stopping, or a member needs the current weights first."""
        return self.stop.is_set() or self.weights.needed(self.version)

    async def train_on(self, batch: Batch, report: StepReport) -> None:
        self.dispatcher.observe_keep_rate(len(batch.groups), int(batch.stats["groups_received"]))
        try:
            m = await asyncio.to_thread(self.trainer.step, [TrainGroup.from_wire(g) for g in batch.groups])
        except Exception:
            if getattr(self.trainer, "updates_in_step", 1) == 0:  # nothing applied: the state is step `version`'s
                path = await asyncio.to_thread(self.save_checkpoint, self.state_dict())
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
        self.record({"step": self.version, "trained": trained, "dropped": dropped})
        self.generated_total += stats["generated"]
        actors = self.members.actor_stats.values()
        report.update({**stats, **self.admission.take_stats(), **self.validator.take_stats(), "version": self.version,
                       "no_progress_warnings": float(self._no_progress),  # then actors' cumulative heartbeat counters
                       **{f"actor_{k}": sum(a.get(k, 0.0) for a in actors) for k in ACTOR_COUNTERS},
                       "actor_engine_restarts": sum(a.get("engine_restarts", 0) for a in actors)})
        self._no_progress = 0  # (after the report: the warnings of this step's wait are counted in it)

    async def checkpoint_if_due(self, force: bool = False) -> None:
        """Every `learner.checkpoint_interval` steps, and at the job's last step (its trained model). A
        scheduled save that fails (a full or read-only disk) is an error the job survives: the last
        checkpoint stays, the next interval tries again; `MAX_FAILED_SAVES` in a row stop the job. A forced or
        last save raises."""
        lrn = self.cfg.learner
        if not (force or self.version % lrn.checkpoint_interval == 0 or self.version == lrn.steps):
            return
        self.metrics.sync()  # the rows of the steps it holds first: it is never trained again
        fsync_path(Path(self.cfg.run.run_dir) / "heldout.jsonl")
        if force or self.version == lrn.steps:
            await asyncio.to_thread(self.save_checkpoint, self.state_dict())
            return
        try:
            await asyncio.to_thread(self.save_checkpoint, self.state_dict())
            self._failed_saves = 0
        except Exception as e:  # a full disk surfaces as OSError, or as torch's or safetensors' own errors
            self._failed_saves += 1
            last = self.ckpt.latest()
            msg = (f"checkpoint of step {self.version} failed ({self._failed_saves} in a row): {type(e).__name__}: "
                   f"{str(e)[:300]}; training goes on, "
                   f"the last checkpoint is {last.path.name if last else 'none'} (a learner restart now redoes the "
                   f"steps since), the next try is at step {self.version + lrn.checkpoint_interval}")
            if self._failed_saves >= MAX_FAILED_SAVES:
                raise RuntimeError(f"{MAX_FAILED_SAVES} checkpoint saves in a row failed, the last at step "
                                   f"{self.version}: {e}") from e
            log.exception(msg)
            events.emit("error", msg, fix=f"free space in {self.ckpt.root} (or check it is writable)")

    def save_checkpoint(self, state: dict) -> Path:
        """Write `state` (`state_dict()`, taken on the event loop: prompts granted meanwhile must not half-change
        the dispatcher's cursor and pending set it holds) and the model; in a worker thread."""
        def write_model(d: Path) -> None:
            if self.trainer.lora is not None:  # the merged model (what eval and vLLM load); the adapters beside it
                self.trainer.model.save_pretrained(d, state_dict=self.trainer.lora.state_dict(), safe_serialization=True)
                save_adapters(self.trainer.model, d.parent)
            else:
                with self.ranks.entries(self.trainer):  # ZeRO-3: the whole model, gathered while it is written
                    self.trainer.model.save_pretrained(d, safe_serialization=True)
            self.tokenizer.save_pretrained(d)

        def write_shards(d: Path) -> None:  # every other rank writes its optimizer shard into the folder
            self.ranks.command("save", [str(d)] * self.ranks.world)
            self.ranks.barrier()

        return self.ckpt.save(state, write_model, write_shards if self.ranks.world > 1 else None)

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
            if self.version == 0:  # it delays the first step: say so
                events.emit("phase", f"held-out estimate before the first step ({self.cfg.run.eval_prompts} prompts "
                                     f"or data.eval, {self.cfg.run.eval_samples} samples each; run.eval_interval)")
            t0 = time.monotonic()
            m = await self.heldout.run(self.trainer.model, self.tokenizer, self.version, self.generated_total)
            if not m:  # it could not be made: `learner.heldout` said why
                return
            events.emit("phase", f"held-out pass@1 at step {self.version}: {100 * m['heldout_pass_at_1']:.1f}% "
                                 f"({time.monotonic() - t0:.0f} s)")
            if report is not None:
                report.update(m)

    # ------------------------------------------------------------------ background tasks
    def record(self, row: dict) -> None:
        """One row of the ledger (`ledger.jsonl`), written through at once."""
        self.ledger.write(json.dumps(row) + "\n")
        self.ledger.flush()

    async def _watchdog_task(self) -> None:
        """Evicts silent actors, sends pending NACKs, takes back leases past their deadline; and when no step
        has completed for `learner.no_progress_s`, says in the log (and the next step's
        `no_progress_warnings`) why no batch is forming."""
        last_step, since, warned = self.version, time.monotonic(), 0.0
        while True:
            await asyncio.sleep(min(1.0, self.members.timeout_s / 4))
            self.sockets.control.drain()  # subscriptions: bounded per peer
            self.intake.evict_silent()
            await self.intake.send_nacks()  # before the deadline: a NACKed group returns its prompt as "invalid"
            self.intake.expire_leases()
            now = time.monotonic()
            if self.version != last_step:
                last_step, since, warned = self.version, now, 0.0
                events.forget("stall:")  # a stall after this step is news again
            elif now - since > self.cfg.learner.no_progress_s and now - warned > self.cfg.learner.no_progress_s:
                warned = now
                self._no_progress += 1
                log.warning("no step for %.0f s (at step %d): %s", now - since, self.version, self.diagnose())
                kind, why, fix = cause(self.dispatcher, self.batcher, self.members, self.version)
                if kind not in BUSY:  # on the console once per kind of stall until the next step
                    events.once(f"stall:{kind}", "stall", f"no step for {now - since:.0f} s (at step {self.version}): "
                                                          f"{why}", fix)

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
        self.record({"start": self.version, "epoch": self.sockets.control.epoch, **self.dispatcher.state()})
        tasks = [asyncio.create_task(self.intake.serve_work(), name="learner:dispatcher"),
                 asyncio.create_task(self.intake.serve_rollouts(), name="learner:rollouts"),
                 asyncio.create_task(self._watchdog_task(), name="learner:watchdog"),
                 asyncio.create_task(self.train(), name="learner:train")]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t.exception() is not None:
                    raise TaskDied(f"task {t.get_name()} died") from t.exception()
            if self.stop.is_set():
                await self.checkpoint_if_due(force=True)
            self.record({"end": self.version, "pending": sorted(self.dispatcher.pending)})
            await self.sockets.control.publish("stop")
            self.ranks.stop_followers()  # only here: after an error a step may still be running in its thread
            return 0
        finally:
            for t in tasks:
                t.cancel()
            self.metrics.close()
            self.ledger.close()
            self.sockets.close()
