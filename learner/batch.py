"""A rank's samples of a step as flat arrays (`SampleTable`), and one micro-batch's tensors built from them
(`build`): no Python object per token anywhere between the wire and the model.

The table holds what a rank trains on: its prompts and its completions, each concatenated into one array
with offsets (as the wire carries a group: `transport/messages.py`), the behaviour log-probs beside the
tokens, and each sample's prompt and advantage. A micro-batch is a set of rows of the table; `build` turns
it into the model's input with index arithmetic on whole arrays (numpy), in one of three layouts: padded
(rows × longest, `logprobs.pack`'s), packed (`learner.packing`: one row, no padding) or shared
(`learner.share_prompt`: the group's one prompt, then its completions).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from learner.logprobs import PackedCompletions


@dataclass
class SampleTable:
    """One rank's samples of a step (S samples of G prompts)."""

    prompts: np.ndarray
    """int32[ΣP] — the prompts, concatenated."""
    prompt_off: np.ndarray
    """int64[G + 1] — prompt g is prompts[prompt_off[g]:prompt_off[g + 1]]."""
    tokens: np.ndarray
    """int32[ΣC] — the completions, concatenated."""
    behav: np.ndarray
    """float32[ΣC] — log μ of each completion token."""
    comp_off: np.ndarray
    """int64[S + 1] — sample i's completion is tokens[comp_off[i]:comp_off[i + 1]]."""
    prompt_of: np.ndarray
    """int64[S] — sample i's prompt."""
    adv: np.ndarray
    """float32[S] — Â of each sample."""

    DTYPES = {"prompts": np.int32, "prompt_off": np.int64, "tokens": np.int32, "behav": np.float32,
              "comp_off": np.int64, "prompt_of": np.int64, "adv": np.float32}

    def __post_init__(self) -> None:
        for f in fields(self):
            setattr(self, f.name, np.ascontiguousarray(getattr(self, f.name), dtype=self.DTYPES[f.name]))

    @property
    def size(self) -> int:
        return len(self.prompt_of)

    def comp_len(self, rows: np.ndarray) -> np.ndarray:
        return self.comp_off[rows + 1] - self.comp_off[rows]

    def prompt_len(self, rows: np.ndarray) -> np.ndarray:
        g = self.prompt_of[rows]
        return self.prompt_off[g + 1] - self.prompt_off[g]

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_bytes(self) -> tuple[list[tuple[str, int]], np.ndarray]:
        """([(array name, element count)], uint8[…]): every array's bytes one after the other (what a
        rank is sent: `learner/ranks.py`)."""
        arrays = self.arrays()
        layout = [(k, int(a.size)) for k, a in arrays.items()]
        return layout, np.concatenate([a.view(np.uint8).ravel() for a in arrays.values()])

    @classmethod
    def from_bytes(cls, layout: list[tuple[str, int]], buf: np.ndarray) -> "SampleTable":
        out, at = {}, 0
        for name, n in layout:
            dt = np.dtype(cls.DTYPES[name])
            out[name] = buf[at: at + n * dt.itemsize].view(dt)
            at += n * dt.itemsize
        if at != buf.size:
            raise ValueError(f"a rank's share has {buf.size} bytes, its layout {at}")
        return cls(**out)


@dataclass
class MicroBatch:
    """One pass's tensors (on the CPU; `to` moves them)."""

    packed: PackedCompletions
    behav: torch.Tensor
    """float32[S, T] — log μ where `packed.mask`, 0 elsewhere."""
    adv: torch.Tensor
    """float32[S]."""

    def to(self, device: str | torch.device) -> "MicroBatch":
        p = self.packed
        moved = {f.name: (v.to(device) if isinstance(v := getattr(p, f.name), torch.Tensor) else v)
                 for f in fields(p)}
        return MicroBatch(PackedCompletions(**moved), self.behav.to(device), self.adv.to(device))


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64[Σ lengths]: starts[0] + 0 … lengths[0] − 1, then starts[1] + 0 …, and so on (one array op)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


def build(table: SampleTable, rows, *, pad_id: int = 0, layout: str = "padded", multiple: int = 1,
          min_tokens: int = 0) -> MicroBatch:
    """The micro-batch of `rows` (indices into `table`) in `layout` ("padded", "packed" or "shared"): what
    `logprobs.pack` gives for the same samples (`multiple`, `min_tokens`: as there; a packed row is padded at
    its end, the padding a sample of its own). Python work per sample (a slice each), none per token."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        raise ValueError("a micro-batch needs at least one sample")
    S = rows.size
    p, c = table.prompt_len(rows), table.comp_len(rows)
    if (p < 1).any():
        raise ValueError("a sample has an empty prompt: a completion needs at least one prompt token")
    T = max(1, int(c.max()))
    a_c, a_p = table.comp_off[rows], table.prompt_off[table.prompt_of[rows]]
    comp_tok = np.concatenate([table.tokens[a: a + n] for a, n in zip(a_c.tolist(), c.tolist())])
    comp_lp = np.concatenate([table.behav[a: a + n] for a, n in zip(a_c.tolist(), c.tolist())])
    msk = np.arange(T)[None, :] < c[:, None]
    tgt = np.zeros((S, T), np.int64)
    tgt[msk] = comp_tok
    behav = np.zeros((S, T), np.float32)
    behav[msk] = comp_lp
    adv = torch.from_numpy(table.adv[rows].copy())
    t = torch.from_numpy
    if layout == "shared":
        if np.unique(table.prompt_of[rows]).size != 1:
            raise ValueError("share_prompt: the samples of one batch must have one prompt")
        prompt = table.prompts[a_p[0]: a_p[0] + p[0]].astype(np.int64)
        P, L = prompt.size, T - 1
        inputs = np.arange(L)[None, :] < (c - 1)[:, None]  # every completion token but the last is an input
        ids = np.full((S, L), pad_id, np.int64)
        ids[inputs] = tgt[:, :L][inputs]
        att = np.ones((S, P + L), np.int64)
        att[:, P:] = inputs
        packed = PackedCompletions(t(ids), t(att), None, t(tgt), t(msk), t(prompt))
        return MicroBatch(packed, t(behav), adv)
    s = p + c
    pieces = []  # each sample's prompt, then its completion
    for ap, np_, ac, nc in zip(a_p.tolist(), p.tolist(), a_c.tolist(), c.tolist()):
        pieces += [table.prompts[ap: ap + np_], table.tokens[ac: ac + nc]]
    seq = np.concatenate(pieces).astype(np.int64)
    k = np.arange(T)[None, :]
    if layout == "packed":
        starts = np.cumsum(s) - s
        total = int(s.sum())
        L = -(-max(total, min_tokens) // multiple) * multiple
        ids = np.full(L, pad_id, np.int64)
        ids[:total] = seq
        lens = np.append(s, L - total) if L > total else s
        pos = ranges(np.zeros(lens.size, np.int64), lens)
        cu = np.zeros(lens.size + 1, np.int32)
        cu[1:] = np.cumsum(lens)
        tpos = np.where(msk, (starts + p - 1)[:, None] + k, 0)
        packed = PackedCompletions(t(ids)[None], None, t(tpos), t(tgt), t(msk), None, position_ids=t(pos)[None],
                                   cu_seqlens=t(cu), max_len=int(lens.max()), real_tokens=total)
        return MicroBatch(packed, t(behav), adv)
    if layout != "padded":
        raise ValueError(f"unknown micro-batch layout {layout!r}: padded, packed or shared")
    L = max(int(s.max()), -(-min_tokens // S))
    L = -(-L // multiple) * multiple
    real = np.arange(L)[None, :] < s[:, None]
    ids = np.full((S, L), pad_id, np.int64)
    ids[real] = seq
    tpos = np.where(msk, (p - 1)[:, None] + k, 0)
    return MicroBatch(PackedCompletions(t(ids), t(real.astype(np.int64)), t(tpos), t(tgt), t(msk)), t(behav), adv)


def prefetched(fn, items: list):
    """fn(item) for each item, in order, each computed on a worker thread while the caller works on the one
    before (one ahead: at most two built at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    if not items:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="brorl-batch") as ex:
        ahead = ex.submit(fn, items[0])
        for i in range(len(items)):
            current = ahead.result()
            if i + 1 < len(items):
                ahead = ex.submit(fn, items[i + 1])
            yield current
