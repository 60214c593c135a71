"""`brorl run` end to end on CPU: groups flow, versions advance, a checkpoint is written; the `brorl run`
process is stopped (SIGTERM, as Ctrl-C does: exit 143, a checkpoint, no process left), resumed, and
continues with the expected step, version and prompts; `brorl eval` of its last checkpoint agrees with the
learner's own held-out estimate at the last step."""

import json
import math
import re
import signal
from pathlib import Path

import pytest

from config.loader import load_config
from evaluation import heldout_tasks
from learner.checkpoint import Checkpointer
from learner.ledger import account, check
from cli.launcher import Launcher
from cli.display import status_lines
from learner.metrics import read
from tests.support.faults import alive, brorl_run_process, ended, tree, wait_for
from tests.support.heldout import assert_agree, brorl_eval


def _ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]


@pytest.mark.vllm
@pytest.mark.slow
def test_run_checkpoint_kill_resume(warm_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config("tiny-cpu", {
        "model.path": warm_model_dir, "run.run_dir": str(run_dir), "learner.steps": 10,
        "learner.checkpoint_interval": 2, "job.prompts_per_step": 4, "job.n_samples": 8,
        "run.eval_interval": 5, "run.eval_prompts": 16, "run.eval_samples": 64, "transport.work_port": 0, "transport.rollout_port": 0, "transport.control_port": 0,
    })
    # fixed free ports (0 would let each process pick its own)
    from transport.ports import free_ports

    port = free_ports(3)
    cfg = cfg.model_copy(update={"transport": cfg.transport.model_copy(update={
        "work_port": port, "rollout_port": port + 1, "control_port": port + 2})})
    ckpt = Checkpointer(run_dir)

    # `brorl run` as its own process, stopped with SIGTERM (what Ctrl-C, `docker stop` or a scheduler sends)
    run_dir.mkdir(parents=True)
    run = brorl_run_process(cfg, tmp_path)
    try:
        wait_for(lambda: ended(run, tmp_path) or (st := ckpt.latest()) is not None and st.meta["step"] >= 4, 400,
                 "no checkpoint at step 4")
        pids = tree(run.pid)
        assert len(pids) >= 4  # launcher, learner, actor, the actor's engine
        at_term = len(read(run_dir / "metrics.jsonl"))
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=300) == 143, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
    # the learner wrote a checkpoint on its way out, and nothing of the job outlived it
    wait_for(lambda: not alive(pids), 30, f"processes outlived brorl run: {alive(pids)}", poll_s=0.5)
    st = ckpt.latest()
    killed_at = st.meta["step"]
    assert max(4, at_term) <= killed_at < 10 and st.meta["version"] == killed_at
    assert (st.model_dir / "model.safetensors").exists() and (st.model_dir / "config.json").exists()
    rows = read(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, killed_at + 1))
    ledger_before = _ledger(run_dir)
    pending = st.meta["dispatcher"]["pending"]

    la2 = Launcher(cfg, resume=True, quiet=True)
    la2.start()
    try:
        assert la2.wait() == 0
    finally:
        la2.stop()
    rows = read(run_dir / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, 11)), steps  # continues at killed_at + 1, nothing repeated or skipped
    for r in rows:
        assert r["version"] == r["step"]  # versions keep counting across the resume
        for k, v in r.items():
            assert v is None or math.isfinite(v), (r["step"], k)
        assert not any(v is None for k, v in r.items() if k != "time"), r
    # how full the engine was, from vLLM's own scheduler stats each engine step (the actor's EngineGauge):
    # several sequences ran side by side (fewer than a group's N at the tails, as completions end), within the
    # engine's max_num_seqs and KV cache
    from actors.stats import EngineGauge
    # (both readings from the first run's actor: the resumed job's new actor counts from 0 again)
    a, b = rows[1], rows[killed_at - 1]
    full = EngineGauge.means(a, b, prefix="actor_")
    assert b["actor_engine_steps"] > a["actor_engine_steps"] > 0
    assert 1 < full["mean_running_seqs"] <= cfg.actor.max_num_seqs, full
    assert 0.0 < full["mean_kv_use"] <= 1.0, full
    # and vLLM's iteration stats: tokens generated per engine step (at most one per running sequence), the share
    # of steps in which a prompt finished its prefill
    assert 1 <= full["mean_gen_tokens"] <= cfg.actor.max_num_seqs and 0.0 < full["mean_prefill_steps"] <= 1.0, full
    after = _ledger(run_dir)[len(ledger_before):]
    # the same next prompts: first what was granted but not consumed, in order, then fresh ones (a prompt
    # that came back meanwhile, e.g. its group too stale, is granted again: the ledger check allows only that)
    check(account(run_dir), 10)
    first = list(dict.fromkeys(pid for row in after for pid in row.get("granted", [])))
    nxt = st.meta["dispatcher"]["next_id"]
    assert first[: len(pending)] == sorted(pending) and len(first) > len(pending)
    assert first[len(pending):] == list(range(nxt, nxt + len(first) - len(pending)))
    # actors' weights followed the versions (the learner checked their checksums)
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert "reports weights" not in learner_log  # no checksum mismatch was reported
    # and no weight sync failed (e.g. a lost rendezvous); the learner's stall diagnosis may name weight
    # syncs among what it could be doing, which is no failure
    assert not re.search(r"weight sync for version \d+ failed", learner_log)
    # the learner's own held-out estimates: before training, every 5 steps, at the end; the live display
    held = read(run_dir / "heldout.jsonl")
    assert [h["step"] for h in held][0] == 0 and held[-1]["step"] == 10
    assert all(0.0 <= h["pass_at_1"] <= 1.0 for h in held)
    k = cfg.run.eval_samples  # each held-out prompt's correct count, kept for paired tests (bench.saturation)
    assert all(len(h["correct"]) == cfg.run.eval_prompts and all(0 <= c <= k for c in h["correct"])
               and h["pass_at_1"] == pytest.approx(sum(h["correct"]) / (k * len(h["correct"]))) for h in held)
    panel = status_lines(rows, 10, 0, held)
    assert panel[0].startswith("[brorl run] step   10/10") and "10:" in panel[3] and "100.0%" in panel[1]
    # the curve is right: `brorl eval` of the last checkpoint (vLLM) and the learner's own estimate at the last step
    # (transformers) agree on the same prompts and samples per prompt, within sampling error, and solve some
    ev = brorl_eval(run_dir, tmp_path / "eval-after.json")
    assert ev["model"].endswith("step-000010/model") and ev["k"] == k
    assert [p["task_id"] for p in ev["per_prompt"]] == [t.task_id for t in heldout_tasks(cfg)]
    assert_agree(held[-1]["correct"], [p["correct"] for p in ev["per_prompt"]], k)


@pytest.mark.vllm
@pytest.mark.slow
def test_a_lora_run_serves_merged_weights_and_resumes(warm_model_dir, tmp_path):
    """`learner.lora_rank`: the actor's engine (no LoRA of its own) gets the merged weights at every version,
    so its behaviour log-probs are the learner's (on-policy: max_staleness 0) to float32 rounding; a checkpoint
    holds the merged model under the base's names and the adapters; a resume continues from them."""
    import torch
    from safetensors.torch import load_file

    from transport.ports import free_ports

    run_dir = tmp_path / "run"
    port = free_ports(3)
    over = {"model.path": warm_model_dir, "run.run_dir": str(run_dir), "learner.steps": 3,
            "learner.checkpoint_interval": 2, "job.prompts_per_step": 4, "job.n_samples": 8,
            "job.max_staleness": 0, "learner.lora_rank": 8, "learner.lr": 1e-2, "run.eval_interval": 0,
            "transport.work_port": port, "transport.rollout_port": port + 1, "transport.control_port": port + 2}
    for steps, resume in ((3, False), (5, True)):
        la = Launcher(load_config("tiny-cpu", {**over, "learner.steps": steps}), resume=resume, quiet=True)
        la.start()
        try:
            assert la.wait() == 0
        finally:
            la.stop()
    rows = read(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # weights of the step before, merged: any drift from the learner's model would show here (one step at this
    # rate moves the policy by far more)
    assert all(r["mismatch_kl"] < 1e-4 for r in rows), [r["mismatch_kl"] for r in rows]
    assert "reports weights" not in (run_dir / "logs" / "learner.log").read_text()  # checksums agreed
    st = Checkpointer(run_dir).latest()
    assert st.step == 5 and (st.path / "adapter.safetensors").exists()
    merged, base = load_file(str(st.model_dir / "model.safetensors")), load_file(f"{warm_model_dir}/model.safetensors")
    assert set(merged) == set(base)  # the base model's names, no adapter tensors: vLLM and `brorl eval` load it
    assert any(not torch.equal(merged[k], base[k]) for k in base if k.endswith("q_proj.weight"))
    assert all(torch.equal(merged[k], base[k]) for k in base if "norm" in k or "embed" in k)
