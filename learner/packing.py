"""Packed sequences (`learner.packing`): a micro-batch's samples concatenated into one row with no padding,
position ids restarting at every sample, and attention that never crosses a sample's boundary.

The samples' boundaries reach every attention layer as transformers' flash-attention keyword arguments
(`cu_seq_lens_q`/`cu_seq_lens_k`, `max_length_q`/`max_length_k`), which the decoder hands down untouched.
`use_packed_attention` makes the model's attention `ATTENTION` ("brorl_varlen"):
  * a packed pass, on CUDA in bf16/fp16: torch's variable-length flash attention
    (`torch.nn.attention.varlen.varlen_attn`), causal within each sample, Σ len² work instead of rows × L²;
  * a packed pass elsewhere (CPU, float32): scaled_dot_product_attention with the block-diagonal causal mask
    the boundaries define — exact, the reference the tests compare with;
  * a padded pass (no boundaries given: `pack`): transformers' own sdpa with its mask.
Under `learner.compile` the attention is traced into each compiled decoder layer, in one graph: it reads nothing
back from the device (the longest sample's length reaches varlen_attn as the int, symbolic there, that it was
given; torch's op has a fake kernel for tracing), so one compiled variant serves rows of any length, any number
of samples and any longest sample.
"""

from __future__ import annotations

import inspect

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION = "brorl_varlen"
"""The attention implementation name registered with transformers."""

_registered = False
_VARLEN = None
"""`_varlen()`, looked up once by `use_packed_attention`: not in every pass, nor inside a compiled layer."""


def _varlen():
    """(torch's varlen_attn, the keyword arguments it takes of window_size, enable_gqa, scale), or None where
    this torch has none (before 2.10). Its signature changed between releases; what it lacks is done by hand."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    return varlen_attn, {k for k in ("window_size", "enable_gqa", "scale", "is_causal") if k in params}


def _segments(cu: torch.Tensor, total: int) -> torch.Tensor:
    """long[total]: the sample each position belongs to, from the boundaries cu (int32[n + 1]): how many samples
    start at or before it, less one (no slice of cu: compiled, a slice's size would specialise on one sample)."""
    pos = torch.arange(total, device=cu.device, dtype=cu.dtype)
    return torch.searchsorted(cu, pos, right=True) - 1


def _masked(query, key, value, cu, scaling, sliding_window):
    """The exact reference: sdpa over the whole row with the block-diagonal causal (and sliding) mask."""
    L = query.shape[2]
    seg = _segments(cu, L)
    pos = torch.arange(L, device=query.device)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    if sliding_window:
        allowed &= pos[None, :] > pos[:, None] - sliding_window
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed[None, None],
                                                           scale=scaling)
    return out.transpose(1, 2)


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     sliding_window=None, softcap=None, cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers' attention interface: query [1, Hq, L, D], key/value [1, Hkv, L, D] -> ([1, L, Hq, D], None)."""
    if cu_seq_lens_q is None:  # a padded pass: transformers' sdpa with the mask it built
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, softcap=softcap, **kwargs)
    if softcap:
        raise ValueError("learner.packing: this model caps its attention logits (softcap), which the packed "
                         "attention does not do: set learner.packing = false")
    if dropout:
        raise ValueError("learner.packing: attention dropout is on; the learner trains without dropout")
    if query.shape[0] != 1:
        raise ValueError(f"learner.packing: a packed pass has one row, got {query.shape[0]}")
    varlen = _VARLEN
    dtype = query.dtype
    if query.is_cuda and dtype == torch.float32 and torch.is_autocast_enabled("cuda"):
        # under autocast the rotary embedding leaves q and k in float32; sdpa would cast them itself
        dtype = torch.get_autocast_dtype("cuda")
    fast = _flash_runs(query, dtype) and not (sliding_window and "window_size" not in varlen[1])
    if not fast:  # (a window this torch's varlen_attn lacks: the exact masked path too)
        return _masked(query, key, value, cu_seq_lens_q, scaling, sliding_window), None
    # max_length_q as given (a symbolic int in a compiled layer): no conversion that could read the device or
    # specialise the compiled layer on one longest sample
    return _flash(*varlen, query, key, value, cu_seq_lens_q, max_length_q, scaling, sliding_window, dtype), None


def _flash_runs(query: torch.Tensor, dtype: torch.dtype) -> bool:
    """Does torch's varlen flash attention run this pass: this torch has it, on CUDA, in bf16 or fp16."""
    return _VARLEN is not None and query.is_cuda and dtype in (torch.float16, torch.bfloat16)


def _flash(fn, takes, query, key, value, cu, m, scaling, sliding_window, dtype):
    """varlen_attn over the packed row: [1, H, L, D] inputs in its [L, H, D] layout, what this torch's
    signature lacks (`takes`) done by hand; -> [1, L, Hq, D]."""
    q = query[0].transpose(0, 1).to(dtype).contiguous()  # [L, Hq, D]
    k = key[0].transpose(0, 1).to(dtype).contiguous()
    v = value[0].transpose(0, 1).to(dtype).contiguous()
    extra = {}
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in takes:
            extra["enable_gqa"] = True
        else:
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    if "window_size" in takes:  # (left, right): causal is (-1, 0); a sliding window of W keys is (W - 1, 0)
        extra["window_size"] = (sliding_window - 1 if sliding_window else -1, 0)
    else:
        extra["is_causal"] = True
    if scaling is not None:
        if "scale" in takes:
            extra["scale"] = scaling
        else:  # the kernel's own 1/sqrt(D): scale q to match
            q = q * (scaling * q.shape[-1] ** 0.5)
    cu = cu.to(torch.int32)
    return fn(q, k, v, cu, cu, m, m, **extra).unsqueeze(0)


def _mask(*args, **kwargs):
    """The masks transformers builds for `ATTENTION`: a padded pass's (sdpa's); none for a packed pass, whose
    boundaries the attention reads itself (no L × L mask built)."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("attention_mask") is None:
        return None
    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """`ATTENTION` known to transformers (once per process)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionMaskInterface.register(ATTENTION, _mask)
    _registered = True


def use_packed_attention(model: torch.nn.Module) -> None:
    """The model's attention becomes `ATTENTION` (padded passes compute as with sdpa; packed ones stay
    within each sample)."""
    global _VARLEN
    _VARLEN = _varlen()
    register()
    try:
        model.set_attn_implementation(ATTENTION)
    except (AttributeError, ValueError):  # an older transformers: the configs directly
        for m in model.modules():
            cfg = getattr(m, "config", None)
            if cfg is not None and hasattr(cfg, "_attn_implementation"):
                cfg._attn_implementation = ATTENTION
