"""Fractional max pooling (``nn.FractionalMaxPool2d/3d``) and its backward, restated with gathers.

Eager draws one sample ``u`` in [0, 1) per (batch, channel, spatial dim); the window starts along a dim of input
size ``n`` with ``o`` outputs and pool size ``k`` are ``int((i + u) * a) - int(u * a)`` for ``i < o - 1`` with
``a = (n - k) / (o - 1)`` computed in the input's dtype, and ``n - k`` for the last output. Each output is the
maximum of its ``k``-window: the first maximum in row-major window order, or the last NaN when the window has
NaNs (eager's loop keeps a value when it is greater than the running maximum or NaN). The index is the position
in the flattened spatial plane. 2-D pooling reads the samples width first (``u[..., 0]`` for W, ``u[..., 1]``
for H); 3-D reads them in dim order (T, H, W). The backward adds grad_output into grad_input at those indices.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

aten = torch.ops.aten


def _round(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` rounded to ``dtype`` and back to fp32: eager computes the starts in the input's own dtype."""
    return t if dtype in (torch.float32, torch.float64) else t.to(dtype).float()


def _scalar(v: float, dtype: torch.dtype) -> float:
    """The Python number ``v`` rounded to ``dtype`` (nearest even), as eager's scalar arithmetic in that dtype."""
    if dtype == torch.float64:
        return float(v)
    if dtype == torch.float16:
        return float(np.float16(v))
    bits = int(np.array(v, dtype=np.float32).view(np.uint32))
    if dtype == torch.bfloat16:
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def _starts(u: torch.Tensor, size: int, outputs: int, pool: int, dtype: torch.dtype) -> torch.Tensor:
    """The window starts ``[N, C, outputs]`` (int64) of one spatial dim from its samples ``u`` ``[N, C]``."""
    last = torch.full((*u.shape, 1), size - pool, dtype=torch.int64)
    if outputs == 1:
        return last
    alpha = _scalar(_scalar(size - pool, dtype) / _scalar(outputs - 1, dtype), dtype)
    u = u.float().unsqueeze(-1)
    i = torch.arange(outputs - 1, dtype=torch.float32)
    first = _round(_round(i + u, dtype) * alpha, dtype).to(torch.int64)
    offset = _round(u * alpha, dtype).to(torch.int64)
    return torch.cat([first - offset, last], -1)


def _fractional_max_pool(x: torch.Tensor, kernel: Any, output_size: Any, samples: torch.Tensor) -> Any:
    nd = len(kernel)
    batched = x.dim() == nd + 2
    xb = x if batched else x.unsqueeze(0)
    n, c, spatial = xb.shape[0], xb.shape[1], list(xb.shape[2:])
    outs = [int(o) for o in output_size]
    samples = samples[:n]  # an unbatched input reads batch 0's samples (eager accepts more rows than it reads)
    order = list(range(nd)) if nd == 3 else [1, 0]  # which sample each spatial dim reads
    strides = [math.prod(spatial[d + 1:]) for d in range(nd)]
    lin = None
    for d in range(nd):
        k = int(kernel[d])
        idx = _starts(samples[:, :, order[d]], spatial[d], outs[d], k, x.dtype).unsqueeze(-1) + torch.arange(k)
        shape = [n, c] + [1] * (2 * nd)
        shape[2 + d], shape[2 + nd + d] = outs[d], k  # output positions first, then the window
        term = (idx * strides[d]).reshape(shape)
        lin = term if lin is None else lin + term
    positions, window = math.prod(outs), math.prod(int(k) for k in kernel)
    lin = lin.expand(n, c, *outs, *[int(k) for k in kernel]).reshape(n, c, positions, window)
    vals = torch.gather(xb.reshape(n, c, -1), 2, lin.reshape(n, c, -1)).reshape(n, c, positions, window)
    nans = torch.isnan(vals)
    last_nan = torch.argmax(nans.to(torch.int64) * torch.arange(1, window + 1), -1, keepdim=True)
    pick = torch.where(nans.any(-1, keepdim=True), last_nan, torch.argmax(vals, -1, keepdim=True))
    out = torch.gather(vals, 3, pick).reshape(n, c, *outs)
    indices = torch.gather(lin, 3, pick).reshape(n, c, *outs)
    if not batched:
        out, indices = out.squeeze(0), indices.squeeze(0)
    return out, indices


def _fractional_max_pool_backward(grad: torch.Tensor, x: torch.Tensor, kernel: Any, output_size: Any,
                                  indices: torch.Tensor) -> torch.Tensor:
    nd = len(kernel)
    planes = math.prod(x.shape[:-nd])
    plane = math.prod(x.shape[-nd:])
    if planes == 0 or plane == 0:
        return torch.zeros(x.shape, dtype=grad.dtype)
    out = torch.zeros(planes, plane, dtype=grad.dtype)
    out = torch.scatter_add(out, 1, indices.reshape(planes, -1), grad.reshape(planes, -1))
    return out.reshape(x.shape)


POOL: dict[Any, Any] = {
    aten.fractional_max_pool2d.default: _fractional_max_pool,
    aten.fractional_max_pool3d.default: _fractional_max_pool,
    aten.fractional_max_pool2d_backward.default: _fractional_max_pool_backward,
    aten.fractional_max_pool3d_backward.default: _fractional_max_pool_backward,
}
