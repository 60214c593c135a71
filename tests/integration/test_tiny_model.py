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
