"""Run Trainer.step with a given backend on the fixed batch; save loss and weights. Used by
tests/test_train_step.py in fresh processes (DeepSpeed owns the process's torch.distributed group)."""

import json
import sys

import torch


def main(model_dir: str, out: str, backend: str, steps: int, micro_batch_tokens: int = 0) -> None:
    from transformers import AutoModelForCausalLM

    from config.schema import LearnerConfig
    from learner.train_step import Trainer
    from tests.support.train_fixtures import fixed_groups

    torch.manual_seed(0)
    groups, eos = fixed_groups(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LearnerConfig(backend=backend, prompts_per_step=len(groups), num_minibatches=2, lr=1e-3,
                        zero_stage=2, seed=0, micro_batch_tokens=micro_batch_tokens)
    tr = Trainer(model, cfg, n_samples=8, pad_id=eos)
    metrics = [tr.step(groups) for _ in range(steps)]
    losses = [m["loss"] for m in metrics]
    rank = tr.backend.rank
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in tr.model.state_dict().items()}, out + ".pt")
        with open(out + ".json", "w") as f:
            json.dump({"losses": losses, "world": tr.backend.world_size,
                       "micro_batches": [m["micro_batches"] for m in metrics]}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 0)
