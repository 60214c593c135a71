"""Builders of valid wire messages for transport tests and benchmarks."""

import numpy as np

from transport import wire


def make_group(group_id: str, n: int = 4, length: int = 5, prompt_len: int = 3, seed: int = 0,
               version: int = 0) -> wire.RolloutGroup:
    rng = np.random.default_rng(seed)
    lengths = np.full(n, length, dtype=np.int32)
    total = int(lengths.sum())
    return wire.RolloutGroup(
        group_id=group_id, prompt_id=seed, actor_id=group_id.split(":")[0], policy_version=version,
        verifier="synthetic", verifier_version="1",
        prompt_ids=rng.integers(0, 1000, prompt_len, dtype=np.int32),
        lengths=lengths,
        tokens=rng.integers(0, 1000, total, dtype=np.int32),
        logprobs=-rng.random(total, dtype=np.float32) * 5,
        rewards=rng.integers(0, 2, n).astype(np.float32),
        correct=rng.integers(0, 2, n).astype(np.uint8),
        finish=np.zeros(n, dtype=np.uint8),
        timings={"generate": 0.5},
    )
