"""Cumulative lowerings: cumsum, cumprod, cummax, cummin, logcumsumexp along any dim (a :class:`ScanKernel`),
and flip (a copy through a negated-stride view).

The scanned dim becomes the free dim of a canonical ``(outer..., rows, n)`` space (other dims merge onto
partitions and unrolled outer loops; strided views are read in place). The kernel is
``codegen/templates/scan.nki.j2``: fp32 scans in chunks with a carried value; integer cumsum exact
over int64 (a result outside the int32 range NeuronCores store raises after the kernel, int32 outputs wrap
like torch's); cummax/cummin return torch's values and indices (NaN wins and stays, ties take the
latest index). cumsum's backward (``flip(cumsum(flip(g)))``) needs ``flip``: one DMA copy reading a
negated-stride view.
"""

from __future__ import annotations

import logging
import math
import operator
from typing import Any

import torch
from neuron_compile.lowering import space as sp
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.intmath import INTS, dtype_of, int_refusal
from neuron_compile.lowering.ir import Access, ArgSpec, BufferRef, KernelCall, ScanKernel
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

CUMMAX_MAX_N = 8192  # cummax/cummin keep whole rows (keys, positions, values) in one partition's SBUF


def _cumsum_check(node: fx.Node) -> str | None:
    out, src = dtype_of(node), dtype_of(node.args[0])
    if out in INTS and out not in (torch.int64, torch.int32):
        return int_refusal("aten.cumsum", out, "a narrow integer accumulation would wrap at its own width",
                           "cumsum with dtype=torch.int64 (the default for integer inputs)")
    if out is not None and out.is_floating_point and src in INTS:
        return int_refusal("aten.cumsum with a float dtype=", src, "integer inputs would be summed in fp32",
                           "cast the input to float first")
    return None


def _float_only(what: str) -> Any:
    def check(node: fx.Node) -> str | None:
        out = dtype_of(node)
        if out is not None and not out.is_floating_point:
            return int_refusal(what, out, "integer products would wrap at 32 bits (torch computes 64-bit)",
                               "cast to float first (x.double() / x.float())")
        return None
    return check


def _cummax_check(node: fx.Node) -> str | None:
    shape = node_shape(node.args[0])
    dim = int(node.args[1]) % max(len(shape), 1)
    n = shape[dim] if shape else 1
    if n > CUMMAX_MAX_N:
        return (f"{node.target} along a dim of {n} elements is not supported: whole rows are scanned in one "
                f"partition's SBUF, at most {CUMMAX_MAX_N} elements")
    return None


def _emit(gl: Any, node: fx.Node, op: str, items: list[tuple[int, str]] | None = None) -> None:
    """One ScanKernel over ``node.args[0]`` along ``node.args[1]``; ``items``: (tuple index, role) of a
    multi-output node (cummax/cummin), else the node itself is the values."""
    x = gl.view_of(node.args[0])
    shape = x.shape
    dim = int(node.args[1]) % max(len(shape), 1)
    kernel_index = len(gl.kernels)
    val = node.meta["val"]
    outs: dict[str, tuple[int, View]] = {}
    if items is None:
        outs["values"] = gl.new_output(node, kernel_index, 0)
    else:
        for slot, (item, role) in enumerate(items):
            t = val[item]
            nd = storage_dtype(t.dtype) or "float32"
            buf = gl._buffer(BufferRef("empty" if math.prod(shape) == 0 else "kernel", kernel_index, slot,
                                       max(math.prod(shape), 1) if math.prod(shape) else 0, nd))
            view = View(buf, tuple(t.shape), contiguous_strides(tuple(t.shape)), 0, t.dtype)
            outs[role] = (buf, view)
            for u in node.users:
                if u.target is operator.getitem and u.args[1] == item:
                    gl.views[u] = view
                    gl.buffer_nodes[buf] = u.name
    if math.prod(shape) == 0:
        for buf, _ in outs.values():
            gl.buffers[buf] = BufferRef("empty", 0, 0, 0, gl.buffers[buf].dtype)
        return
    out_dtype = (val[0] if items is not None else val).dtype
    int64_out = op == "sum" and out_dtype == torch.int64
    space = shape or (1,)
    roles = ["red" if d == dim else "keep" for d in range(len(space))]
    strides = [x.strides or (0,)] + [v.strides or (0,) for _, v in outs.values()]
    canon = sp.canonicalize(space, roles, strides, part_role="keep", free_role="red", split_limit=1 << 30)
    accs = {role: Access(slot, 0, sp.canonical_strides(canon, v.strides or (0,)))
            for slot, (role, (_, v)) in enumerate(outs.items())}
    results = [b for b, _ in outs.values()]
    flag_slot = -1
    if int64_out:
        from neuron_compile.lowering.ops.scatter import check_flag

        flag_slot = len(results)
        results.append(check_flag(gl, node, kernel_index, flag_slot, "cumsum: an int64 running sum left the int32 "
                                  "range that NeuronCores store (values beyond +-2**31); cumsum in float64 on the "
                                  "host instead", "assert"))
    key = "float" if x.torch_dtype.is_floating_point else "int"
    kernel = ScanKernel(
        f"k{kernel_index}_cum{op}", "scan", (ArgSpec(gl.buffers[x.buffer].numel, gl.buffers[x.buffer].dtype),),
        tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in results), canon.space, canon.n_outer,
        Access(0, x.offset, sp.canonical_strides(canon, x.strides or (0,))), accs["values"], accs.get("indices"),
        op, key, int64_out, (str(node.target).replace("aten::", "aten."),), flag_slot)
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, (x.buffer,), tuple(results)))


@register_lowering(aten.cumsum.default, family="scan", kind="copy", check=_cumsum_check)
def lower_cumsum(gl: Any, node: fx.Node) -> None:
    """aten.cumsum along any dim: fp32 chunked scan; integers exact (int64 beyond int32 raises, int32 wraps)."""
    _emit(gl, node, "sum")


@register_lowering(aten.cumprod.default, family="scan", kind="copy", check=_float_only("aten.cumprod"))
def lower_cumprod(gl: Any, node: fx.Node) -> None:
    """aten.cumprod along any dim (float): fp32 chunked scan with a carried product."""
    _emit(gl, node, "prod")


@register_lowering(aten.logcumsumexp.default, family="scan", kind="copy", check=_float_only("aten.logcumsumexp"))
def lower_logcumsumexp(gl: Any, node: fx.Node) -> None:
    """aten.logcumsumexp along any dim: running max plus a rescaled running sum (one linear scan), log."""
    _emit(gl, node, "logsumexp")


def _items(node: fx.Node) -> list[tuple[int, str]]:
    return [(0, "values"), (1, "indices")]


@register_lowering(aten.cummax.default, family="scan", kind="copy", check=_cummax_check)
def lower_cummax(gl: Any, node: fx.Node) -> None:
    """aten.cummax along any dim (rows <= 8192): torch's values and indices (NaN wins, ties: latest index)."""
    _emit(gl, node, "max", _items(node))


@register_lowering(aten.cummin.default, family="scan", kind="copy", check=_cummax_check)
def lower_cummin(gl: Any, node: fx.Node) -> None:
    """aten.cummin along any dim (rows <= 8192): torch's values and indices (NaN wins, ties: latest index)."""
    _emit(gl, node, "min", _items(node))


@register_lowering(aten.flip.default, family="movement", kind="copy")
def lower_flip(gl: Any, node: fx.Node) -> None:
    """aten.flip: one DMA copy reading a negated-stride view (outputs must not have negative strides)."""
    v = gl.view_of(node.args[0])
    dims = {int(d) % max(len(v.shape), 1) for d in node.args[1]}
    offset = v.offset
    strides = list(v.strides)
    for d in dims:
        if d < len(v.shape) and v.shape[d] > 1:  # a 0-d tensor flips to itself
            offset += (v.shape[d] - 1) * v.strides[d]
            strides[d] = -strides[d]
    src = View(v.buffer, v.shape, tuple(strides), offset, v.torch_dtype)
    kernel_index = len(gl.kernels)
    buf, dst = gl.new_output(node, kernel_index, 0)
    gl.emit_copy(f"k{kernel_index}_flip", [(src, dst)], [buf], ("aten.flip.default",))
