"""Movement lowerings: views (free: only strides change) and copies (cat, materialized reshapes).

View rules take the input :class:`View` and return the output view, or a
:class:`~neuron_compile.lowering.index_algebra.NotAffine` (with its reason) when no strided access of
the same buffer reaches the result: a reshape merging dims of a permuted tensor. Whether it can be a
view is decided by the sympy index algebra (:mod:`lowering.index_algebra`); the graph lowering then
copies the input to a contiguous buffer first, unless the rest of the view chain makes the composed
access affine again (:func:`algebra_step`).
"""

from __future__ import annotations

import math

import torch
from neuron_compile.lowering import index_algebra as ia
from neuron_compile.lowering import partition
from neuron_compile.lowering.dtypes import BITCAST_SIZES
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import qualified_name, register_lowering
from neuron_compile.lowering.views import View
from torch import fx

aten = torch.ops.aten


def _replace(v: View, shape, strides, offset=None) -> View:
    return View(v.buffer, tuple(int(s) for s in shape), tuple(int(s) for s in strides),
                v.offset if offset is None else int(offset), v.torch_dtype)


@register_lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, family="movement", kind="view")
def lower_view(node: fx.Node, v: View) -> View | ia.NotAffine:
    """aten.view/reshape: a view when the index algebra finds one affine access (torch's strides), else why not."""
    shape = node_shape(node)
    strides = ia.reshape_access(v.shape, v.strides, shape)
    return strides if isinstance(strides, ia.NotAffine) else _replace(v, shape, strides)


@register_lowering(aten.unsqueeze.default, family="movement", kind="view")
def lower_unsqueeze(node: fx.Node, v: View) -> View:
    """aten.unsqueeze: insert a size-1 dim."""
    dim = node.args[1] % (len(v.shape) + 1)
    stride = v.strides[dim] * v.shape[dim] if dim < len(v.shape) else 1
    return _replace(v, v.shape[:dim] + (1,) + v.shape[dim:], v.strides[:dim] + (stride,) + v.strides[dim:])


@register_lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, family="movement", kind="view")
def lower_squeeze(node: fx.Node, v: View) -> View:
    """aten.squeeze: drop size-1 dims."""
    shape = node_shape(node)
    keep = [(s, st) for s, st in zip(v.shape, v.strides, strict=True)]
    if len(node.args) > 1:
        dims = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
        drop = {d % len(v.shape) for d in dims if v.shape[d % len(v.shape)] == 1} if v.shape else set()
    else:
        drop = {i for i, s in enumerate(v.shape) if s == 1}
    keep = [p for i, p in enumerate(keep) if i not in drop]
    assert tuple(s for s, _ in keep) == shape
    return _replace(v, [s for s, _ in keep], [st for _, st in keep])


@register_lowering(aten.permute.default, family="movement", kind="view")
def lower_permute(node: fx.Node, v: View) -> View:
    """aten.permute: reorder strides."""
    dims = [d % len(v.shape) for d in node.args[1]]
    return _replace(v, [v.shape[d] for d in dims], [v.strides[d] for d in dims])


@register_lowering(aten.t.default, family="movement", kind="view")
def lower_t(node: fx.Node, v: View) -> View:
    """aten.t: 2-D transpose (a view)."""
    return _replace(v, v.shape[::-1], v.strides[::-1])


@register_lowering(aten.transpose.int, family="movement", kind="view")
def lower_transpose(node: fx.Node, v: View) -> View:
    """aten.transpose: swap two dims (a view; a 0-d tensor's dims 0 and -1 are itself)."""
    n = len(v.shape)
    if n == 0:
        return v
    a, b = node.args[1] % n, node.args[2] % n
    shape, strides = list(v.shape), list(v.strides)
    shape[a], shape[b] = shape[b], shape[a]
    strides[a], strides[b] = strides[b], strides[a]
    return _replace(v, shape, strides)


@register_lowering(aten.expand.default, family="movement", kind="view")
def lower_expand(node: fx.Node, v: View) -> View:
    """aten.expand: stride-0 broadcast."""
    shape = node_shape(node)
    off = len(shape) - len(v.shape)
    strides = [0] * off + [st if s == t else 0 for s, st, t in zip(v.shape, v.strides, shape[off:], strict=True)]
    return _replace(v, shape, strides)


@register_lowering(aten.slice.Tensor, family="movement", kind="view")
def lower_slice(node: fx.Node, v: View) -> View:
    """aten.slice with a positive step: offset and stride change."""
    dim = node.args[1] % len(v.shape) if len(node.args) > 1 else 0
    start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
    step = node.args[4] if len(node.args) > 4 else 1
    size = v.shape[dim]
    start = min(max(start + size if start < 0 else start, 0), size)
    shape = node_shape(node)
    strides = list(v.strides)
    strides[dim] *= step
    return _replace(v, shape, strides, v.offset + start * v.strides[dim])


@register_lowering(aten.select.int, family="movement", kind="view")
def lower_select(node: fx.Node, v: View) -> View:
    """aten.select: drop a dim at a fixed index."""
    dim = node.args[1] % len(v.shape)
    index = node.args[2] % v.shape[dim]
    return _replace(v, v.shape[:dim] + v.shape[dim + 1:], v.strides[:dim] + v.strides[dim + 1:],
                    v.offset + index * v.strides[dim])


def _as_strided_args(node: fx.Node) -> tuple[torch.Tensor | None, list[int], list[int], int]:
    """(the input's value, size, stride, storage offset) of an as_strided (offset None: the input's own)."""
    val = node.args[0].meta.get("val")
    base = val.storage_offset() if isinstance(val, torch.Tensor) else 0
    offset = node.args[3] if len(node.args) > 3 and node.args[3] is not None else base
    return (val if isinstance(val, torch.Tensor) else None, [int(n) for n in node.args[1]],
            [int(st) for st in node.args[2]], int(offset))


def _in_storage(node: fx.Node) -> bool:
    """The window lies within the storage a dense input (a permutation of a contiguous layout) spans: read in the
    input's own layout, it is the same strided access shifted by the input's storage offset."""
    val, size, stride, offset = _as_strided_args(node)
    assert val is not None
    pairs = sorted((st, n) for n, st in zip(val.shape, val.stride(), strict=True) if n != 1)
    span = 1
    for st, n in pairs:
        if st != span:
            return False
        span *= n
    if math.prod(size) == 0:
        return True
    last = offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
    return val.storage_offset() <= offset and last < val.storage_offset() + max(span, 1) and min(stride, default=0) >= 0


def _as_strided_window(node: fx.Node) -> tuple[list[int], list[list[int]]] | None:
    """The window in the input's index space: (its first element's index, each dim's index step), when each of its
    dims steps through the input's elements without carrying into another dim; else None."""
    val, size, stride, offset = _as_strided_args(node)
    assert val is not None
    shape, strides = list(val.shape), list(val.stride())
    order = sorted((d for d in range(len(shape)) if shape[d] > 1 and strides[d] > 0), key=lambda d: -strides[d])

    def coords(distance: int) -> list[int] | None:  # the index at a storage distance, by the input's strides
        out = [0] * len(shape)
        for d in order:
            out[d], distance = divmod(distance, strides[d])
        return out if distance == 0 else None

    if math.prod(size) == 0:
        return [0] * len(shape), [[0] * len(shape) for _ in size]
    first = coords(offset - val.storage_offset()) if offset >= val.storage_offset() else None
    steps = [coords(st) if n > 1 else [0] * len(shape) for n, st in zip(size, stride, strict=True)]
    if first is None or any(st is None for st in steps):
        return None
    last = [f + sum((n - 1) * st[d] for n, st in zip(size, steps, strict=True)) for d, f in enumerate(first)]  # type: ignore[index]
    if any(x >= max(n, 1) for x, n in zip(last, shape, strict=True)):
        return None
    return first, steps  # type: ignore[return-value]


def _as_strided_check(node: fx.Node) -> str | None:
    val, size, stride, offset = _as_strided_args(node)
    if val is None:
        return "as_strided of a non-tensor"
    if _in_storage(node) or _as_strided_window(node) is not None:
        return None
    return (f"as_strided(size={size}, stride={stride}, storage_offset={offset}) reads storage outside its input's "
            f"elements (shape {tuple(val.shape)}, strides {tuple(val.stride())}, storage offset "
            f"{val.storage_offset()}), which a compiled graph does not have; .clone() the base tensor first")


@register_lowering(aten.as_strided.default, family="movement", kind="view", check=_as_strided_check)
def lower_as_strided(node: fx.Node, v: View) -> View | ia.NotAffine:
    """aten.as_strided: the window it reads of its input's storage (eager's layout of the input: its value's strides
    and storage offset), as a view of our buffer of the input. In the input's own layout (a dense input is passed
    as it is) that is the same access, shifted; in another (a non-dense input is passed contiguously, a kernel may
    write a permuted value densely) it is the window's steps through the input's elements."""
    val, size, stride, offset = _as_strided_args(node)
    assert val is not None
    if tuple(v.strides) == tuple(val.stride()) and _in_storage(node):
        return _replace(v, size, stride, v.offset + offset - val.storage_offset())
    window = _as_strided_window(node)
    if window is None:  # our layout differs and the window carries across dims: read a copy in eager's layout
        return ia.NotAffine(f"as_strided's window is not one strided access of the input in our layout "
                            f"(strides {tuple(v.strides)} for eager's {tuple(val.stride())})")
    first, steps = window
    return _replace(v, size, [sum(k * st for k, st in zip(step, v.strides, strict=True)) for step in steps],
                    v.offset + sum(i * st for i, st in zip(first, v.strides, strict=True)))


def _eager_layout(node: fx.Node) -> tuple[int, ...] | None:
    """The layout to copy an as_strided's input into when no view of ours reaches the window: eager's own, when
    dense (then the window is the same access, _in_storage); else contiguous (the window then steps through
    the input's elements, which the check made sure of)."""
    val = node.args[0].meta["val"]
    return tuple(val.stride()) if _in_storage(node) and val.numel() else None


lower_as_strided.copy_layout = _eager_layout  # type: ignore[attr-defined]  (read by GraphLowering's copy fallback)


@register_lowering(aten.unfold.default, family="movement", kind="view")
def lower_unfold(node: fx.Node, v: View) -> View:
    """aten.unfold(dim, size, step): windows along ``dim`` (stride * step) with the window as a new last dim."""
    if not v.shape:
        return _replace(v, node_shape(node), (1,))
    dim, step = node.args[1] % len(v.shape), node.args[3]
    shape = node_shape(node)
    strides = list(v.strides)
    strides[dim] = v.strides[dim] * step
    return _replace(v, shape, [*strides, v.strides[dim]])


@register_lowering(aten.diagonal.default, family="movement", kind="view")
def lower_diagonal(node: fx.Node, v: View) -> View:
    """aten.diagonal(offset, dim1, dim2): the two dims replaced by one of stride stride1 + stride2 (last)."""
    args = list(node.args) + [0, 0, 1][len(node.args) - 1:]
    off = node.kwargs.get("offset", args[1])
    d1 = node.kwargs.get("dim1", args[2]) % len(v.shape)
    d2 = node.kwargs.get("dim2", args[3]) % len(v.shape)
    start = off * v.strides[d2] if off >= 0 else -off * v.strides[d1]
    keep = [d for d in range(len(v.shape)) if d not in (d1, d2)]
    shape = node_shape(node)
    strides = [v.strides[d] for d in keep] + [v.strides[d1] + v.strides[d2]]
    return _replace(v, shape, strides, v.offset + (start if shape[-1] > 0 else 0))


def algebra_step(node: fx.Node, v: ia.IndexedView) -> ia.IndexedView | None:
    """The view op of ``node`` applied to an index-algebra view (None: an op the algebra does not model)."""
    out = _algebra_step(node, v)
    return out if out is not None and out.shape == node_shape(node) else None


def _algebra_step(node: fx.Node, v: ia.IndexedView) -> ia.IndexedView | None:
    target, args = node.target, node.args
    if target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return ia.reshape(v, node_shape(node))
    if target is aten.permute.default:
        return ia.permute(v, tuple(args[1]))
    if target is aten.t.default:
        return ia.permute(v, tuple(range(len(v.shape)))[::-1])
    if target is aten.transpose.int:
        dims = list(range(len(v.shape)))
        a, b = args[1] % len(dims), args[2] % len(dims)
        dims[a], dims[b] = dims[b], dims[a]
        return ia.permute(v, tuple(dims))
    if target is aten.expand.default:
        return ia.expand(v, node_shape(node))
    if target is aten.unsqueeze.default:
        return ia.unsqueeze(v, args[1])
    if target is aten.squeeze.default:
        return ia.squeeze(v, None)
    if target in (aten.squeeze.dim, aten.squeeze.dims):
        return ia.squeeze(v, tuple(args[1]) if isinstance(args[1], (list, tuple)) else (args[1],))
    if target is aten.select.int:
        return ia.select(v, args[1], args[2])
    if target is aten.slice.Tensor:
        extra = list(args[1:]) + [None] * 4
        return ia.slice_(v, extra[0] or 0, extra[1], extra[2], extra[3] or 1)
    return None


partition._LAYOUT_VIEWS.update({aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                                aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims})


def _cat_check(node: fx.Node) -> str | None:
    return None


@register_lowering(aten.cat.default, family="movement", kind="copy", check=_cat_check)
def lower_cat(gl, node: fx.Node) -> None:
    """aten.cat: one DMA per input into its slice of the output (HBM to HBM)."""
    tensors = [t for t in node.args[0] if math.prod(node_shape(t)) > 0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    srcs = [gl.view_of(t) for t in tensors]  # may emit copy kernels: the index is taken after
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    dim %= max(len(out.shape), 1)
    pairs = []
    start = 0
    for src in srcs:
        dst = View(out.buffer, src.shape, out.strides, out.offset + start * out.strides[dim], out.torch_dtype)
        pairs.append((src, dst))
        start += src.shape[dim]
    gl.emit_copy(f"k{kernel_index}_cat", pairs, [buf], ("aten.cat.default",))


def _slice_bounds(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    start = 0 if start is None else start
    end = size if end is None else end
    start = min(max(start + size if start < 0 else start, 0), size)
    end = min(max(end + size if end < 0 else end, start), size)
    return start, end


@register_lowering(aten.slice_scatter.default, family="movement", kind="copy")
def lower_slice_scatter(gl, node: fx.Node) -> None:
    """aten.slice_scatter (slice's backward): DMA ``input`` into the output, then ``src`` over its slice.

    Both DMAs are issued in order on one queue of one kernel, so the slice write lands last.
    """
    base, src_node = node.args[0], node.args[1]
    extra = list(node.args[2:]) + [None] * 4
    dim = node.kwargs.get("dim", extra[0] if extra[0] is not None else 0)
    start = node.kwargs.get("start", extra[1])
    end = node.kwargs.get("end", extra[2])
    step = node.kwargs.get("step", extra[3] if extra[3] is not None else 1)
    base_view, src = gl.view_of(base), gl.view_of(src_node)  # may emit copy kernels: the index is taken after
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    dim %= max(len(out.shape), 1)
    start, _ = _slice_bounds(out.shape[dim], start, end)
    pairs = [(base_view, out)]
    if src.numel > 0:
        strides = list(out.strides)
        strides[dim] *= step
        dst = View(out.buffer, src.shape, tuple(strides), out.offset + start * out.strides[dim], out.torch_dtype)
        pairs.append((src, dst))
    gl.emit_copy(f"k{kernel_index}_slice_scatter", pairs, [buf], ("aten.slice_scatter.default",))


def _strided_window(node: fx.Node) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(size, stride, storage offset) of an as_strided_scatter's window."""
    offset = node.args[4] if len(node.args) > 4 and node.args[4] is not None else 0
    return tuple(int(s) for s in node.args[2]), tuple(int(s) for s in node.args[3]), int(offset)


def _as_strided_scatter_check(node: fx.Node) -> str | None:
    base, src = node.args[0].meta.get("val"), node.args[1].meta.get("val")
    size, stride, offset = _strided_window(node)
    if not isinstance(base, torch.Tensor) or not isinstance(src, torch.Tensor):
        return "as_strided_scatter of non-tensor arguments"
    if not base.is_contiguous() or base.storage_offset() != 0:
        return (f"as_strided_scatter into a non-contiguous input (shape {tuple(base.shape)}, strides "
                f"{tuple(base.stride())}, offset {base.storage_offset()}): only a whole contiguous input is supported")
    if math.prod(size) == 0:
        return None
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if offset < 0 or last >= max(base.numel(), 1) or any(s < 0 for s in stride):
        return (f"as_strided_scatter view (size {size}, stride {stride}, offset {offset}) reaches outside the "
                f"input's {base.numel()} elements")
    span = 1  # the view's elements are distinct when each dim's stride clears the span of the smaller ones
    for s, n in sorted((s, n) for n, s in zip(size, stride, strict=True) if n > 1):
        if s < span:
            return (f"as_strided_scatter view (size {size}, stride {stride}) writes some elements more than once "
                    f"(which write lands is unspecified)")
        span = s * n
    return None


@register_lowering(aten.as_strided_scatter.default, torch.ops.prims.as_strided_scatter.default, family="movement",
                   kind="copy", check=_as_strided_scatter_check)
def lower_as_strided_scatter(gl, node: fx.Node) -> None:
    """as_strided_scatter (an ``as_strided`` view's backward, as in Longformer): the input, then ``src`` over the
    strided window of the output's storage: two DMAs in order on one queue of one copy kernel."""
    base, src = gl.view_of(node.args[0]), gl.view_of(node.args[1])  # may emit copy kernels: the index is taken after
    size, stride, offset = _strided_window(node)
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    pairs = [(base, out)]
    if src.numel > 0:
        pairs.append((src, View(out.buffer, size, stride, out.offset + offset, out.torch_dtype)))
    gl.emit_copy(f"k{kernel_index}_as_strided_scatter", pairs, [buf], (qualified_name(node.target),))


def _bitcast_check(node: fx.Node) -> str | None:
    src = node.args[0].meta["val"].dtype if isinstance(node.args[0], fx.Node) else None
    dst = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    if src not in BITCAST_SIZES or dst not in BITCAST_SIZES:
        return (f"a bitcast from {src} to {dst} is not supported: int64/float64 are stored as 32-bit values and bool "
                "as bytes, so their bits differ from torch's; bitcast between float32/int32, bfloat16/float16/int16 "
                "or int8/uint8/float8")
    return None


@register_lowering(aten.view.dtype, family="movement", kind="copy", check=_bitcast_check)
def lower_view_dtype(gl, node: fx.Node) -> None:
    """aten.view.dtype (``x.view(torch.int32)``): a DMA of the source's bytes, read as the new dtype (the access
    pattern's ``dtype=``), into a buffer of its own (every downstream kernel sees an ordinary input of that dtype).

    Another element size (``x.view(torch.uint8)`` of float32, two bfloat16 as one float32) scales the last dim as torch
    does: the source is read with its strides and offset counted in elements of the new dtype, which needs its last
    dim contiguous (copied so first when it is not) and its other strides a whole number of new elements."""
    src = gl.view_of(node.args[0])  # may emit copy kernels: the index is taken after
    old, new = BITCAST_SIZES[src.torch_dtype], BITCAST_SIZES[node.meta["val"].dtype]
    if old != new and src.numel and not _reinterpretable(src, old, new):
        src = gl.copy_contiguous(src, node.name)
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    if not out.numel:
        return
    if old != new:  # the source's layout in elements of the new dtype, over the output's shape
        src = View(src.buffer, out.shape, tuple(st * old // new for st in src.strides[:-1]) + (1,) if out.shape else (),
                   src.offset * old // new, out.torch_dtype)
    gl.emit_copy(f"k{kernel_index}_bitcast", [(src, out)], [buf], ("aten.view.dtype",),
                 src_dtype=gl.buffers[buf].dtype)


def _reinterpretable(src: View, old: int, new: int) -> bool:
    """Whether ``src`` (element size ``old``) reads as elements of size ``new`` in place: a contiguous last dim,
    and every other stride and the offset whole elements of the new size."""
    if not src.shape or (src.strides[-1] != 1 and src.shape[-1] != 1):
        return False
    return all(st * old % new == 0 for st in src.strides[:-1]) and src.offset * old % new == 0
