"""The learner service (asyncio): the diagram of shared/design.md as a loop.

    dispatcher (data cursor, credits) ─┐
    rollout receiver ── admit (staleness) → dynamic sampling → batch of B groups
                                     → advantages → PPO + TIS → version + 1 → broadcast → checkpoint

`LearnerService.train` is the top-level loop. The dispatcher, the rollout receiver and the heartbeat
watch are named background tasks; if any dies, `run` stops with its error instead of hanging.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path

from config.schema import BrorlConfig
from learner.batching import Admission, Batcher, Dispatcher, Membership
from learner.checkpoint import Checkpointer
from learner.metrics import MetricsWriter
from learner.train_step import Trainer
from transport import wire
from transport.weights import WeightBroadcaster, WeightSyncError, free_port
from transport.zmq_transport import Endpoints, LearnerSockets, Security

log = logging.getLogger("brorl.learner")


def main(cfg: BrorlConfig, resume: bool) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    svc = LearnerService(cfg, resume=resume)
    return asyncio.run(svc.run())


class LearnerService:
    def __init__(self, cfg: BrorlConfig, *, resume: bool = False):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        torch.manual_seed(cfg.learner.seed)
        self.ckpt = Checkpointer(cfg.run.run_dir)
        state = self.ckpt.latest() if resume else None
        model_dir = state.model_dir if state else cfg.model.path
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, cfg.model.dtype))
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.trainer = Trainer(model, cfg.learner, n_samples=cfg.actor.n_samples,
                               temperature=cfg.actor.temperature, pad_id=self.tokenizer.eos_token_id)
        self.dispatcher = Dispatcher(cfg)
        self.admission = Admission(cfg.learner.max_staleness)
        self.batcher = Batcher(cfg.learner.prompts_per_step, cfg.learner.dynamic_sampling)
        self.members = Membership()
        self.version = 0
        if state is not None:
            self.ckpt.restore(state, self)
            log.info("resumed from %s: step %d, version %d, cursor %d", state.path, self.trainer.state.step,
                     self.version, self.dispatcher.cursor)
        t = cfg.transport
        self.sockets = LearnerSockets(Endpoints(t.host, t.work_port, t.rollout_port, t.control_port),
                                      Security(t.curve, t.keys_dir), t.high_water_mark)
        self.sockets.control.version = self.version
        self.broadcaster = WeightBroadcaster(lambda: self.trainer.model.state_dict().items(),
                                             bucket_mb=t.weight_bucket_mb, timeout_s=t.weight_timeout_s,
                                             backend=t.weight_backend, host=t.host)
        self.metrics = MetricsWriter(cfg.run.run_dir)
        # every grant and every trained prompt, in order: the audit trail that exact resume is checked on
        self.ledger = open(Path(cfg.run.run_dir) / "ledger.jsonl", "a")
        self.stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._eval_tasks = None
        self._t_first: float | None = None  # first group's arrival: the origin of heldout wall_s
        self._eval_s = 0.0
        self.generated_total = 0  # samples generated since this process started (resume: counts afresh)

    # ------------------------------------------------------------------ the loop
    async def heldout(self) -> float:
        """Held-out pass@1 of the current policy (run.eval_interval), appended to heldout.jsonl."""
        import torch

        from learner.sft import estimate_pass_at_1
        from verifiers.datasets import task_source

        r = self.cfg.run
        if self._eval_tasks is None:
            src = task_source(self.cfg.verifiers.task, r.seed, "eval", self.cfg.verifiers.difficulty)
            self._eval_tasks = [next(src) for _ in range(r.eval_prompts)]

        def run() -> float:
            with torch.random.fork_rng():  # sampling here must not shift the training RNG stream
                torch.manual_seed(r.seed + self.version)
                return estimate_pass_at_1(self.trainer.model, self.tokenizer, self._eval_tasks, k=r.eval_samples,
                                          max_new_tokens=self.cfg.actor.max_tokens)

        t0 = time.monotonic()
        p = await asyncio.to_thread(run)
        wall = 0.0 if self._t_first is None else t0 - self._t_first - self._eval_s
        row = {"step": self.trainer.state.step, "version": self.version, "generated": self.generated_total,
               "wall_s": wall, "eval_s": time.monotonic() - t0, "pass_at_1": p}
        if self._t_first is not None:
            self._eval_s += row["eval_s"]  # wall_s counts training time only
        with open(Path(self.cfg.run.run_dir) / "heldout.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        log.info("held-out pass@1 at step %d: %.3f", row["step"], p)
        return p

    async def train(self) -> None:
        steps = self.cfg.learner.steps
        every = self.cfg.run.eval_interval
        if every and self.trainer.state.step == 0:
            await self.heldout()
        while self.trainer.state.step < steps and not self.stop.is_set():
            t0 = time.monotonic()
            groups = await self.collect_batch()            # admit → dynamic sampling → B kept groups
            if groups is None:
                break
            t1 = time.monotonic()
            step = self.trainer.state.step
            stats = self.batcher.take_stats()
            self.dispatcher.observe_keep_rate(len(groups), int(stats["groups_received"]))
            batch = [g.to_train_group() for g in groups]
            m = await asyncio.to_thread(self.trainer.step, batch)   # advantages → PPO + TIS
            t2 = time.monotonic()
            self.version = self.trainer.state.step                 # version + 1
            await self.publish_weights()                           # broadcast
            t3 = time.monotonic()
            dropped = stats.pop("consumed_ids")
            self.dispatcher.commit([g.prompt_id for g in groups] + dropped)
            self._record({"step": step + 1, "trained": [g.prompt_id for g in groups], "dropped": dropped})
            if self.version % self.cfg.learner.checkpoint_interval == 0:
                await asyncio.to_thread(self.ckpt.save, self)
            self.generated_total += stats["generated"]
            if every and (self.version % every == 0 or self.version == steps):
                m["heldout_pass_at_1"] = await self.heldout()
            actors = self.members.actor_stats.values()
            self.metrics.write(step + 1, {
                **m, **stats, **self.admission.take_stats(step),
                "wait_s": t1 - t0, "train_s": t2 - t1, "broadcast_s": t3 - t2, "version": self.version,
                "samples_per_s": stats["generated"] / max(t3 - t0, 1e-9),
                "tokens_per_s": stats["tokens"] / max(t3 - t0, 1e-9),
                # cumulative over the actors' current runs, from their heartbeats
                "actor_idle_s": sum(a.get("idle_s", 0.0) for a in actors),
                "actor_engine_restarts": sum(a.get("engine_restarts", 0) for a in actors)})

    async def collect_batch(self) -> list | None:
        step = self.trainer.state.step
        batch: list = []
        while not self.stop.is_set():
            if self.members.needs_sync(self.version):
                await self.publish_weights()
            more = self.batcher.pop(self.batcher.B - len(batch))
            keep, stale = self.admission.check_batch(more, step)
            self.dispatcher.give_back([g.prompt_id for g in stale])
            batch += keep
            if len(batch) == self.batcher.B:
                return batch
            await asyncio.sleep(0.01)
        return None

    async def publish_weights(self) -> None:
        alive = self.members.alive()
        if not alive:
            self.members.synced_version = self.version
            await self.sockets.control.publish("version", version=self.version)
            return
        try:
            if self.members.group != alive:
                info, offsets = self.broadcaster.rendezvous_info(free_port(self.cfg.transport.host), [1] * len(alive))
                await self.sockets.control.publish("weights", rendezvous=info, plan=self.broadcaster.plan.to_dict(),
                                                   offsets=dict(zip(alive, offsets)))
                await self.broadcaster.open(info)
                self.members.group = alive
            await self.sockets.control.publish("version", version=self.version)
            self.members.expected[self.version] = await self.broadcaster.broadcast()
            self.members.synced_version = self.version
        except WeightSyncError as e:
            log.error("weight sync for version %d failed: %s; regrouping with live actors", self.version, e)
            self.members.group = []
            self.members.drop_silent()

    # ------------------------------------------------------------------ background tasks
    async def _work_task(self) -> None:
        while True:
            ident, msg = await self.sockets.work.recv()
            if isinstance(msg, wire.Hello):
                if self.members.hello(msg.actor_id):
                    self.sockets.control.weights = {}  # stale: the next rendezvous forms a new group
                await self.sockets.answer_hello(ident, msg)
            elif isinstance(msg, wire.WorkRequest):
                self.members.seen(msg.actor_id)
                self.dispatcher.give_back(msg.returned)
                items = self.dispatcher.grant(msg.actor_id, msg.credits, self.batcher.room(),
                                              step=self.trainer.state.step, actor_version=msg.version,
                                              settled=len(self.batcher.consumed_ids))
                if items:
                    self._record({"granted": [i.prompt_id for i in items], "actor": msg.actor_id})
                await self.sockets.work.send(ident, wire.WorkAssignment(items))
            elif isinstance(msg, wire.Heartbeat):
                self.members.heartbeat(msg)
            elif isinstance(msg, wire.Admin):
                await self.sockets.work.send(ident, await self.admin(msg))

    def _record(self, row: dict) -> None:
        self.ledger.write(json.dumps(row) + "\n")
        self.ledger.flush()

    async def admin(self, msg: wire.Admin) -> wire.AdminReply:
        """Operator commands. A verifier swap is validated here first (import + self-test), then
        published; each actor validates again, acknowledges in its heartbeat, and keeps the previous
        verifier if its own check fails."""
        from verifiers.registry import VerifierLoadError, load, run_self_test

        if msg.command == "swap":
            name, path = str(msg.args.get("name", "")), str(msg.args.get("path", ""))
            try:
                v = load(path)
                run_self_test(v)
            except VerifierLoadError as e:
                return wire.AdminReply(False, f"rejected, previous verifier stays in force: {e}")
            await self.sockets.control.publish("swap", name=name, path=path)
            return wire.AdminReply(True, f"verifier {name!r} -> {path} (version {v.version}) published")
        if msg.command == "status":
            return wire.AdminReply(True, f"step {self.trainer.state.step}, version {self.version}, "
                                         f"actors {self.members.alive()}")
        return wire.AdminReply(False, f"unknown command {msg.command!r}")

    async def _rollout_task(self) -> None:
        while True:
            g = await self.sockets.rollouts.recv()
            if self._t_first is None:
                self._t_first = time.monotonic()
            acks = [g.group_id] + self.sockets.rollouts.take_duplicate_ids()
            await self.sockets.work.send(g.actor_id.encode(), wire.GroupAck(acks))
            self.dispatcher.answered(g.prompt_id)
            if self.admission.admit(g, self.trainer.state.step):
                self.batcher.add(g)
            else:
                self.batcher.count_stale(g)
                self.dispatcher.give_back([g.prompt_id])

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        self._tasks = [asyncio.create_task(self._work_task(), name="learner:dispatcher"),
                       asyncio.create_task(self._rollout_task(), name="learner:rollouts")]
        train = asyncio.create_task(self.train(), name="learner:train")
        try:
            done, _ = await asyncio.wait([train, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t.exception() is not None:
                    raise RuntimeError(f"task {t.get_name()} died") from t.exception()
            if self.stop.is_set():
                await asyncio.to_thread(self.ckpt.save, self)
            await self.sockets.control.publish("stop")
            return 0
        finally:
            for t in [train, *self._tasks]:
                t.cancel()
            self.metrics.close()
            self.ledger.close()
            self.sockets.close()
