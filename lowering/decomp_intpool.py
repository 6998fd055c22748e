"""Max and average pooling of integers (1-D, 2-D and 3-D; max with indices), exactly.

The pool kernels compare in fp32, which holds every integer only below 2^24. An integer max pool is instead a scan
over the kernel's taps in eager's order (the last dim innermost): each tap is one strided slice of the padded
input, and an elementwise int32 ``>`` keeps the first largest value of each window and its flat input index,
exactly as eager's loop (``val > maxval``). Taps that fall into the padding or past the input never win (eager
pads with -inf): a static mask per tap says where each one is inside the input. An integer average is the same
scan summing (in int64, guarded like every int64 sum) and a truncating division by the window size, as eager's
CPU kernel (which takes int64 only).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from neuron_compile.lowering.decomp_conv import _per_dim, _pool_out

aten = torch.ops.aten


def _taps(x: torch.Tensor, ks: list[int], st: list[int], pad: list[int], dil: list[int], outs: list[int]) -> Any:
    """Per kernel tap, in eager's order: the strided slice of the padded input it reads for every output, where
    that is inside the input, and its flat input index (the spatial dims' row-major offset)."""
    n = len(ks)
    sizes = [int(s) for s in x.shape[-n:]]
    pads: list[int] = []  # every spatial dim padded so that each tap's slice exists (the padding never counts)
    for size, k, s, p, d, o in reversed(list(zip(sizes, ks, st, pad, dil, outs, strict=True))):
        pads += [p, max(0, (o - 1) * s + (k - 1) * d + 1 - size - p)]
    xp = aten.constant_pad_nd.default(x, pads, 0)
    mults = [1] * n
    for i in range(n - 2, -1, -1):
        mults[i] = mults[i + 1] * sizes[i + 1]
    for taps in itertools.product(*[range(k) for k in ks]):
        v, valid, flat = xp, None, None
        for dim, (t, s, p, d, o, size, mult) in enumerate(zip(taps, st, pad, dil, outs, sizes, mults, strict=True)):
            axis = x.dim() - n + dim
            v = aten.slice.Tensor(v, axis, t * d, t * d + (o - 1) * s + 1, s)
            coord = torch.arange(o, device=x.device) * s + (t * d - p)
            shape = [1] * x.dim()
            shape[axis] = o
            inside = ((coord >= 0) & (coord < size)).reshape(shape)
            term = (coord * mult).reshape(shape)
            valid = inside if valid is None else valid & inside
            flat = term if flat is None else flat + term
        yield v, valid, flat


def _geometry(x: torch.Tensor, n: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
              ceil_mode: bool) -> tuple[list[int], ...]:
    ks = _per_dim(kernel_size, n, [])
    st, pad, dil = _per_dim(stride, n, ks), _per_dim(padding, n, [0] * n), _per_dim(dilation, n, [1] * n)
    sizes = [int(s) for s in x.shape[-n:]]
    outs = [_pool_out(*a, ceil_mode) for a in zip(sizes, ks, st, pad, dil, strict=True)]
    return ks, st, pad, dil, outs


def _int_max_pool(n: int) -> Any:
    def fn(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
           ceil_mode: bool = False) -> Any:
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            return NotImplemented
        if x.dim() == n + 1:  # unbatched
            v, i = fn(x.unsqueeze(0), kernel_size, stride, padding, dilation, ceil_mode)
            return v.squeeze(0), i.squeeze(0)
        best = index = seen = None
        for v, valid, flat in _taps(x, *_geometry(x, n, kernel_size, stride, padding, dilation, ceil_mode)):
            if best is None:
                best, index, seen = v, flat.expand(v.shape), valid
                continue
            take = valid & (~seen | (v > best))
            best = torch.where(take, v, best)
            index = torch.where(take, flat, index)
            seen = seen | valid
        assert best is not None and index is not None
        return best.contiguous(), index.to(torch.int64).contiguous()

    return fn


def _int_avg_pool(n: int) -> Any:
    """Integer average pooling as eager's CPU kernel computes it: the window's sum divided by the window size
    (clipped to the padded input; to the input with count_include_pad=False; or divisor_override), truncated."""
    def fn(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
           count_include_pad: bool = True, divisor_override: Any = None) -> Any:
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            return NotImplemented
        if x.dim() == n + 1:  # unbatched
            return fn(x.unsqueeze(0), kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override).squeeze(0)
        ks, st, pad, dil, outs = _geometry(x, n, kernel_size, stride, padding, 1, ceil_mode)
        total = None
        for v, valid, _ in _taps(x, ks, st, pad, dil, outs):
            term = torch.where(valid, v.to(torch.int64), 0)
            total = term if total is None else total + term
        assert total is not None
        divisor: Any = int(divisor_override) if divisor_override else 1
        if not divisor_override:
            for dim, (k, s, p, o) in enumerate(zip(ks, st, pad, outs, strict=True)):
                size = int(x.shape[x.dim() - n + dim])
                start = torch.arange(o, device=x.device) * s - p
                end = torch.clamp(start + k, max=size + p)
                length = end - start if count_include_pad else (
                    torch.clamp(end, max=size) - torch.clamp(start, min=0))
                shape = [1] * x.dim()
                shape[x.dim() - n + dim] = o
                divisor = divisor * length.reshape(shape)
        return torch.div(total, divisor, rounding_mode="trunc").to(x.dtype).contiguous()

    return fn


INTPOOL: dict[Any, Any] = {
    aten.max_pool2d_with_indices.default: _int_max_pool(2),
    aten.max_pool3d_with_indices.default: _int_max_pool(3),
    aten.avg_pool2d.default: _int_avg_pool(2),
    aten.avg_pool3d.default: _int_avg_pool(3),
}
