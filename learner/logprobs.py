"""Per-token log-probs of completions under a causal LM, with memory bounded in vocabulary × batch.

The naive path (`model(ids).logits.float().log_softmax(-1)`) materialises float32 logits of shape
[S, L, V]: for 128 × 512 samples of 1k tokens and V = 151k that is ~40 TB. Here the decoder runs once
to hidden states [S, L, H]; only the hidden rows of *response* tokens are kept ([M, H], M = response
tokens), and those are pushed through the LM head in chunks of ⌊budget / (4·V)⌋ rows. Each chunk runs
under activation checkpointing, so backward recomputes the chunk's logits instead of storing them:
peak extra memory is a fixed budget of float32 logits (`chunk_mb`), whatever S, L or V are.

Temperature: the actor's behaviour log-probs are vLLM's *processed* log-probs — after dividing the
logits by the sampling temperature (and after top-p, which we keep at 1.0 for training). So the learner
scores tokens under softmax(logits / temperature) too; π_old, πθ and μ are then the same family of
distributions, and the TIS ratio π_old/μ measures only engine mismatch and staleness.

Shared prompts (`pack(..., share_prompt=True)`, `learner.share_prompt`): the N completions of a group
share one prompt. Then the decoder runs on the prompt once, recording every layer's keys and values
(`PromptCache`), and on the completions against them, the prompt's K/V expanded along the batch; the
prompt's last hidden state predicts every completion's first token. Gradients flow into the shared prompt
activations once, summed over the completions, which is what the unshared computation gives (tested
equal, with and without activation checkpointing: the cache stores nothing on a recomputation, so a
checkpointed layer recomputes the same keys and values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from learner.kernels import linear_logprob, resolve


@dataclass
class PackedCompletions:
    """Right-padded prompt+completion sequences and where their response tokens sit.

    input_ids:      long[S, L]  prompt tokens then completion tokens, right-padded with `pad_id`
    attention_mask: long[S, L]  1 on real tokens
    target_pos:     long[S, T]  position in the sequence whose hidden state predicts completion
                                token t (prompt_len − 1 + t); 0 where t is padding
    targets:        long[S, T]  completion token ids, right-padded with 0
    mask:           bool[S, T]  True on real completion tokens

    Shared layout (`prompt` set; every sample has that prompt):
    prompt:         long[P]     the shared prompt
    input_ids:      long[S, L]  completion tokens but the last (they predict the next), right-padded
    attention_mask: long[S, P + L]  1 on the prompt and on real tokens of input_ids

    Packed layout (`cu_seqlens` set, `learner.packing`; `learner/packing.py`): the samples concatenated in one
    row, no padding (but a last run of `pad_id` up to a compiled length, a sample of its own)
    input_ids:      long[1, L]  every sample's prompt then completion, one after the other
    attention_mask: None
    position_ids:   long[1, L]  position within its own sample
    cu_seqlens:     int32[n + 1]  where each sample starts (and the row ends); max_len: the longest
    target_pos:     long[S, T]  position in the row whose hidden state predicts completion token t
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    target_pos: torch.Tensor | None
    targets: torch.Tensor
    mask: torch.Tensor
    prompt: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_len: int = 0
    real_tokens: int = 0
    """Packed layout: the samples' own tokens (the rest of the row is the compiled length's padding)."""

    def token_counts(self) -> tuple[int, int]:
        """(tokens the decoder processes, padding included; real ones): what padding costs."""
        if self.cu_seqlens is not None:
            return self.input_ids.numel(), self.real_tokens
        if self.prompt is None:
            return self.input_ids.numel(), int(self.attention_mask.sum())
        P = self.prompt.numel()
        return P + self.input_ids.numel(), int(self.attention_mask.sum()) - (self.input_ids.shape[0] - 1) * P


def pack(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int = 0, device: str | torch.device = "cpu",
    share_prompt: bool = False, multiple: int = 1, min_tokens: int = 0,
) -> PackedCompletions:
    """The samples as one batch; `share_prompt`: all of them have one prompt, computed once. `multiple`: the
    padded length is a multiple of it (the compiled learner: one alignment class of kernels, so a batch whose
    length happens to be a multiple of 8 does not recompile the layers mid-run). `min_tokens`: the length is
    padded until rows × length reaches it (`learner.compiling.min_tokens`; not with `share_prompt`)."""
    if len(prompts) != len(completions):
        raise ValueError(f"prompts ({len(prompts)}) and completions ({len(completions)}) differ in length")
    if not prompts:
        raise ValueError("completions is empty: nothing to score")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompts[{i}] is empty: a completion needs at least one prompt token")
    S = len(prompts)
    if share_prompt:
        return _pack_shared(prompts, completions, pad_id, torch.device(device))
    L = max(max(len(p) + len(c) for p, c in zip(prompts, completions)), -(-min_tokens // S))
    L = -(-L // multiple) * multiple
    tgt, msk = _targets(completions)
    ids = torch.full((S, L), pad_id, dtype=torch.long)
    att = torch.zeros((S, L), dtype=torch.long)
    pos = torch.zeros(tgt.shape, dtype=torch.long)
    for s, (p, c) in enumerate(zip(prompts, completions)):
        seq = list(p) + list(c)
        ids[s, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        att[s, : len(seq)] = 1
        pos[s, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
    dev = torch.device(device)
    return PackedCompletions(ids.to(dev), att.to(dev), pos.to(dev), tgt.to(dev), msk.to(dev))


def _targets(completions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets long[S, T], mask bool[S, T]): the completion tokens right-padded with 0, and where they are."""
    T = max(1, max(len(c) for c in completions))
    tgt = torch.zeros((len(completions), T), dtype=torch.long)
    msk = torch.zeros((len(completions), T), dtype=torch.bool)
    for s, c in enumerate(completions):
        tgt[s, : len(c)] = torch.tensor(c, dtype=torch.long)
        msk[s, : len(c)] = True
    return tgt, msk


def _pack_shared(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                 dev: torch.device) -> PackedCompletions:
    prompt = list(prompts[0])
    if any(list(p) != prompt for p in prompts):
        raise ValueError("share_prompt: the samples of one batch must have one prompt")
    S, P = len(completions), len(prompt)
    tgt, msk = _targets(completions)
    L = tgt.shape[1] - 1
    ids = torch.full((S, L), pad_id, dtype=torch.long)
    att = torch.zeros((S, P + L), dtype=torch.long)
    att[:, :P] = 1
    for s, c in enumerate(completions):
        if len(c) > 1:
            ids[s, : len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
            att[s, P: P + len(c) - 1] = 1
    return PackedCompletions(ids.to(dev), att.to(dev), None, tgt.to(dev), msk.to(dev),
                             torch.tensor(prompt, dtype=torch.long, device=dev))


class PromptCache(DynamicCache):
    """Keys and values of a shared prompt, for running many completions against one prompt pass.

    Recording (the prompt pass): a layer's first update stores its K/V; a later one (activation
    checkpointing recomputing the layer in backward) stores nothing and returns its input, as the first did.
    Reading (`reading = True`, the completions' pass): an update returns [prompt K/V expanded to the batch,
    new K/V] and stores nothing, so a recomputation sees exactly what the forward saw."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = False

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        have = len(self.layers) > layer_idx and self.layers[layer_idx].is_initialized
        if self.reading:
            layer, b = self.layers[layer_idx], key_states.shape[0]
            return (torch.cat([layer.keys.expand(b, -1, -1, -1), key_states], dim=-2),
                    torch.cat([layer.values.expand(b, -1, -1, -1), value_states], dim=-2))
        if have:
            return key_states, value_states
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def _shared_hidden(decoder: torch.nn.Module, batch: PackedCompletions) -> torch.Tensor:
    for layer in getattr(decoder, "layers", []):  # our cache is safe to keep through a checkpointed layer
        layer._can_checkpoint_with_cache = True
    cache = PromptCache()
    h_prompt = decoder(input_ids=batch.prompt[None], past_key_values=cache, use_cache=True).last_hidden_state
    S = batch.mask.shape[0]
    first = h_prompt[:, -1:].expand(S, 1, -1)  # the prompt's last state predicts every first token
    if batch.input_ids.shape[1] == 0:
        hidden = first
    else:
        cache.reading = True
        h = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, past_key_values=cache,
                    use_cache=True).last_hidden_state
        hidden = torch.cat([first, h], dim=1)
    return hidden[batch.mask]


def completion_hidden(model: torch.nn.Module, batch: PackedCompletions) -> torch.Tensor:
    """Final hidden states that predict each response token, flattened: [M, H], M = batch.mask.sum()."""
    decoder = model.get_decoder()
    if batch.prompt is not None:
        return _shared_hidden(decoder, batch)
    if batch.cu_seqlens is not None:  # packed: the samples' boundaries go to every attention layer
        cu, m = batch.cu_seqlens, batch.max_len
        hidden = decoder(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                         cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=m, max_length_k=m).last_hidden_state
        return hidden[0, batch.target_pos[batch.mask]]
    # no KV cache: a scoring pass never reads one back. Left to its default, transformers builds one whenever
    # activation checkpointing is off, and each compiled layer then guards on its own cache slot: a 28-layer
    # model would recompile its layer per depth and hit the recompile limit (`learner.compile` without
    # checkpointing); it would also keep every layer's keys and values for nothing
    hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
    rows = torch.gather(hidden, 1, batch.target_pos.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return rows[batch.mask]


def _chunk_logp(head: torch.nn.Module, h: torch.Tensor, tgt: torch.Tensor, temperature: float):
    logits = head(h)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # float32 at least
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


_compiled_chunk_logp = None


def compiled_chunk_logp():
    """`_chunk_logp` under torch.compile (dynamic shapes: the chunk's row count varies), built once."""
    global _compiled_chunk_logp
    if _compiled_chunk_logp is None:
        _compiled_chunk_logp = torch.compile(_chunk_logp, dynamic=True)
    return _compiled_chunk_logp


def rows_per_chunk(chunk_mb: float, vocab: int) -> int:
    """Rows of float32 logits [rows, vocab] that fit in `chunk_mb` MiB (at least one)."""
    return max(1, int(chunk_mb * 2**20) // (4 * vocab))


def token_logprobs(
    model: torch.nn.Module,
    batch: PackedCompletions,
    *,
    temperature: float = 1.0,
    chunk_mb: float | None = 256.0,
    compiled: bool = False,
    recompute: bool = True,
    kernel: str = "off",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs and entropies of the completion tokens.

    Returns (logp float32[S, T], entropy float32[S, T]); both are 0 where `batch.mask` is False.
    `logp` carries gradients to the model; `entropy` is detached (a metric), None on the "liger" path.
    `kernel` (`learner.logprob_kernel`): "chunked" or "liger", the fused LM head + log-prob of
    `learner/kernels.py` (the vocabulary logits of a chunk only, recomputed in backward); "off", the head module
    on checkpointed chunks below. `recompute = False` keeps the logits: the "off" path whatever `kernel` says.
    `chunk_mb` bounds the float32 logits held at once; `None` computes all logits at once (the
    unbounded baseline, for benchmarks). `compiled`: the chunk's head, log-softmax and entropy as fused
    kernels (`learner.compile`). `recompute` (`learner.logprob_recompute`): a chunk's logits are recomputed in
    backward (checkpointed) rather than kept until it: the same values, less memory, one more LM-head pass.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    head = model.get_output_embeddings()
    h = completion_hidden(model, batch)
    tgt = batch.targets[batch.mask]
    M = h.shape[0]
    vocab = getattr(head, "out_features", None) or head.weight.shape[0]  # (a ZeRO-3 weight is empty between passes)
    chunk_tokens = None if chunk_mb is None else rows_per_chunk(chunk_mb, vocab)
    if chunk_tokens is None or M <= chunk_tokens:
        chunks = [(0, M)]
    else:
        chunks = [(i, min(i + chunk_tokens, M)) for i in range(0, M, chunk_tokens)]
    run = resolve(kernel if recompute and chunk_tokens is not None else "off", h, head)
    if run != "off":
        lp, en = linear_logprob(h, head, tgt, temperature, kernel=run, rows=chunk_tokens, compiled=compiled)
        return _scatter(batch.mask, lp, M), None if en is None else _scatter(batch.mask, en, M).detach()
    logps, ents = [], []
    fn = compiled_chunk_logp() if compiled else _chunk_logp
    for a, b in chunks:
        if recompute and chunk_tokens is not None and torch.is_grad_enabled() and h.requires_grad:
            lp, en = checkpoint(fn, head, h[a:b], tgt[a:b], temperature, use_reentrant=False)
        else:
            lp, en = fn(head, h[a:b], tgt[a:b], temperature)
        logps.append(lp)
        ents.append(en)
    return _scatter(batch.mask, torch.cat(logps), M), _scatter(batch.mask, torch.cat(ents), M).detach()


def _scatter(mask: torch.Tensor, values: torch.Tensor, M: int) -> torch.Tensor:
    """values [M] (float32, or float64 for a float64 model) at mask's True places of a [S, T] tensor of zeros."""
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(mask, values) if M else out
