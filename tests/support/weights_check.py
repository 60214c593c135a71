"""The checksum a receiver must report for a model's weights, computed apart from the broadcast (tests compare
what the broadcaster sent and what receivers loaded against it)."""

from __future__ import annotations

from typing import Iterable

import torch

from transport.checksum import bucket_checksum, combine_checksums
from transport.weights import WeightPlan, pack_bucket


def weights_checksum(named: Iterable[tuple[str, torch.Tensor]], plan: WeightPlan,
                     dtype: torch.dtype | None = None) -> str:
    tensors = [t for _, t in named]
    return combine_checksums([bucket_checksum(pack_bucket(tensors[a:b], n, "cpu", dtype)) for a, b, n in plan.buckets])
