"""`brorl make-tiny-model`: a Qwen2-architecture model and its tokenizer, built locally, no download.

The tokenizer is a small BPE trained with `tokenizers` on text from the synthetic task generator (over an
alphabet of printable ASCII, so any prompt tokenizes without unknowns). The model is a randomly
initialised `Qwen2ForCausalLM` (~1M parameters, head_dim 32: vLLM's CPU attention rejects 16) saved as
a Hugging Face folder — config.json, tokenizer files, model.safetensors — that transformers and vLLM
both load. Everything is deterministic for a seed.
"""

from __future__ import annotations

import json
import string
from dataclasses import asdict, dataclass
from pathlib import Path

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 160
    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # head_dim = 32
    num_key_value_heads: int = 2
    max_position_embeddings: int = 256
    corpus_lines: int = 20_000


def train_tokenizer(seed: int, spec: TinyModelSpec):
    from tokenizers import Tokenizer, decoders, models, trainers

    from verifiers import synthetic

    alphabet = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[EOS],
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    lines = synthetic.corpus(seed, spec.corpus_lines, difficulty=2)
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


BUILDER = 2
"""The builder's version, written into `brorl-tiny.json`: bump it whenever a build's output changes (the
tokenizer, the architecture, the initialisation), so that `ensure_model` rebuilds folders of older builds."""


# Qwen2-style chat template of a reasoning model (DeepSeek-R1-distilled Qwen): the assistant turn opens a
# <think> block, which the model closes before its answer.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
CHAT_SPECIAL = ["<|im_start|>", "<|im_end|>"]
THINK = ["<think>", "</think>"]  # plain added tokens (not special): they survive decoding, as in Qwen's


def tiny_tokenizer(seed: int = 0, spec: TinyModelSpec = TinyModelSpec(), chat: bool = False):
    """The tiny model's tokenizer (a transformers fast tokenizer); `chat`: as `build_tiny_model`'s."""
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(seed, spec), eos_token=EOS, pad_token=EOS)
    if chat:
        from tokenizers import AddedToken

        hf_tok.add_special_tokens({"additional_special_tokens": CHAT_SPECIAL, "eos_token": "<|im_end|>"})
        hf_tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
        hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def build_tiny_model(out_dir: str | Path, seed: int = 0, spec: TinyModelSpec = TinyModelSpec(),
                     chat: bool = False) -> Path:
    """Write tokenizer + randomly initialised Qwen2 model to `out_dir`; returns the folder. `chat`: the
    tokenizer also carries a Qwen2-style chat template with a reasoning block (`CHAT_TEMPLATE`), its turn
    tokens and `<think>`/`</think>`, and `<|im_end|>` ends a completion (a user's reasoning model, in small)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok = tiny_tokenizer(seed, spec, chat)
    eos_id = hf_tok.convert_tokens_to_ids(hf_tok.eos_token)
    cfg = Qwen2Config(
        vocab_size=hf_tok.vocab_size if len(hf_tok) <= spec.vocab_size else len(hf_tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    meta = {"builder": BUILDER, "seed": seed, "spec": asdict(spec), "chat": chat,
            "parameters": sum(p.numel() for p in model.parameters())}
    (out / "brorl-tiny.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def is_model_dir(path: str | Path) -> bool:
    """A Hugging Face model folder: config.json, weights (one file or shards, safetensors or .bin) and a
    tokenizer's files."""
    p = Path(path)
    return ((p / "config.json").is_file()
            and (any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin")))
            and any((p / f).is_file() for f in TOKENIZER_FILES))
