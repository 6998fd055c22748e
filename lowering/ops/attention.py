"""Lowering of the fused ``neuron_compile::attention`` node into an :class:`AttentionKernel`.

The node is created by :func:`neuron_compile.lowering.attention.fuse_attention` (which checked the
pattern, shapes and the SBUF budget). This rule resolves where q, k, v (and an additive mask) live
(strided views of runtime buffers, broadcast over batch/heads), allocates the output buffer in the
layout the replaced subgraph produced (e.g. SDPA's ``[B, S, H, D]`` memory format behind a
``[B, H, S, D]`` view) and builds the kernel IR.
"""

from __future__ import annotations

import logging
import math

from neuron_compile.lowering import space as sp
from neuron_compile.lowering.attention import ATTENTION_OP, key_step
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.ir import ArgSpec, AttentionKernel, BufferRef, KernelCall
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx

log = logging.getLogger(__name__)

_SOURCE_OPS = ("aten.bmm.default", "aten.amax.default", "aten.sub.Tensor", "aten.exp.default",
               "aten.sum.dim_IntList", "aten.div.Tensor", "aten.bmm.default")


def _bhsd(view: View, batch: int, heads: int, rows: int, cols: int, swap: bool = False) -> tuple[int, tuple[int, ...]]:
    """(offset, strides over (b, h, row, col)) of a source broadcast to ``[batch, heads, rows, cols]``."""
    shape, strides = list(view.shape), list(view.strides)
    if swap:
        shape[-2:], strides[-2:] = shape[-2:][::-1], strides[-2:][::-1]
    if len(shape) == 3 and shape[0] == batch * heads and heads > 1:
        out = (heads * strides[0], strides[0], strides[1], strides[2])
    else:
        if len(shape) == 3 and heads == 1:
            shape, strides = [shape[0], 1, *shape[1:]], [strides[0], 0, *strides[1:]]
        out = tuple(sp.broadcast_strides(shape, strides, [batch, heads, rows, cols]))
    return view.offset, out


@register_lowering(ATTENTION_OP, family="attention", kind="attention")
def lower_attention(gl: object, node: fx.Node) -> None:
    """neuron_compile.attention: softmax(scale * q k^T + mask | causal) v as one flash-attention kernel."""
    q, k, v, mask, scale, causal, batch, heads, k_rows, out_perm = node.args
    views = [gl.view_of(n) for n in (q, k, v)]  # type: ignore[attr-defined]
    sq, d = views[0].shape[-2], views[0].shape[-1]
    sk = views[1].shape[-2] if k_rows else views[1].shape[-1]
    dv = views[2].shape[-1]
    args: list[int] = []
    accesses = []
    for view, rows, cols, swap in ((views[0], sq, d, False), (views[1], sk, d, not k_rows), (views[2], sk, dv, False)):
        if view.buffer not in args:
            args.append(view.buffer)
        off, st = _bhsd(view, batch, heads, rows, cols, swap)
        accesses.append((args.index(view.buffer), off, st))
    mask_access = None
    if mask is not None:
        mv = gl.view_of(mask)  # type: ignore[attr-defined]
        if mv.buffer not in args:
            args.append(mv.buffer)
        off, st = _bhsd(mv, batch, heads, sq, sk)
        mask_access = (args.index(mv.buffer), off, st)
    val = node.meta["val"]
    out_dtype = storage_dtype(val.dtype) or "float32"
    shape = tuple(int(s) for s in val.shape)
    if out_perm:  # the buffer is contiguous in the permuted order; the node is a view of it
        # The layout is the decomposition's choice, not the model's: [b, h, s, d] results are stored
        # [b, s, h, d] so the usual ``transpose(1, 2).reshape(b, s, h * d)`` is a contiguous view
        # (its layout clone becomes an alias, see GraphLowering._alias_clone) instead of a copy kernel.
        if len(shape) == 4:
            out_perm = [0, 2, 1, 3]
        buf_strides = contiguous_strides([shape[p] for p in out_perm])
        strides = [0] * len(shape)
        for i, p in enumerate(out_perm):
            strides[p] = buf_strides[i]
    else:
        strides = list(contiguous_strides(shape))
    out_bhsd = tuple(strides) if len(shape) == 4 else (strides[0], 0, strides[1], strides[2])
    kernel_index = len(gl.kernels)  # type: ignore[attr-defined]
    buf = gl._buffer(BufferRef("kernel", kernel_index, 0, max(math.prod(shape), 1), out_dtype))  # type: ignore
    gl.views[node] = View(buf, shape, tuple(strides), 0, val.dtype)  # type: ignore[attr-defined]
    gl.buffer_nodes[buf] = node.name  # type: ignore[attr-defined]
    cdt = storage_dtype(views[0].torch_dtype) or "float32"

    def spec(b: int) -> ArgSpec:
        return ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype)  # type: ignore[attr-defined]

    # Each access is (arg, offset, strides); the arg index is implied by the position (q, k, v, mask).
    kernel = AttentionKernel(
        f"k{kernel_index}_attention", "attention", tuple(spec(b) for b in args), (spec(buf),), int(batch),
        int(heads), int(sq), int(sk), int(d), int(dv), float(scale), bool(causal),
        (accesses[0][0], accesses[0][1], accesses[0][2]), (accesses[1][0], accesses[1][1], accesses[1][2]),
        (accesses[2][0], accesses[2][1], accesses[2][2]),
        mask_access, out_bhsd, cdt, key_step(cdt), _SOURCE_OPS)
    gl.kernels.append(kernel)  # type: ignore[attr-defined]
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf,)))  # type: ignore[attr-defined]
    log.debug("attention kernel %s: b=%d h=%d sq=%d sk=%d d=%d dv=%d causal=%s mask=%s", kernel.name, batch, heads,
              sq, sk, d, dv, causal, mask is not None)


__all__ = ["lower_attention"]
