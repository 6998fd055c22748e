"""Lowering of ``neuron_compile::conv_weight_grad`` (a convolution's grad_weight) to a ConvWgradKernel.

The op comes from the ``convolution_backward`` decomposition (:mod:`lowering.decomp_conv`); grad_input is
an ordinary (transposed) convolution and grad_bias a sum, so only the weight gradient needs this rule. The
plan: chunks of <= 128 output positions (images x rows x cols), the taps accumulated per pass (PSUM holds
``[C_out tile, C_in tile]`` per tap, 4 banks at a time), and the group packing shared with the forward.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from neuron_compile.lowering.decomp_conv import CONV_WEIGHT_GRAD
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.ir import Access, ArgSpec, BufferRef, ConvWgradKernel, KernelCall
from neuron_compile.lowering.ops.conv import (
    SBUF_BUDGET,
    ConvGeometry,
    arg_index,
    group_pack,
    itemsize,
    nchw,
    pair,
)
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

PSUM_BANKS = 4  # banks of per-tap accumulators per pass (the rest hold the transposes)
MATMUL_N = 512


def wgrad_geometry(node: fx.Node) -> ConvGeometry:
    x, go, wsize, stride, padding, dilation, groups = node.args
    xs, gs = node_shape(x), node_shape(go)
    nsp = len(xs) - 2
    hw = (1, xs[2]) if nsp == 1 else (xs[2], xs[3])
    ohw = (1, gs[2]) if nsp == 1 else (gs[2], gs[3])
    ks = (1, wsize[2]) if nsp == 1 else (wsize[2], wsize[3])
    return ConvGeometry(xs[0], xs[1], gs[1], int(groups), hw, ohw, ks, pair(stride, nsp, 1), pair(padding, nsp, 0),
                        pair(dilation, nsp, 1), False)


def wgrad_plan(geo: ConvGeometry, dtype: str) -> tuple[tuple[int, int, int], int, int] | None:
    """(chunk, taps per pass, output rows per stage), None when even one chunk's stage exceeds the SBUF budget.

    A chunk is <= 128 output positions (images x rows x cols); a stage loads go and the input band of several
    chunk rows at once (one DMA each), as many as the budget allows."""
    oh, ow = geo.out_hw
    if oh * ow <= PMAX:
        chunk = (max(1, min(geo.batch, PMAX // (oh * ow))), oh, ow)
    elif ow <= PMAX:
        chunk = (1, PMAX // ow, ow)
    else:
        chunk = (1, 1, PMAX)
    gpp = group_pack(geo)
    ci_tile = min(PMAX, gpp * geo.cin_g)
    taps = geo.kernel[0] * geo.kernel[1]
    tpp = min(taps, PSUM_BANKS * max(1, MATMUL_N // ci_tile))
    nc, rc, cc = chunk
    bw = max((ow - 1) * geo.stride[1] + (geo.kernel[1] - 1) * geo.dilation[1] + 1, geo.padding[1] + geo.in_hw[1])
    dsz = itemsize(dtype)

    def cost(rows: int) -> int:
        br = (rows - 1) * geo.stride[0] + (geo.kernel[0] - 1) * geo.dilation[0] + 1
        return dsz * (nc * br * bw + nc * rows * ow + 2 * PMAX + 2048 // dsz)

    rows = oh if oh == rc else rc * max(1, oh // rc)
    while rows > rc and cost(rows) > SBUF_BUDGET:
        rows = max(rc, (rows // 2) // rc * rc)
    return (chunk, tpp, rows) if cost(rows) <= SBUF_BUDGET else None


def _wgrad_check(node: fx.Node) -> str | None:
    xv = node.args[0].meta.get("val")
    if not isinstance(xv, torch.Tensor) or xv.dim() not in (3, 4):
        return "the weight gradient of a 1-D or 2-D convolution only"
    if math.prod(node_shape(node)) == 0 or math.prod(node_shape(node.args[1])) == 0:
        return None
    geo = wgrad_geometry(node)
    if wgrad_plan(geo, storage_dtype(xv.dtype) or "float32") is None:
        return (f"convolution weight gradient: an input band for kernel {geo.kernel} with dilation {geo.dilation} "
                f"does not fit the SBUF budget")
    return None


@register_lowering(CONV_WEIGHT_GRAD, family="conv", kind="conv", check=_wgrad_check)
def lower_conv_weight_grad(gl: Any, node: fx.Node) -> None:
    """neuron_compile.conv_weight_grad: sum over positions of go^T x window^T per tap, on TensorE."""
    shape = node_shape(node)
    dtype = node.meta["val"].dtype
    if math.prod(shape) == 0:
        buf = gl._buffer(BufferRef("empty", 0, 0, 0, storage_dtype(dtype) or "float32"))
        gl.views[node] = View(buf, shape, contiguous_strides(shape), 0, dtype)
        return
    geo = wgrad_geometry(node)
    xv, gv = gl.view_of(node.args[0]), gl.view_of(node.args[1])  # may emit copies: take the index after
    kernel_index = len(gl.kernels)
    cdt = storage_dtype(xv.torch_dtype) or "float32"
    plan = wgrad_plan(geo, cdt)
    assert plan is not None
    chunk, tpp, stage_rows = plan
    args: list[int] = []
    x_off, x_st = nchw(xv)
    g_off, g_st = nchw(gv)
    x_acc = Access(arg_index(args, xv.buffer), x_off, x_st)
    g_acc = Access(arg_index(args, gv.buffer), g_off, g_st)
    buf, out = gl.new_output(node, kernel_index, 0)
    kernel = ConvWgradKernel(
        f"k{kernel_index}_conv_wgrad", "conv_wgrad", tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in args),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype),), geo.batch, geo.in_hw, geo.out_hw, geo.kernel,
        geo.stride, geo.padding, geo.dilation, geo.groups, geo.cin_g, geo.cout_g, group_pack(geo), x_acc, g_acc,
        Access(0, out.offset, (out.strides[0], out.strides[1])), chunk, tpp, cdt,
        ("aten.convolution_backward.default",), stage_rows)
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf,)))
    log.debug("%s: %s", node.name, kernel)
