import hashlib
import json
from pathlib import Path

import pytest
import torch

from learner.tiny_model import build_tiny_model, is_model_dir

# vLLM and transformers both run the tiny model in float32 on CPU but with different kernels
# (vLLM's CPU attention and fused RMSNorm/SiLU vs torch eager), so per-token log-probs differ only by
# float32 rounding accumulated over 4 layers: ~1e-6 relative, ~1e-5 absolute on log-probs near -5.
# We allow 1e-3 absolute per token: 100x the observed error, and still 3 orders of magnitude below
# what a real disagreement (a different token distribution, a wrong position or temperature) gives.
LOGPROB_ATOL = 1e-3


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


@pytest.mark.vllm
def test_vllm_logprobs_match_transformers(vllm_engine, tiny_cfg, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from actors.engine import sampling_params
    from learner.logprobs import pack, token_logprobs

    prompts = ["3+4=", "25-7=", "9+9="]
    outs = vllm_engine.generate(prompts, sampling_params(tiny_cfg.actor, n=8, max_tokens=8))
    P, C, B = [], [], []
    for o in outs:
        assert len(o.outputs) == 8
        for c in o.outputs:
            assert len(c.logprobs) == len(c.token_ids) > 0
            P.append(list(o.prompt_token_ids))
            C.append(list(c.token_ids))
            B.append([step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    batch = pack(P, C)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch, temperature=tiny_cfg.actor.temperature)
    behav = torch.zeros_like(logp).masked_scatter(batch.mask, torch.tensor([x for b in B for x in b]))
    err = (logp - behav).abs()[batch.mask]
    assert torch.isfinite(err).all()
    assert err.max().item() < LOGPROB_ATOL, f"max |Δlogp| = {err.max().item():.2e}"
    # the comparison is sharp: scoring under another temperature is far outside the tolerance
    with torch.no_grad():
        hot, _ = token_logprobs(model, batch, temperature=2.0)
    assert (hot - behav).abs()[batch.mask].max().item() > 100 * LOGPROB_ATOL
