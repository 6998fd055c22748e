"""``torch.histogram`` and ``torch.histogramdd`` with static bin counts, as eager computes them.

The number of bins is static; the edges may depend on the data. Without ``range`` the outer edges are the data's
minimum and maximum (per dimension for histogramdd), widened by 0.5 on both sides when they are equal, and 0 and 1
for an empty input. The edges are eager's ``linspace`` between them: ``lo + step * i`` for the lower half of the
edges and ``hi - step * (bins - i)`` for the upper half, each rounded once (torch's kernel rounds the product and
the sum together); on device that single rounding is recovered with an exact product split and a compensated sum.
With ``range``, the edges are computed at compile time by torch's own ``linspace``.

With a bin count each element's bin is eager's: its linear guess ``(x - lo) * bins / (hi - lo)``, corrected against
the edges of the neighbouring bins only; with bin tensors, a search of every edge. The last edge itself is in the
last bin; elements outside the edges (and NaNs) are dropped. (Eager refuses data whose range is
not finite; here its edges are NaN and no element is counted.) The counts (or summed weights) are one
``scatter_add`` into the bins plus a spare bin for the dropped elements. ``density`` divides by the total and then
by each bin's width (per dimension), in eager's order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from neuron_compile.lowering.exact_float import ieee_divide, two_product, two_sum

aten = torch.ops.aten


def _add_rounded_once(a: torch.Tensor, p: torch.Tensor, p_err: torch.Tensor) -> torch.Tensor:
    """``a + (p + p_err)`` rounded (nearly always) once, as torch's linspace rounds ``a + step * i``."""
    s, err = two_sum(a, p)
    return s + (err + p_err)


def _linspace(lo: torch.Tensor, hi: torch.Tensor, bins: int) -> torch.Tensor:
    """Eager's ``linspace(lo, hi, bins + 1)`` for 0-d tensor endpoints."""
    idx = torch.arange(bins + 1, dtype=lo.dtype)
    step = ieee_divide(hi - lo, bins)
    lower = _add_rounded_once(lo, *two_product(step, idx))
    upper = _add_rounded_once(hi, *two_product(-step, float(bins) - idx))
    return torch.where(idx < (bins + 1) // 2, lower, upper)


def _outer_edges(column: torch.Tensor, limits: Sequence[float] | None) -> tuple[Any, Any]:
    """(leftmost, rightmost) of one dimension: ``range``'s Python floats or the data's 0-d min and max."""
    if limits is not None:
        lo, hi = float(limits[0]), float(limits[1])
        return (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)
    if column.numel() == 0:
        return 0.0, 1.0
    lo, hi = torch.amin(column), torch.amax(column)
    same = lo == hi
    return torch.where(same, lo - 0.5, lo), torch.where(same, hi + 0.5, hi)


MAX_BINS = 2**24 - 1  # data-dependent edges: the edge index must be exact in float32


def _too_many(bins: Sequence[int], range: Sequence[float] | None) -> bool:  # noqa: A002 (torch's name)
    return range is None and max(int(b) for b in bins) > MAX_BINS


def _edges(column: torch.Tensor, bins: int, limits: Sequence[float] | None) -> torch.Tensor:
    lo, hi = _outer_edges(column, limits)
    if isinstance(lo, float):
        return torch.linspace(lo, hi, bins + 1, dtype=column.dtype)
    return _linspace(lo, hi, bins)


def _bin(column: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Each element's bin among arbitrary sorted ``edges`` (eager's binary search)."""
    return torch.searchsorted(edges, column, right=True) - 1


def _bin_linear(column: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Each element's bin among linspace ``edges``, as eager finds it: the bin its distance from the first edge
    predicts, corrected by comparing it with the edges of that bin's neighbours only. Where the bins are narrower
    than the data's spacing (repeated edges), that local search, not a search of every edge, decides."""
    count = edges.shape[0]
    guess = ieee_divide((column - edges[0]) * float(count - 1), edges[-1] - edges[0])
    guess = guess.nan_to_num().clamp(0, count - 1).trunc().long()  # outside the edges (dropped) or inside
    neighbour = guess[:, None] + torch.arange(-1, 2)  # [N, 3]
    held = (neighbour >= 0) & (neighbour < count) & (edges[neighbour.clamp(0, count - 1)] <= column[:, None])
    return guess.clamp(min=1) - 2 + held.sum(1)


def _count(points: torch.Tensor, edges: list[torch.Tensor], weight: torch.Tensor | None, density: bool,
           dtype: torch.dtype, linear: bool = False) -> torch.Tensor:
    """The histogram of ``points`` ``[N, D]`` over per-dimension ``edges`` (``linear``: linspace edges)."""
    sizes = [e.shape[0] - 1 for e in edges]
    total = math.prod(sizes)
    flat = torch.zeros(points.shape[0], dtype=torch.int64)
    inside = torch.ones(points.shape[0], dtype=torch.bool)
    for d, e in enumerate(edges):
        column = points[:, d].contiguous()
        bins = e.shape[0] - 1
        pos = (_bin_linear if linear else _bin)(column, e).clamp(0, bins - 1)  # the last edge is in the last bin
        ok = (column >= e[0]) & (column <= e[-1])
        flat = flat + pos * math.prod(sizes[d + 1:])
        inside = inside & ok
    flat = torch.where(inside, flat, total)  # the spare bin
    values = torch.ones(points.shape[0], dtype=dtype) if weight is None else weight.reshape(-1).to(dtype)
    hist = torch.zeros(total + 1, dtype=dtype).scatter_add(0, flat, values)[:total].reshape(sizes)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            shape = [1] * len(sizes)
            shape[d] = sizes[d]
            hist = hist / (e[1:] - e[:-1]).reshape(shape)
    return hist


def histogram_bin_ct(x: torch.Tensor, bins: int = 100, *, range: Sequence[float] | None = None,  # noqa: A002
                     weight: torch.Tensor | None = None, density: bool = False) -> Any:
    if _too_many([bins], range):
        return NotImplemented
    column = x.reshape(-1)
    edges = _edges(column, int(bins), range)
    return _count(column.unsqueeze(1), [edges], weight, density, x.dtype, linear=True), edges


def histogram_bins_tensor(x: torch.Tensor, bins: torch.Tensor, *, weight: torch.Tensor | None = None,
                          density: bool = False) -> Any:
    edges = bins.to(x.dtype)
    return _count(x.reshape(-1, 1), [edges], weight, density, x.dtype), edges


def _points(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _limits(range: Sequence[float] | None, d: int) -> Sequence[float] | None:  # noqa: A002 (torch's name)
    return None if range is None else (range[2 * d], range[2 * d + 1])


def histogramdd_bin_edges(x: torch.Tensor, bins: Sequence[int], *, range: Sequence[float] | None = None,  # noqa: A002
                          weight: torch.Tensor | None = None, density: bool = False) -> Any:
    if _too_many(bins, range):
        return NotImplemented
    return _dd_edges(_points(x), bins, range)


def _dd_edges(points: torch.Tensor, bins: Sequence[int], range: Sequence[float] | None) -> list[torch.Tensor]:  # noqa: A002
    return [_edges(points[:, d].contiguous(), int(b), _limits(range, d)) for d, b in enumerate(bins)]


def histogramdd_from_bin_cts(x: torch.Tensor, bins: Sequence[int], *, range: Sequence[float] | None = None,  # noqa: A002
                             weight: torch.Tensor | None = None, density: bool = False) -> Any:
    if _too_many(bins, range):
        return NotImplemented
    points = _points(x)
    return _count(points, _dd_edges(points, bins, range), weight, density, x.dtype, linear=True)


def histogramdd_from_bin_tensors(x: torch.Tensor, bins: Sequence[torch.Tensor], *, weight: torch.Tensor | None = None,
                                 density: bool = False) -> torch.Tensor:
    return _count(_points(x), [b.to(x.dtype) for b in bins], weight, density, x.dtype)


HISTOGRAM: dict[Any, Any] = {
    aten.histogram.bin_ct: histogram_bin_ct,
    aten.histogram.bins_tensor: histogram_bins_tensor,
    aten._histogramdd_bin_edges.default: histogramdd_bin_edges,
    aten._histogramdd_from_bin_cts.default: histogramdd_from_bin_cts,
    aten._histogramdd_from_bin_tensors.default: histogramdd_from_bin_tensors,
}
