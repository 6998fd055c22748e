"""Integer products (``prod`` and ``cumprod``), exactly: elementwise integer multiplications, never fp32.

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


def _along_last(x: torch.Tensor, dim: int, dtype: Any) -> tuple[torch.Tensor, torch.dtype, int] | None:
    """``x`` in its multiplication dtype with ``dim`` moved last, the result dtype and ``dim`` (None: float)."""
    out = _result_dtype(x, dtype)
    if out is None:
        return None
    y = _compute(x, out)
    if x.dim() == 0:
        return y, out, 0
    dim = dim % x.dim()
    return y.movedim(dim, -1), out, dim


def _prod_dim(x: torch.Tensor, dim: int, keepdim: bool = False, dtype: Any = None) -> Any:
    prepared = _along_last(x, dim, dtype)
    if prepared is None:
        return NotImplemented
    y, out, dim = prepared
    if x.dim() == 0:
        return y.to(out)
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
    y = torch.where(zero, 0, y).movedim(-1, dim)
    return (y if keepdim else y.squeeze(dim)).to(out)


def _prod(x: torch.Tensor, dtype: Any = None) -> Any:
    if _result_dtype(x, dtype) is None:
        return NotImplemented
    return _prod_dim(x.reshape(-1), 0, False, dtype)


def _cumprod(x: torch.Tensor, dim: int, dtype: Any = None) -> Any:
    prepared = _along_last(x, dim, dtype)
    if prepared is None:
        return NotImplemented
    y, out, dim = prepared
    if x.dim() == 0:
        return y.to(out)
    after_zero = torch.cumsum((y == 0).to(torch.int32), -1) > 0
    y = torch.where(after_zero, 1, y)
    n = y.shape[-1]
    step = 1
    while step < n:
        y = torch.cat([y[..., :step], y[..., step:] * y[..., :n - step]], -1)
        step *= 2
    return torch.where(after_zero, 0, y).movedim(-1, dim).to(out)


INTPROD: dict[Any, Any] = {
    aten.prod.default: _prod,
    aten.prod.dim_int: _prod_dim,
    aten.cumprod.default: _cumprod,
}
