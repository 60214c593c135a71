"""A model of a real model's shape (Qwen2-1.5B by default; Llama 3 8B), random weights, with a tokenizer of its full
vocabulary: what the GPU benchmarks run the whole loop on when no checkpoint may be downloaded.

    python -m tinymodel.shaped OUT_DIR [--shape qwen2-1.5b] [--dtype bfloat16]

The tokenizer reads text one character at a time (printable ASCII, so every task prompt tokenizes
without unknowns) and has `vocab_size` entries: the characters, the end-of-text token, and synthetic
tokens `<t12345>` for the rest. A random-weight model samples from the whole vocabulary, so every id the
engine can produce decodes to text (the verifiers score text), and the LM head and the log-softmax are
as large as the real model's. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

from tinymodel.build import EOS

SHAPES = {
    "qwen2-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151_936, max_position_embeddings=32_768,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6),
    # Llama 3 8B (untied head; no rope scaling, which random weights do not need): the one-GPU LoRA case
    "llama3-8b": dict(arch="llama", tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128_256,
                      max_position_embeddings=8192, rope_theta=500_000.0, rms_norm_eps=1e-5),
    # the same construction at a size a 2-core CPU runs in seconds (tests, `bench.e2e --quick`)
    "small": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=4096, max_position_embeddings=2048),
}


def char_tokenizer(vocab_size: int):
    """A `PreTrainedTokenizerFast` of exactly `vocab_size` ids: one per printable character, EOS, and
    synthetic tokens for the rest."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    if vocab_size < len(chars) + 1:
        raise ValueError(f"vocab_size {vocab_size} is below the {len(chars) + 1} characters and EOS it must hold")
    vocab = {c: i for i, c in enumerate(chars)}
    vocab[EOS] = len(vocab)
    for i in range(len(vocab), vocab_size):
        vocab[f"<t{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # every character on its own
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    if len(hf) != vocab_size:
        raise AssertionError(f"tokenizer has {len(hf)} ids, wanted {vocab_size}")
    return hf


def build_shaped_model(out_dir: str | Path, shape: str = "qwen2-1.5b", *, seed: int = 0,
                       dtype: str = "bfloat16", device: str = "cpu") -> Path:
    """Write config, tokenizer and random weights (in `dtype`) of `shape` to `out_dir`; returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = char_tokenizer(SHAPES[shape]["vocab_size"])
    eos = tok.convert_tokens_to_ids(EOS)
    spec = {"arch": "qwen2", "tie_word_embeddings": True, **SHAPES[shape]}
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "llama": (LlamaConfig, LlamaForCausalLM)}[spec.pop("arch")]
    cfg = config_cls(**spec, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, torch_dtype=dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(cfg).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = eos
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "brorl-shaped.json").write_text(json.dumps({"shape": shape, "seed": seed, "dtype": dtype,
                                                       "parameters": sum(p.numel() for p in model.parameters())}) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--shape", default="qwen2-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where to initialise the weights (cuda is faster for 1.5B)")
    a = ap.parse_args()
    print(build_shaped_model(a.out_dir, a.shape, seed=a.seed, dtype=a.dtype, device=a.device))


if __name__ == "__main__":
    main()
