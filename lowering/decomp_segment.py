"""``segment_reduce`` (ragged segments along one axis, given by ``lengths`` or ``offsets``) and its backward.

The segments are data, their count is not: ``lengths`` ``[..., S]`` (or ``offsets`` ``[..., S + 1]``) give S
segments along ``axis`` (the last dim of lengths; the dims before it are batch dims shared with the data). Each
position along the axis finds its segment by a binary search of the segment ends; positions outside every
segment go to a spare row that is dropped. The rows are then reduced by one ``scatter_reduce`` onto rows
holding the initial value, as eager: ``sum`` and ``prod`` fold ``initial`` in, ``max``/``min`` compare with it,
``mean`` is ``(initial + sum) / length``. An empty segment is ``initial`` or, without one, the reduction's
identity (0, 1, -inf, +inf; NaN for mean).

The backward restates eager's kernel: sum and mean pass the segment's gradient (over the length for mean);
max/min pass it to every element equal to the result or NaN, and divide it among them when there are several
and the gradient is positive (eager divides only positive gradients); prod passes ``grad * output / x``, and
for a zero or NaN element ``grad`` times the product of the segment's other elements and ``initial``.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

_SCATTER = {"sum": "sum", "mean": "sum", "max": "amax", "min": "amin", "prod": "prod"}
_IDENTITY = {"sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf"), "prod": 1.0}


def _bounds(lengths: torch.Tensor | None, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends) ``[..., S]`` of the segments."""
    if offsets is not None:
        return offsets[..., :-1], offsets[..., 1:]
    assert lengths is not None
    ends = torch.cumsum(lengths, -1)
    return ends - lengths, ends


def _layout(data: torch.Tensor, lengths: torch.Tensor | None, offsets: torch.Tensor | None,
            axis: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(index, starts, ends, axis): ``index`` is data's shape, each element's segment (S for an element outside
    every segment: the spare row); starts and ends are ``[..., S]``."""
    starts, ends = _bounds(lengths, offsets)
    starts, ends = starts.to(torch.int64), ends.to(torch.int64)
    axis = axis % data.dim()
    batch, n, inner = list(data.shape[:axis]), data.shape[axis], data.dim() - axis - 1
    segments = ends.shape[-1]
    pos = torch.arange(n, dtype=torch.int64).expand(*batch, n).contiguous()
    seg = torch.searchsorted(ends.contiguous(), pos, right=True)  # the first segment ending after the position
    start = torch.gather(starts, -1, torch.clamp(seg, max=max(segments - 1, 0)))
    seg = torch.where((seg < segments) & (pos >= start), seg, segments)
    return seg.reshape(*batch, n, *[1] * inner).expand(data.shape), starts, ends, axis


def _rows(data: torch.Tensor, axis: int, segments: int, fill: float) -> torch.Tensor:
    """S + 1 rows along ``axis`` (the segments and the spare row) holding ``fill``."""
    shape = list(data.shape)
    shape[axis] = segments + 1
    return torch.full(shape, fill, dtype=data.dtype)


def _per_segment(ends: torch.Tensor, t: torch.Tensor, data: torch.Tensor, axis: int) -> torch.Tensor:
    """``t`` ``[..., S]`` shaped to broadcast against the segment rows ``[..., S, inner...]``."""
    return t.reshape(*ends.shape, *[1] * (data.dim() - axis - 1))


def segment_reduce(data: torch.Tensor, reduce: str, *, lengths: torch.Tensor | None = None,
                   indices: torch.Tensor | None = None, offsets: torch.Tensor | None = None, axis: int = 0,
                   unsafe: bool = False, initial: Any = None) -> torch.Tensor:
    index, starts, ends, axis = _layout(data, lengths, offsets, axis)
    segments = ends.shape[-1]
    rows = _rows(data, axis, segments, _IDENTITY[reduce] if initial is None else float(initial))
    out = rows.scatter_reduce(axis, index, data, _SCATTER[reduce], include_self=True).narrow(axis, 0, segments)
    if reduce == "mean":
        count = _per_segment(ends, ends - starts, data, axis)
        empty = float("nan") if initial is None else float(initial)
        out = torch.where(count > 0, out / count.clamp(min=1).to(out.dtype), empty)
    return out


def segment_reduce_backward(grad: torch.Tensor, output: torch.Tensor, data: torch.Tensor, reduce: str, *,
                            lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None, axis: int = 0,
                            initial: Any = None) -> torch.Tensor:
    index, starts, ends, axis = _layout(data, lengths, offsets, axis)
    segments = ends.shape[-1]

    def at_elements(t: torch.Tensor) -> torch.Tensor:  # a per-segment value at each element (0 outside)
        return torch.gather(torch.cat([t, _rows(data, axis, 0, 0.0)], axis), axis, index)

    def reduce_segments(t: torch.Tensor, how: str = "sum", fill: float = 0.0) -> torch.Tensor:  # sum or prod
        rows = _rows(t, axis, segments, fill)
        return rows.scatter_reduce(axis, index, t, how, include_self=True).narrow(axis, 0, segments)

    g = at_elements(grad)
    inside = index < segments
    if reduce == "sum":
        return torch.where(inside, g, 0)
    if reduce == "mean":
        count = _per_segment(ends, ends - starts, data, axis).clamp(min=1).to(grad.dtype)
        return torch.where(inside, at_elements(grad / count), 0)
    if reduce in ("max", "min"):
        hit = (torch.isnan(data) | (data == at_elements(output))) & inside
        ties = at_elements(reduce_segments(hit.to(data.dtype)))
        return torch.where(hit, torch.where((ties > 1) & (g > 0), g / ties, g), 0)
    special = (data == 0) | torch.isnan(data)  # prod
    others = reduce_segments(torch.where(special, 1.0, data).to(data.dtype), "prod", 1.0 if initial is None else float(initial))
    zeros, nans = (at_elements(reduce_segments(m.to(data.dtype))) for m in (data == 0, torch.isnan(data)))
    other_zeros, other_nans = zeros - (data == 0).to(data.dtype), nans - torch.isnan(data).to(data.dtype)
    rest = torch.where(other_nans > 0, float("nan"), torch.where(other_zeros > 0, 0.0, 1.0)).to(data.dtype)
    exclusive = at_elements(others) * rest
    return torch.where(inside, torch.where(special, g * exclusive, g * at_elements(output) / data), 0)


SEGMENT: dict[Any, Any] = {
    aten.segment_reduce.default: segment_reduce,
    aten._segment_reduce_backward.default: segment_reduce_backward,
}
