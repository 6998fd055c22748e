"""Pooling lowerings: max / avg pooling forward and backward as :class:`~neuron_compile.lowering.ir.PoolKernel`.

- ``neuron_compile::max_pool`` / ``max_pool_index`` / ``max_pool_backward`` (from the
  ``max_pool2d_with_indices(_backward)`` decompositions in :mod:`lowering.decomp_conv`: the backward
  recomputes the argmax from the input, so training never stores indices);
- ``aten.avg_pool2d`` / ``aten.avg_pool2d_backward`` (ceil_mode, count_include_pad, divisor_override).

1-D pooling arrives as 2-D with H = 1. The plan: rows (N x C) on partitions, the taps' valid output ranges per
spatial dim, and the stage height that fits the SBUF budget. 3-D pooling is rewritten to 2-D first (average:
lowering.decomp_conv; max: lowering.decomp_conv3d).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from neuron_compile.lowering.decomp_conv import MAX_POOL, MAX_POOL_BACKWARD, MAX_POOL_INDEX
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.ir import Access, ArgSpec, BufferRef, KernelCall, PoolKernel
from neuron_compile.lowering.ops.conv import SBUF_BUDGET, arg_index, pair
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import qualified_name, register_lowering
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx

from neuron_compile.errors import LoweringError

log = logging.getLogger(__name__)
aten = torch.ops.aten

Tap = tuple[int, int, int, int, int]


def pool_taps(in_size: int, out_size: int, k: int, s: int, p: int, d: int, count_pad: bool) -> tuple[Tap, ...]:
    """Per tap: outputs ``[lo, hi)`` whose window position is a real input element, and ``[clo, chi)`` that count it
    toward an average (the padded extent ``[-p, in + p)`` with count_include_pad, else the real ones)."""
    taps = []
    for t in range(k):
        off = t * d - p
        lo = -(off // s) if off < 0 else 0
        hi = min(out_size, (in_size - 1 - off) // s + 1) if in_size - 1 - off >= 0 else 0
        if count_pad:
            clo, chi = 0, min(out_size, (in_size + 2 * p - 1 - t * d) // s + 1)
        else:
            clo, chi = lo, hi
        taps.append((t, lo, max(lo, hi), clo, max(clo, chi)))
    return tuple(taps)


def _sizes(x: fx.Node, node: fx.Node, out_node: fx.Node | None = None) -> tuple[int, int, tuple[int, int], tuple[int, int]]:
    xs = node_shape(x)
    os_ = node_shape(out_node if out_node is not None else node)
    return xs[0], xs[1], (xs[2], xs[3]), (os_[2], os_[3])


def plane_rows(views: list[View]) -> tuple[int, int, list[tuple[int, int, int, int]]] | None:
    """(outer, rows, per view (outer, row, h, w) strides): N x C merged onto partitions when every view allows."""
    n, c = views[0].shape[0], views[0].shape[1]
    if all(v.strides[0] == c * v.strides[1] or n == 1 for v in views):
        return 1, n * c, [(0, v.strides[1], v.strides[2], v.strides[3]) for v in views]
    return n, c, [(v.strides[0], v.strides[1], v.strides[2], v.strides[3]) for v in views]


def _stage(mode: str, in_hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
           stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int]) -> int | None:
    """Output rows (forward) or input rows (backward) per stage within the SBUF budget; None if one row is too wide."""
    (h, w), (oh, ow) = in_hw, out_hw
    bw = max((ow - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1, padding[1] + w)
    reach = (kernel[0] - 1) * dilation[0] + 1

    def cost(n: int) -> int:
        if mode in ("max", "max_index", "avg"):
            return 4 * (((n - 1) * stride[0] + reach) * bw + 8 * n * ow)
        q = n // stride[0] + reach // stride[0] + 2  # outputs reaching n input rows
        return 4 * ((n + 2 * reach + 2 * stride[0]) * bw * 2 + 8 * q * ow)

    full = oh if mode in ("max", "max_index", "avg") else h
    n = full
    while n > 1 and cost(n) > SBUF_BUDGET:
        n = (n + 1) // 2
    return n if cost(n) <= SBUF_BUDGET else None


def _geom(node: fx.Node) -> tuple[Any, ...]:
    """(mode, x node, go node, out-shape node, kernel, stride, padding, dilation, count_pad, divisor); a kernel
    longer than the padded input (EfficientNet's ``AvgPool2d(1280, ceil_mode=True)`` over 7 x 7: a global pool)
    is cut to the taps that can reach it, which changes no window."""
    g = _geom_args(node)
    hw = node_shape(g[1])[2:4]
    ks = tuple(min(k, -(-(n + 2 * p) // d)) for k, n, p, d in zip(g[4], hw, g[6], g[7], strict=True))
    return (*g[:4], ks, *g[5:])


def _geom_args(node: fx.Node) -> tuple[Any, ...]:
    t = node.target
    a = node.args
    if t in (MAX_POOL, MAX_POOL_INDEX):
        mode = "max" if t is MAX_POOL else "max_index"
        return mode, a[0], None, node, pair(a[1], 2, 1), pair(a[2], 2, 1), pair(a[3], 2, 0), pair(a[4], 2, 1), \
            False, 0.0
    if t is MAX_POOL_BACKWARD:
        return "max_backward", a[1], a[0], a[0], pair(a[2], 2, 1), pair(a[3], 2, 1), pair(a[4], 2, 0), \
            pair(a[5], 2, 1), False, 0.0
    if t is aten.avg_pool2d.default:
        ks = pair(a[1], 2, 1)
        st = pair(a[2], 2, 1) if len(a) > 2 and a[2] else ks
        pad = pair(a[3], 2, 0) if len(a) > 3 else (0, 0)
        cip = a[5] if len(a) > 5 else True
        div = a[6] if len(a) > 6 else None
        return "avg", a[0], None, node, ks, st, pad, (1, 1), bool(cip), float(div or 0.0)
    # avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor)
    ks = pair(a[2], 2, 1)
    st = pair(a[3], 2, 1) if a[3] else ks
    return "avg_backward", a[1], a[0], a[0], ks, st, pair(a[4], 2, 0), (1, 1), bool(a[6]), float(a[7] or 0.0)


def _pool_check(node: fx.Node) -> str | None:
    mode, x, go, onode, ks, st, pad, dil, _, _ = _geom(node)
    xv = x.meta.get("val")
    if not isinstance(xv, torch.Tensor) or xv.dim() != 4:
        return "pooling of a 4-D [N, C, H, W] input only (1-D pooling arrives as 2-D; 3-D pooling is not supported)"
    if not xv.dtype.is_floating_point:
        return f"pooling of {xv.dtype} is not supported (floating point only)"
    if math.prod(node_shape(node)) == 0 or math.prod(node_shape(onode)) == 0:
        return None
    _, _, hw, ohw = _sizes(x, node, onode)
    if _stage(mode, hw, ohw, ks, st, pad, dil) is None:
        return f"pooling rows of width {hw[1]} do not fit the SBUF budget of one kernel"
    return None


def _adaptive_max_check(node: fx.Node) -> str | None:
    xv = node.args[0].meta.get("val")
    if not isinstance(xv, torch.Tensor) or not xv.dtype.is_floating_point:
        return "adaptive max pooling of a floating-point tensor only"
    out = [int(o) for o in node.args[1]]
    if any(o <= 0 for o in out):
        return f"adaptive max pooling to {tuple(out)}: every output size must be positive"
    return None


@register_lowering(aten.adaptive_max_pool2d.default, family="pool", kind="conv", check=_adaptive_max_check)
def lower_adaptive_max_pool2d(gl: Any, node: fx.Node) -> None:
    """adaptive max pooling, any output size: max pooling (kernel = stride) or the windows gathered.

    The decomposition in lowering/decomp_conv.py rewrites it before lowering."""
    raise LoweringError(f"{node.name}: adaptive_max_pool2d reached the lowering undecomposed")


@register_lowering(MAX_POOL, MAX_POOL_INDEX, MAX_POOL_BACKWARD, aten.avg_pool2d.default,
                   aten.avg_pool2d_backward.default, family="pool", kind="conv", check=_pool_check)
def lower_pool(gl: Any, node: fx.Node) -> None:
    """max/avg pooling (values, max indices, backward): window taps on VectorE, padding never read."""
    mode, x, go, onode, ks, st, pad, dil, cip, div = _geom(node)
    shape = node_shape(node)
    dtype = node.meta["val"].dtype
    if math.prod(shape) == 0:
        buf = gl._buffer(BufferRef("empty", 0, 0, 0, storage_dtype(dtype) or "float32"))
        gl.views[node] = View(buf, shape, contiguous_strides(shape), 0, dtype)
        return
    _, _, hw, ohw = _sizes(x, node, onode)
    xv = gl.view_of(x)
    gv = gl.view_of(go) if go is not None else None
    kernel_index = len(gl.kernels)  # after the views: resolving one may emit a copy kernel
    buf, out = gl.new_output(node, kernel_index, 0)
    views = [v for v in (xv, gv, out) if v is not None]
    outer, rows, strides = plane_rows(views)
    args: list[int] = []
    x_acc = Access(arg_index(args, xv.buffer), xv.offset, strides[0]) if mode != "avg_backward" else None
    g_acc = Access(arg_index(args, gv.buffer), gv.offset, strides[1]) if gv is not None else None
    o_acc = Access(0, out.offset, strides[-1])
    taps_h = pool_taps(hw[0], ohw[0], ks[0], st[0], pad[0], dil[0], cip)
    taps_w = pool_taps(hw[1], ohw[1], ks[1], st[1], pad[1], dil[1], cip)
    stage = _stage(mode, hw, ohw, ks, st, pad, dil)
    assert stage is not None
    kernel = PoolKernel(
        f"k{kernel_index}_{mode}_pool", "pool", tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in args),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype),), mode, outer, rows, hw, ohw, ks, st, pad, dil,
        taps_h, taps_w, x_acc, g_acc, o_acc, stage, div, (qualified_name(node.target),))
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf,)))
    log.debug("%s: %s", node.name, kernel)
