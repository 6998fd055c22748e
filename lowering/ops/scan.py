"""Scan lowerings: cumsum along any dim (a :class:`ScanKernel`), and flip (a copy through a negated-stride view).

The scanned dim becomes the free dim of a canonical ``(outer..., part, free)`` space (other dims merge
onto partitions and unrolled outer loops); each 128-row tile scans free-dim chunks with
``nisa.tensor_tensor_scan`` carrying the running sum in a ``(P, 1)`` tile; integer cumsum (an int32
result buffer) is exact instead: a log-step Hillis-Steele scan of GpSimd int32 ``tensor_tensor`` adds
over shifted slices, plus an int32 carry (``codegen/render_index.scan_body``). cumsum's backward
(``flip(cumsum(flip(g)))``) needs ``flip``: one DMA copy reading a negated-stride view.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from neuron_compile.lowering import space as sp
from neuron_compile.lowering.intmath import INTS, dtype_of, int_refusal
from neuron_compile.lowering.ir import Access, ArgSpec, KernelCall, ScanKernel
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.views import View
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

SCAN_FREE_TILE = 512


def _cumsum_check(node: fx.Node) -> str | None:
    out, src = dtype_of(node), dtype_of(node.args[0])
    if out in INTS and out not in (torch.int64, torch.int32):
        return int_refusal("aten.cumsum", out, "int32 accumulation is stored with a saturating cast, torch wraps",
                           "cumsum with dtype=torch.int64 (the default for integer inputs)")
    if out in INTS and src is not None and src.is_floating_point:
        return int_refusal("aten.cumsum with an integer dtype=", src, "torch truncates each float first, "
                           "NeuronCore casts round to nearest", "cumsum in float and round explicitly")
    return None


@register_lowering(aten.cumsum.default, family="scan", kind="copy", check=_cumsum_check)
def lower_cumsum(gl: Any, node: fx.Node) -> None:
    """aten.cumsum along any dim: chunked scan with a carried (P, 1) sum (fp32; integers exact in int32)."""
    src = gl.view_of(node.args[0])
    shape = node_shape(node)
    rank = len(shape)
    dim = int(node.args[1]) % max(rank, 1)
    kernel_index = len(gl.kernels)
    buf, dst = gl.new_output(node, kernel_index, 0)
    space = shape or (1,)
    roles = ["red" if d == dim else "keep" for d in range(len(space))]
    s_strides = src.strides or (0,)
    d_strides = dst.strides or (0,)
    canon = sp.canonicalize(space, roles, [s_strides, d_strides], part_role="keep", free_role="red",
                            split_limit=1 << 30)
    kernel = ScanKernel(
        f"k{kernel_index}_cumsum", "scan",
        (ArgSpec(gl.buffers[src.buffer].numel, gl.buffers[src.buffer].dtype),),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype),),
        canon.space, canon.n_outer,
        Access(0, src.offset, sp.canonical_strides(canon, s_strides)),
        Access(0, dst.offset, sp.canonical_strides(canon, d_strides)),
        "add", SCAN_FREE_TILE, ("aten.cumsum.default",))
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, (src.buffer,), (buf,)))


@register_lowering(aten.flip.default, family="movement", kind="copy")
def lower_flip(gl: Any, node: fx.Node) -> None:
    """aten.flip: one DMA copy reading a negated-stride view (outputs must not have negative strides)."""
    v = gl.view_of(node.args[0])
    dims = {int(d) % max(len(v.shape), 1) for d in node.args[1]}
    offset = v.offset
    strides = list(v.strides)
    for d in dims:
        if v.shape[d] > 1:
            offset += (v.shape[d] - 1) * v.strides[d]
            strides[d] = -strides[d]
    src = View(v.buffer, v.shape, tuple(strides), offset, v.torch_dtype)
    kernel_index = len(gl.kernels)
    buf, dst = gl.new_output(node, kernel_index, 0)
    gl.emit_copy(f"k{kernel_index}_flip", [(src, dst)], [buf], ("aten.flip.default",))
