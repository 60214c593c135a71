"""`run.reproducible` end to end: two runs of one command, side by side (so their timings differ), give the
same steps, the same training metrics and the same held-out curve, bit for bit. The command trains on a user's
files (verl Parquet chat rows, a chat template given in the config, answers read after a reasoning block), and
`brorl eval` of the last checkpoint agrees with the learner's own last estimate."""

import concurrent.futures
import dataclasses
import json

import pytest

from bench.common import brorl_run
from config.loader import load_config
from evaluation import heldout_tasks
from taskdata import PromptRenderer
from tests.support import user_data
from tests.support.heldout import assert_agree, brorl_eval
from transport.ports import free_ports

SAME = ("generated", "groups_received", "drop_all_correct", "drop_all_wrong", "pass_rate", "reward_mean",
        "completion_len_mean", "loss", "pg_loss", "grad_norm", "entropy", "approx_kl", "mismatch_kl", "tis_mean",
        "ratio_mean")
"""Every metric that is not a time: what was generated, kept and dropped, and what training did with it."""
K = 64
"""Held-out samples per prompt: enough that the estimate and `brorl eval` must agree within a few points."""


@pytest.mark.vllm
@pytest.mark.slow
def test_two_runs_of_one_reproducible_command_are_the_same(warm_model_dir, tmp_path):
    first = free_ports(3)
    ports = {"a": first, "b": free_ports(3, avoid=range(first, first + 3))}
    data = user_data.arithmetic(tmp_path / "data")
    # the warm model never writes "</think>": with the default data.unclosed_reasoning ("wrong") every completion
    # would score 0 on both sides; "score" reads a completion whose reasoning never closes whole
    user = {"data.train": json.dumps([str(data["train"])]), "data.eval": json.dumps([str(data["eval"])]),
            "data.chat_template": user_data.ARITHMETIC_TEMPLATE, "data.reasoning_end": "</think>",
            "data.unclosed_reasoning": "score"}

    def one(name: str) -> dict:
        p = ports[name]
        return brorl_run(tmp_path / name, {
            "model.path": warm_model_dir, "run.reproducible": "true", "run.seed": 3, "learner.steps": 4,
            "job.prompts_per_step": 4, "job.n_samples": 8, "job.max_staleness": 0, "actor.prompts_per_request": 2,
            "run.eval_interval": 2, "run.eval_samples": K, **user,
            "transport.work_port": p, "transport.rollout_port": p + 1, "transport.control_port": p + 2}, timeout=900)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.map(one, ["a", "b"])
    assert len(a["metrics"]) == len(b["metrics"]) == 4
    for ra, rb in zip(a["metrics"], b["metrics"]):
        assert {k: ra[k] for k in SAME} == {k: rb[k] for k in SAME}, f"step {ra['step']}"
    assert [(h["step"], h["pass_at_1"], h["correct"]) for h in a["heldout"]] == \
           [(h["step"], h["pass_at_1"], h["correct"]) for h in b["heldout"]]
    assert [h["step"] for h in a["heldout"]] == [0, 2, 4]
    assert all(h["k"] == K and h["pass_at_k"] >= h["pass_at_1"] for h in a["heldout"])  # pass@K beside pass@1
    assert a["metrics"][-1][f"heldout_pass_at_{K}"] == a["heldout"][-1]["pass_at_k"]
    # the model moved: a test of two runs that trained nothing would prove nothing
    assert a["metrics"][-1]["grad_norm"] > 0 and a["heldout"][0]["correct"] != a["heldout"][-1]["correct"]

    # the held-out file went through the chat template, to the very tokens the warm start trained on as plain text
    cfg = load_config(tmp_path / "a" / "config.toml")
    tasks = heldout_tasks(cfg)
    chat, plain = (PromptRenderer.for_model(warm_model_dir, d) for d in (cfg.data, load_config("tiny-cpu").data))
    assert chat.templated and all(t.messages for t in tasks) and len(tasks) == 19
    assert [chat.render(t).ids for t in tasks] == [plain.render(dataclasses.replace(t, messages=())).ids for t in tasks]
    # the curve is right on user data: `brorl eval` of the last checkpoint (vLLM, the run's own config) and the
    # learner's estimate at the last step (transformers) agree on the same prompts and samples, and solve some
    ev = brorl_eval(tmp_path / "a", tmp_path / "eval-after.json")
    assert ev["model"].endswith("step-000004/model") and ev["k"] == K and ev["left_out"] == 0
    assert [p["task_id"] for p in ev["per_prompt"]] == [t.task_id for t in tasks]
    assert_agree(a["heldout"][-1]["correct"], [p["correct"] for p in ev["per_prompt"]], K)
