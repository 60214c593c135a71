"""The actor role end to end, with a real vLLM engine (CPU), real sockets and a real weight group.

One actor process runs through a scripted scenario (engine start-up costs ~20-40 s, so it is paid once):
groups with behaviour log-probs, a weight update through the transport, staleness gating under a learner
that runs ahead, verifiers that raise / hang / kill their worker plus a rejected bad hot swap, a killed
engine rebuilt in place, and SIGTERM with no orphan process left. A second, short run checks N = 32.
"""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from config.loader import load_config, to_toml
from learner.logprobs import pack, token_logprobs
from tests.fake_learner import FakeLearner

ROOT = Path(__file__).resolve().parents[1]
# Behaviour log-probs against a transformers recompute on the same weights: vLLM and torch differ only
# by float32 rounding (~1e-6 per token, test_tiny_model.py), so the mismatch KL is ~1e-10; 1e-4 leaves
# room and is still 100x below what one training step of staleness gives on this model (~1e-2).
KL_BOUND = 1e-4


def mismatch_kl(model, groups) -> float:
    """Mean k3 estimate of KL(μ ‖ π) over all tokens, μ = the actor's reported log-probs."""
    P, C, B = [], [], []
    for g in groups:
        for comp, lp in zip(g.completions(), g.completion_logprobs()):
            if len(comp):
                P.append(g.prompt_ids.tolist())
                C.append(comp.tolist())
                B.append(lp.tolist())
    b = pack(P, C)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b)
    mu = torch.zeros_like(lp).masked_scatter(b.mask, torch.tensor([x for row in B for x in row]))
    d = (mu - lp)[b.mask]
    return float((torch.exp(-d) - 1 + d).mean())


def start_actor(cfg, tmp_path: Path, learner_url: str, actor_id: str) -> subprocess.Popen:
    cfg_path = tmp_path / f"{actor_id}.toml"
    cfg_path.write_text(to_toml(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / f"{actor_id}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "config.cli", "actor", "--config", str(cfg_path),
                             "--learner", learner_url, "--actor-id", actor_id], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def actor_cfg(model_dir: str, n: int, **extra):
    return load_config("tiny-cpu", {"model.path": model_dir, "actor.n_samples": n, "actor.max_tokens": 6,
                                    "actor.prompts_per_request": 2, "verifiers.timeout_s": 2.0,
                                    "learner.max_staleness": 1, **extra})


@pytest.mark.vllm
@pytest.mark.slow
async def test_actor_scenario(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fl = FakeLearner(model)
    proc = start_actor(actor_cfg(tiny_model_dir, 8), tmp_path, fl.work_url, "a0")
    try:
        # 1. groups of N = 8 with behaviour log-probs that match the weights (version 0 = disk weights)
        groups = await fl.wait_groups(4, timeout_s=240)
        assert all(g.n == 8 and g.policy_version == 0 for g in groups)
        assert all(len(g.reasons) == 8 for g in groups)
        kl0 = mismatch_kl(model, groups)
        assert kl0 < KL_BOUND, kl0

        # 2. a weight update through the transport: later groups come from the new weights
        new = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        torch.manual_seed(5)
        with torch.no_grad():
            for p in new.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        fl.model = new
        checksum = await fl.push_weights(["a0"], version=1)
        v1 = await fl.wait_groups(3, where=lambda g: g.policy_version == 1)
        assert mismatch_kl(new, v1) < KL_BOUND
        assert mismatch_kl(model, v1) > 100 * KL_BOUND  # ...and not from the old ones
        await asyncio.sleep(1.5)
        assert any(h.version == 1 and h.checksum == checksum for h in fl.heartbeats)

        # 3. staleness gating: the learner announces version 3 (2 ahead > max_staleness 1) and does not
        #    broadcast yet; the actor must stop asking for work until the weights arrive
        loop = asyncio.get_running_loop()
        await fl.sockets.control.publish("version", version=3)
        t_pub = loop.time()
        await asyncio.sleep(4.0)
        late = [r for t, r in fl.requests if t > t_pub + 1.0]
        assert late == [], f"actor asked for work while 2 versions behind: {late}"
        await fl.broadcaster.broadcast()  # the actor has been waiting for exactly this
        await fl.wait_groups(2, where=lambda g: g.policy_version == 3, timeout_s=120)
        assert any(t > t_pub + 4.0 for t, _ in fl.requests)  # work resumed after the update

        # 4. verifiers that raise, hang, and kill their worker; then a bad swap that must be rejected
        for kind, reason in (("raises", "error: RuntimeError"), ("hangs", "timeout"), ("crashes", "worker crashed")):
            await fl.sockets.control.publish("swap", name="synthetic", path=f"tests.verifier_mods.{kind}")
            bad = await fl.wait_groups(1, timeout_s=120, where=lambda g, k=kind: g.verifier_version == f"{k}-1")
            g = bad[0]
            assert float(g.rewards.sum()) == 0.0 and all(r.startswith(reason) for r in g.reasons), g.reasons
            assert proc.poll() is None, "the actor died"
        await fl.sockets.control.publish("swap", name="synthetic", path="verifiers.synthetic")
        await fl.wait_groups(1, timeout_s=60, where=lambda g: g.verifier_version == "1")
        await fl.sockets.control.publish("swap", name="synthetic", path="tests.verifier_mods.broken")
        await asyncio.sleep(2.5)
        assert any("rejected" in h.error and "broken" in h.error for h in fl.heartbeats)
        n_before = len(fl.groups)
        after = await fl.wait_groups(n_before + 2, timeout_s=60)
        assert all(g.verifier_version == "1" for g in after[n_before:])  # the previous verifier stays

        # 5. engine death: SIGKILL the EngineCore. The actor rebuilds the engine in place and reports it, says
        #    hello again, takes no work on the disk weights, and after the learner's next rendezvous
        #    generates from the current weights
        old_tree = psutil.Process(proc.pid).children(recursive=True)
        core = [p for p in old_tree if "EngineCore" in p.name() + " ".join(p.cmdline())]
        assert core, [p.name() for p in old_tree]
        hellos = fl.hellos.count("a0")
        os.kill(core[0].pid, signal.SIGKILL)
        t_kill = loop.time()
        while fl.hellos.count("a0") == hellos:
            assert proc.poll() is None, "the actor died with its engine"
            assert loop.time() - t_kill < 240, "no hello from a rebuilt engine"
            await asyncio.sleep(0.2)
        assert any("engine died" in h.error and "restarting" in h.error for h in fl.heartbeats)
        await fl.push_weights(["a0"], version=4)
        v4 = await fl.wait_groups(2, where=lambda g: g.policy_version == 4, timeout_s=180)
        assert mismatch_kl(new, v4) < KL_BOUND
        assert all(g.policy_version >= 0 for g in fl.groups)  # nothing generated before the weights came
        assert proc.poll() is None

        # 6. SIGTERM: a clean exit and no process of the actor's tree (nor of the dead engine's) survives
        tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True) + old_tree]
        assert tree, "expected engine and scoring processes under the actor"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 90) == 0
        await asyncio.sleep(2.0)
        alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"orphans after SIGTERM: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
        fl.close()


@pytest.mark.vllm
@pytest.mark.slow
async def test_actor_groups_of_32(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fl = FakeLearner(model)
    proc = start_actor(actor_cfg(tiny_model_dir, 32), tmp_path, fl.work_url, "a32")
    try:
        groups = await fl.wait_groups(2, timeout_s=240)
        assert all(g.n == 32 for g in groups)
        assert mismatch_kl(model, groups) < KL_BOUND
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 90)
        finally:
            if proc.poll() is None:
                proc.kill()
            fl.close()
