"""The step's model FLOPs (learner/flops.py): the shape read from a model, the count per pass, the card's peak."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from learner.flops import ModelShape, PEAK_BF16, peak_flops, step_flops


def _model(tied: bool) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg)


@pytest.mark.parametrize("tied", [True, False])
def test_the_shape_counts_the_decoder_layers_parameters_and_not_the_embeddings(tied):
    model = _model(tied)
    shape = ModelShape.of(model)
    d, ffn, kv = 64, 128, 64 * 2 // 4
    per_layer = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * ffn + 2 * d  # q (bias), k, v (bias), o; mlp; 2 norms
    assert shape == ModelShape(params=3 * per_layer + d, layers=3, hidden=64, vocab=300)  # + the final norm
    total = sum(p.numel() for p in model.parameters())
    assert shape.params == total - 300 * 64 * (1 if tied else 2)


def test_a_step_counts_three_forwards_per_sample_plus_pi_old_outside_the_first_minibatch_and_the_reference():
    shape = ModelShape(params=1000, layers=2, hidden=8, vocab=50)
    f = shape.forward_flops(10, 4)
    assert f == 2 * 1000 * 10 + 2 * 2 * 8 * 100 + 2 * 50 * 8 * 4
    samples = [(10, 4)] * 6
    assert step_flops(shape, samples, set(), reference=False) == 6 * 4 * f  # π_old of all: 4 forwards each
    assert step_flops(shape, samples, {0, 1, 2}, reference=False) == (3 * 4 + 3 * 3) * f
    assert step_flops(shape, samples, {0, 1, 2}, reference=True) == (3 * 5 + 3 * 4) * f


def test_the_peak_is_known_for_listed_cards_and_none_on_a_cpu():
    assert peak_flops("cpu") is None
    if torch.cuda.is_available():  # on a GPU machine: the card's entry, or None for an unlisted card
        name = torch.cuda.get_device_name(0)
        hit = [k for k in PEAK_BF16 if k in name]
        assert peak_flops("cuda") == (PEAK_BF16[max(hit, key=len)] if hit else None)


def test_lora_frozen_weights_drop_their_weight_gradients_from_the_count():
    from config.loader import load_config
    from learner.lora import add_adapters

    model = _model(tied=False)
    full = ModelShape.of(model)
    lrn = load_config("tiny-cpu", {"learner.lora_rank": 4}).learner
    shape = ModelShape.of(add_adapters(model, lrn))
    assert shape.frozen and not full.frozen and shape.params == full.params  # the adapters are counted out of P
    s, r = 10, 4
    weight_grads = 2 * shape.params * s + 2 * shape.vocab * shape.hidden * r  # one forward's matmuls over weights
    assert shape.train_flops(s, r) == 3 * shape.forward_flops(s, r) - weight_grads
    assert step_flops(shape, [(s, r)], {0}, reference=False) == shape.train_flops(s, r)
    assert step_flops(full, [(s, r)], {0}, reference=False) == 3 * full.forward_flops(s, r)
