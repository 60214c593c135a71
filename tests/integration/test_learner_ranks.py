"""`brorl learner` with `learner.devices = 2` (DeepSpeed ZeRO-2 on two gloo ranks, real processes) against
`FakeActor`s: rank 0 serves and hands rank 1 its share of every step; checkpoints hold both optimizer
shards and resume on two ranks; a rank killed by SIGKILL takes the learner down at once, loudly."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config.loader import to_toml
from learner.metrics import read
from learner.service import LearnerService
from tests.integration.test_learner_service import B, N, check_accounting, job
from tests.support.fake_actor import FakeActor
from tests.support.procs import stop_tree

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def start_learner(cfg, tmp_path: Path, *extra: str) -> subprocess.Popen:
    path = tmp_path / "learner.toml"
    path.write_text(to_toml(cfg))
    log = open(tmp_path / "learner.log", "ab")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1",
           **({"DS_ACCELERATOR": "cpu"} if cfg.learner.device == "cpu" else {})}
    return subprocess.Popen([sys.executable, "-m", "cli", "learner", "--config", str(path), *extra], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def ranks_of(learner: subprocess.Popen) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(learner.pid).children()]


async def train_with(cfg, learner: subprocess.Popen, tmp_path: Path, timeout_s: float = 240.0) -> list[FakeActor]:
    ep = LearnerService.endpoints_of(cfg)
    # the learner is a subprocess starting two DeepSpeed ranks: on 2 busy cores that can take a minute
    actors = [FakeActor(ep, f"a{i}", n_samples=N, seed=i, sync_timeout_s=120) for i in range(2)]
    try:
        # Both actors start (start-up barrier) before either asks for work: the tiny job trains a step in
        # ~0.1 s, so an actor that asked first could train the whole job while the other was still starting.
        # It then never joined a weight group (that actor got none of the versions) or, when the learner had
        # already exited, timed out in its barrier: both seen in CI and reproduced here, ~1 run in 3.
        for a in actors:
            a.may_work.clear()
        await asyncio.gather(*(a.start() for a in actors))
        for a in actors:
            a.may_work.set()
        deadline = time.monotonic() + timeout_s
        while learner.poll() is None:
            assert time.monotonic() < deadline, (tmp_path / "learner.log").read_text()[-3000:]
            await asyncio.sleep(0.1)
    finally:
        for a in actors:
            await a.kill()
        stop_tree(learner)
    assert learner.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]
    return actors


def two_ranks(model_dir: str, run_dir: Path, steps: int, device: str = "cpu", zero_stage: int = 2):
    return job(model_dir, run_dir, steps=steps, **{"learner.devices": 2, "learner.backend": "deepspeed",
                                                   "learner.device": device, "learner.zero_stage": zero_stage,
                                                   "learner.num_minibatches": 2, "transport.weight_timeout_s": 60.0,
                                                   "transport.heartbeat_timeout_s": 10.0})


@pytest.mark.parametrize("zero_stage", [2, 3])
async def test_two_learner_ranks_train_checkpoint_and_resume(tiny_model_dir, tmp_path, zero_stage, device="cpu"):
    """ZeRO-2 and ZeRO-3 (parameters partitioned: the broadcast gathers them bucket by bucket, the checkpoint
    all at once, every rank taking part); the checkpoint then refused on another rank count."""
    run_dir = tmp_path / "run"
    cfg = two_ranks(tiny_model_dir, run_dir, steps=4, device=device, zero_stage=zero_stage)
    learner = start_learner(cfg, tmp_path)
    actors = await train_with(cfg, learner, tmp_path)
    rows = read(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["groups"] == B for r in rows), rows
    assert all(r["samples"] == B * N and r["train_tokens"] > 0 for r in rows), rows  # both ranks' tokens
    groups = [ln for ln in (tmp_path / "learner.log").read_text().splitlines() if "weight group for version" in ln]
    for a in actors:  # (a failure shows how the learner formed its weight groups)
        assert a.received_versions[-1:] == [4], (a.actor_id, a.received_versions, groups)
    ckpt = run_dir / "checkpoints" / "step-000004"
    assert json.loads((ckpt / "state.json").read_text())["ranks"] == 2
    assert (ckpt / "optimizer.pt").stat().st_size > 0 and (ckpt / "optimizer-rank1.pt").stat().st_size > 0
    assert "optimizer-rank1.pt" in json.loads((ckpt / "manifest.json").read_text())
    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(ckpt / "model", dtype=torch.float32).state_dict()
    init = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert all(saved[k].shape == v.shape for k, v in init.items())  # whole tensors, not ZeRO-3 partitions
    assert any(not torch.equal(saved[k], v) for k, v in init.items())  # and trained ones
    # what the actors received last (version 4, bucket by bucket) is what the checkpoint of step 4 holds
    from tests.support.weights_check import weights_checksum
    from transport.weights import make_plan

    dtype = getattr(torch, cfg.model.dtype)
    plan = make_plan(saved.items(), cfg.transport.weight_bucket_mb, dtype)
    assert {a.checksum for a in actors} == {weights_checksum(saved.items(), plan, dtype)}

    cfg6 = two_ranks(tiny_model_dir, run_dir, steps=6, device=device, zero_stage=zero_stage)
    learner = start_learner(cfg6, tmp_path, "--resume")
    await train_with(cfg6, learner, tmp_path)
    rows = read(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6], rows
    check_accounting(run_dir, 6)  # no prompt lost or trained twice across the restart

    # resuming those two ranks' checkpoint on one rank is refused, with the reason (their optimizer shards)
    one = job(tiny_model_dir, run_dir, steps=8, **{"learner.backend": "deepspeed", "learner.num_minibatches": 2,
                                                   "learner.zero_stage": zero_stage})
    learner = start_learner(one, tmp_path, "--resume")
    try:
        assert learner.wait(timeout=120) != 0
    finally:
        stop_tree(learner)
    assert "written by 2 learner ranks" in (tmp_path / "learner.log").read_text()
    assert [r["step"] for r in read(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]  # and nothing trained


async def test_a_killed_rank_stops_the_learner_at_once(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    cfg = two_ranks(tiny_model_dir, run_dir, steps=1000)
    learner = start_learner(cfg, tmp_path)
    ep = LearnerService.endpoints_of(cfg)
    actors = [FakeActor(ep, "a0", n_samples=N, seed=0, sync_timeout_s=180)]
    try:
        await asyncio.gather(*(a.start() for a in actors))
        deadline = time.monotonic() + 240
        while not (run_dir / "metrics.jsonl").exists() or len(read(run_dir / "metrics.jsonl")) < 2:
            assert time.monotonic() < deadline and learner.poll() is None, (tmp_path / "learner.log").read_text()[-3000:]
            await asyncio.sleep(0.1)
        pids = ranks_of(learner)
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGKILL)  # the follower (started second)
        t0 = time.monotonic()
        while learner.poll() is None:
            assert time.monotonic() - t0 < 15, "the learner did not stop after a rank died"
            await asyncio.sleep(0.1)
    finally:
        for a in actors:
            await a.kill()
        stop_tree(learner)
    assert learner.returncode == 1
    assert "rank 1 of 2 exited" in (tmp_path / "learner.log").read_text()
    import psutil

    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
