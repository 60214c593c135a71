"""`run.reproducible` end to end: two runs of one command, side by side (so their timings differ), give the
same steps, the same training metrics and the same held-out curve, bit for bit."""

import concurrent.futures

import pytest

from bench.common import brorl_run
from transport.ports import free_ports

SAME = ("generated", "groups_received", "drop_all_correct", "drop_all_wrong", "pass_rate", "reward_mean",
        "completion_len_mean", "loss", "pg_loss", "grad_norm", "entropy", "approx_kl", "mismatch_kl", "tis_mean",
        "ratio_mean")
"""Every metric that is not a time: what was generated, kept and dropped, and what training did with it."""


@pytest.mark.vllm
@pytest.mark.slow
def test_two_runs_of_one_reproducible_command_are_the_same(warm_model_dir, tmp_path):
    first = free_ports(3)
    ports = {"a": first, "b": free_ports(3, avoid=range(first, first + 3))}

    def one(name: str) -> dict:
        p = ports[name]
        return brorl_run(tmp_path / name, {
            "model.path": warm_model_dir, "run.reproducible": "true", "run.seed": 3, "learner.steps": 4,
            "job.prompts_per_step": 4, "job.n_samples": 8, "job.max_staleness": 0, "actor.prompts_per_request": 2,
            "run.eval_interval": 2, "run.eval_prompts": 16, "run.eval_samples": 4,
            "transport.work_port": p, "transport.rollout_port": p + 1, "transport.control_port": p + 2}, timeout=900)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.map(one, ["a", "b"])
    assert len(a["metrics"]) == len(b["metrics"]) == 4
    for ra, rb in zip(a["metrics"], b["metrics"]):
        assert {k: ra[k] for k in SAME} == {k: rb[k] for k in SAME}, f"step {ra['step']}"
    assert [(h["step"], h["pass_at_1"], h["correct"]) for h in a["heldout"]] == \
           [(h["step"], h["pass_at_1"], h["correct"]) for h in b["heldout"]]
    assert [h["step"] for h in a["heldout"]] == [0, 2, 4]
    assert all(h["k"] == 4 and h["pass_at_k"] >= h["pass_at_1"] for h in a["heldout"])  # pass@4 beside pass@1
    assert a["metrics"][-1]["heldout_pass_at_4"] == a["heldout"][-1]["pass_at_k"]
    # the model moved: a test of two runs that trained nothing would prove nothing
    assert a["metrics"][-1]["grad_norm"] > 0 and a["heldout"][0]["correct"] != a["heldout"][-1]["correct"]
