"""Fused LM head + log-prob (`learner.logprob_kernel`) and Liger's layer kernels (`learner.liger_kernels`).

`linear_logprob(h, head, targets, temperature, ...)`: the log-prob of each target token (and the entropy, a
metric) of rows h [M, H] under softmax(head(h) / temperature), without a micro-batch's vocabulary logits
ever existing at once:

- "chunked" (`ChunkedLinearLogprob`, torch; CPU and GPU): the rows go through the head in chunks; a chunk's
  logits give its log-probs, entropies and log-normaliser (kept: [M] floats) and are dropped. Backward
  recomputes each chunk's logits and turns the upstream per-token gradient g into the logits' gradient
  g · (onehot(target) − softmax) / temperature in one pass, then into the gradients of h and of the head's
  weight (accumulated in float32 across chunks). Under autocast the matrix multiplications run in the
  autocast dtype, as the head's own forward and backward would.
- "liger" (CUDA): Liger-Kernel's fused linear cross-entropy (`reduction="none"`, Triton; the cross-entropy
  of a token is minus its log-prob, the rows scaled by 1 / temperature first). It returns no entropy: the
  entropy metric is left out of the step's metrics on that path.
- "off": the head module on checkpointed chunks (`learner/logprobs.py`'s original path).

Where a path cannot run (Liger not installed or not on CUDA, a ZeRO-3 head whose weight is partitioned between
passes) the next one does, and one log line says which (`resolve`).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger("brorl.learner")

KERNELS = ("chunked", "liger", "off")


def _stats(logits: torch.Tensor, tgt: torch.Tensor, temperature: float):
    """(log-prob of the target, log-normaliser, entropy) of float32 logits / temperature, per row."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - lse
    ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, lse, ent


def _grad_logits(logits: torch.Tensor, tgt: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, temperature: float):
    """d(Σ g · logp) / d logits = g · (onehot(target) − softmax(logits / T)) / T, in the logits' dtype."""
    z = logits.to(lse.dtype) / temperature
    gs = (g / temperature).unsqueeze(-1)
    grad = -torch.exp(z - lse.unsqueeze(-1)) * gs
    grad = grad.scatter_add(-1, tgt.unsqueeze(-1), gs)
    return grad.to(logits.dtype)


_compiled: dict[str, object] = {}


def _fn(name: str, compiled: bool):
    """`_stats` / `_grad_logits`, under torch.compile (`learner.compile`; dynamic: a chunk's rows vary) if asked."""
    fn = {"stats": _stats, "grad": _grad_logits}[name]
    if not compiled:
        return fn
    if name not in _compiled:
        _compiled[name] = torch.compile(fn, dynamic=True)
    return _compiled[name]


_MIXED_MM = [True]  # does this torch have a bf16 × bf16 → float32 addmm (CUDA)? Cleared at its first failure


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc + a @ b, acc float32: on CUDA with low-precision a, b in one matmul writing float32 (no low-precision
    [V, H] product to cast and add: a chunk's weight gradient is the size of the head)."""
    if a.dtype != acc.dtype and a.is_cuda and _MIXED_MM[0]:
        try:
            return torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)  # torch ≥ 2.8, as Liger accumulates
        except (TypeError, RuntimeError, NotImplementedError) as e:
            _MIXED_MM[0] = False
            log.info("learner.logprob_kernel: no float32-output addmm here (%s); the head's gradient is cast and added",
                     str(e).splitlines()[0][:120])
    return acc.add_(a @ b)


def _autocast_state(dev: torch.device) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(dev.type), torch.get_autocast_dtype(dev.type)


class ChunkedLinearLogprob(torch.autograd.Function):
    """(logp [M], entropy [M]) of rows h [M, H] under softmax((h Wᵀ + b) / T) at `targets`; the module's docstring."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature: float, rows: int, compiled: bool):
        dev = h.device
        ctx.amp = _autocast_state(dev)
        stats = _fn("stats", compiled)
        M = h.shape[0]
        out_dtype = torch.promote_types(torch.promote_types(h.dtype, weight.dtype), torch.float32)
        logp = torch.empty(M, dtype=out_dtype, device=dev)
        lse = torch.empty(M, dtype=out_dtype, device=dev)
        ent = torch.empty(M, dtype=out_dtype, device=dev)
        enabled, dtype = ctx.amp
        with torch.autocast(dev.type, enabled=False):  # the head's weight cast once, not once per chunk
            w_c = weight.to(dtype) if enabled else weight
            b_c = None if bias is None else bias.to(w_c.dtype)
            for a in range(0, M, rows):
                b = min(a + rows, M)
                h_c = h[a:b].to(dtype) if enabled else h[a:b]
                lp, ls, en = stats(F.linear(h_c, w_c, b_c), targets[a:b], temperature)
                logp[a:b], lse[a:b], ent[a:b] = lp, ls, en
            del w_c
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.temperature, ctx.rows, ctx.compiled = temperature, rows, compiled
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, _g_ent):
        h, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        enabled, dtype = ctx.amp
        grad_fn = _fn("grad", ctx.compiled)
        gh = torch.empty_like(h) if need_h else None
        gw = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device) \
            if need_w else None
        gb = torch.zeros(bias.shape, dtype=torch.promote_types(bias.dtype, torch.float32), device=bias.device) \
            if need_b else None
        # autocast off, the casts explicit: the matmuls in autocast's dtype, as the head's own backward; the
        # float32 accumulation of the weight's gradient left in float32
        with torch.autocast(h.device.type, enabled=False):
            w_c = weight.to(dtype) if enabled else weight
            for a in range(0, h.shape[0], ctx.rows):
                b = min(a + ctx.rows, h.shape[0])
                h_c = h[a:b].to(dtype) if enabled else h[a:b]
                logits = F.linear(h_c, w_c, None if bias is None else bias.to(w_c.dtype))
                gl = grad_fn(logits, targets[a:b], lse[a:b], g_logp[a:b].to(lse.dtype), ctx.temperature)
                if need_h:
                    gh[a:b] = (gl @ w_c).to(h.dtype)
                if need_w:
                    gw = _accumulate(gw, gl.t(), h_c)
                if need_b:
                    gb += gl.sum(0).to(gb.dtype)
        return (gh, None if gw is None else gw.to(weight.dtype), None if gb is None else gb.to(bias.dtype),
                None, None, None, None)


def liger_available() -> str | None:
    """None if Liger-Kernel's fused linear cross-entropy can run here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import liger_kernel.ops.fused_linear_cross_entropy  # noqa: F401
    except Exception as e:  # noqa: BLE001 (an ImportError, or Triton failing to load)
        return f"liger-kernel does not import ({type(e).__name__}: {e})"
    return None


_said: set[tuple[str, str]] = set()


def resolve(kernel: str, h: torch.Tensor, head: torch.nn.Module) -> str:
    """The path that runs for `kernel` on these rows and this head (the module's docstring); logs once per
    (asked, running) pair which one runs and, when it is another, why."""
    if kernel not in KERNELS:
        raise ValueError(f"learner.logprob_kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    why, run = None, kernel
    if kernel != "off" and not isinstance(getattr(head, "weight", None), torch.Tensor):
        why, run = f"the LM head ({type(head).__name__}) has no weight tensor", "off"
    elif kernel != "off" and hasattr(head.weight, "ds_id"):
        why, run = "the LM head's weight is partitioned (ZeRO-3)", "off"
    elif kernel == "liger" and (h.device.type != "cuda" or liger_available()):
        why, run = ("the rows are not on a CUDA device" if h.device.type != "cuda" else liger_available()), "chunked"
    if (kernel, run) not in _said:
        _said.add((kernel, run))
        log.info("learner.logprob_kernel = %s: the %s log-prob path runs%s", kernel, run,
                 f" ({why})" if why else "")
    return run


def linear_logprob(h: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float, *,
                   kernel: str, rows: int, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp [M], entropy [M] or None) through the resolved path `kernel` ("chunked" or "liger"; the module's
    docstring). `rows`: rows of logits per chunk ("chunked"; Liger sizes its own chunks)."""
    bias = getattr(head, "bias", None)
    if kernel == "chunked":
        return ChunkedLinearLogprob.apply(h, head.weight, bias, targets, temperature, max(1, rows), compiled)
    if kernel == "liger":
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        M, H = h.shape
        V = head.weight.shape[0]
        # Liger cuts the rows into ~V / (c · H) chunks whatever their number: c sized so that a chunk holds about
        # `rows` rows, as ours do (few chunks: each adds a whole head-sized weight gradient)
        c = max(1, round(rows * V / max(1, M * H)))
        loss = LigerFusedLinearCrossEntropyFunction.apply(
            (h / temperature).contiguous(), head.weight, targets.contiguous(),
            None if bias is None else bias / temperature, None, -100, 0.0, 0.0, "none", None, False, None, False,
            False, False, None, None, c)[0]
        return -loss.float(), None
    raise ValueError(f"linear_logprob: no fused path {kernel!r}")


def apply_liger_kernels(model: torch.nn.Module, device: str) -> str:
    """Liger's RMSNorm, SwiGLU and RoPE kernels patched into `model` (`learner.liger_kernels`), in place; its
    fused cross-entropy is not (the learner never computes a language-model loss). Returns the model type.
    Refused on a CPU and for a model family Liger has no patch for."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"learner.liger_kernels needs a CUDA device (learner.device is {device!r}): Liger's "
                         f"kernels are Triton GPU kernels; set learner.liger_kernels = false")
    why = liger_available()
    if why:
        raise ValueError(f"learner.liger_kernels: {why}; install liger-kernel or set learner.liger_kernels = false")
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if fn is None:
        raise ValueError(f"learner.liger_kernels: Liger-Kernel has no kernels for model type {model_type!r}; "
                         f"set learner.liger_kernels = false")
    import inspect

    kw = {k: v for k, v in dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                fused_linear_cross_entropy=False).items() if k in inspect.signature(fn).parameters}
    fn(model=model, **kw)
    log.info("learner.liger_kernels: Liger's %s kernels patched into the %s model",
             "/".join(k for k in ("rope", "rms_norm", "swiglu") if kw.get(k)), model_type)
    return model_type
