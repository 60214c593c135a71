"""The `brorl-1.5b` preset as a user runs it on their own model and data: a Qwen2-1.5B-shaped model folder whose
tokenizer has a chat template with a reasoning block, a verl-layout Parquet file, a 4,096-token completion budget;
`brorl run` renders the prompts through the template, generates on one GPU, trains a step on another with the
preset's learner (ZeRO-2, compiled layers, bf16 autocast, token-budget
micro-batches). On a one-GPU machine the learner and the actor share the GPU (gloo weights, a fixed KV cache),
as a user with one card runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from learner.metrics import read
from tests.support import user_data
from tinymodel.build import CHAT_TEMPLATE
from transport.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_brorl_preset_trains_a_step_of_a_1p5b_chat_model_on_a_parquet_file(tmp_path):
    from transformers import AutoTokenizer

    from tinymodel.shaped import build_shaped_model

    model = build_shaped_model(tmp_path / "model", "qwen2-1.5b", device="cuda")
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHAT_TEMPLATE  # its markers are plain characters here: the template path all the same
    tok.save_pretrained(model)
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [user_data._verl(p, "openai/gsm8k", a, i) for i, (p, a) in enumerate(user_data.MATH)]
    rows += [user_data._verl(p, "gpqa", a, 10 + i) for i, (p, a) in enumerate(user_data.SCIENCE)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")  # a verl-layout file
    assert torch.cuda.device_count() >= 1, "this test needs a GPU"
    if torch.cuda.device_count() >= 2:  # the learner on GPU 0, the actor on GPU 1
        place = {"learner.gpus": [0], "actor.gpus": [1]}
    else:  # one card for both, set up for sharing (docs/configuration.md, GPU placement)
        place = {"learner.gpus": [0], "actor.gpus": [0], "transport.weight_backend": "gloo", "actor.kv_cache_gib": 16,
                 "actor.gpu_memory_utilization": 0.3}
    port = free_ports(3)
    over = {"model.path": str(model), "data.train": [str(tmp_path / "train.parquet")], "run.run_dir": str(tmp_path / "run"),
            "learner.steps": 1, "job.prompts_per_step": 1, "job.n_samples": 64, "actor.num_actors": 1,
            "actor.prompts_per_request": 1, "actor.max_tokens": 4096, "actor.max_model_len": 4608,
            "learner.dynamic_sampling": False,  # random weights solve nothing: every group would be dropped
            **place, "transport.work_port": port,
            "transport.rollout_port": port + 1, "transport.control_port": port + 2}
    flags = [x for k, v in over.items() for x in (f"--{k}", v if isinstance(v, str) else json.dumps(v))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "cli", "run", "--config", "brorl-1.5b", "--no-eval", *flags],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840)
    log = (tmp_path / "run" / "logs" / "learner.log")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:] + (log.read_text()[-3000:] if log.exists() else "")
    rows = read(tmp_path / "run" / "metrics.jsonl")
    print({k: rows[-1].get(k) for k in ("samples", "train_tokens", "completion_len_max", "truncated_frac", "train_s")})
    assert [row["step"] for row in rows] == [1] and rows[0]["samples"] == 64
    assert 1 <= rows[0]["completion_len_max"] <= 4096 and 0 <= rows[0]["truncated_frac"] <= 1
    assert not any(k.startswith("rejected_") and v for k, v in rows[0].items())  # the prompt tokens were the learner's
    ledger = [json.loads(line) for line in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    assert {s for row in ledger if "granted" in row for s in row["sources"]} <= {"openai/gsm8k", "gpqa"}
