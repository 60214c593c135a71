"""Model FLOPs of a training step, and the model FLOPs utilisation (MFU) the learner reports per step.

One forward over a sample of s = prompt + completion tokens, r of them response tokens, costs
2·P·s (the matmuls over the P decoder parameters, embeddings excluded) + 2·layers·d·s² (causal attention:
QKᵀ and AV over the lower triangle) + 2·V·d·r (the LM head, which the learner runs on response tokens only).
A backward costs two forwards. A step runs, per trained sample, the training forward and backward (3
forwards), the π_old forward of every mini-batch but the first (`learner/train_step.py`) and, with a KL term,
the reference policy's forward. With frozen weights (LoRA: `learner.lora_rank`) the backward computes no weight
gradients for them, one forward's matmuls less (the adapters' own are negligible). Recomputation (activation checkpointing, the chunked LM head) does not count:
MFU measures the work the algorithm needs, not the work a memory-saving choice adds.

MFU = model FLOPs / step seconds / (ranks × the card's dense bf16 peak). The peak is known for the cards in
`PEAK_BF16` (by the name CUDA reports); elsewhere (a CPU, an unlisted card) only `model_tflops` is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "H20": 148e12, "A100": 312e12, "A800": 312e12,
             "B200": 2250e12, "GB200": 2500e12, "L40S": 362e12}
"""Dense bf16 peak FLOP/s by card (NVIDIA's data sheets, SXM parts; without sparsity)."""


@dataclass(frozen=True)
class ModelShape:
    params: int
    """P: parameters of the decoder's layers (embeddings and LM head excluded)."""
    layers: int
    hidden: int
    vocab: int
    frozen: bool = False
    """The decoder's and LM head's weights are frozen (LoRA): no weight gradients in backward."""

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        """The shape of a Hugging Face causal LM (a ZeRO-3 parameter counts its full size, `ds_numel`)."""
        cfg = model.config
        text = getattr(cfg, "text_config", None) or cfg
        size = lambda p: int(getattr(p, "ds_numel", 0) or p.numel())  # noqa: E731
        outside = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
                   for p in m.parameters()}
        params = [p for p in model.parameters() if id(p) not in outside]
        total, trained = sum(size(p) for p in params), sum(size(p) for p in params if p.requires_grad)
        frozen = 2 * trained < total  # LoRA: adapters train (counted out of P: their matmuls are negligible)
        return cls(total - trained if frozen else total, int(text.num_hidden_layers), int(text.hidden_size),
                   int(text.vocab_size), frozen=frozen)

    def forward_flops(self, seq_len: int, response_len: int) -> float:
        """One forward over one sample (the module's docstring)."""
        s, r = seq_len, response_len
        return 2.0 * self.params * s + 2.0 * self.layers * self.hidden * s * s + 2.0 * self.vocab * self.hidden * r

    def train_flops(self, seq_len: int, response_len: int) -> float:
        """Forward and backward over one sample: three forwards, less the weight gradients of frozen weights."""
        frozen = 2.0 * self.params * seq_len + 2.0 * self.vocab * self.hidden * response_len if self.frozen else 0.0
        return 3 * self.forward_flops(seq_len, response_len) - frozen


def step_flops(shape: ModelShape, samples: list[tuple[int, int]], first_minibatch: set[int], reference: bool) -> float:
    """Model FLOPs of a step over `samples` ((sequence length, response length) each): training forward and
    backward of each, the π_old forward of those not in `first_minibatch` (their indices), and the reference
    forward of each with `reference`."""
    total = 0.0
    for i, (s, r) in enumerate(samples):
        total += shape.train_flops(s, r) + shape.forward_flops(s, r) * ((i not in first_minibatch) + reference)
    return total


def peak_flops(device: str | torch.device) -> float | None:
    """The dense bf16 peak of the card behind `device`, or None (a CPU, an unlisted card)."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(dev)
    # the longest matching key: "GB200" before "B200", "H200" rather than "H20"
    hits = [k for k in PEAK_BF16 if k in name]
    return PEAK_BF16[max(hits, key=len)] if hits else None
