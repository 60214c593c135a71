"""The weight buckets' checksums: the learner's and every receiver's must agree, bit for bit, CPU or GPU."""

from __future__ import annotations

import torch

MASK64 = (1 << 64) - 1


def bucket_checksum(flat: torch.Tensor) -> int:
    """Fletcher-style checksum of a uint8 bucket, read as 64-bit words w_p: (S2 + K·S1) mod 2^64 with
    S1 = Σ w_p and S2 = Σ (p+1)·w_p (trailing bytes count as words of their own). Sensitive to any
    changed, missing or moved word; integer sums wrap mod 2^64 in any order, so CPU and GPU agree bit for
    bit. Computed as a row and a column reduction of a [R, 1024] view, two memory-bound passes without
    large temporaries (the learner and every receiver pay it per update)."""
    return int(bucket_checksum_tensor(flat).item()) & MASK64


def bucket_checksum_tensor(flat: torch.Tensor) -> torch.Tensor:
    """`bucket_checksum` as a 0-d int64 tensor on the bucket's device, computed without waiting for the device
    (a GPU sender or receiver reads every bucket's checksum once, at the end of the update)."""
    if flat.storage_offset() % 8 or not flat.is_contiguous():
        flat = flat.contiguous().clone()
    n8 = flat.numel() // 8
    words = flat[: n8 * 8].view(torch.int64)
    cols_n = 1024
    rows_n = n8 // cols_n
    dev = flat.device
    s1 = s2 = torch.zeros((), dtype=torch.int64, device=dev)
    if rows_n:
        block = words[: rows_n * cols_n].view(rows_n, cols_n)
        rows, cols = block.sum(dim=1), block.sum(dim=0)
        s1 = s1 + rows.sum()
        s2 = s2 + cols_n * (torch.arange(rows_n, device=dev, dtype=torch.int64) * rows).sum()
        s2 = s2 + (torch.arange(1, cols_n + 1, device=dev, dtype=torch.int64) * cols).sum()
    rest = torch.cat([words[rows_n * cols_n:], flat[n8 * 8:].to(torch.int64)])  # < 1032 values
    if rest.numel():
        first = rows_n * cols_n + 1
        s1 = s1 + rest.sum()
        s2 = s2 + (torch.arange(first, first + rest.numel(), device=dev, dtype=torch.int64) * rest).sum()
    return s2 + s1 * _K_SIGNED  # int64 arithmetic wraps mod 2^64: the same bits as the unsigned formula


_K_SIGNED = 0x9E3779B97F4A7C15 - (1 << 64)


def checksum_values(sums: list[torch.Tensor]) -> list[int]:
    """The per-bucket checksums of `bucket_checksum_tensor` as unsigned ints (one device read for all)."""
    return [v & MASK64 for v in torch.stack(sums).tolist()] if sums else []


def combine_checksums(per_bucket: list[int]) -> str:
    total = 0
    for i, c in enumerate(per_bucket):
        total = (total + (i + 1) * c) & MASK64
    return f"{total:016x}"
