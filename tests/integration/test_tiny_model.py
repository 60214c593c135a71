import hashlib
import json
from pathlib import Path

import torch

from tinymodel import build_tiny_model, is_model_dir



def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_shape_and_size(tiny_model_dir):
    d = Path(tiny_model_dir)
    assert is_model_dir(d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32
    n = json.loads((d / "brorl-tiny.json").read_text())["parameters"]
    assert 200_000 <= n <= 5_000_000


def test_deterministic_for_seed(tiny_model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(Path(tiny_model_dir))
    assert (again / "tokenizer.json").read_text() == (Path(tiny_model_dir) / "tokenizer.json").read_text()
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _digest(other) != _digest(Path(tiny_model_dir))


def test_loads_in_transformers(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    text = "12+34=46"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.unk_token_id is None or tok.unk_token_id not in ids
    out = model(torch.tensor([ids]))
    assert out.logits.shape == (1, len(ids), model.config.vocab_size)
    assert tok.eos_token_id == model.config.eos_token_id


def test_ensure_model_rebuilds_a_tiny_model_of_an_older_builder_or_an_unfinished_warm_start(tmp_path, monkeypatch):
    """`brorl run` reuses the tiny model under runs/ only if the current builder made it and its warm start
    finished; otherwise it rebuilds and says why. A model brorl did not build is used as it is. (The warm
    start itself is replaced by a recorder here: its own tests train it for real.)"""
    import tinymodel
    import tinymodel.warm_start as ws
    from config.loader import load_config

    calls = []

    def fake_warm_start(cfg, path, seed=0):
        calls.append(path)
        return ws.SftResult(7, 0.3, [])

    monkeypatch.setattr(ws, "warm_start", fake_warm_start)
    monkeypatch.chdir(tmp_path)
    cfg = load_config("tiny-cpu", {"model.path": "runs/m"})
    said: list[str] = []
    meta = tmp_path / "runs/m/brorl-tiny.json"
    weights = tmp_path / "runs/m/model.safetensors"

    tinymodel.ensure_model(cfg, log=said.append)
    info = json.loads(meta.read_text())
    assert info["builder"] == tinymodel.BUILDER and info["warm_start"] == {"updates": 7, "pass_at_1": 0.3}
    assert len(calls) == 1
    built = weights.stat().st_mtime_ns
    tinymodel.ensure_model(cfg, log=said.append)  # current and finished: reused
    assert len(calls) == 1 and weights.stat().st_mtime_ns == built

    for change, why in [({"builder": 1}, "older brorl"), ({"warm_start": "pending"}, "never finished"),
                        ({"builder": None, "warm_start": None}, "older brorl")]:
        meta.write_text(json.dumps({**json.loads(meta.read_text()), **change}))
        said.clear()
        tinymodel.ensure_model(cfg, log=said.append)
        assert any(why in m for m in said if m.startswith("rebuilding")), (change, said)
        assert json.loads(meta.read_text())["warm_start"] == {"updates": 7, "pass_at_1": 0.3}
    assert len(calls) == 4

    tinymodel.ensure_model(load_config("tiny-cpu", {"model.path": "runs/raw"}), sft=False, log=said.append)
    assert json.loads((tmp_path / "runs/raw/brorl-tiny.json").read_text())["warm_start"] == "skipped"
    said.clear()
    tinymodel.ensure_model(load_config("tiny-cpu", {"model.path": "runs/raw"}), log=said.append)  # kept, with a note
    assert len(calls) == 4 and any("without a warm start" in m for m in said)

    meta.unlink()  # not built by brorl (no record): used as it is, whatever it holds
    tinymodel.ensure_model(cfg, log=said.append)
    assert len(calls) == 4 and not meta.exists()


def test_a_users_sharded_model_is_a_model_and_a_partial_folder_under_runs_is_left_alone(tmp_path, monkeypatch):
    """A sharded checkpoint with a sentencepiece tokenizer is a model folder; a folder under runs/ that holds a
    user's files but no complete model is refused by name, not built into (its files unchanged)."""
    import pytest

    from config.loader import load_config
    from tinymodel import ensure_model

    shards = tmp_path / "sharded"
    shards.mkdir()
    for f in ("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
              "model.safetensors.index.json", "tokenizer.model"):
        (shards / f).write_text("{}")
    assert is_model_dir(shards)
    (shards / "tokenizer.model").unlink()
    assert not is_model_dir(shards)
    monkeypatch.chdir(tmp_path)
    partial = tmp_path / "runs" / "mine"
    partial.mkdir(parents=True)
    (partial / "config.json").write_text('{"mine": 1}')
    cfg = load_config("tiny-cpu", {"model.path": "runs/mine"})
    with pytest.raises(SystemExit, match="runs/mine.*no complete model.*leaves them"):
        ensure_model(cfg, log=lambda m: None)
    assert [p.name for p in partial.iterdir()] == ["config.json"]
    assert (partial / "config.json").read_text() == '{"mine": 1}'
