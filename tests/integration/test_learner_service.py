"""The real learner service (sockets, trainer, gloo weight broadcast, checkpoints) against `FakeActor`s:
grants, admission, dynamic sampling with backfill and regrouping after an actor dies, in seconds.

Each test runs the service and its actors in one event loop until the job's last step, then checks the
metrics, the ledger and what the actors received."""

import asyncio
import json
import time
from pathlib import Path

import pytest

from config.loader import load_config
from learner.metrics import read
from learner.service import LearnerService
from tests.support.fake_actor import FakeActor
from tests.support.waiting import until
from transport.ports import free_ports

N, B = 4, 2


def job(model_dir: str, run_dir: Path, steps: int = 4, **over):
    port = free_ports(3)
    return load_config("tiny-cpu", {
        "model.path": model_dir, "run.run_dir": str(run_dir), "run.eval_interval": 0, "learner.steps": steps,
        "job.prompts_per_step": B, "job.n_samples": N, "job.max_staleness": 1,
        "learner.checkpoint_interval": 2, "learner.num_minibatches": 1, "transport.work_port": port,
        "transport.rollout_port": port + 1, "transport.control_port": port + 2, "transport.weight_timeout_s": 10.0,
        "transport.heartbeat_timeout_s": 2.0, **over})


async def until_alive(svc: LearnerService, ids: set[str], timeout_s: float = 30.0) -> None:
    """Wait until the learner counts exactly `ids` alive (a hello is no sign of life; a heartbeat is)."""
    deadline = time.monotonic() + timeout_s
    while set(svc.members.alive()) != ids:
        assert time.monotonic() < deadline, f"actors alive: {svc.members.alive()}"
        await asyncio.sleep(0.02)


async def run_job(cfg, actors, during=None, timeout_s=120.0) -> LearnerService:
    svc = LearnerService(cfg)
    service = asyncio.create_task(svc.run(), name="service")
    try:
        # every actor is up (alive to the learner) before any works, so all of them are in the weight group
        # from step 1: hellos are no sign of life, and one actor alone trains a job of a few steps in a second
        for a in actors:
            a.may_work.clear()
        await asyncio.gather(*(a.start() for a in actors))
        await until_alive(svc, {a.actor_id for a in actors})
        for a in actors:
            a.may_work.set()
        if during is not None:  # what the test does during the job; the job ending first fails it, with the reason
            act = asyncio.create_task(during(svc), name="during")
            await asyncio.wait({act, service}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if not act.done():
                act.cancel()
                raise AssertionError("the job ended before the test's action during it was done" if service.done()
                                     else f"the test's action during the job took over {timeout_s:.0f} s") \
                    from (service.exception() if service.done() else None)
            act.result()
        assert await asyncio.wait_for(service, timeout_s) == 0
    finally:
        service.cancel()
        for a in actors:
            await a.kill()
    return svc


async def between_updates(actor: FakeActor, svc: LearnerService, version: int, timeout_s: float = 90.0) -> None:
    """Wait until the learner is at `version` or later and `actor` has loaded it: an in-process FakeActor
    cannot stop a gloo call running in a thread the way SIGKILL stops a process, so tests kill it between
    weight updates."""
    await until(lambda: svc.version >= version and (actor.received_versions or [0])[-1] >= svc.version
                and not actor._weights_lock.locked(), f"{actor.actor_id} holding version {version} or later",
                timeout_s, lambda: f"the learner at version {svc.version}, group {svc.members.group}, alive "
                f"{svc.members.alive()}; {actor.actor_id} received {actor.received_versions[-4:]}", poll_s=0.01)


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]


def check_accounting(run_dir: Path, steps: int) -> tuple[list[int], dict[int, list[str]]]:
    """Every step trained B prompts, no prompt twice, each trained prompt was granted; returns the trained
    prompts and, per prompt, the actors it was granted to, in order."""
    rows = ledger(run_dir)
    granted: dict[int, list[str]] = {}
    for r in rows:
        for pid in r.get("granted", []):
            granted.setdefault(pid, []).append(r["actor"])
    steps_rows = [r for r in rows if "trained" in r]
    assert [r["step"] for r in steps_rows] == list(range(1, steps + 1))
    trained = [pid for r in steps_rows for pid in r["trained"]]
    assert all(len(r["trained"]) == B for r in steps_rows)
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert set(trained) <= set(granted), "a trained prompt was never granted"
    dropped = [pid for r in steps_rows for pid in r["dropped"]]
    assert not set(dropped) & set(trained)
    return trained, granted


async def test_two_actors_train_and_receive_every_version(tiny_model_dir, tmp_path):
    cfg = job(tiny_model_dir, tmp_path, **{"actor.share_gpu": "timeshare"})
    ep = LearnerService.endpoints_of(cfg)
    actors = [FakeActor(ep, f"a{i}", n_samples=N, seed=i) for i in range(2)]
    svc = await run_job(cfg, actors)
    rows = read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["version"] == r["step"] for r in rows), rows
    assert all(r["groups"] == B for r in rows), rows  # each step trained B kept groups
    check_accounting(tmp_path, 4)
    for a in actors:  # both were in the weight group and loaded every version, checksummed
        assert a.received_versions == [1, 2, 3, 4], (a.actor_id, a.received_versions)
        # time-sharing: each step announced before it trains (its weights not yet out), and its end after them
        assert a.computes == [(s, v) for k in range(1, 5) for s, v in ((k, k - 1), (0, k))], a.computes
    assert svc.members.checksum_mismatch == 0 and svc.members.checksum_ok >= 2
    assert (tmp_path / "checkpoints" / "step-000004" / "model" / "model.safetensors").exists()


async def test_dynamic_sampling_backfills_until_b_kept_groups(tiny_model_dir, tmp_path):
    """With p(correct) = 0.2 and N = 4, ~41 % of groups are all wrong: they are dropped, counted and
    replaced by more groups until B mixed ones are there."""
    cfg = job(tiny_model_dir, tmp_path, steps=3)
    actors = [FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, p_correct=0.2, seed=7)]
    await run_job(cfg, actors)
    rows = read(tmp_path / "metrics.jsonl")
    assert sum(r["drop_all_wrong"] for r in rows) > 0
    assert all(r["groups"] == B and r["groups_kept"] == B for r in rows)  # only mixed groups reach training
    # dynamic sampling's pass rate, kept samples / generated, is below 1 exactly in the steps that dropped a
    # group (with B = 2, a step sees no all-wrong group ~35 % of the time: not every step has one)
    dropped = [r["drop_all_wrong"] + r["drop_all_correct"] > 0 for r in rows]
    assert [r["pass_rate"] < 1.0 for r in rows] == dropped, rows
    assert all(r["pass_rate"] == 1.0 for r, d in zip(rows, dropped) if not d), rows
    # only mixed groups are trained, B groups of N completions of 3 tokens each; the share of what was
    # generated that the step trains is the batch's samples over the samples generated since the last step
    assert all(r["train_tokens"] == B * N * 3 for r in rows), rows
    assert all(r["train_pass_rate"] == pytest.approx(B * N / r["generated"]) for r in rows), rows
    assert sum(r["tokens"] for r in rows) > sum(r["train_tokens"] for r in rows)  # generated: dropped groups too
    trained, _ = check_accounting(tmp_path, 3)
    by_prompt = {g.prompt_id: g for g in actors[0].sent}
    for pid in trained:
        assert 0 < int(by_prompt[pid].correct.sum()) < N


async def test_stale_groups_are_dropped_and_their_prompts_regranted(tiny_model_dir, tmp_path):
    """An actor that stamps its groups 2 versions older than it holds exceeds max_staleness = 1 from step 2
    on: each such group is dropped at admission, counted, and its prompt goes back to the queue and is
    trained from a later grant (which actor gets it is a matter of who asks first)."""
    cfg = job(tiny_model_dir, tmp_path, steps=10)
    ep = LearnerService.endpoints_of(cfg)
    actors = [FakeActor(ep, "honest", n_samples=N, seed=1), FakeActor(ep, "stale", n_samples=N, seed=2, stale_by=2)]
    await run_job(cfg, actors)
    rows = read(tmp_path / "metrics.jsonl")
    assert sum(r["drop_stale"] for r in rows) > 0
    trained, granted = check_accounting(tmp_path, 10)
    regranted = [pid for pid in trained if len(granted[pid]) > 1]
    assert regranted, "no prompt was trained after being re-granted"


async def test_dead_actor_is_regrouped_out_and_training_goes_on(tiny_model_dir, tmp_path):
    """Kill one of two actors after step 2: the learner drops it from the weight group (at the latest when
    a broadcast to it fails) and finishes the job with the survivor."""
    cfg = job(tiny_model_dir, tmp_path, steps=6)
    ep = LearnerService.endpoints_of(cfg)
    actors = [FakeActor(ep, "a0", n_samples=N, seed=1), FakeActor(ep, "a1", n_samples=N, seed=2)]

    async def kill_after_step_2(svc):
        await between_updates(actors[1], svc, 2)
        await actors[1].kill()
        svc.killed_at = time.monotonic()

    t0 = time.monotonic()
    svc = await run_job(cfg, actors, during=kill_after_step_2)
    check_accounting(tmp_path, 6)
    assert actors[0].received_versions[-1] == 6  # the survivor got every version to the end
    assert svc.members.group == ["a0"]
    # the dead member cost at most one weight timeout, not a stalled job
    assert time.monotonic() - svc.killed_at < cfg.transport.weight_timeout_s + 30, time.monotonic() - t0


async def test_restarted_actor_is_a_new_incarnation_and_its_groups_train(tiny_model_dir, tmp_path):
    """The only actor dies and a new process takes its actor id at once (as `brorl run` restarts it): its
    groups, numbered from 0 again, are not mistaken for duplicates, the prompts the dead one held go back
    to the queue, and training carries on to the last step."""
    cfg = job(tiny_model_dir, tmp_path, steps=6)
    ep = LearnerService.endpoints_of(cfg)
    first = FakeActor(ep, "a0", n_samples=N, seed=1)
    second = FakeActor(ep, "a0", n_samples=N, seed=2)

    async def restart_after_step_2(svc):
        await between_updates(first, svc, 2)
        await first.kill()
        await second.start()

    svc = await run_job(cfg, [first], during=restart_after_step_2)
    await second.kill()
    trained, granted = check_accounting(tmp_path, 6)
    assert second.sockets is None and second.sent, "the new incarnation sent nothing"
    mine = {g.prompt_id for g in second.sent}
    assert len(mine & set(trained)) >= 2, "the new incarnation's groups were not trained"
    assert svc.sockets.rollouts.duplicates == 0
    restarted = [r for r in ledger(tmp_path) if r.get("reason") == "restarted"]
    assert len(restarted) == 1 and restarted[0]["actor"] == "a0"
    for pid in restarted[0]["returned"]:  # what the dead process held was granted again
        assert len(granted[pid]) >= 2


async def test_nonfinite_steps_change_nothing_then_stop_the_job_with_a_checkpoint(tiny_model_dir, tmp_path):
    """Rewards of 3e38 (finite, so the wire takes them; admitted because the verifier here declares a range
    that wide) make every advantage NaN: each step is skipped with weights and optimizer untouched and
    counted; `max_nonfinite_steps` = 2 in a row stop the job with the error, after a checkpoint whose
    weights are the ones training started from."""
    import torch
    from safetensors.torch import load_file

    from learner.service import NonFiniteTraining

    cfg = job(tiny_model_dir, tmp_path, steps=10, **{"learner.max_nonfinite_steps": 2})
    svc = LearnerService(cfg)
    svc.desk.reward_ranges["synthetic"] = (0.0, 3.4e38)  # what a verifier's REWARD_RANGE may declare
    before = {k: v.clone() for k, v in svc.trainer.model.state_dict().items()}
    actor = FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, seed=3, reward=3e38)
    service = asyncio.create_task(svc.run())
    await actor.start()
    try:
        with pytest.raises(RuntimeError) as err:
            await asyncio.wait_for(service, 60)
        assert isinstance(err.value.__cause__, NonFiniteTraining)
    finally:
        await actor.kill()
    rows = read(tmp_path / "metrics.jsonl")
    assert [r["step_skipped"] for r in rows] == [1.0, 1.0] and all(r["nonfinite_skipped"] == 1 for r in rows)
    for k, v in svc.trainer.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not svc.trainer.backend.optimizer.state  # AdamW never stepped: no moments were created
    saved = load_file(str(tmp_path / "checkpoints" / "step-000002" / "model" / "model.safetensors"))
    assert all(torch.equal(saved[k], before[k]) for k in saved)


async def test_the_only_actor_gone_the_learner_waits_quietly_for_the_next(tiny_model_dir, tmp_path):
    """With no actor left the learner neither spins nor floods the control channel: it announces the
    version once and waits; a new actor process then brings the job to its end."""
    cfg = job(tiny_model_dir, tmp_path, steps=5)
    ep = LearnerService.endpoints_of(cfg)
    first, second = FakeActor(ep, "a0", n_samples=N, seed=1), FakeActor(ep, "a0", n_samples=N, seed=2)

    async def die_then_come_back(svc):
        await between_updates(first, svc, 2)
        await first.kill()
        await until(lambda: not svc.members.alive(), "the dead actor evicted after the heartbeat timeout", 60,
                    lambda: f"alive {svc.members.alive()}", poll_s=0.05)
        published, publish = [], svc.sockets.control.publish

        async def recording(kind, **payload):
            published.append(kind)
            return await publish(kind, **payload)
        svc.sockets.control.publish = recording
        await asyncio.sleep(1.0)
        svc.sockets.control.publish = publish
        assert len(published) <= 2, f"the learner spins publishing to nobody: {published}"
        await second.start()

    await run_job(cfg, [first], during=die_then_come_back)
    await second.kill()
    check_accounting(tmp_path, 5)
    assert second.received_versions and second.received_versions[-1] == 5


async def test_a_training_step_that_raises_before_changing_anything_leaves_a_checkpoint(tiny_model_dir, tmp_path):
    """Whatever raises inside a step before its first optimizer update (here: the log-prob pass) stops the
    learner with the error — after a checkpoint of the state it was in, so nothing is lost."""
    import torch
    from safetensors.torch import load_file

    cfg = job(tiny_model_dir, tmp_path, steps=6, **{"learner.checkpoint_interval": 100})
    svc = LearnerService(cfg)
    real = svc.trainer._logp

    def logp(*a, **k):
        if svc.trainer.state.step == 2:
            raise RuntimeError("device-side assert (simulated)")
        return real(*a, **k)

    svc.trainer._logp = logp
    actor = FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, seed=4)
    service = asyncio.create_task(svc.run())
    await actor.start()
    try:
        with pytest.raises(RuntimeError) as err:
            await asyncio.wait_for(service, 60)
        assert "device-side assert" in str(err.value.__cause__)
    finally:
        await actor.kill()
    saved = load_file(str(tmp_path / "checkpoints" / "step-000002" / "model" / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in svc.trainer.model.state_dict().items() if k in saved)


async def test_a_bf16_job_keeps_fp32_master_weights_and_serves_bf16(tiny_model_dir, tmp_path):
    """model.dtype = bfloat16: the learner trains float32 master weights (checkpointed as such, for an exact
    resume) and sends the actors bf16 — half the bytes — whose checksums match."""
    import torch
    from safetensors.torch import load_file

    cfg = job(tiny_model_dir, tmp_path, steps=2, **{"model.dtype": "bfloat16"})
    actor = FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, seed=3)
    svc = await run_job(cfg, [actor])
    assert set(svc.weights.broadcaster.plan.dtype_names) == {"bfloat16"}
    assert all(p.dtype == torch.float32 for p in svc.trainer.model.parameters())
    assert actor.received_versions == [1, 2] and actor.checksum == svc.members.expected[2]  # bf16 bytes arrived intact
    saved = load_file(tmp_path / "checkpoints" / "step-000002" / "model" / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.float32}


async def test_the_last_step_is_checkpointed_whatever_the_interval(tiny_model_dir, tmp_path):
    """A job of 3 steps with checkpoint_interval 2 leaves steps 2 and 3: the trained model is never lost."""
    cfg = job(tiny_model_dir, tmp_path, steps=3)
    await run_job(cfg, [FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, seed=0)])
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert saved == ["step-000002", "step-000003"], saved
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000003"


def closed(svc: LearnerService) -> LearnerService:
    """A service that will not run: its sockets closed now (a ZeroMQ context left to the garbage collector
    blocks whichever later test collects it, in its term())."""
    svc.sockets.close()
    svc.metrics.close()
    svc.ledger.close()
    return svc


async def test_a_resumed_learner_drops_the_rows_of_the_steps_it_trains_again(tiny_model_dir, tmp_path):
    """A learner killed after rows past its checkpoint (steps 3 and 4, the held-out estimate at 4) resumes at the
    checkpoint's step 2: those rows go, the rest stay. One killed before any checkpoint resumes at step 0 and
    trains everything again, its held-out estimate at 0 included: every row goes."""
    from learner.metrics import read

    cfg = job(tiny_model_dir, tmp_path / "one", steps=2)
    await run_job(cfg, [FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, seed=0)])
    run = tmp_path / "one"
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 0.1}\n{"step": 4, "loss": 0.2}\n')
    with open(run / "heldout.jsonl", "a") as f:
        f.write('{"step": 2, "pass_at_1": 0.5}\n{"step": 4, "pass_at_1": 0.6}\n')
    assert closed(LearnerService(cfg, resume=True)).version == 2
    assert [r["step"] for r in read(run / "metrics.jsonl")] == [1, 2]
    assert [r["step"] for r in read(run / "heldout.jsonl")] == [2]
    fresh = job(tiny_model_dir, tmp_path / "two", steps=2)
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.1}\n')
    (tmp_path / "two" / "heldout.jsonl").write_text('{"step": 0, "pass_at_1": 0.1}\n')
    assert closed(LearnerService(fresh, resume=True)).version == 0
    assert read(tmp_path / "two" / "metrics.jsonl") == read(tmp_path / "two" / "heldout.jsonl") == []


async def test_a_new_run_continues_another_runs_optimizer_with_its_own_rate_and_step(tiny_model_dir, tmp_path):
    """learner.init_from: a second phase starts from the first's checkpoint, weights and AdamW moments and
    update counts included, at its own step 0 and its own learning rate; model.path must be that weights' folder."""
    import torch

    cfg = job(tiny_model_dir, tmp_path / "one", steps=2)
    await run_job(cfg, [FakeActor(LearnerService.endpoints_of(cfg), "a0", n_samples=N, seed=0)])
    ckpt = tmp_path / "one" / "checkpoints" / "step-000002"
    saved = torch.load(ckpt / "optimizer.pt", weights_only=False)
    with pytest.raises(ValueError, match="set model.path to"):
        job(tiny_model_dir, tmp_path / "two", **{"learner.init_from": str(ckpt)})
    two = job(str(ckpt / "model"), tmp_path / "two", steps=1, **{"learner.init_from": str(ckpt), "learner.lr": 1e-5,
                                                                   "learner.lr_base_samples": B * N})
    svc = closed(LearnerService(two))
    state = svc.trainer.backend.optimizer_state()
    assert svc.version == 0 and svc.dispatcher.cursor == 0
    assert {g["lr"] for g in state["param_groups"]} == {1e-5}
    assert len(state["state"]) == len(saved["state"]) > 0
    for k, s in saved["state"].items():  # the moments and the update count go on from phase one
        assert torch.equal(state["state"][k]["exp_avg_sq"], s["exp_avg_sq"]) and float(state["state"][k]["step"]) == 2
    fresh = closed(LearnerService(job(str(ckpt / "model"), tmp_path / "three", steps=1)))
    assert fresh.trainer.backend.optimizer_state()["state"] == {}  # without it: a fresh optimizer
    # a folder that is no checkpoint is refused by name
    with pytest.raises(ValueError, match="is not a complete brorl checkpoint"):
        LearnerService(job(str(tmp_path / "one" / "checkpoints" / "nope" / "model"), tmp_path / "four",
                           **{"learner.init_from": str(tmp_path / "one" / "checkpoints" / "nope")}))
