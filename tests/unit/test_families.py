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


def test_the_cycle_check_passes_a_resume_from_step_3_and_names_what_went_wrong():
    """`bench.families --cycle`'s verdict on a family's run → eval → resume record."""
    from bench.families import check_cycle

    ok = {"first_steps": [1, 2, 3], "first_checkpoints": [3], "eval": {"prompts": 8, "k": 4, "pass_at_1": 0.25},
          "steps": [1, 2, 3, 4, 5], "versions": [1, 2, 3, 4, 5], "final_checkpoints": [3, 5], "ledger_error": None}
    assert check_cycle(ok) is None
    bad = {  # each: one field of a broken cycle -> the words its reason must hold
        "first_checkpoints": ([], "no checkpoint at step 3"),
        "steps": ([1, 2, 3, 1, 2, 3, 4, 5], "steps [1, 2, 3, 1, 2, 3, 4, 5], not [1, 2, 3, 4, 5]"),  # retrained
        "versions": ([1, 2, 3, 1, 2], "versions are [1, 2, 3, 1, 2]"),
        "eval": ({"prompts": 8, "k": 4, "pass_at_1": None}, "brorl eval gave 8 prompts"),
        "final_checkpoints": ([3], "no checkpoint at step 5"),
        "ledger_error": ("prompt 7 trained twice", "prompt ledger: prompt 7 trained twice"),
    }
    for key, (value, words) in bad.items():
        assert words in check_cycle({**ok, key: value}), key
