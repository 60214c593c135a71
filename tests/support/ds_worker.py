"""Run Trainer.step with a given backend on the fixed batch; save loss and weights. Used by
tests/test_train_step.py in fresh processes (DeepSpeed owns the process's torch.distributed group)."""

import contextlib
import json
import sys

import torch


def main(model_dir: str, out: str, backend: str, steps: int, micro_batch_tokens: int = 0, device: str = "cpu",
         zero_stage: int = 2) -> None:
    """backend "deepspeed-ranks": DeepSpeed with the service's rank protocol (rank 0 plans every step and
    hands each rank its share; the others follow); "deepspeed": every rank plans the whole step itself;
    "deepspeed-ranks-compiled": the rank protocol with `learner.compile`, every rank warmed up first as the
    learner's first step does (rank 0 tells the others by command)."""
    from torch._dynamo.utils import counters
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from config.schema import JobConfig, LearnerConfig
    from learner.ranks import Ranks
    from learner.train_step import Trainer
    from tests.support.train_fixtures import fixed_groups

    ranks = None
    if device == "cuda":
        import os

        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
    compiled = backend == "deepspeed-ranks-compiled"
    if backend in ("deepspeed-ranks", "deepspeed-ranks-compiled"):
        backend = "deepspeed"
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        ranks = Ranks()
    torch.manual_seed(0)
    groups, eos = fixed_groups(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LearnerConfig(backend=backend, num_minibatches=2, lr=1e-3,
                        zero_stage=zero_stage, seed=0, micro_batch_tokens=micro_batch_tokens, device=device,
                        compile=compiled)
    tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos, ranks=ranks)
    if ranks is not None and ranks.rank > 0:
        ranks.follow(tr)
        ranks.close()
        return
    tr.compiling.ensure(tr)
    frames = counters["frames"]["ok"]
    metrics = [tr.step(groups) for _ in range(steps)]
    whole = ranks.whole(tr.backend, list(tr.model.state_dict(keep_vars=True).values())) if ranks else None
    with whole or contextlib.nullcontext():  # ZeRO-3: the weights gathered by every rank
        weights = {k: v.detach().cpu().clone() for k, v in tr.model.state_dict().items()}
    if ranks is not None:
        ranks.stop_followers()
        ranks.close()
    losses = [m["loss"] for m in metrics]
    rank = tr.backend.rank
    if rank == 0:
        torch.save(weights, out + ".pt")
        with open(out + ".json", "w") as f:
            json.dump({"losses": losses, "world": tr.backend.world_size,
                       "micro_batches": [m["micro_batches"] for m in metrics], "warm_up_s": tr.compiling.seconds,
                       "compiled_in_steps": counters["frames"]["ok"] - frames}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 0,
         sys.argv[6] if len(sys.argv) > 6 else "cpu", int(sys.argv[7]) if len(sys.argv) > 7 else 2)
