"""``torch.histogram`` and ``torch.histogramdd`` with static bin counts, as eager computes them.

The number of bins is static; the edges may depend on the data. Without ``range`` the outer edges are the data's
minimum and maximum (per dimension for histogramdd), widened by 0.5 on both sides when they are equal, and 0 and 1
for an empty input. The edges are eager's ``linspace`` between them: ``lo + step * i`` for the lower half of the
edges and ``hi - step * (bins - i)`` for the upper half, each rounded once (torch's kernel rounds the product and
the sum together); on device that single rounding is recovered with an exact product split and a compensated sum.
With ``range``, the edges are computed at compile time by torch's own ``linspace``.

Each element falls in the bin whose edges hold it (``searchsorted(edges, x, right=True) - 1``), the last edge
itself in the last bin; elements outside the edges (and NaNs) are dropped. (Eager refuses data whose range is
not finite; here its edges are NaN and no element is counted.) The counts (or summed weights) are one
``scatter_add`` into the bins plus a spare bin for the dropped elements. ``density`` divides by the total and then
by each bin's width (per dimension), in eager's order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten


def _product(step: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``step * i`` as an fp32 product and its exact rounding error (Dekker; ``i`` holds at most 12 bits)."""
    split = step * 4097.0
    hi = split - (split - step)
    lo = step - hi
    p = step * i
    return p, (hi * i - p) + lo * i


def _sum_rounded_once(a: torch.Tensor, p: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
    """``a + (p + err)`` rounded (nearly always) once: the sum's own rounding error is added back."""
    s = a + p
    v = s - a
    e = (a - (s - v)) + (p - v)
    return s + (e + err)


def _divide_rounded(d: torch.Tensor, n: int) -> torch.Tensor:
    """``d / n`` correctly rounded (nearly always): a NeuronCore divides by multiplying with a reciprocal, so the
    quotient is corrected once by its exact remainder ``d - q * n``."""
    q = d * (1.0 / n)
    p, err = _product(q, torch.full((), float(n), dtype=d.dtype))
    return q + ((d - p) - err) * (1.0 / n)


def _linspace(lo: torch.Tensor, hi: torch.Tensor, bins: int) -> torch.Tensor:
    """Eager's ``linspace(lo, hi, bins + 1)`` for 0-d tensor endpoints."""
    idx = torch.arange(bins + 1, dtype=lo.dtype)
    step = _divide_rounded(hi - lo, bins)
    up, up_err = _product(step, idx)
    down, down_err = _product(step, float(bins) - idx)
    lower = _sum_rounded_once(lo, up, up_err)
    upper = _sum_rounded_once(hi, -down, -down_err)
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


MAX_BINS = 4095  # data-dependent edges: the exact product split holds for edge indices of up to 12 bits


def _too_many(bins: Sequence[int], range: Sequence[float] | None) -> bool:  # noqa: A002 (torch's name)
    return range is None and max(int(b) for b in bins) > MAX_BINS


def _edges(column: torch.Tensor, bins: int, limits: Sequence[float] | None) -> torch.Tensor:
    lo, hi = _outer_edges(column, limits)
    if isinstance(lo, float):
        return torch.linspace(lo, hi, bins + 1, dtype=column.dtype)
    return _linspace(lo, hi, bins)


def _bin(column: torch.Tensor, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(each element's bin, whether it is inside the outer edges)."""
    bins = edges.shape[0] - 1
    pos = torch.clamp(torch.searchsorted(edges, column, right=True) - 1, 0, bins - 1)
    return pos, (column >= edges[0]) & (column <= edges[-1])


def _count(points: torch.Tensor, edges: list[torch.Tensor], weight: torch.Tensor | None, density: bool,
           dtype: torch.dtype) -> torch.Tensor:
    """The histogram of ``points`` ``[N, D]`` over per-dimension ``edges``."""
    sizes = [e.shape[0] - 1 for e in edges]
    total = math.prod(sizes)
    flat = torch.zeros(points.shape[0], dtype=torch.int64)
    inside = torch.ones(points.shape[0], dtype=torch.bool)
    for d, e in enumerate(edges):
        pos, ok = _bin(points[:, d].contiguous(), e)
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
    return _count(column.unsqueeze(1), [edges], weight, density, x.dtype), edges


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
    return _count(points, _dd_edges(points, bins, range), weight, density, x.dtype)


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
