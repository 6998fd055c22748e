"""topk over rows longer than one partition's SBUF (vocabulary-sized logits) as two rounds of short topks.

The row is cut into chunks of ``TOPK_CHUNK`` elements (the last one padded with a value that never wins:
-inf for the largest, NaN for the smallest, the dtype's extreme for integers); each chunk's top k
(one SortKernel, chunks on partitions) keeps its candidates with their global indices; a second topk
over the ``chunks * k`` candidates picks the result (recursively while still too long). Candidates stay
in chunk order, so equal values keep their original order and the values are exactly eager's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)
aten = torch.ops.aten

TOPK_CHUNK = 2048  # elements per chunk (a power of two, within SORT_MAX_N)
TOPK_LONG_MAX_K = 512  # chunks keep k candidates each: k must be well below the chunk size


def long_topk_fits(n: int, k: int) -> bool:
    from neuron_compile.lowering.ops.sort import SORT_MAX_N

    return n > SORT_MAX_N and k <= TOPK_LONG_MAX_K


def _topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    if x.dim() == 0 or not long_topk_fits(x.shape[dim], k):
        return NotImplemented
    dim %= x.dim()
    n = x.shape[dim]
    rows = x.movedim(dim, -1)
    lead = tuple(rows.shape[:-1])
    chunks = -(-n // TOPK_CHUNK)
    if x.dtype.is_floating_point:
        pad = float("-inf") if largest else float("nan")
    else:
        info = torch.iinfo(x.dtype) if x.dtype != torch.bool else None
        pad = (info.min if largest else info.max) if info is not None else (not largest)
    padded = aten.constant_pad_nd.default(rows, [0, chunks * TOPK_CHUNK - n], pad)
    cand, local = aten.topk.default(padded.reshape(*lead, chunks, TOPK_CHUNK), k, -1, largest, True)
    base = torch.arange(chunks, dtype=torch.int64).unsqueeze(1) * TOPK_CHUNK
    where = (local + base).reshape(*lead, chunks * k)
    values, pick = aten.topk.default(cand.reshape(*lead, chunks * k), k, -1, largest, True)
    indices = torch.gather(where, -1, pick)
    return values.movedim(-1, dim), indices.movedim(-1, dim)


SORT: dict[Any, Callable[..., Any]] = {aten.topk.default: _topk}
