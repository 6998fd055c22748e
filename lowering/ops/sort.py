"""Sort-family lowerings: sort/argsort/msort, topk, kthvalue, median/nanmedian, mode as one :class:`SortKernel`
each, and searchsorted/bucketize as a :class:`SearchKernel`.

The sorted dim becomes the free dim of a canonical ``(outer..., rows, n)`` space (the other dims merge
onto partitions and unrolled outer loops, addressed through strides, so any dim of any strided view
sorts without a copy). The kernel (``codegen/templates/sort.nki.j2``) runs a bitonic network on int32
keys with the original index as tie-breaker, so every result is the stable sort's: ``sort`` with or
without ``stable=True`` equals CPU torch's stable sort (NaN sorts as the largest value, ``-0.0`` equals
``0.0``); ``topk``/``kthvalue`` keep the first columns (a top-k network when k <= n / 4), median/mode pick
their column on chip. Rows up to 4096 elements sit in one partition; a plain sort of a longer row (up to
128 x 4096) spans partitions. Multi-output ops define their ``getitem`` users' values directly
(:func:`item_outputs`). Long-row topk is a decomposition (``lowering/decomp_sort.py``).
"""

from __future__ import annotations

import logging
import math
import operator
from typing import Any

import torch
from neuron_compile.lowering import space as sp
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.ir import Access, ArgSpec, BufferRef, KernelCall, SearchKernel, SortKernel
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

# Longest sorted row (after padding to a power of two): the row's int32 keys, int32 indices and fp32
# values plus the compare-exchange masks (~26 bytes per element) must fit one partition's SBUF
# (192 KiB on trn1, 224/256 KiB on trn2/trn3) without spilling.
SORT_MAX_N = 4096
SORT_CHUNK = 4096  # elements per partition of a longer row (plain sort: up to 128 partitions)
SORT_LONG_MAX = 128 * SORT_CHUNK

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def _val(a: Any) -> torch.Tensor | None:
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def item_outputs(gl: Any, node: fx.Node, kernel_index: int,
                 items: list[tuple[int, tuple[int, ...], torch.dtype]]) -> dict[int, tuple[int, View]]:
    """Result buffers of a multi-output node: ``items`` = (tuple index, shape, dtype) of the kernel's outputs
    in slot order. Every ``getitem`` user of an item gets its view; returns {tuple index: (buffer, view)}."""
    out: dict[int, tuple[int, View]] = {}
    for slot, (item, shape, dtype) in enumerate(items):
        nd = storage_dtype(dtype) or "float32"
        buf = gl._buffer(BufferRef("kernel", kernel_index, slot, max(math.prod(shape), 1), nd))
        out[item] = (buf, View(buf, shape, contiguous_strides(shape), 0, dtype))
    for user in node.users:
        if user.target is operator.getitem and user.args[1] in out:
            buf, view = out[user.args[1]]
            gl.views[user] = view
            gl.buffer_nodes[buf] = user.name
    return out


def empty_items(gl: Any, node: fx.Node, items: list[tuple[int, tuple[int, ...], torch.dtype]]) -> None:
    """Zero-element results need no kernel: empty buffers for every item."""
    for item, shape, dtype in items:
        buf = gl._buffer(BufferRef("empty", 0, 0, 0, storage_dtype(dtype) or "float32"))
        view = View(buf, shape, contiguous_strides(shape), 0, dtype)
        for user in node.users:
            if user.target is operator.getitem and user.args[1] == item:
                gl.views[user] = view


def _sort_check(node: fx.Node, dim: Any, what: str) -> str | None:
    x = _val(node.args[0])
    if x is None:
        return None
    if x.dtype not in _FLOATS + _INTS:
        return f"{what} of {x.dtype} is not supported"
    n = x.shape[int(dim) % x.dim()] if x.dim() else 1
    if what == "aten.sort" and n and 1 << (n - 1).bit_length() > SORT_LONG_MAX:
        return (f"{what} along a dim of {n} elements is not supported: a row is sorted in at most 128 partitions "
                f"of {SORT_CHUNK} elements ({SORT_LONG_MAX}); sort shorter rows or run this op eagerly "
                f"(options={{'fallback': 'eager'}})")
    if what != "aten.sort" and n and 1 << (n - 1).bit_length() > SORT_MAX_N:
        return (f"{what} along a dim of {n} elements is not supported: a sorted row (padded to a power of two) "
                f"must fit one partition's SBUF, at most {SORT_MAX_N} elements; sort shorter rows (reshape and "
                f"merge) or run this op eagerly (options={{'fallback': 'eager'}})")
    return None


def _arg(node: fx.Node, pos: int, name: str, default: Any) -> Any:
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


def emit_sort(gl: Any, node: fx.Node, dim: int, descending: bool, keep: tuple[int, int],
              items: list[tuple[int, tuple[int, ...], torch.dtype, str]], source: str, select: str = "",
              x: View | None = None, guard: tuple[str, str] | None = None) -> None:
    """One SortKernel over ``x`` (default ``node.args[0]``) along ``dim``, storing sorted columns ``keep``.

    ``items``: (tuple index, output shape, dtype, 'values' | 'indices'); an output's shape is the input's
    with the sorted dim resized to ``keep`` width or removed. ``select`` ('median'/'nanmedian') stores
    one column whose position the kernel finds per row (item -1: a single-tensor result).
    """
    x = x if x is not None else gl.view_of(node.args[0])
    shape = x.shape
    rank = len(shape)
    dim = dim % max(rank, 1)
    plain = [(i, s, d) for i, s, d, _ in items]
    if math.prod(shape) == 0 or keep[1] <= keep[0]:
        empty_items(gl, node, plain)
        return
    kernel_index = len(gl.kernels)
    if items[0][0] == -1:  # the node itself is the (only) result
        buf, view = gl.new_output(node, kernel_index, 0)
        bufs = {-1: (buf, view)}
    else:
        bufs = item_outputs(gl, node, kernel_index, plain)
    space = shape or (1,)
    roles = ["red" if d == dim else "keep" for d in range(len(space))]
    x_strides = x.strides or (0,)

    def over_space(view: View) -> tuple[int, ...]:
        """The output's strides over the input's space (the sorted dim: the output's, or 0 when removed)."""
        if len(view.shape) == len(space):
            return tuple(view.strides) if view.strides else (0,)
        kept = list(view.strides)
        return tuple(kept[:dim]) + (0,) + tuple(kept[dim:])

    out_strides = {role: over_space(bufs[i][1]) for i, _, _, role in items}
    canon = sp.canonicalize(space, roles, [x_strides, *out_strides.values()], part_role="keep", free_role="red",
                            split_limit=1 << 30)
    acc = {role: Access(slot, 0, sp.canonical_strides(canon, out_strides[role]))
           for slot, (_, _, _, role) in enumerate(items)}
    dtype = x.torch_dtype
    n_pad = 1 << max(canon.space[-1] - 1, 0).bit_length()
    chunks = n_pad // SORT_CHUNK if n_pad > SORT_MAX_N else 1  # a long row spans several partitions
    results = [bufs[i][0] for i, *_ in items]
    flag_slot = -1
    if guard is not None:  # (kind, message): a device check the runner reads after the kernels
        from neuron_compile.lowering.ops.scatter import check_flag

        flag_slot = len(results)
        results.append(check_flag(gl, node, kernel_index, flag_slot, guard[1], guard[0]))
    kernel = SortKernel(
        f"k{kernel_index}_{source.split('.')[1]}", "sort",
        (ArgSpec(gl.buffers[x.buffer].numel, gl.buffers[x.buffer].dtype),),
        tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in results),
        canon.space, canon.n_outer, Access(0, x.offset, sp.canonical_strides(canon, x_strides)),
        acc.get("values"), acc.get("indices"), descending, keep,
        "float" if dtype.is_floating_point else "int", select, chunks=chunks, source_ops=(source,),
        flag_slot=flag_slot)
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, (x.buffer,), tuple(results)))


def _items(node: fx.Node) -> list[tuple[int, tuple[int, ...], torch.dtype, str]]:
    """(item, shape, dtype, role) of the (values, indices) items some getitem user reads."""
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    vals = node.meta["val"]
    out = []
    for item, role in ((0, "values"), (1, "indices")):
        if item in used:
            out.append((item, tuple(int(s) for s in vals[item].shape), vals[item].dtype, role))
    return out


def _check_sort(node: fx.Node) -> str | None:
    return _sort_check(node, _arg(node, 1, "dim", -1), "aten.sort")


def _check_sort_stable(node: fx.Node) -> str | None:
    return _sort_check(node, node.kwargs.get("dim", -1), "aten.sort")


@register_lowering(aten.sort.default, family="sort", kind="copy", check=_check_sort)
def lower_sort(gl: Any, node: fx.Node) -> None:
    """aten.sort (argsort, msort) along any dim: stable bitonic sort in SBUF (NaN largest; rows <= 4096)."""
    dim, desc = int(_arg(node, 1, "dim", -1)), bool(_arg(node, 2, "descending", False))
    n = node_shape(node.args[0])[dim] if node_shape(node.args[0]) else 1
    emit_sort(gl, node, dim, desc, (0, n), _items(node), "aten.sort.default")


@register_lowering(aten.sort.stable, family="sort", kind="copy", check=_check_sort_stable)
def lower_sort_stable(gl: Any, node: fx.Node) -> None:
    """aten.sort(stable=...) along any dim: the same stable sort (NaN largest; rows <= 4096)."""
    dim, desc = int(node.kwargs.get("dim", -1)), bool(node.kwargs.get("descending", False))
    n = node_shape(node.args[0])[dim] if node_shape(node.args[0]) else 1
    emit_sort(gl, node, dim, desc, (0, n), _items(node), "aten.sort.stable")


def _check_topk(node: fx.Node) -> str | None:
    from neuron_compile.lowering.decomp_sort import long_topk_max_k

    x = _val(node.args[0])
    dim = int(_arg(node, 2, "dim", -1))
    n = x.shape[dim % x.dim()] if x is not None and x.dim() else 1
    if n > SORT_MAX_N:  # long rows reach lowering only when the chunked topk (decomp_sort.py) could not apply
        return (f"aten.topk with k={node.args[1]} of rows of {n} elements is not supported: rows longer than "
                f"{SORT_MAX_N} are reduced chunk by chunk, which keeps at most k={long_topk_max_k()}; take a smaller "
                f"k or run this op eagerly (options={{'fallback': 'eager'}})")
    return _sort_check(node, dim, "aten.topk")


@register_lowering(aten.topk.default, family="sort", kind="copy", check=_check_topk)
def lower_topk(gl: Any, node: fx.Node) -> None:
    """aten.topk (largest or smallest, sorted): the first k columns of a stable sort (NaN largest)."""
    k = int(node.args[1])
    dim, largest = int(_arg(node, 2, "dim", -1)), bool(_arg(node, 3, "largest", True))
    emit_sort(gl, node, dim, largest, (0, k), _items(node), "aten.topk.default")


def _check_kthvalue(node: fx.Node) -> str | None:
    return _sort_check(node, _arg(node, 2, "dim", -1), "aten.kthvalue")


@register_lowering(aten.kthvalue.default, family="sort", kind="copy", check=_check_kthvalue)
def lower_kthvalue(gl: Any, node: fx.Node) -> None:
    """aten.kthvalue: column k - 1 of the ascending stable sort (NaN largest)."""
    k = int(node.args[1])
    dim = int(_arg(node, 2, "dim", -1))
    emit_sort(gl, node, dim, False, (k - 1, k), _items(node), "aten.kthvalue.default")


def _check_median(node: fx.Node) -> str | None:
    dim = _arg(node, 1, "dim", None) if node.target in (aten.median.dim, aten.nanmedian.dim) else None
    if dim is None:
        x = _val(node.args[0])
        n = x.numel() if x is not None else 0
        if n and 1 << (n - 1).bit_length() > SORT_MAX_N:
            return (f"{node.target} of {n} elements is not supported: the flattened input is sorted in one "
                    f"partition's SBUF, at most {SORT_MAX_N} elements; take the median along a dim instead")
        return _sort_check(node, 0, str(node.target)) if x is not None and x.dim() else None
    return _sort_check(node, dim, str(node.target))


@register_lowering(aten.median.dim, aten.nanmedian.dim, family="sort", kind="copy", check=_check_median)
def lower_median_dim(gl: Any, node: fx.Node) -> None:
    """aten.median/nanmedian along a dim: the lower median of the stable sort (median: NaN if the row has one,
    with the first NaN's index; nanmedian: of the non-NaN values), its position found on chip."""
    shape = node_shape(node.args[0])
    dim = int(_arg(node, 1, "dim", -1)) % max(len(shape), 1)
    n = shape[dim] if shape else 1
    x = _val(node.args[0])
    nan_aware = x is not None and x.dtype.is_floating_point
    select = "nanmedian" if node.target == aten.nanmedian.dim else "median"
    mid = (n - 1) // 2
    emit_sort(gl, node, dim, False, (mid, mid + 1), _items(node), str(node.target).replace("aten::", "aten."),
              select if nan_aware else "")


@register_lowering(aten.median.default, aten.nanmedian.default, family="sort", kind="copy", check=_check_median)
def lower_median_all(gl: Any, node: fx.Node) -> None:
    """aten.median/nanmedian of all elements (0-d result): the flattened input sorted as one row."""
    v = gl.view_of(node.args[0])
    if not v.is_contiguous():
        v = gl.copy_contiguous(v, f"{node.name}_flat")
    n = max(math.prod(v.shape), 1) if v.shape else 1
    flat = View(v.buffer, (n,), (1,), v.offset, v.torch_dtype)
    select = "nanmedian" if node.target == aten.nanmedian.default else "median"
    mid = (n - 1) // 2
    val = node.meta["val"]
    emit_sort(gl, node, 0, False, (mid, mid + 1), [(-1, (), val.dtype, "values")],
              str(node.target).replace("aten::", "aten."), select if val.dtype.is_floating_point else "", x=flat)


def _check_mode(node: fx.Node) -> str | None:
    return _sort_check(node, _arg(node, 1, "dim", -1), "aten.mode")


@register_lowering(aten.mode.default, family="sort", kind="copy", check=_check_mode)
def lower_mode(gl: Any, node: fx.Node) -> None:
    """aten.mode along a dim: runs of equal values in the stable sort; the smallest most frequent value and an
    index of it (its last occurrence). A float row holding NaN raises (CPU torch's result there depends on
    its sort's comparisons with NaN)."""
    shape = node_shape(node.args[0])
    dim = int(_arg(node, 1, "dim", -1)) % max(len(shape), 1)
    x = _val(node.args[0])
    guard = ("assert", "mode of a row containing NaN is not supported by the neuron backend (CPU torch's result "
             "there depends on how its sort compares NaN); drop or replace NaN first (torch.nan_to_num)") \
        if x is not None and x.dtype.is_floating_point else None
    emit_sort(gl, node, dim, False, (0, 1), _items(node), "aten.mode.default", "mode", guard=guard)


# -- searchsorted / bucketize ------------------------------------------------------------------------

SEARCH_MAX_SEQ = 16384  # a row's sorted sequence held in SBUF beside its values (64 KiB fp32)


def _search_check(node: fx.Node) -> str | None:
    seq_node = node.args[0] if node.target == aten.searchsorted.Tensor else node.args[1]
    seq, vals = _val(seq_node), _val(node.args[1] if node.target == aten.searchsorted.Tensor else node.args[0])
    if seq is None or vals is None:
        return None
    for t in (seq, vals):
        if t.dtype not in _FLOATS + _INTS or t.dtype == torch.bool:
            return f"{node.target} on {t.dtype} is not supported"
    if seq.dim() > 1 and tuple(seq.shape[:-1]) != tuple(vals.shape[:-1]):
        return f"{node.target}: sorted_sequence {tuple(seq.shape)} and input {tuple(vals.shape)} leading dims differ"
    if seq.dim() and seq.shape[-1] > SEARCH_MAX_SEQ:
        return (f"{node.target} with a sorted sequence of {seq.shape[-1]} elements is not supported: each row's "
                f"sequence is held in one partition's SBUF, at most {SEARCH_MAX_SEQ} elements")
    return None


def emit_search(gl: Any, node: fx.Node, seq_node: fx.Node, right: bool, sorter_node: Any, source: str) -> None:
    values, seq = gl.view_of(node.args[1] if node.target == aten.searchsorted.Tensor else node.args[0]), \
        gl.view_of(seq_node)
    sorter = gl.view_of(sorter_node) if isinstance(sorter_node, fx.Node) else None
    kernel_index = len(gl.kernels)  # after the views: resolving one may emit a copy kernel
    buf, out = gl.new_output(node, kernel_index, 0)
    if math.prod(values.shape) == 0:
        gl.buffers[buf] = BufferRef("empty", 0, 0, 0, gl.buffers[buf].dtype)
        return
    shape = values.shape or (1,)
    v_strides, o_strides = values.strides or (0,), out.strides or (0,)
    shared = len(seq.shape) <= 1
    b = seq.shape[-1] if seq.shape else 1
    b_stride = seq.strides[-1] if seq.shape else 0
    if shared:  # one sequence for every value: any layout of the values, split into rows
        over = [tuple(0 for _ in shape)]
        canon = sp.canonicalize(shape, ["keep"] * len(shape), [v_strides, o_strides], part_role="keep",
                                free_role="keep", split_limit=SEARCH_ROW, split_above=SEARCH_ROW)
        seq_strides = sp.canonical_strides(canon, over[0])[:-1] + (b_stride,)
        sorter_strides = sp.canonical_strides(canon, over[0])[:-1] + (sorter.strides[-1] if sorter and
                                                                      sorter.shape else 0,)
    else:  # one sequence per leading index: rows are the leading dims
        seq_over = tuple(seq.strides[:-1]) + (0,)
        srt_over = tuple(sorter.strides[:-1]) + (0,) if sorter is not None else seq_over
        roles = ["keep"] * (len(shape) - 1) + ["red"]
        canon = sp.canonicalize(shape, roles, [v_strides, o_strides, seq_over, srt_over], part_role="keep",
                                free_role="red", split_limit=1 << 30)
        seq_strides = sp.canonical_strides(canon, seq_over)[:-1] + (b_stride,)
        sorter_strides = sp.canonical_strides(canon, srt_over)[:-1] + (sorter.strides[-1] if sorter else 0,)
    args: list[int] = []
    for v in (values, seq, sorter):
        if v is not None and v.buffer not in args:
            args.append(v.buffer)
    key = "int" if not values.torch_dtype.is_floating_point and not seq.torch_dtype.is_floating_point else "float"
    kernel = SearchKernel(
        f"k{kernel_index}_{source.split('.')[1]}", "search",
        tuple(ArgSpec(gl.buffers[a].numel, gl.buffers[a].dtype) for a in args),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype),), canon.space, canon.n_outer,
        Access(args.index(values.buffer), values.offset, sp.canonical_strides(canon, v_strides)),
        Access(0, out.offset, sp.canonical_strides(canon, o_strides)),
        Access(args.index(seq.buffer), seq.offset, seq_strides), b,
        Access(args.index(sorter.buffer), sorter.offset, sorter_strides) if sorter is not None else None,
        right, key, (source,))
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf,)))


SEARCH_ROW = 2048  # values per row when a shared sequence lets them split into rows freely


@register_lowering(aten.searchsorted.Tensor, family="sort", kind="copy", check=_search_check)
def lower_searchsorted(gl: Any, node: fx.Node) -> None:
    """aten.searchsorted (left/right, side=, sorter=; 1-D or per-row sequences): ATen's binary search per value."""
    right = bool(node.kwargs.get("right", False)) or node.kwargs.get("side") == "right"
    emit_search(gl, node, node.args[0], right, node.kwargs.get("sorter"), "aten.searchsorted.Tensor")


@register_lowering(aten.bucketize.Tensor, family="sort", kind="copy", check=_search_check)
def lower_bucketize(gl: Any, node: fx.Node) -> None:
    """aten.bucketize (left/right): the binary search of searchsorted over the 1-D boundaries."""
    emit_search(gl, node, node.args[1], bool(node.kwargs.get("right", False)), None, "aten.bucketize.Tensor")
