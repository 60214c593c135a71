"""A user's own model and data, end to end: a locally built model folder whose tokenizer has a Qwen2-style chat
template with a reasoning block, and files in the layouts of other frameworks (a verl Parquet file mixing
math, code and science; an HF `datasets` folder of IFEval rows; a JSONL file with other field names). One
`brorl run` command trains on them — prompts rendered through the chat template, the group's prompt tokens
checked against the learner's, completions read after `</think>`, metrics to W&B offline — and evaluates on a
held-out Parquet file, per data source."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from learner.ledger import account, check
from learner.metrics import read
from tests.support import user_data
from transport.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"openai/gsm8k", "codecontests", "gpqa", "ifeval_hf", "reasoning_gym"}


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> str:
    from tinymodel import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("chat-model"), seed=0, chat=True))


def _flags(over: dict) -> list[str]:
    out = []
    for k, v in over.items():
        out += [f"--{k}", v if isinstance(v, str) else json.dumps(v)]
    return out


@pytest.mark.vllm
@pytest.mark.slow
def test_brorl_run_trains_on_a_users_model_and_files_and_evaluates_per_source(chat_model_dir, tmp_path):
    paths = user_data.write(tmp_path / "data")
    run_dir = tmp_path / "run"
    port = [free_ports(3) + i for i in range(3)]
    over = {**user_data.sources(paths), "model.path": chat_model_dir, "run.run_dir": str(run_dir), "run.seed": 1,
            "learner.steps": 3, "job.prompts_per_step": 4, "learner.num_minibatches": 1, "job.n_samples": 4,
            "actor.prompts_per_request": 4, "actor.max_tokens": 16, "actor.max_model_len": 128,
            "learner.dynamic_sampling": False,  # a random-weight model solves nothing: every group would be dropped
            "learner.overlong_buffer": 4, "data.reasoning_end": "</think>", "run.eval_samples": 2,
            "run.eval_interval": 3, "run.wandb_project": "brorl-e2e", "learner.checkpoint_interval": 3,
            "transport.work_port": port[0], "transport.rollout_port": port[1], "transport.control_port": port[2]}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "cli", "run", *_flags(over)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    rows = read(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3]
    # the engine generated from the chat template's rendering (the raw prompts are shorter than any rendered one)
    from config.loader import load_config
    from taskdata import PromptRenderer
    from taskdata.sources import load_all

    cfg = load_config("tiny-cpu", over)
    renderer = PromptRenderer.for_model(chat_model_dir, cfg.data)
    tasks = [t for lo in load_all(cfg.data, "train") for t in lo.tasks]
    rendered = min(len(renderer.render(t).ids) for t in tasks)  # the shortest prompt through the template
    assert min(len(renderer.tok(t.prompt)["input_ids"]) for t in tasks) < rendered  # a raw prompt is shorter
    assert min(row["prompt_len_min"] for row in rows) >= rendered, [row["prompt_len_min"] for row in rows]
    for row in rows:  # every group's prompt tokens were the learner's rendering: none rejected for it
        assert not any(k.startswith("rejected_") and v for k, v in row.items()), row
        assert 0.0 <= row["truncated_frac"] <= 1.0 and 1 <= row["completion_len_max"] <= 16
        assert row["samples"] > 0 and row["version"] == row["step"]
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    granted = [s for row in ledger if "granted" in row for s in row["sources"]]
    assert SOURCES <= set(granted), granted  # rows of every file and data source went to the actor
    check(account(run_dir), 3)
    # the held-out Parquet file, per data source: the learner's own estimate and `brorl eval` after training
    held = read(run_dir / "heldout.jsonl")
    assert [h["step"] for h in held] == [0, 3] and set(held[-1]["by_source"]) == {"openai/gsm8k", "gpqa"}
    after = json.loads((run_dir / "eval-after.json").read_text())
    assert after["prompts"] == 3 and set(after["by_source"]) == {"openai/gsm8k", "gpqa"}
    assert after["by_source"]["openai/gsm8k"]["prompts"] == 2 and "pass_at_2" in after["by_source"]["gpqa"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["pass_at_1_by_source"]) == {"openai/gsm8k", "gpqa"}
    # metrics went to W&B (offline: its files in the run folder)
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
