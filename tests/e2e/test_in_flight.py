"""Weights updated in flight (`actor.in_flight_on_update = "keep"`) on a real vLLM engine (CPU): the engine
pauses with its requests frozen, loads the new weights and resumes them, and every token of a group says
which weights sampled it — exactly: the tokens labelled with the old version are the old weights' samples
(their behaviour log-probs equal the old model's), and the first token labelled new is not. Time-sharing the
GPU (`actor.share_gpu = "timeshare"`), the learner's step before the first update pauses the engine, and
its weights resume it."""

import asyncio

import numpy as np
import pytest
import torch

from learner.logprobs import pack, token_logprobs
from tests.e2e.test_actor import actor_cfg, start_actor, stop_actor
from tests.support.fake_learner import FakeLearner

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def perturbed(model_dir: str, seed: int):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if seed is None:  # the disk weights
        return m
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


def logprobs_under(model, g) -> list[np.ndarray]:
    comps = [c.tolist() for c in g.completions()]
    b = pack([g.prompt_ids.tolist()] * len(comps), comps)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b)
    return [lp[i][b.mask[i]].numpy() for i in range(len(comps))]


async def push_until_mixed(fl: FakeLearner, model_dir: str, models: dict, tries: int = 6, device: str = "cpu"):
    """Push versions after the newest in `models` (perturbed weights, recorded there) while the actor
    generates, until a group arrives whose tokens were sampled by two versions or more; returns such groups.
    Each push waits a moment after a group arrived, so that it lands while requests are mid-completion."""
    for v in range(max(models) + 1, max(models) + 1 + tries):
        await asyncio.sleep(0.2 * (v % 3))
        models[v] = fl.model = perturbed(model_dir, v).to(device)
        await fl.push_weights(["a0"], version=v)
        # a group sampled (in part) by v: one in flight when v landed (`versions` are offsets from the group's
        # first version), or, where v landed on an idle engine (a slow machine), one wholly of v (no offsets):
        # then the next push tries again
        await fl.wait_groups(1, timeout_s=120, where=lambda g, v=v: (
            g.token_versions().max() if g.versions.size else g.policy_version) >= v)
        mixed = [g for g in fl.groups if g.versions.size and g.versions.min() < g.versions.max()]
        if mixed:
            return mixed
    raise AssertionError(f"no group was sampled by two versions in {tries} pushes")


def split_versions(g) -> list[np.ndarray]:
    """Each completion's per-token versions (absolute)."""
    return np.split(g.token_versions(), np.cumsum(g.lengths)[:-1])


async def test_a_kept_request_carries_each_tokens_version_exactly(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    m0 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fl = FakeLearner(m0)
    cfg = actor_cfg(tiny_model_dir, 8, **{"actor.in_flight_on_update": "keep", "actor.max_tokens": 48,
                                          "actor.max_model_len": 64, "job.max_staleness": 8,
                                          "actor.share_gpu": "timeshare"})
    proc = start_actor(cfg, tmp_path, fl.work_url, "a0")
    try:
        await fl.wait_groups(2, timeout_s=240)  # generating under the disk weights (version 0)
        models = {0: m0}
        # the learner computes step 1: the engine pauses, its requests kept, and takes no step while held
        await fl.sockets.control.publish("compute", step=1)
        h1 = await fl.wait_heartbeat(lambda h: h.stats.get("held_s", 0) > 0.3, "held for the learner's step")
        h2 = await fl.wait_heartbeat(lambda h: h.stats["held_s"] > h1.stats["held_s"] + 0.5, "still held")
        assert h2.stats["engine_steps"] == h1.stats["engine_steps"], (h1.stats, h2.stats)
        # version 1 (step 1's weights) is pushed first: the hold passes into the kept update, which resumes
        mixed = await push_until_mixed(fl, tiny_model_dir, models)
        for _ in range(100):  # the actor's heartbeat counts the update it kept requests through
            if any(h.stats.get("kept_updates", 0) >= 1 for h in fl.heartbeats):
                break
            await asyncio.sleep(0.1)
        assert any(h.stats.get("kept_updates", 0) >= 1 for h in fl.heartbeats), fl.heartbeats[-1:]
        g = mixed[0]
        v_old = int(g.token_versions().min())
        ref_lp = logprobs_under(models[v_old], g)
        first_new = []
        for comp_mu, comp_v, ref in zip(g.completion_logprobs(), split_versions(g), ref_lp):
            old = comp_v == v_old
            # the old weights' tokens: their μ is that version's log-prob (float rounding only)
            np.testing.assert_allclose(comp_mu[old], ref[old], atol=2e-3)
            if (~old).any():
                first_new.append(abs(comp_mu[~old][0] - ref[~old][0]))
        assert first_new and np.mean(np.array(first_new) > 2e-3) >= 0.75, first_new  # the label moves exactly there
    finally:
        await stop_actor(proc, fl)
