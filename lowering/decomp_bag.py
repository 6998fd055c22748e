"""EmbeddingBag as ATen ops the backend lowers: ``_embedding_bag`` / ``_embedding_bag_forward_only`` and their
backward ops.

Forward: each index's bag from the offsets (``searchsorted(offsets, position, right=True) - 1``; padding_idx
entries go to an extra, dropped bag), the rows gathered (``embedding``), scaled by ``per_sample_weights``,
then summed per bag with ``index_put(accumulate=True)`` (a row scatter-add), divided by the bag size
for ``mean``, or reduced with ``scatter_reduce(amax)`` for ``max``, whose ``max_indices`` is the first row
reaching the maximum (CPU torch's choice, so gradients land where eager puts them). Empty bags give 0.
The four results keep ATen's meaning for the backward decompositions below: ``offset2bag`` (bag per
index, the extra bag for padding), ``bag_size`` (non-padding count) and ``max_indices``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)
aten = torch.ops.aten


def _bags(indices: torch.Tensor, offsets: torch.Tensor, include_last_offset: bool, padding_idx: int
          ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(flat indices, bag of each index, number of bags); padding entries in bag ``number of bags``."""
    if indices.dim() == 2:
        n_bags, length = indices.shape
        flat = indices.reshape(-1)
        bag = torch.arange(n_bags, dtype=torch.int64).unsqueeze(1).expand(n_bags, length).reshape(-1)
    else:
        flat = indices
        n_bags = offsets.numel() - (1 if include_last_offset else 0)
        starts = offsets[:n_bags].to(torch.int64)
        position = torch.arange(flat.numel(), dtype=torch.int64)
        bag = torch.searchsorted(starts, position, right=True) - 1
        if include_last_offset:  # indices past the last offset belong to no bag
            bag = torch.where(position >= offsets[n_bags:].to(torch.int64), n_bags, bag)
    if padding_idx >= 0:
        bag = torch.where(flat == padding_idx, n_bags, bag)
    return flat, bag, n_bags


def _embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                   scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                   per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                   padding_idx: int = -1) -> Any:
    flat, bag, n_bags = _bags(indices, offsets, include_last_offset, padding_idx)
    n, d = flat.numel(), weight.shape[1]
    rows = aten.embedding.default(weight, flat)
    if per_sample_weights is not None:  # in fp32 like ATen's CPU kernel (one rounding of the bag's sum)
        rows = rows.to(torch.float32) * per_sample_weights.reshape(-1, 1).to(torch.float32)
    bag_size = torch.zeros(n_bags + 1, dtype=torch.int64).index_put(
        [bag], torch.ones(n, dtype=torch.int64), accumulate=True)[:n_bags]
    count = bag_size.to(torch.float32)
    if mode in (0, 1):
        total = torch.zeros(n_bags + 1, d, dtype=torch.float32).index_put(
            [bag], rows.to(torch.float32), accumulate=True)[:n_bags]
        if mode == 1:
            total = total / count.clamp_min(1.0).unsqueeze(1)
        out = total.to(weight.dtype)
        max_indices = bag_size if mode == 1 else torch.zeros_like(bag_size)
    else:
        spread = bag.unsqueeze(1).expand(n, d)
        best = torch.zeros(n_bags + 1, d, dtype=rows.dtype).scatter_reduce(0, spread, rows, "amax",
                                                                              include_self=False)
        out = best[:n_bags].to(weight.dtype)
        reached = rows == aten.index_select.default(best, 0, bag)
        position = torch.arange(n, dtype=torch.int64).unsqueeze(1).expand(n, d)
        first = torch.full((n_bags + 1, d), n, dtype=torch.int64).scatter_reduce(
            0, spread, torch.where(reached, position, n), "amin")[:n_bags]
        max_indices = aten.index_select.default(flat, 0, first.clamp_max(max(n - 1, 0)).reshape(-1)).view(n_bags, d)
        max_indices = torch.where(first < n, max_indices, 0)
    return out, bag, bag_size, max_indices


def _embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                            offset2bag: torch.Tensor, bag_size: torch.Tensor, maximum_indices: torch.Tensor,
                            num_weights: int, scale_grad_by_freq: bool, mode: int, sparse: bool,
                            per_sample_weights: torch.Tensor | None, padding_idx: int = -1) -> Any:
    if sparse or scale_grad_by_freq:
        return NotImplemented  # refused by name (lowering/ops/scatter.py)
    flat = indices.reshape(-1)
    d = grad.shape[1]
    if mode == 2:
        g = torch.where(bag_size.unsqueeze(1) > 0, grad, 0.0)
        return torch.zeros(num_weights, d, dtype=grad.dtype).scatter_add(0, maximum_indices, g)
    padded = torch.cat([grad, torch.zeros(1, d, dtype=grad.dtype)])
    g = aten.index_select.default(padded, 0, offset2bag).to(torch.float32)
    if mode == 1:
        sizes = torch.cat([bag_size, torch.ones(1, dtype=bag_size.dtype)]).to(torch.float32).clamp_min(1.0)
        g = g / aten.index_select.default(sizes, 0, offset2bag).unsqueeze(1)
    if per_sample_weights is not None:
        g = g * per_sample_weights.reshape(-1, 1).to(torch.float32)
    out = torch.zeros(num_weights, d, dtype=torch.float32).index_put([flat], g, accumulate=True)
    return out.to(grad.dtype)


def _per_sample_weights_backward(grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor,
                                 offsets: torch.Tensor, offset2bag: torch.Tensor, mode: int,
                                 padding_idx: int = -1) -> Any:
    d = grad.shape[1]
    padded = torch.cat([grad, torch.zeros(1, d, dtype=grad.dtype)])
    g = aten.index_select.default(padded, 0, offset2bag)
    rows = aten.embedding.default(weight, indices.reshape(-1))
    return (g * rows).sum(1)


BAG: dict[Any, Callable[..., Any]] = {
    aten._embedding_bag.default: _embedding_bag,
    aten._embedding_bag_forward_only.default: _embedding_bag,
    aten._embedding_bag_backward.default: _embedding_bag_backward,
    aten._embedding_bag_per_sample_weights_backward.default: _per_sample_weights_backward,
}
