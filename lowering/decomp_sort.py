"""topk over rows longer than one partition's SBUF (vocabulary-sized logits) as two rounds of short topks.

The row is cut into chunks of ``TOPK_CHUNK`` elements, or ``SORT_MAX_N`` for k above ``TOPK_SMALL_K`` (k is at
most half a chunk, so every round at least halves the row; the last chunk is padded with a value that never wins:
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

TOPK_CHUNK = 2048  # elements per chunk for k <= TOPK_SMALL_K (a power of two, within SORT_MAX_N)
TOPK_SMALL_K = 512


def _chunk(k: int) -> int:
    from neuron_compile.lowering.ops.sort import SORT_MAX_N

    return TOPK_CHUNK if k <= TOPK_SMALL_K else SORT_MAX_N  # a round keeps k of every chunk: k <= chunk / 2


def long_topk_max_k() -> int:
    from neuron_compile.lowering.ops.sort import SORT_MAX_N

    return SORT_MAX_N // 2


def long_topk_fits(n: int, k: int) -> bool:
    from neuron_compile.lowering.ops.sort import SORT_MAX_N

    return n > SORT_MAX_N and k <= long_topk_max_k()


def _topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    if x.dim() == 0 or not long_topk_fits(x.shape[dim], k):
        return NotImplemented
    dim %= x.dim()
    n = x.shape[dim]
    rows = x.movedim(dim, -1)
    lead = tuple(rows.shape[:-1])
    chunk = _chunk(k)
    chunks = -(-n // chunk)
    if x.dtype.is_floating_point:
        pad = float("-inf") if largest else float("nan")
    else:
        info = torch.iinfo(x.dtype) if x.dtype != torch.bool else None
        pad = (info.min if largest else info.max) if info is not None else (not largest)
    padded = aten.constant_pad_nd.default(rows, [0, chunks * chunk - n], pad)
    cand, local = aten.topk.default(padded.reshape(*lead, chunks, chunk), k, -1, largest, True)
    base = torch.arange(chunks, dtype=torch.int64).unsqueeze(1) * chunk
    where = (local + base).reshape(*lead, chunks * k)
    values, pick = aten.topk.default(cand.reshape(*lead, chunks * k), k, -1, largest, True)
    indices = torch.gather(where, -1, pick)
    return values.movedim(-1, dim), indices.movedim(-1, dim)


SORT: dict[Any, Callable[..., Any]] = {aten.topk.default: _topk}
