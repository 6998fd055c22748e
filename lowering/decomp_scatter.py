"""Decompositions that route gather/scatter-family ops to the line kernels of ``lowering/ops/scatter.py``.

``scatter``/``scatter_add`` with one index per row along ``dim`` (cross-entropy's backward) stay ATen ops and
fuse into loop kernels (``lowering/ops/index.py``); ``gather`` is ``lowering/decomp_index.py``'s (a linear
row gather) except for a 0-d self. Every other form becomes one of two ops of this package, whose eager
implementations define their semantics:

- ``neuron_compile::gather_lines(self, dim, index, lo)``: gather from lines held in SBUF (``masked_scatter``'s
  source lookup, 0-d gathers), negative indices wrapping when ``lo < 0``.
- ``neuron_compile::scatter_lines(self, dim, index, src, fill, reduce, include_self, lo, error)``: scatter,
  scatter_add, scatter_reduce, index_add, index_copy, index_fill, index_reduce, put; ``src`` None scatters
  the scalar ``fill``; ``reduce`` 'assign' takes the last write (CPU torch's order for duplicates).

Both raise like eager for indices outside ``[lo, size)`` (device-side guard flag; ``error`` 'index' gives
an IndexError, 'runtime' a RuntimeError).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from neuron_compile.lowering.decomp_bag import BAG
from neuron_compile.lowering.decomp_sort import SORT
from neuron_compile.lowering.mathlib import NARROW_INTS
from neuron_compile.lowering.registry import register_declined

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)
aten = torch.ops.aten

_LIB = torch.library.Library("neuron_compile", "FRAGMENT")
_LIB.define("gather_lines(Tensor self, int dim, Tensor index, int lo) -> Tensor")
_LIB.define("scatter_lines(Tensor self, int dim, Tensor index, Tensor? src, float fill, str reduce, "
            "bool include_self, int lo, str error) -> Tensor")


def _wrapped(index: torch.Tensor, size: int, lo: int) -> torch.Tensor:
    return torch.where(index < 0, index + size, index) if lo < 0 else index


def _gather_lines_eager(x: torch.Tensor, dim: int, index: torch.Tensor, lo: int) -> torch.Tensor:
    if x.dim() == 0:  # a 0-d self is a line of one element; the result has the index's shape
        return torch.gather(x.reshape(1), 0, _wrapped(index.reshape(-1), 1, lo)).reshape(index.shape)
    return torch.gather(x, dim, _wrapped(index, x.shape[dim], lo))


def _one_line(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A 0-d / 1-D self as one line: index and src of any shape flattened, src's first elements (one per index) or
    its single value for every index."""
    index = index.reshape(-1)
    if src is not None:
        src = src.reshape(-1)
        src = src[: index.numel()] if src.numel() > 1 else src.expand(index.shape)
    return x.reshape(-1), index, src


def _scatter_lines_eager(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor | None, fill: float,
                         reduce: str, include_self: bool, lo: int, error: str) -> torch.Tensor:
    shape = x.shape
    if x.dim() <= 1:  # 0-d / 1-D self: one line
        (x, index, src), dim = _one_line(x, index, src), 0
    index = _wrapped(index, x.shape[dim], lo)
    if src is None:
        src = torch.full(index.shape, fill, dtype=x.dtype)
    if reduce == "assign":
        return x.scatter(dim, index, src).reshape(shape)
    return x.scatter_reduce(dim, index, src, reduce, include_self=include_self).reshape(shape)


_LIB.impl("gather_lines", _gather_lines_eager, "CompositeExplicitAutograd")
_LIB.impl("scatter_lines", _scatter_lines_eager, "CompositeExplicitAutograd")
GATHER_LINES = torch.ops.neuron_compile.gather_lines.default
SCATTER_LINES = torch.ops.neuron_compile.scatter_lines.default


def one_per_row(x: torch.Tensor, dim: int, index: torch.Tensor) -> bool:
    """One index per row along ``dim``, other dims equal (the fused loop-kernel form of index.py)."""
    if x.dim() == 0 or index.dim() != x.dim():
        return False
    dim %= x.dim()
    return index.shape[dim] == 1 and all(a == b for d, (a, b) in enumerate(zip(index.shape, x.shape, strict=True))
                                          if d != dim)


def _gather(x: torch.Tensor, dim: int, index: torch.Tensor, sparse_grad: bool = False) -> Any:
    """gather: lowering/decomp_index.py's linear row gather; a 0-d self and forms it leaves out: a line gather."""
    if x.dim() == 0:
        return GATHER_LINES(x, 0, index, 0)
    from neuron_compile.lowering.decomp_index import gather

    out = gather(x, dim, index, sparse_grad=sparse_grad)
    if out is NotImplemented and not one_per_row(x, dim, index):  # forms the linear row gather leaves out (1-D)
        return GATHER_LINES(x, dim % x.dim(), index, 0)
    return out


# A float scatter-add with an index of its own per element goes element by element through the DMA scatter-add
# (~5.5 us per 128 elements) rather than the compare kernel (every index against every target of a line, lines on
# partitions: ~5 ns per target and index for each tile of 128 lines) from this many targets per fully used tile
# of lines: measured break-even under the cost model (trn2) for 512 indices per line, 1100 targets at 128 lines,
# ~270 at 32 (benchmarks/sort_scatter.py's word counts).
ELEMENT_SCATTER_BREAK_EVEN = 1100


def _element_wise_is_cheaper(x: torch.Tensor, dim: int, index: torch.Tensor) -> bool:
    lines = index.numel() // max(index.shape[dim], 1)
    tiles = -(-lines // PMAX)
    return x.shape[dim] * tiles * PMAX >= ELEMENT_SCATTER_BREAK_EVEN * lines


def index_shared_by_lines(shape: Sequence[int], dim: int, index_shape: Sequence[int],
                          index_strides: Sequence[int]) -> bool:
    """The index is the same for every line (stride 0 or size 1 off ``dim``) and spans self (of ``shape``) there:
    the lowering's row scatter (lowering/ops/scatter.py) takes such a scatter-add as it is."""
    return all(index_shape[d] == shape[d] and (index_strides[d] == 0 or index_shape[d] == 1)
               for d in range(len(shape)) if d != dim)


def _element_scatter_add(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, lo: int,
                         op: str) -> torch.Tensor:
    """scatter-add along a long dim with an index of its own per element: every element's flat address in ``x``
    (its index times the dim's stride plus its line's offset), then one scatter-add into ``x`` flattened, a line
    whose rows are single elements. O(elements) instead of O(elements x targets)."""
    size = x.shape[dim]
    strides = [math.prod(x.shape[d + 1:]) for d in range(x.dim())]
    idx = _wrapped(index, size, lo)
    ok = (idx >= 0) & (idx < size)
    aten._assert_async.msg(ok.all(), f"index out of range in aten.{op}: an index is outside [{lo}, {size}) "
                                     f"for dimension {dim} of size {size}; fix the indices")
    flat = idx * strides[dim]
    for d, n in enumerate(index.shape):
        if d != dim and n > 1:
            at = [1] * index.dim()
            at[d] = n
            flat = flat + (torch.arange(n, dtype=torch.int64) * strides[d]).view(at)
    flat = torch.where(ok, flat, 0)  # a bad index raises (above); its element goes nowhere harmful meanwhile
    part = src[tuple(slice(0, n) for n in index.shape)]
    out = SCATTER_LINES(x.reshape(-1), 0, flat.reshape(-1), part.reshape(-1), 0.0, "sum", True, 0, "runtime")
    return out.view(x.shape)


def _scatter(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor | None, fill: float, reduce: str,
             include_self: bool = True, lo: int = 0, error: str = "runtime", op: str = "scatter_add") -> torch.Tensor:
    """``op``: the ATen op's name for error messages."""
    if index.numel() == 0 or x.numel() == 0:
        return x.clone()
    if src is not None and src.dim() == 0 and index.dim():
        src = src.expand(index.shape)
    dim %= max(x.dim(), 1)
    if (reduce == "sum" and include_self and src is not None and x.dtype.is_floating_point and x.dim() > 1
            and not index_shared_by_lines(x.shape, dim, index.shape, index.stride())
            and _element_wise_is_cheaper(x, dim, index)):
        return _element_scatter_add(x, dim, index, src, lo, op)
    if reduce in ("mean", "prod") and not (x.dtype.is_floating_point or x.is_complex()):
        if src is None:  # scatter(..., value, reduce="multiply"): the value at every index
            src = torch.full(index.shape, int(fill), dtype=x.dtype)
        out = (_int_scatter_mean if reduce == "mean" else _int_scatter_prod)(x, dim, index, src, include_self, lo,
                                                                              error)
        if out is not NotImplemented:
            return out
    if reduce == "sum" and x.dtype in NARROW_INTS:
        # torch wraps the sums at 8/16 bits: accumulate in int32, then cast back (the cast wraps like torch's)
        wide = SCATTER_LINES(x.to(torch.int32), dim, index, src.to(torch.int32) if src is not None else None, fill,
                             reduce, include_self, lo, error)
        return wide.to(x.dtype)
    return SCATTER_LINES(x, dim, index, src, fill, reduce, include_self, lo, error)


def _int_scatter_mean(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, include_self: bool,
                      lo: int, error: str) -> torch.Tensor:
    """Eager's integer mean: the sum (wrapping at x's width; int64 guarded) floor-divided by the number of values
    summed, itself counted in x's dtype (so it wraps too; a count that wraps to 0 divides by 1)."""
    total = _scatter(x, dim, index, src, 0.0, "sum", include_self, lo, error)
    ones = torch.ones(index.shape, dtype=torch.int32)
    count = SCATTER_LINES(torch.ones(x.shape, dtype=torch.int32), dim, index, ones, 0.0, "sum", include_self, lo,
                          error).to(x.dtype)
    return torch.div(total, torch.where(count == 0, 1, count), rounding_mode="floor")


_DENSE_PRODUCT_LIMIT = 1 << 22  # elements of the one-hot factor tensor an integer scatter product may build


def _int_scatter_prod(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, include_self: bool,
                      lo: int, error: str) -> Any:
    """An integer scatter product, exactly: per line, a ``[targets, indices]`` one-hot table of factors (the
    value where the index aims at the target, else 1) multiplied out along the indices by the integer ``prod``
    (exact elementwise multiplications; int64 guarded, narrower dtypes wrapping like eager). NotImplemented
    (refused by name) when that table would exceed ``_DENSE_PRODUCT_LIMIT`` elements."""
    shape = x.shape
    if x.dim() <= 1:  # one line, as the scatter kernel takes it
        (x, index, src), dim = _one_line(x, index, src), 0
    else:
        src = src[tuple(slice(0, n) for n in index.shape)]
    size = x.shape[dim]
    if index.numel() * size > _DENSE_PRODUCT_LIMIT:
        return NotImplemented
    # how many values aim at each target (the scatter kernel also raises for indices outside [lo, size))
    hits = SCATTER_LINES(torch.zeros(x.shape, dtype=torch.int32), dim, index, torch.ones(index.shape,
                         dtype=torch.int32), 0.0, "sum", True, lo, error)
    region = tuple(slice(0, n) if d != dim else slice(None) for d, n in enumerate(index.shape))
    xr, hit_any = x[region].movedim(dim, -1), (hits[region] > 0).movedim(dim, -1)
    idx, vals = _wrapped(index, size, lo).movedim(dim, -1), src.to(x.dtype).movedim(dim, -1)
    aims = idx.unsqueeze(-2) == torch.arange(size).unsqueeze(-1)  # [..., targets, indices]
    product = torch.prod(torch.where(aims, vals.unsqueeze(-2), torch.ones((), dtype=x.dtype)), -1, dtype=x.dtype)
    res = torch.where(hit_any, xr * product if include_self else product, xr).movedim(-1, dim)
    if res.shape != x.shape:  # the index covers part of the other dims: the rest of x is kept
        pads = [p for d in reversed(range(x.dim())) for p in (0, x.shape[d] - res.shape[d])]
        inside = torch.ones((), dtype=torch.bool)
        for d, n in enumerate(index.shape):
            if d != dim:
                at = [1] * x.dim()
                at[d] = x.shape[d]
                inside = inside & (torch.arange(x.shape[d]) < n).view(at)
        res = torch.where(inside, aten.constant_pad_nd.default(res, pads, 0), x)
    return res.reshape(shape)


def _scatter_src(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> Any:
    if one_per_row(x, dim, index) and tuple(src.shape) == tuple(index.shape) and not x.is_complex():
        return NotImplemented
    return _scatter(x, dim, index, src, 0.0, "assign")


def _fill(x: torch.Tensor, value: Any) -> tuple[torch.Tensor | None, float]:
    """(src, fill) of a scatter of a scalar: a float fill, or, for complex values, a 0-d source of x's dtype (the
    complex pass splits the scatter into parts; lowering/complex_more.py)."""
    if x.is_complex():
        return torch.scalar_tensor(value, dtype=x.dtype), 0.0
    return None, float(value)


def _scatter_value(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> Any:
    if one_per_row(x, dim, index) and not x.is_complex():
        return NotImplemented
    return _scatter(x, dim, index, *_fill(x, value), "assign")


def _scatter_add(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> Any:
    if one_per_row(x, dim, index) and tuple(src.shape) == tuple(index.shape) and not x.is_complex():
        return NotImplemented
    return _scatter(x, dim, index, src, 0.0, "sum")


_OLD_REDUCE = {"add": "sum", "multiply": "prod"}


def _scatter_reduce_old(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *, reduce: str) -> Any:
    return _scatter(x, dim, index, src, 0.0, _OLD_REDUCE[reduce], op="scatter")


def _scatter_value_reduce_old(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any, *, reduce: str) -> Any:
    return _scatter(x, dim, index, *_fill(x, value), _OLD_REDUCE[reduce])


def _scatter_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *,
                    include_self: bool = True) -> Any:
    return _scatter(x, dim, index, src, 0.0, reduce, include_self, op="scatter_reduce")


def _line_index(index: torch.Tensor, dim: int, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """A 1-D index along ``dim`` broadcast over the other dims of ``shape`` (a stride-0 view)."""
    index = index.reshape(-1)
    view = [1] * len(shape)
    view[dim] = index.numel()
    full = list(shape)
    full[dim] = index.numel()
    return index.view(view).expand(full)


def _index_op(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor | None, fill: float, reduce: str,
              include_self: bool = True, lo: int = 0, error: str = "runtime") -> torch.Tensor:
    if x.dim() == 0:  # 0-d self: a line of one element (the custom op takes index/source of any shape)
        return _scatter(x, 0, index, source, fill, reduce, include_self, lo, error)
    if index.dim() == 0:
        index = index.unsqueeze(0)
    dim %= x.dim()
    shape = list(x.shape)
    shape[dim] = index.numel()
    full = _line_index(index, dim, shape)
    if source is not None:
        source = source.expand(shape) if source.dim() == 0 else source
    return _scatter(x, dim, full, source, fill, reduce, include_self, lo, error)


def index_add_rows(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``x[index[k]] += source[k]`` along dim 0, negative indices wrapping (index_put's accumulate), in x's dtype
    with the scatter kernel's exact adds."""
    return _index_op(x, 0, index, source, 0.0, "sum", lo=-max(x.shape[0], 1), error="index")


_TYPE_NAMES = {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte"}


def _check_index_args(op: str, x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> None:
    """Eager's argument checks of index_add/index_reduce (their meta functions skip them, so a mismatched source
    would otherwise compile): the same exception type and message, at compile time."""
    if index.dim() > 1:
        raise IndexError(f"{op}_(): Index is supposed to be a vector, but got dim: {index.dim()} with type: "
                         f"{_TYPE_NAMES.get(index.dtype, index.dtype)} and size: {list(index.shape)}")
    d = dim % max(x.dim(), 1)
    if source.dim() == 0 and index.numel() != 1:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    n = 1 if source.dim() == 0 else source.shape[d] if d < source.dim() else None
    if n is not None and index.numel() != n:
        raise RuntimeError(f"{op}_(): Number of indices ({index.numel()}) should be equal to source.size(dim): "
                           f"({n}), for dim: {dim}")
    if x.dim() != source.dim() or any(x.shape[k] != source.shape[k] for k in range(x.dim()) if k != d):
        raise RuntimeError(f"source tensor shape must match self tensor shape, excluding the specified dimension. "
                           f"Got self.shape = {list(x.shape)} source.shape = {list(source.shape)}")


def _index_add(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha: Any = 1) -> Any:
    _check_index_args("index_add", x, dim, index, source)
    return _index_op(x, dim, index, source if alpha == 1 else source * alpha, 0.0, "sum")


def _index_copy(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> Any:
    return _index_op(x, dim, index, source, 0.0, "assign", error="index")


def _index_fill_scalar(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> Any:
    if isinstance(value, complex) and not x.is_complex():
        return NotImplemented  # eager refuses it too: refused by name
    size = x.shape[dim % x.dim()] if x.dim() else 1
    return _index_op(x, dim, index, *_fill(x, value), "assign", lo=-size, error="index")


def _index_fill_tensor(x: torch.Tensor, dim: int, index: torch.Tensor, value: torch.Tensor) -> Any:
    size = x.shape[dim % x.dim()] if x.dim() else 1
    return _index_op(x, dim, index, value.to(x.dtype), 0.0, "assign", lo=-size, error="index")


def _index_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str, *,
                  include_self: bool = True) -> Any:
    _check_index_args("index_reduce", x, dim, index, source)
    return _index_op(x, dim, index, source, 0.0, reduce, include_self, error="index")


def _put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> Any:
    """x.put: a scatter into the flattened self (0-d and 1-D operands are taken as one line)."""
    flat = x.reshape(-1) if x.dim() > 1 else x
    idx = index.reshape(-1) if index.dim() > 1 else index
    src = source.reshape(-1) if source.dim() > 1 else source
    out = _scatter(flat, 0, idx, src, 0.0, "sum" if accumulate else "assign", True, lo=-max(x.numel(), 1),
                   error="index")
    return out.reshape(x.shape) if x.dim() > 1 else out


def _masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> Any:
    """out[mask] = source's first mask.sum() elements in order: position = running count of the mask."""
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    mask_b = mask.expand(shape)
    if x.numel() == 0:
        return x.clone()
    pos = torch.cumsum(mask_b.reshape(-1).to(torch.int64), 0) - 1
    src = source.reshape(-1)
    if src.numel() == 0:
        src = torch.zeros(1, dtype=x.dtype)
    vals = GATHER_LINES(src, 0, torch.clamp_min(pos, 0), 0).view(shape)
    return torch.where(mask_b, vals, x.expand(shape))


def _masked_scatter_backward(grad: torch.Tensor, mask: torch.Tensor, sizes: Any) -> Any:
    """source's gradient: grad's masked elements in order (the inverse of the forward's running-count gather),
    then zeros for the source elements the mask did not reach."""
    n = math.prod(int(s_) for s_ in sizes)
    out = torch.zeros(n, dtype=grad.dtype)
    if n == 0 or grad.numel() == 0:
        return out.view(list(sizes))
    m = mask.expand(grad.shape).reshape(-1)
    pos = torch.clamp(torch.cumsum(m.to(torch.int64), 0) - 1, 0, n - 1)
    vals = torch.where(m, grad.reshape(-1), 0)
    return torch.scatter_add(out, 0, pos, vals).view(list(sizes))


def _nonzero_static(x: torch.Tensor, *, size: int, fill_value: int = -1) -> Any:
    """nonzero_static: the coordinates of the first ``size`` nonzero elements in row-major order, ``fill_value``
    rows after them. The k-th nonzero is where the running count first reaches k + 1 (a binary search)."""
    size = int(size)
    if x.dim() == 0 or size == 0 or x.numel() == 0:
        return torch.full((size, x.dim()), fill_value, dtype=torch.int64)
    count = torch.cumsum((x.reshape(-1) != 0).to(torch.int64), 0)
    k = torch.arange(size, dtype=torch.int64)
    lin = torch.clamp(torch.searchsorted(count, k + 1), max=x.numel() - 1)
    coords, rest = [], lin
    for n in reversed(x.shape):
        coords.append(torch.remainder(rest, n))
        rest = torch.div(rest, n, rounding_mode="floor")
    found = (k < count[-1]).unsqueeze(1)
    return torch.where(found, torch.stack(coords[::-1], 1), fill_value)


# Ops whose output size depends on the values: Dynamo runs them eagerly at a graph break unless fullgraph=True, which
# brings them here; the refusal names a static-shape way to write them.
_DATA_DEPENDENT = {
    aten.nonzero.default: "torch.nonzero_static(x, size=n) (the first n, padded with fill_value)",
    aten.masked_select.default: "torch.where(mask, x, 0) (the same shape, unselected elements zero)",
    aten._unique2.default: "a sort and a first-occurrence mask of the same shape, or run it outside the compiled "
                           "region",
    aten.unique_dim.default: "run it outside the compiled region",
    aten.unique_consecutive.default: "a mask comparing neighbours (x[1:] != x[:-1]), or run it outside the compiled "
                                     "region",
    aten.repeat_interleave.Tensor: "repeats given as a Python int, or run it outside the compiled region",
    aten.bincount.default: "torch.zeros(n).scatter_add_(0, x, torch.ones_like(x, dtype=torch.float)) for a fixed n",
}
register_declined(lambda node: (f"its output size depends on the input values (a data-dependent shape; NeuronCore "
                                f"kernels have static shapes): use {_DATA_DEPENDENT[node.target]}"),
                  *_DATA_DEPENDENT)


SCATTER: dict[Any, Callable[..., Any]] = {
    aten.gather.default: _gather,
    aten.scatter.src: _scatter_src,
    aten.scatter.value: _scatter_value,
    aten.scatter.reduce: _scatter_reduce_old,
    aten.scatter.value_reduce: _scatter_value_reduce_old,
    aten.scatter_add.default: _scatter_add,
    aten.scatter_reduce.two: _scatter_reduce,
    aten.index_add.default: _index_add,
    aten.index_copy.default: _index_copy,
    aten.index_fill.int_Scalar: _index_fill_scalar,
    aten.index_fill.int_Tensor: _index_fill_tensor,
    aten.index_reduce.default: _index_reduce,
    aten.put.default: _put,
    aten.masked_scatter.default: _masked_scatter,
    aten.masked_scatter_backward.default: _masked_scatter_backward,
    aten.nonzero_static.default: _nonzero_static,
    **BAG,  # EmbeddingBag (lowering/decomp_bag.py)
    **SORT,  # topk of long rows (lowering/decomp_sort.py)
}
