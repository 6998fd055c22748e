"""Advanced indexing in terms of one-dim gathers and selects (decompositions AOTAutograd applies).

- ``x[i0, i1, ...]`` with several index tensors (NumPy rules: the index tensors broadcast; the result
  dims go where the indexed dims were when those are adjacent, first otherwise): the indexed dims are
  moved first and flattened, the indices combined into one linear index (negative ones wrapped), one row
  gather along dim 0, then the result dims are put in place. Each index tensor is bounds-checked on
  device (``lowering.graph_checks`` checks the single-index gathers this produces).
- ``x[mask] = v`` (``index_put`` with a boolean mask and a broadcastable value) is ``where(mask, v, x)``.
- ``x[i0, ...] = v`` without accumulation: the last write to a position wins, as eager's sequential
  loop; the winner of each position is the largest writer index aiming at it (a max reduction over a
  one-hot comparison), then a gather of the winners' values and a select.
- ``index_put(accumulate=True)`` with several index tensors accumulates through the linear index; into an
  integer tensor, with one index tensor too, it is a scatter-add (exact integer adds, not the fp32 row kernel).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from neuron_compile.lowering.decomp_scatter import index_add_rows

aten = torch.ops.aten


def _bool(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _check(idx: torch.Tensor, size: int, what: str) -> None:
    ok = torch.logical_and(idx >= -size, idx < size).all()
    aten._assert_async.msg(ok, f"index out of range in aten.{what}: an index is outside [{-size}, {size}) for a "
                               f"dimension of size {size}")


def _linear(x: torch.Tensor, indices: list[Any], what: str) -> tuple[torch.Tensor, list[int], list[int], torch.Tensor]:
    """x with its indexed dims first and flattened, the indexed dims, the other dims, the linear index."""
    dims = [d for d, t in enumerate(indices) if t is not None]
    idx = torch.broadcast_tensors(*[indices[d] for d in dims])
    lin = None
    for d, t in zip(dims, idx, strict=True):
        size = x.shape[d]
        _check(t, size, what)
        t = torch.where(t < 0, t + size, t)
        lin = t if lin is None else lin * size + t
    rest = [d for d in range(x.dim()) if d not in dims]
    flat = x.permute(dims + rest).reshape(math.prod(x.shape[d] for d in dims), *[x.shape[d] for d in rest])
    assert lin is not None
    return flat, dims, rest, lin


def _result_dims(dims: list[int], nb: int, rank: int) -> list[int] | None:
    """Permutation from (broadcast dims, other dims) to torch's result order, or None if already there."""
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    if not adjacent or dims[0] == 0:
        return None
    before = dims[0]
    return list(range(nb, nb + before)) + list(range(nb)) + list(range(nb + before, rank))


def index_tensor(x: torch.Tensor, indices: list[Any]) -> Any:
    real = [t for t in indices if t is not None]
    if len(real) <= 1 or any(_bool(t) for t in real):
        return NotImplemented  # one index tensor: the gather rule itself; masks: data-dependent shape
    flat, dims, rest, lin = _linear(x, list(indices) + [None] * (x.dim() - len(indices)), "index.Tensor")
    out = aten.index.Tensor(flat, [lin.reshape(-1)])
    out = out.reshape([*lin.shape, *[x.shape[d] for d in rest]])  # a list: 0-d indices and no other dim is shape []
    perm = _result_dims(dims, lin.dim(), out.dim())
    return out if perm is None else out.permute(perm)


def _masked_put(x: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """``x[mask] = values`` with one value row per True position, in order: the k-th True position takes
    ``values[k]`` (its index is the running count of Trues), checked on device to hold exactly that many."""
    rest = list(x.shape[mask.dim():])
    m = mask.reshape([*mask.shape, *([1] * len(rest))])
    if values.dim() <= len(rest) or values.shape[0] == 1:  # one row broadcast to every True position
        v = values.to(x.dtype)
        v = v.reshape(v.shape[1:]) if v.dim() > len(rest) else v
        return torch.where(m, x + v, x) if accumulate else torch.where(m, v, x)
    n = values.shape[0]
    aten._assert_async.msg(mask.sum() == n, f"shape mismatch in aten.index_put: the mask selects a different "
                                             f"number of positions than the {n} value rows given")
    if n == 0:
        return x.clone()
    flat = mask.reshape(-1)
    pos = (torch.cumsum(flat.to(torch.int64), 0) - 1).clamp(min=0)
    rows = torch.index_select(values.to(x.dtype).expand(n, *rest), 0, pos)
    rows = rows.reshape([*mask.shape, *rest])
    return torch.where(m, x + rows, x) if accumulate else torch.where(m, rows, x)


def index_put(x: torch.Tensor, indices: list[Any], values: torch.Tensor, accumulate: bool = False) -> Any:
    real = [t for t in indices if t is not None]
    if not real:
        return NotImplemented
    if len(real) == 1 and _bool(real[0]):
        d = next(i for i, t in enumerate(indices) if t is not None)
        mask = real[0].bool()
        if d + mask.dim() > x.dim():
            return NotImplemented
        if values.numel() != 1 and values.dim() >= 1 and d == 0:
            return _masked_put(x, mask, values, accumulate)
        if values.numel() != 1:
            return NotImplemented
        m = mask.reshape([*([1] * d), *mask.shape, *([1] * (x.dim() - d - mask.dim()))])
        v = values.reshape(()).to(x.dtype)
        return torch.where(m, x + v, x) if accumulate else torch.where(m, v, x)
    if any(_bool(t) for t in real):
        return NotImplemented
    exact = accumulate and not (x.dtype.is_floating_point or x.is_complex())
    if len(real) == 1 and accumulate and not exact:
        return NotImplemented  # the row scatter-add rule (lowering.ops.index), which adds in fp32
    full = list(indices) + [None] * (x.dim() - len(indices))
    flat, dims, rest, lin = _linear(x, full, "index_put")
    nb = lin.dim()
    # values broadcast to the indexing result's shape, then laid out as (tokens, other dims)
    res_shape = [*lin.shape, *[x.shape[d] for d in rest]]
    perm = _result_dims(dims, nb, len(res_shape))
    if perm is not None:
        res_shape = [res_shape[p] for p in perm]
    vals = values.to(x.dtype).expand(res_shape)
    if perm is not None:
        inv = [perm.index(i) for i in range(len(perm))]
        vals = vals.permute(inv)
    tokens = lin.reshape(-1)
    if tokens.shape[0] == 0 or x.numel() == 0:
        return x.clone()  # no index entry (or no element): nothing is written
    vals = vals.reshape(tokens.shape[0], *[x.shape[d] for d in rest])
    if exact:  # integer sums: the scatter kernel's exact integer adds (int64 guarded, narrower ones wrapping)
        out = index_add_rows(flat, tokens, vals)
    elif accumulate:
        out = aten.index_put.default(flat, [tokens], vals, True)
    else:
        rows = flat.shape[0]
        hit = tokens.unsqueeze(0) == torch.arange(rows, device=x.device).unsqueeze(1)  # [rows, tokens]
        writer = torch.where(hit, torch.arange(tokens.shape[0], device=x.device).unsqueeze(0), -1).amax(1)
        took = torch.index_select(vals, 0, writer.clamp(min=0))
        keep = (writer >= 0).reshape(rows, *([1] * (flat.dim() - 1)))
        out = torch.where(keep, took, flat)
    out = out.reshape(*[x.shape[d] for d in dims], *[x.shape[d] for d in rest])
    inv_perm = [0] * x.dim()
    for pos, d in enumerate(dims + rest):
        inv_perm[d] = pos
    return out.permute(inv_perm)


def gather(x: torch.Tensor, dim: int, index: torch.Tensor, *, sparse_grad: bool = False) -> Any:
    """gather with any index shape: ``x[a_0, ..., index, ..., a_n]`` with ``a_k`` aranges over the index's
    own dims (one linear row gather). One index per row along ``dim`` (cross_entropy) keeps its fused rule."""
    if x.dim() == 0 or index.dim() != x.dim():
        return NotImplemented
    d = dim % x.dim()
    if index.shape[d] == 1 and all(index.shape[k] == x.shape[k] for k in range(x.dim()) if k != d):
        return NotImplemented
    aranges: list[Any] = []
    for k in range(x.dim()):
        if k == d:
            aranges.append(index)
        else:
            shape = [1] * x.dim()
            shape[k] = index.shape[k]
            aranges.append(torch.arange(index.shape[k], device=x.device).view(shape))
    _check(index, x.shape[d], "gather")  # gather takes no negative indices: the wrap below never applies
    aten._assert_async.msg((index >= 0).all(), f"index out of range in aten.gather: negative index for a dimension "
                                                f"of size {x.shape[d]}")
    return index_tensor(x, aranges)


INDEX: dict[Any, Any] = {
    aten.gather.default: gather,
    aten.index.Tensor: index_tensor,
    aten.index_put.default: index_put,
}
