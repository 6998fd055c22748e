"""Index lowerings: embedding/index_select (row gather), index_put accumulate, gather/scatter.

- ``embedding`` / ``index_select`` / ``index.Tensor`` (one index tensor) become a :class:`GatherKernel`: indices on partitions, rows
  fetched by an indirect DMA (``vector_offset``), any dim via strided (permuted) views.
- ``index_put(accumulate=True)`` (what ``embedding_dense_backward`` and ``index_select``'s backward
  decompose to), and the float index_add / scatter_add whose index is shared by every row, become an
  :class:`IndexAddKernel`: a DMA scatter-add, duplicates combined on TensorE first.
- ``gather`` / ``scatter`` / ``scatter_add`` with one index per row along ``dim`` (what
  ``nll_loss`` / ``cross_entropy`` forward and backward produce) are fused loop-kernel rules: an
  iota along ``dim`` compared with the index selects the element (masked reduction / select).
- random ops live in :mod:`lowering.ops.random`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from neuron_compile.lowering import space as sp
from neuron_compile.lowering.ir import Access, ArgSpec, GatherKernel, IndexAddKernel, KernelCall
from neuron_compile.lowering.partition import node_shape, shape_map
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx

from neuron_compile.errors import LoweringError

log = logging.getLogger(__name__)
aten = torch.ops.aten


def collapse(shape: tuple[int, ...], stride_sets: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Merge neighbouring dims (size-1 dims dropped) wherever every stride set allows it."""
    sizes: list[int] = []
    strides: list[list[int]] = [[] for _ in stride_sets]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if sizes and all(st[-1] == s[d] * size for st, s in zip(strides, stride_sets, strict=True)):
            sizes[-1] *= size
            for st, s in zip(strides, stride_sets, strict=True):
                st[-1] = s[d]
            continue
        sizes.append(size)
        for st, s in zip(strides, stride_sets, strict=True):
            st.append(s[d])
    return sizes, strides


def _flat_index(gl: Any, idx: View, name: str) -> View:
    """The index tensor as one strided 1-D run (copied to a dense buffer when it is not)."""
    sizes, (strides,) = collapse(idx.shape, [idx.strides])
    if len(sizes) > 1:
        idx = gl.copy_contiguous(idx, name)
        sizes, (strides,) = collapse(idx.shape, [idx.strides])
    n = math.prod(idx.shape)
    return View(idx.buffer, (n,), (strides[0] if strides else 1,), idx.offset, idx.torch_dtype)


def _arg_index(args: list[int], buf: int) -> int:
    if buf not in args:
        args.append(buf)
    return args.index(buf)


def _emit_gather(gl: Any, node: fx.Node, table: View, dim: int, idx_node: fx.Node, source: str,
                 wrap_negative: bool = False) -> None:
    """``out = table.index_select(dim, idx)`` with ``idx`` flattened (embedding: dim 0, idx any shape)."""
    dim %= max(len(table.shape), 1)
    post_shape = table.shape[dim + 1:]
    post_sizes, (post_strides,) = collapse(post_shape, [table.strides[dim + 1:]])
    if len(post_sizes) > 1:  # the row is not one strided run: gather from a dense copy
        table = gl.copy_contiguous(table, f"{node.name}_table")
        post_sizes, (post_strides,) = collapse(post_shape, [table.strides[dim + 1:]])
    idx = _flat_index(gl, gl.view_of(idx_node), f"{node.name}_index")
    n = idx.shape[0]
    row = math.prod(post_shape)
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    pre_shape = table.shape[:dim]
    out_pre = contiguous_strides(pre_shape + (n * row,))[:-1] if pre_shape else ()
    pre_sizes, (t_pre, o_pre) = collapse(pre_shape, [table.strides[:dim], out_pre])
    args: list[int] = []
    _arg_index(args, table.buffer)
    _arg_index(args, idx.buffer)
    if len(args) != 2:
        raise LoweringError(f"{node.name}: table and indices share a buffer")
    kernel = GatherKernel(
        f"k{kernel_index}_{source.split('.')[1]}", "gather",
        tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in args),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype),),
        rows=n, row_size=row, num_rows_table=table.shape[dim] if table.shape else 1,
        table_offset=table.offset, row_stride=table.strides[dim] if table.shape else 1,
        elem_stride=post_strides[0] if post_strides else 1, index=Access(1, idx.offset, idx.strides),
        outer=tuple(zip(pre_sizes, t_pre, o_pre, strict=True)), wrap_negative=wrap_negative, source_ops=(source,))
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf,)))
    del out


def _embedding_check(node: fx.Node) -> str | None:
    if len(node_shape(node.args[0])) < 1:
        return "embedding of a 0-d weight"
    return None


@register_lowering(aten.embedding.default, family="index", kind="gather", check=_embedding_check)
def lower_embedding(gl: Any, node: fx.Node) -> None:
    """aten.embedding: row gather by indirect DMA (128 indices per tile); padding_idx only affects backward."""
    _emit_gather(gl, node, gl.view_of(node.args[0]), 0, node.args[1], "aten.embedding.default")


def _index_select_check(node: fx.Node) -> str | None:
    n = math.prod(node_shape(node.args[2]))
    if len(node_shape(node.args[0])) == 0 and n != 1:
        return f"index_select on a 0-d tensor takes exactly one index, got {n} (eager raises here too)"
    return None


@register_lowering(aten.index_select.default, family="index", kind="gather", check=_index_select_check)
def lower_index_select(gl: Any, node: fx.Node) -> None:
    """aten.index_select along any dim: a row gather over the strided (permuted) view."""
    _emit_gather(gl, node, gl.view_of(node.args[0]), int(node.args[1]), node.args[2], "aten.index_select.default")


def _index_check(node: fx.Node) -> str | None:
    indices = list(node.args[1])
    real = [i for i, t in enumerate(indices) if t is not None]
    if len(real) != 1:
        return "advanced indexing with more than one index tensor is not supported (index one dim at a time)"
    val = indices[real[0]].meta.get("val") if isinstance(indices[real[0]], fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dtype in (torch.bool, torch.uint8):
        return "indexing with a boolean mask is not supported (data-dependent shape); use integer indices"
    return None


@register_lowering(aten.index.Tensor, family="index", kind="gather", check=_index_check)
def lower_index(gl: Any, node: fx.Node) -> None:
    """aten.index with one integer index tensor (``x[idx]``, ``x[:, idx]``): a row gather; negative indices wrap."""
    indices = list(node.args[1])
    k = next(i for i, t in enumerate(indices) if t is not None)
    _emit_gather(gl, node, gl.view_of(node.args[0]), k, indices[k], "aten.index.Tensor", wrap_negative=True)


# -- index_put (accumulate) ----------------------------------------------------------------------


def _index_put_check(node: fx.Node) -> str | None:
    indices = list(node.args[1])
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if not accumulate:
        return ("index_put with a boolean mask and a value per True position has a data-dependent shape; "
                "broadcast the values and use torch.where(mask, values, x)")
    real = [i for i, t in enumerate(indices) if t is not None]
    if len(real) != 1:
        return "index_put with more than one index tensor is not supported (index one dim at a time)"
    idx = indices[real[0]]
    val = idx.meta.get("val") if isinstance(idx, fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dtype in (torch.bool, torch.uint8):
        return "index_put with a boolean mask index is not supported (use integer indices)"
    out = node.meta.get("val")
    if isinstance(out, torch.Tensor) and not out.dtype.is_floating_point:  # decomp_index makes these scatter-adds
        return (f"index_put(accumulate=True) on {out.dtype} is not supported by the row kernel: it accumulates in "
                f"fp32 (TensorE and the DMA engines' adds), exact only up to 2**24; accumulate into a float tensor")
    return None


@register_lowering(aten.index_put.default, family="index", kind="gather", check=_index_put_check)
def lower_index_put(gl: Any, node: fx.Node) -> None:
    """aten.index_put(accumulate=True), one integer index tensor: a DMA scatter-add of the value rows."""
    base = gl.view_of(node.args[0])
    indices = list(node.args[1])
    k = next(i for i, t in enumerate(indices) if t is not None)
    idx = _flat_index(gl, gl.view_of(indices[k]), f"{node.name}_index")
    idx_shape = node_shape(indices[k])
    shape = base.shape
    full_values_shape = shape[:k] + idx_shape + shape[k + 1:]
    values = gl.view_of(node.args[2])
    vstrides = sp.broadcast_strides(values.shape, values.strides, full_values_shape)
    # Merge the index dims of the values into one token dim.
    tok_sizes, (tok_strides,) = collapse(idx_shape, [tuple(vstrides[k:k + len(idx_shape)])])
    if len(tok_sizes) > 1:
        values = gl.copy_contiguous(View(values.buffer, tuple(full_values_shape), tuple(vstrides), values.offset,
                                         values.torch_dtype), f"{node.name}_values")
        vstrides = list(values.strides)
        tok_sizes, (tok_strides,) = collapse(idx_shape, [tuple(vstrides[k:k + len(idx_shape)])])
    v_tok = tok_strides[0] if tok_strides else 0
    strides = tuple(vstrides[:k]) + (v_tok,) + tuple(vstrides[k + len(idx_shape):])
    values = View(values.buffer, shape[:k] + (idx.shape[0],) + shape[k + 1:], strides, values.offset,
                  values.torch_dtype)
    emit_index_add(gl, node, base, k, idx, values, "aten.index_put.default")


def emit_index_add(gl: Any, node: fx.Node, base: View, k: int, idx: View, values: View, source_op: str,
                   wrap: bool = True, flag_message: str | None = None) -> None:
    """``out = base; out[..., idx[n], ...] += values[..., n, ...]`` along dim ``k`` (an :class:`IndexAddKernel`):
    ``idx`` a 1-D view, ``values`` of ``base``'s shape with ``len(idx)`` at ``k``. Negative indices wrap when
    ``wrap``; with ``flag_message`` an index outside the dim raises that after the kernels (else the graph's own
    bounds check does)."""
    from neuron_compile.lowering.ops.scatter import check_flag

    shape = base.shape
    post_shape = shape[k + 1:]
    kernel_index = len(gl.kernels)
    out_strides = contiguous_strides(shape)
    post = [base.strides[k + 1:], values.strides[k + 1:], out_strides[k + 1:]]
    if len(collapse(post_shape, post)[0]) > 1:  # rows must be one strided run of every operand: dense copies
        if len(collapse(post_shape, [base.strides[k + 1:], out_strides[k + 1:]])[0]) > 1:
            base = gl.copy_contiguous(base, f"{node.name}_self")
        if len(collapse(post_shape, [values.strides[k + 1:], out_strides[k + 1:]])[0]) > 1:
            values = gl.copy_contiguous(values, f"{node.name}_values")
        kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    if out.shape != shape:  # a 0-d result scattered as a line of one element
        out = View(buf, shape, out_strides, out.offset, out.torch_dtype)
    post_sizes, post_strides = collapse(post_shape, [base.strides[k + 1:], values.strides[k + 1:],
                                                     out.strides[k + 1:]])
    pre_sizes, pre_strides = collapse(shape[:k], [base.strides[:k], values.strides[:k], out.strides[:k]])
    ps = [s[0] if s else 1 for s in post_strides]
    args: list[int] = []
    a_base = _arg_index(args, base.buffer)
    a_idx = _arg_index(args, idx.buffer)
    a_val = _arg_index(args, values.buffer)
    outputs = [ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype)]
    results = [buf]
    if flag_message is not None:
        outputs.append(ArgSpec(1, "int32"))
        results.append(check_flag(gl, node, kernel_index, 1, flag_message, "index"))
    kernel = IndexAddKernel(
        f"k{kernel_index}_index_put", "index_put",
        tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in args), tuple(outputs),
        rows=shape[k], tokens=idx.shape[0], row_size=math.prod(post_shape),
        base=Access(a_base, base.offset, (base.strides[k], ps[0])),
        index=Access(a_idx, idx.offset, idx.strides),
        values=Access(a_val, values.offset, (values.strides[k], ps[1])),
        out=Access(0, out.offset, (out.strides[k], ps[2])),
        outer=tuple(zip(pre_sizes, *pre_strides, strict=True)),
        source_ops=(source_op,), wrap=wrap, flag_slot=1 if flag_message is not None else -1)
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), tuple(results)))


# -- gather / scatter along a dim with one index per row -------------------------------------------


def _one_per_row(node: fx.Node, dim_pos: int, idx_pos: int) -> str | None:
    shape = node_shape(node.args[0])
    ishape = node_shape(node.args[idx_pos])
    dim = int(node.args[dim_pos]) % max(len(shape), 1)
    if len(ishape) != len(shape) or (shape and ishape[dim] != 1) or any(
            a != b for d, (a, b) in enumerate(zip(ishape, shape, strict=True)) if d != dim):
        return (f"{node.target} with index shape {ishape} for input {shape} along dim {dim} is not supported "
                f"(only one index per row along dim, other dims equal, as nll_loss/cross_entropy use)")
    return None


def _gather_check(node: fx.Node) -> str | None:
    return _one_per_row(node, 1, 2)


@register_lowering(aten.gather.default, family="index", kind="reduction", check=_gather_check)
def lower_gather(ctx: Any, node: fx.Node, x: Any, dim: int, index: Any, *args: Any, **kwargs: Any) -> Any:
    """aten.gather with one index per row along ``dim``: sum(where(iota == index, x, 0)) over dim."""
    b = ctx.b
    hit = b.binary("equal", ctx.iota_along_reduced(node), index)
    return b.reduce("add", b.select(hit, x, 0.0))


def _iota_along(ctx: Any, node: fx.Node, dim: int) -> Any:
    """A full tile holding each element's index along ``dim`` of the node's shape."""
    shape = node_shape(node)
    role = ctx.member_role(node)
    cmap = shape_map(shape, role, ctx.g)
    if role != "full" or cmap is None:
        raise LoweringError(f"{node.name}: {node.target} result of shape {shape} does not span kernel space "
                            f"{ctx.g.space}")
    dim %= len(shape)
    coeffs = sp.to_space([1 if d == dim else 0 for d in range(len(shape))], shape, cmap, ctx.g.space)
    return ctx.b.emit("iota", "full", (), {"coeffs": (0, coeffs)}, phase=0)


def _scatter_check(node: fx.Node) -> str | None:
    reason = _one_per_row(node, 1, 2)
    if reason is None and node.target != aten.scatter.value and node_shape(node.args[3]) != node_shape(node.args[2]):
        return f"{node.target} with src shape {node_shape(node.args[3])} != index shape {node_shape(node.args[2])}"
    if reason is None and node.kwargs.get("reduce") is not None:
        return f"{node.target} with reduce= is not supported"
    return reason


@register_lowering(aten.scatter.value, aten.scatter.src, family="index", check=_scatter_check)
def lower_scatter(ctx: Any, node: fx.Node, x: Any, dim: int, index: Any, src: Any, **kwargs: Any) -> Any:
    """aten.scatter (value or src) with one index per row along ``dim``: where(iota == index, src, x)."""
    b = ctx.b
    hit = b.binary("equal", _iota_along(ctx, node, dim), index)
    return b.select(hit, src, x)


@register_lowering(aten.scatter_add.default, family="index", check=_scatter_check)
def lower_scatter_add(ctx: Any, node: fx.Node, x: Any, dim: int, index: Any, src: Any) -> Any:
    """aten.scatter_add with one index per row along ``dim``: x + where(iota == index, src, 0)."""
    b = ctx.b
    hit = b.binary("equal", _iota_along(ctx, node, dim), index)
    return b.binary("add", x, b.select(hit, src, 0.0))
