"""Integer products (``prod`` and ``cumprod``), exactly: elementwise integer multiplications, never fp32; and
sums kept in a narrow integer dtype (``sum``/``cumsum`` with ``dtype=torch.int8``), as int64 sums cast back.

The reductions and scans of the kernels accumulate in fp32, which holds every integer only below 2^24. An integer
``prod`` is instead a tree of elementwise multiplications (the reduced dim halved per step, padded with ones) and
``cumprod`` a Hillis-Steele scan (``y[i] *= y[i - 2^k]``), both in the result dtype: int64 (what torch gives for
integer and bool inputs) is guarded like every int64 multiplication (lowering/intguard.py: a result past int32
raises, it never wraps), an explicit narrower ``dtype=`` wraps at its width as eager's. Integer multiplication is
associative, so the order differs from eager's but not the result. Every partial product is a product of some of
the factors, so it leaves int32 only if the result does, except next to a zero: rows with a zero (for cumprod,
positions at or after the first zero) multiply ones instead and are set to 0 at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _result_dtype(x: torch.Tensor, dtype: Any) -> torch.dtype | None:
    """The integer dtype eager computes the product in, or None when it is a float product."""
    out = dtype if dtype is not None else (torch.int64 if not (x.dtype.is_floating_point or x.dtype.is_complex)
                                           else x.dtype)
    return None if out.is_floating_point or out.is_complex or out == torch.bool else out


def _compute(x: torch.Tensor, out: torch.dtype) -> torch.Tensor:
    """``x`` in the dtype the multiplications run in: int64 (guarded) or int32 (wrapping, cast back after)."""
    return x.to(torch.int64 if out == torch.int64 else torch.int32)


def _along(x: torch.Tensor, dim: int, dtype: Any, body: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``body`` applied to ``x`` (in its multiplication dtype) along ``dim`` moved last, in the result dtype;
    NotImplemented for a float product. A 0-d tensor is its own product."""
    out = _result_dtype(x, dtype)
    if out is None:
        return NotImplemented
    y = _compute(x, out)
    if x.dim() == 0:
        return y.to(out)
    dim = dim % x.dim()
    return body(y.movedim(dim, -1)).movedim(-1, dim).to(out)


def _tree_product(y: torch.Tensor) -> torch.Tensor:
    """The product over the last dim (kept, size 1): halves multiplied pairwise, padded with ones."""
    zero = (y == 0).any(-1, keepdim=True)
    y = torch.where(zero, 1, y)
    n = y.shape[-1]
    width = 1
    while width < n:
        width *= 2
    if width > n:
        y = torch.cat([y, torch.ones(*y.shape[:-1], width - n, dtype=y.dtype, device=y.device)], -1)
    while y.shape[-1] > 1:
        half = y.shape[-1] // 2
        y = y[..., :half] * y[..., half:]
    if n == 0:
        y = torch.ones(*y.shape[:-1], 1, dtype=y.dtype, device=y.device)
    return torch.where(zero, 0, y)


def _prefix_products(y: torch.Tensor) -> torch.Tensor:
    """The prefix products along the last dim (Hillis-Steele: y[i] *= y[i - 2^k])."""
    after_zero = torch.cumsum((y == 0).to(torch.int32), -1) > 0
    y = torch.where(after_zero, 1, y)
    n = y.shape[-1]
    step = 1
    while step < n:
        y = torch.cat([y[..., :step], y[..., step:] * y[..., :n - step]], -1)
        step *= 2
    return torch.where(after_zero, 0, y)


def _prod_dim(x: torch.Tensor, dim: int, keepdim: bool = False, dtype: Any = None) -> Any:
    out = _along(x, dim, dtype, _tree_product)
    return out if out is NotImplemented or keepdim or x.dim() == 0 else out.squeeze(dim % x.dim())


def _prod(x: torch.Tensor, dtype: Any = None) -> Any:
    return _prod_dim(x.reshape(-1), 0, False, dtype)


def _cumprod(x: torch.Tensor, dim: int, dtype: Any = None) -> Any:
    return _along(x, dim, dtype, _prefix_products)


_NARROW = (torch.int8, torch.uint8, torch.int16)


def _narrow_sum(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """A sum kept in int8/uint8/int16 (``dtype=``): eager's wrap at that width is the int64 sum's, cast (addition
    modulo 2^k does not care when it wraps)."""
    if dtype not in _NARROW or x.dtype.is_floating_point or x.dtype.is_complex:  # integer sums widen by default
        return NotImplemented
    wide = x.to(torch.int64)
    total = wide.sum() if dim is None else aten.sum.dim_IntList(wide, dim, keepdim)
    return total.to(dtype)


def _narrow_cumsum(x: torch.Tensor, dim: int, *, dtype: Any = None) -> Any:
    if dtype not in _NARROW or x.dtype.is_floating_point or x.dtype.is_complex:
        return NotImplemented
    return torch.cumsum(x.to(torch.int64), dim).to(dtype)


INTPROD: dict[Any, Any] = {
    aten.sum.default: _narrow_sum,
    aten.sum.dim_IntList: _narrow_sum,
    aten.cumsum.default: _narrow_cumsum,
    aten.prod.default: _prod,
    aten.prod.dim_int: _prod_dim,
    aten.cumprod.default: _cumprod,
}
