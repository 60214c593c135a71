"""LoRA in the learner (`learner.lora_rank` > 0): a frozen base, trainable float32 adapters, merged exports.

    model = load_base(path, cfg, compute_dtype)   # the base in the compute dtype on CUDA (float32 on CPU)
    add_adapters(model, cfg)                      # peft's LoRA layers on `lora_targets`; only they train
    view = MergedView(model)                      # what the actors and checkpoints get: the base model's names,
    view.named_shapes(); view.tensors(a, b)       # W + scale·B·A for every adapted weight, the rest as it is

The adapters are injected into the Hugging Face model itself (`peft.inject_adapter_in_model`), so the trainer
runs the same module API (decoder layers, input embeddings, LM head) as without LoRA. The merge is computed
out of place, one tensor at a time, in float32 and cast to the base's dtype: the base is never modified, so it
stays bit-identical across steps (an in-place merge and unmerge in bf16 would drift it). The engine thus loads
plain weights over every transport, with no LoRA support of its own.
A checkpoint holds the merged model in `model/` (what `brorl eval` and vLLM load) and the adapters, exactly,
in `adapter.safetensors`; a resume loads the base from `model.path` again and the adapters from the checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

from config.schema import LearnerConfig

ADAPTER = "default"  # peft's adapter name
ADAPTER_FILE = "adapter.safetensors"  # in a checkpoint folder, beside model/


def is_adapter(name: str) -> bool:
    """Is `name` (a state_dict key) a LoRA adapter's parameter?"""
    return ".lora_A." in name or ".lora_B." in name


def base_dtype(cfg: LearnerConfig, compute_dtype: torch.dtype) -> torch.dtype:
    """The frozen base's dtype: the compute dtype on a GPU, float32 on a CPU (as the full model there)."""
    return compute_dtype if torch.device(cfg.device).type == "cuda" else torch.float32


def add_adapters(model: torch.nn.Module, cfg: LearnerConfig) -> torch.nn.Module:
    """Freeze `model` and inject LoRA adapters (rank `lora_rank`, `lora_alpha`, no dropout: PPO needs a
    deterministic policy) into the linear layers named in `lora_targets`; the adapters are float32 and the only
    parameters that train. Raises ValueError if no layer matches, or a match is not a plain linear layer."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    for p in model.parameters():
        p.requires_grad_(False)
    lc = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets),
                    lora_dropout=0.0, bias="none")
    try:
        model = inject_adapter_in_model(lc, model)
    except ValueError as e:
        raise ValueError(f"learner.lora_targets {cfg.lora_targets}: {e}") from e
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    unmatched = [t for t in cfg.lora_targets if not any(n == t or n.endswith(f".{t}") for n, _ in layers)]
    if unmatched:  # e.g. Phi-3's fused qkv_proj / gate_up_proj: adapting only some projections would be silent
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, LoraLayer)
                         or (isinstance(m, torch.nn.Linear) and ".lora_" not in n and not n.endswith(".base_layer"))})
        raise ValueError(f"learner.lora_targets {unmatched} match no layer of {type(model).__name__}; its linear "
                         f"layers are named {linear}: set learner.lora_targets to those to adapt")
    odd = [n for n, m in layers if not isinstance(m, LoraLinear) or m.fan_in_fan_out]
    if odd:
        raise ValueError(f"learner.lora_targets: {odd[:3]} are not plain linear layers; target only those")
    for name, p in model.named_parameters():
        adapter = is_adapter(name)
        if adapter:
            p.data = p.data.float()  # peft gives the adapters the base's dtype: train them in float32
        p.requires_grad_(adapter)
    return model


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' parameters by state_dict key (detached, on the CPU): what a checkpoint saves."""
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if is_adapter(k)}


def save_adapters(model: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import save_file

    save_file(adapter_state(model), str(Path(folder) / ADAPTER_FILE))


def load_adapters(model: torch.nn.Module, folder: Path) -> None:
    """The adapters saved in checkpoint `folder`, exactly; ValueError if they are not this model's."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(folder) / ADAPTER_FILE))
    params = dict(model.named_parameters())
    ours = {k for k in params if is_adapter(k)}
    if set(saved) != ours or any(saved[k].shape != params[k].shape for k in saved):
        raise ValueError(f"{folder / ADAPTER_FILE} holds other adapters than learner.lora_rank / lora_targets make "
                         f"({len(saved)} tensors saved, {len(ours)} here): resume with the run's own LoRA settings")
    with torch.no_grad():
        for k, v in saved.items():
            params[k].copy_(v)


class MergedView:
    """The model as the actors serve it: the base model's state_dict names (peft's `base_layer.` removed, the
    adapters left out), adapted weights merged out of place."""

    def __init__(self, model: torch.nn.Module):
        from peft.tuners.lora import LoraLayer

        layers = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
        self.entries: list[tuple[str, torch.Tensor, object]] = []  # (served name, base tensor, LoRA layer or None)
        for key, t in model.state_dict(keep_vars=True).items():
            if is_adapter(key):
                continue
            layer = None
            if ".base_layer." in key:
                prefix, attr = key.split(".base_layer.", 1)
                key = f"{prefix}.{attr}"
                layer = layers[prefix] if attr == "weight" else None
            self.entries.append((key, t, layer))

    def named_shapes(self) -> list[tuple[str, torch.Tensor]]:
        """(name, meta tensor of the served shape and dtype), in the plan's order."""
        return [(k, torch.empty(t.shape, dtype=t.dtype, device="meta")) for k, t, _ in self.entries]

    def tensors(self, first: int = 0, last: int | None = None) -> list[torch.Tensor]:
        """The served tensors of entries [first, last): merged weights computed now (one new tensor each)."""
        return [merged(layer, t) if layer is not None else t.detach() for _, t, layer in self.entries[first:last]]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The merged model on the CPU, one tensor merged at a time (a checkpoint must not hold a second copy
        of the model on a GPU that an engine shares)."""
        return {k: self.tensors(i, i + 1)[0].cpu() for i, (k, _, _) in enumerate(self.entries)}


@torch.no_grad()
def merged(layer, weight: torch.Tensor) -> torch.Tensor:
    """W + scale·B·A, in float32, cast to W's dtype; W is left untouched."""
    a, b = layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight
    return torch.addmm(weight.detach().float(), b.float(), a.float(), alpha=layer.scaling[ADAPTER]).to(weight.dtype)
