"""The tiny models of the family matrix (`tinymodel.families`) keep what sets each family apart."""

import json

import pytest

from tinymodel.build import TinyModelSpec, train_tokenizer
from tinymodel.families import FAMILIES, HEAD_DIM, SLIDING_WINDOW, build_family


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tok = train_tokenizer(0, TinyModelSpec(corpus_lines=300))
    root = tmp_path_factory.mktemp("families")
    return {n: json.loads((build_family(n, root / n, tokenizer=tok) / "config.json").read_text()) for n in FAMILIES}


def test_each_family_keeps_its_features(built):
    for name, cfg in built.items():
        assert cfg["hidden_size"] // cfg["num_attention_heads"] == HEAD_DIM, name  # vLLM's CPU attention needs 32
        assert cfg["vocab_size"] == built["qwen3"]["vocab_size"], name  # one tokenizer for all
    assert {n for n, c in built.items() if c["num_key_value_heads"] < c["num_attention_heads"]} == set(FAMILIES) - {"phi3"}
    assert {n for n, c in built.items() if c["tie_word_embeddings"]} == {"qwen2.5", "qwen3", "gemma3"}
    assert built["mistral"]["sliding_window"] == built["gemma3"]["sliding_window"] == SLIDING_WINDOW
    assert built["gemma3"]["layer_types"] == ["sliding_attention", "full_attention"]
    assert built["llama3"]["rope_parameters"]["rope_type"] == "llama3"
    moe = built["qwen3-moe"]
    assert (moe["num_local_experts"], moe["num_experts_per_tok"], moe["norm_topk_prob"]) == (8, 2, True)
    assert [c["architectures"][0] for c in built.values()] == [
        "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM",
        "MistralForCausalLM", "Phi3ForCausalLM"]


def test_an_unknown_family_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match="unknown model family 'llama2'.*qwen3-moe"):
        build_family("llama2", tmp_path)
