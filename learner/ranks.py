"""The learner's ranks on one host: rank 0 serves, the others follow (`learner.devices` > 1).

`brorl learner` with `learner.devices = K` starts K processes (`cli/learner.py`), one per GPU (or per
gloo rank on CPU), with the usual torch.distributed env (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Rank 0 runs the whole service: sockets, batching, the ledger, held-out evaluation,
checkpoints and the weight broadcast to the actors (under ZeRO-2 every rank holds the full parameters, so
rank 0 sends its own; under ZeRO-3 every rank gathers each bucket with it, `gather` below). The other ranks hold a model and a DeepSpeed engine and do what rank 0 tells them,
one command at a time, over a gloo group of their own (commands are small Python objects; the training
collectives stay on DeepSpeed's group, NCCL on GPUs):

    ("warm_up", None)     `learner.compile`: compile now, before the first step (`Trainer.warm_up`)
    ("step", header)      train on this share of the step (`learner.train_step.Trainer.run`): the header says
                          how its passes are made; the samples follow as one flat tensor (`Ranks.step`)
    ("save", folder)      write this rank's optimizer shard into the checkpoint folder being written
    ("gather", (a, b))    ZeRO-3: gather the parameters of state_dict entries [a, b) with rank 0 (None:
                          all of them), and let them go again (rank 0 keeps them whole while it reads them)
    ("stop", None)        leave

A rank gets only its own micro-batches, never the whole batch: its samples' arrays (`learner.batch.SampleTable`)
and its passes' rows as one flat byte tensor, sent point to point on the gloo group (`Ranks.step`) — no pickle
of tokens. A rank that dies
ends the learner: the launcher (`cli/learner.py`) sees it exit and stops the others, and the job resumes
from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from pathlib import Path
from typing import Any

from config.schema import BrorlConfig
from learner.checkpoint import Checkpointer
from learner.train_step import Trainer

log = logging.getLogger("brorl.learner")

FOLLOW_TIMEOUT = datetime.timedelta(days=30)
"""How long a following rank waits for rank 0's next command (rank 0 may wait a long time for data)."""


def env_rank() -> tuple[int, int, int]:
    """(rank, local rank, world size) from the torch.distributed env; (0, 0, 1) outside a rank group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return rank, int(os.environ.get("LOCAL_RANK", str(rank))), world


def join_ranks(cfg):
    """This process's config (with several CUDA ranks: its own device, cuda:<local rank>) and its `Ranks`;
    joins the ranks' torch.distributed group first (gloo on CPU, NCCL on GPUs)."""
    rank, local, world = env_rank()
    if world != cfg.learner.devices:
        raise ValueError(f"learner.devices is {cfg.learner.devices} but this process is one of WORLD_SIZE = {world} "
                         f"ranks: start the learner with `brorl learner`, which starts learner.devices ranks")
    if world > 1:
        import torch
        import torch.distributed as dist

        dev = cfg.learner.device
        if dev.startswith("cuda"):
            dev = f"cuda:{local}"
            torch.cuda.set_device(dev)
        cfg = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"device": dev})})
        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.startswith("cuda") else "gloo", timeout=FOLLOW_TIMEOUT)
    return cfg, Ranks()


class Ranks:
    """This process's place among the learner's ranks, and the command channel between them."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.rank, self.local_rank, self.world = env_rank()
        self.group = None
        if self.world > 1:
            if not dist.is_initialized():
                raise RuntimeError("Ranks: torch.distributed is not initialised (join_ranks does it)")
            self.group = dist.new_group(backend="gloo", timeout=FOLLOW_TIMEOUT)

    def _scatter(self, items: list[Any] | None) -> Any:
        import torch.distributed as dist

        out: list[Any] = [None]
        dist.scatter_object_list(out, items if self.rank == 0 else None, src=0, group=self.group)
        return out[0]

    def command(self, name: str, per_rank: list[Any]) -> Any:
        """Rank 0: send command `name` with `per_rank[r]` to rank r; returns rank 0's own item."""
        if self.world == 1:
            return per_rank[0]
        return self._scatter([(name, x) for x in per_rank])[1]

    def step(self, shares: list) -> Any:
        """Rank 0: hand every rank its share of a step (`learner.microbatch.RankShare`); returns rank 0's. The
        command carries each share's structure, its bytes follow (`encode_share`)."""
        if self.world == 1:
            return shares[0]
        import torch
        import torch.distributed as dist

        encoded = [encode_share(s) for s in shares]
        self._scatter([("step", head) for head, _ in encoded])
        for r, (_, buf) in enumerate(encoded):
            if r and buf is not None:
                dist.send(torch.from_numpy(buf), dst=r, group=self.group)
        return shares[0]

    def _receive_share(self, head: dict) -> Any:
        import numpy as np
        import torch
        import torch.distributed as dist

        buf = None
        if head["nbytes"]:
            t = torch.empty(head["nbytes"], dtype=torch.uint8)
            dist.recv(t, src=0, group=self.group)
            buf = t.numpy()
        return decode_share(head, buf if buf is not None else np.zeros(0, np.uint8))

    def receive(self, name: str) -> Any:
        """Ranks > 0: the next command, which must be `name`; returns its argument."""
        got, arg = self._scatter(None)
        if got != name:
            raise RuntimeError(f"rank {self.rank}: expected command {name!r} from rank 0, got {got!r}")
        return arg

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            dist.barrier(group=self.group)

    @contextlib.contextmanager
    def whole(self, backend, tensors: list, span: tuple[int, int] | None = None):
        """Rank 0: `tensors` (state_dict entries [span), or all) whole while the context lasts — under ZeRO-3
        every rank gathers them with us; otherwise nothing to do."""
        if backend.partitioned and self.world > 1:
            self.command("gather", [span] * self.world)
        with backend.gathered(tensors):
            yield tensors

    def entries(self, trainer, first: int = 0, last: int | None = None):
        """Rank 0, a context: the model's state_dict entries [first, last) whole (the weight broadcast's
        buckets; all of them for a checkpoint)."""
        if getattr(trainer, "lora", None) is not None:  # LoRA (one rank): merged weights under the base's names
            return contextlib.nullcontext(trainer.lora.tensors(first, last))
        tensors = list(trainer.model.state_dict(keep_vars=True).values())
        span = None if first == 0 and last is None else (first, last)
        return self.whole(trainer.backend, tensors[first:last], span)

    @staticmethod
    def shapes(trainer) -> list:
        """The model's state_dict names with whole shapes and dtypes (meta tensors): what a weight-broadcast
        plan is made of, also while ZeRO-3 holds only a shard of each parameter."""
        import torch

        if getattr(trainer, "lora", None) is not None:
            return trainer.lora.named_shapes()
        full = trainer.backend.full_shape
        return [(k, torch.empty(full(v), dtype=v.dtype, device="meta"))
                for k, v in trainer.model.state_dict(keep_vars=True).items()]

    def close(self) -> None:
        """Leave the process groups before the interpreter exits (an exit with them alive can abort in a
        communication thread's destructor: status -6 for a job that went well)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def stop_followers(self) -> None:
        if self.world > 1:
            self.command("stop", [None] * self.world)

    def follow(self, trainer) -> int:
        """Ranks > 0: do rank 0's commands until it says stop."""
        import torch

        while True:
            name, arg = self._scatter(None)
            if name == "step":
                trainer.run(self._receive_share(arg))
            elif name == "warm_up":
                log.info("rank %d: learner.compile: compiled before the first step in %.1f s", self.rank, trainer.warm_up())
            elif name == "save":
                torch.save(trainer.backend.optimizer_state(), Path(arg) / Checkpointer.optimizer_file(self.rank))
                self.barrier()
            elif name == "gather":
                named = list(trainer.model.state_dict(keep_vars=True).values())
                with trainer.backend.gathered(named[slice(*arg)] if arg else named):
                    pass
            elif name == "stop":
                log.info("rank %d: stopped by rank 0", self.rank)
                return 0
            else:
                raise RuntimeError(f"rank {self.rank}: unknown command {name!r} from rank 0")


def encode_share(share) -> tuple[dict, Any]:
    """A `RankShare` as (header: skip, the table's layout, each pass's row count and weight; uint8 bytes: the
    table's arrays, then every pass's rows), or (header, None) for a share without samples."""
    import numpy as np

    passes = [[(len(m.rows), m.weight) for m in mb] for mb in share.minibatches]
    if share.table is None:
        return {"skip": share.skip, "passes": passes, "layout": [], "nbytes": 0}, None
    layout, table = share.table.to_bytes()
    rows = [np.asarray(m.rows, np.int64) for mb in share.minibatches for m in mb]
    buf = np.concatenate([table, *(r.view(np.uint8) for r in rows)])
    return {"skip": share.skip, "passes": passes, "layout": layout, "table_bytes": table.size,
            "nbytes": buf.size}, buf


def decode_share(head: dict, buf):
    """`encode_share`'s inverse."""
    import numpy as np

    from learner.batch import SampleTable
    from learner.microbatch import Micro, RankShare

    if not head["layout"]:
        return RankShare([[Micro(np.zeros(0, np.int64), w) for _, w in mb] for mb in head["passes"]], skip=head["skip"])
    n = head["table_bytes"]
    table = SampleTable.from_bytes(head["layout"], buf[:n])
    rows = buf[n:].view(np.int64)
    out, at = [], 0
    for mb in head["passes"]:
        out.append([])
        for k, w in mb:
            out[-1].append(Micro(rows[at: at + k], w))
            at += k
    if at != rows.size:
        raise ValueError(f"a rank's share carries {rows.size} rows, its passes {at}")
    return RankShare(out, skip=head["skip"], table=table)


def build_trainer(cfg: BrorlConfig, model_dir: str | Path, ranks: Ranks | None = None, adapters: Path | None = None):
    """The model (float32 master weights whatever model.dtype is: that is the compute (autocast) and serving
    dtype), its tokenizer and the trainer: the same on every rank. With `learner.lora_rank`: the frozen base
    from `model_dir` in `learner.lora.base_dtype`, LoRA adapters (those saved in checkpoint folder `adapters`,
    if given) in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learner import lora

    torch.manual_seed(cfg.learner.seed)
    if cfg.run.reproducible:
        torch.use_deterministic_algorithms(True)  # CPU ops are; CUDA ones that are not then raise, naming the op
    compute = getattr(torch, cfg.model.dtype)
    lrn = cfg.learner
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=lora.base_dtype(lrn, compute) if lrn.lora_rank else torch.float32)
    if lrn.lora_rank:
        model = lora.add_adapters(model, lrn)
        if adapters is not None:
            lora.load_adapters(model, adapters)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    trainer = Trainer(model, cfg.learner, cfg.job, max_tokens=cfg.actor.max_tokens,
                      temperature=cfg.actor.temperature,
                      pad_id=tokenizer.eos_token_id, compute_dtype=compute, ranks=ranks)
    return trainer, tokenizer


def follow(cfg: BrorlConfig, ranks: Ranks) -> int:
    """Ranks > 0: build the same model and engine as rank 0 (from the checkpoint it resumes, if any), then
    do its commands until it stops."""
    saved, step = ranks.receive("start")  # the checkpoint rank 0 resumes (or ""), and its step
    trainer, _ = build_trainer(cfg, Path(saved) / "model" if saved else cfg.model.path, ranks)
    if saved:  # resumed, or another run's checkpoint (learner.init_from: step 0)
        trainer.state.step = step
        trainer.backend.load_optimizer_state(Checkpointer.load_optimizer(Path(saved), ranks.rank))
        trainer.backend.set_lr(trainer.lr)
    return ranks.follow(trainer)
