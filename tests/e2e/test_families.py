"""The model-family matrix (`bench.families`): each family's tiny model, after a weight update pushed into a CPU
vLLM engine through brorl's broadcast, scores the engine's samples with the learner's code within fp32 rounding
of the engine's own distributions."""

import pytest

from bench.families import KL_MAX, check_family

# Qwen3-MoE checks what dense families cannot: vLLM's CPU experts keep their weights prepacked, so an update
# must repack them (`transport.vllm_ext.reprepack_cpu_moe`), and the router's choices must agree after it.
CI_FAMILIES = ["llama3", "qwen2.5", "qwen3", "qwen3-moe", "gemma3", "mistral", "phi3"]


@pytest.fixture(scope="module")
def shared_tokenizer():
    from tinymodel.build import TinyModelSpec, train_tokenizer

    return train_tokenizer(0, TinyModelSpec())


@pytest.mark.vllm
@pytest.mark.parametrize("family", CI_FAMILIES)
def test_family_logprobs_match_vllm_after_an_update(family, shared_tokenizer, tmp_path):
    import torch

    threads = torch.get_num_threads()
    row = check_family(family, tmp_path, tokenizer=shared_tokenizer)
    # the engine ran in this process: the rest of the session keeps its threads
    torch.set_num_threads(threads + 1)
    assert torch.get_num_threads() == threads + 1
    torch.set_num_threads(threads)
    assert row["tokens"] == 4 * 4 * 24
    assert row["kl_max_at_load"] <= KL_MAX, row  # the engine's own checkpoint load
    assert row["kl_max"] <= KL_MAX, row  # after the update
    # the update reached the engine: the weights before it are far from what the engine samples with
    assert row["kl_before_update"] > 10 * KL_MAX, row
    if "router_agreement" in row:  # a MoE model: after the update the engine routes every token as the learner does
        assert row["router_agreement"] == 1.0 and row["routed_pairs"] > 0, row
