"""Tiny models of the families users bring, built locally from each family's real configuration.

Each builder keeps what sets its family apart — grouped-query attention, Llama 3's rope scaling, Qwen's
attention biases, Qwen3's q/k-norm, Gemma 3's interleaved sliding-window layers and scaled embeddings,
Mistral's sliding window, Phi-3's fused projections, tied or untied embeddings, a Qwen3-MoE router — at a
size that runs on a CPU in seconds (head_dim 32: vLLM's CPU attention rejects 16). Every family shares the
tiny model's tokenizer (`tinymodel.build.train_tokenizer`), so the vocabulary size is the same everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

from tinymodel.build import EOS, TinyModelSpec, train_tokenizer

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 2, 1, 32, 2
SLIDING_WINDOW = 8  # shorter than a prompt and its completion: the window really cuts attention


def _common(vocab: int, eos: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, torch_dtype="float32")


def _llama3(c):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return LlamaForCausalLM, LlamaConfig(**c, rope_parameters=rope, tie_word_embeddings=False)


def _qwen25(c):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM, Qwen2Config(**c, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                         tie_word_embeddings=True)


def _qwen3(c):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM, Qwen3Config(**c, head_dim=HEAD_DIM, tie_word_embeddings=True,
                                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def _qwen3_moe(c):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM, Qwen3MoeConfig(
        **c, head_dim=HEAD_DIM, tie_word_embeddings=False, num_experts=8, num_local_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def _gemma3(c):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    return Gemma3ForCausalLM, Gemma3TextConfig(
        **c, head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM, sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None, attn_logit_softcapping=None,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}})


def _mistral(c):
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM, MistralConfig(**c, head_dim=HEAD_DIM, sliding_window=SLIDING_WINDOW,
                                             tie_word_embeddings=False)


def _phi3(c):
    from transformers import Phi3Config, Phi3ForCausalLM

    # Phi-3-mini: multi-head attention (as many key/value heads as heads), fused qkv and gate/up projections
    return Phi3ForCausalLM, Phi3Config(**{**c, "num_key_value_heads": HEADS}, tie_word_embeddings=False,
                                       sliding_window=None)


FAMILIES = {
    "llama3": (_llama3, "GQA 2:1, llama3 rope scaling, untied embeddings"),
    "qwen2.5": (_qwen25, "GQA 2:1, q/k/v biases, tied embeddings"),
    "qwen3": (_qwen3, "GQA 2:1, q/k-norm, tied embeddings"),
    "qwen3-moe": (_qwen3_moe, "GQA 2:1, q/k-norm, 8 experts top-2 router, untied embeddings"),
    "gemma3": (_gemma3, "GQA 2:1, q/k-norm, sliding window 8 / global layers, scaled embeddings, tied"),
    "mistral": (_mistral, "GQA 2:1, sliding window 8, untied embeddings"),
    "phi3": (_phi3, "multi-head attention, fused qkv and gate/up projections, untied embeddings"),
}
"""Family name → (builder of (model class, config) from the shared fields, what the tiny model keeps)."""


def build_family(name: str, out_dir: str | Path, seed: int = 0, tokenizer=None) -> Path:
    """Write the tiny model of family `name` (config.json, model.safetensors, tokenizer files) to `out_dir`.
    `tokenizer`: a `train_tokenizer` result to reuse (training one takes a second)."""
    import torch
    from transformers import PreTrainedTokenizerFast

    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}: choose one of {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if tokenizer is not None else train_tokenizer(seed, TinyModelSpec())
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    eos = hf_tok.convert_tokens_to_ids(EOS)
    cls, cfg = FAMILIES[name][0](_common(len(hf_tok), eos))
    torch.manual_seed(seed)
    model = cls(cfg).float()
    with torch.no_grad():  # transformers initialises norms to their identity: perturb them, so they matter
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    (out / "brorl-family.json").write_text(json.dumps(
        {"family": name, "seed": seed, "parameters": sum(p.numel() for p in model.parameters())}, indent=2) + "\n")
    return out
