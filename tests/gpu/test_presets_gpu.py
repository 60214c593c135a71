"""The paper's presets on a GPU: `brorl-1.5b` and `prorl-1.5b` load and train a step of a
Qwen2-1.5B-shaped model with their own learner settings (ZeRO-2, compiled layers, bf16 autocast over
float32 master weights, token-budget micro-batches, activation checkpointing) and their own group size N,
without running out of memory. Each runs in a fresh process (`bench.learner`'s `preset` case)."""

import json
import math

import pytest

from bench.common import run_isolated


@pytest.mark.gpu
@pytest.mark.timeout(900)  # compiling the layers takes a minute or two
@pytest.mark.parametrize("preset,groups", [("brorl-1.5b", 1), ("prorl-1.5b", 8)])
def test_a_paper_preset_trains_a_step_of_a_1p5b_shaped_model(preset, groups):
    p = {"preset": preset, "groups": groups, "prompt": 256, "completions": [4096, 1024, 512, 256]}
    r = run_isolated("bench.learner", ["--case", "gpu-preset:" + json.dumps(p)], timeout=840)
    print(preset, {k: r.get(k) for k in ("n", "seconds", "tokens_per_s", "mfu", "peak_gib", "loss", "micro_batches")})
    assert r["ok"] and r["n"] >= 16 and math.isfinite(r["loss"]), r
    assert r["micro_batches"] > 1  # the step was split by the token budget, not one pass
