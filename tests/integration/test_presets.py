"""Every preset under config/ starts its task stream as a user starts it: loaded (with the user's data files where
the preset trains on them), its tasks rendered for a model through the prompt path the learner uses, its
held-out tasks and its verifiers found. A preset that cannot start (the 1.5B presets' `task = "math"` once
did) fails here, not on a rented GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from config.loader import load_config, preset_paths
from learner.batching import TaskStream
from taskdata import PromptRenderer, heldout_tasks, verifier_names
from tests.support import user_data
from verifiers.registry import Registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from tinymodel import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("chat"), chat=True))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return user_data.write(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("preset", [p.stem for p in preset_paths()])
def test_every_preset_starts_its_task_stream(preset, chat_model, files):
    from transformers import AutoTokenizer

    bare = load_config(preset, {"data.train": "x.parquet"})  # what the preset itself asks for
    over = {"model.path": chat_model, **(user_data.sources(files) if not bare.verifiers.task else {})}
    cfg = load_config(preset, over)
    renderer = PromptRenderer(AutoTokenizer.from_pretrained(chat_model), cfg.data, cfg.actor.max_model_len - 1)
    stream = TaskStream(cfg, renderer)
    rendered = [stream[i] for i in range(8)]
    assert all(ids and t.verifier for t, ids in rendered) and stream.unrenderable == 0
    assert all(ids[:1] == [renderer.tok.convert_tokens_to_ids("<|im_start|>")] for _, ids in rendered)
    assert heldout_tasks(cfg, n=4) and verifier_names(cfg) <= Registry().names()


def test_data_preview_shows_rows_as_the_engine_and_the_verifiers_see_them(chat_model, files):
    over = user_data.sources(files)
    r = subprocess.run([sys.executable, "-m", "cli", "data", "preview", "--config", "brorl-1.5b", "--rows", "1",
                        "--model.path", chat_model, "--data.train", json.dumps(over["data.train"]),
                        "--data.eval", json.dumps(over["data.eval"])], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "chat template on" in out
    assert "layout verl  rows 10: used 8, bad 2" in out and "layout ifeval" in out and "layout custom" in out
    assert "codecontests -> code (2), gpqa -> science (2), openai/gsm8k -> math (4)" in out
    assert "train.parquet:10: reference: test 0 expects no output" in out  # bad rows named: file, row, field
    assert "other.jsonl:3: not valid JSON" in out
    assert "<|im_start|>assistant" in out and "tokens):" in out and "prompt tokens (first 8 rows): min" in out
    assert "instructions punctuation:no_comma" in out and "reasoning-gym basic_arithmetic: answer" in out
    missing = subprocess.run([sys.executable, "-m", "cli", "data", "preview", "--data.train", "nope.parquet"],
                             capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 1 and "nope.parquet: no such file or folder" in missing.stdout
