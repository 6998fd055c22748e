"""Gather/scatter with any index shape: :class:`LineGatherKernel` and :class:`ScatterKernel`.

``lowering/decomp_scatter.py`` turns gather (other than one index per row), scatter, scatter_add,
scatter_reduce, index_add/copy/fill/reduce, put and masked_scatter into ``neuron_compile::gather_lines`` /
``scatter_lines``. A *line* is one position of every dim but ``dim`` of the index: lines go 128 per tile
onto partitions (any strides: views cost nothing), the indexed dim along the free axis. Gathers pick with
``nc_n_gather`` from the line of ``self`` held in SBUF; scatters compare every index with every target
of the line (iota) and reduce the matching sources, so duplicates accumulate deterministically and
``assign`` keeps the last write as CPU torch does. A float scatter-add whose index is the same for every
line (index_add, index_select's backward, an expanded index) is a row scatter instead: ``index.py``'s DMA
scatter-add, O(indices x row) rather than O(indices x targets). All write a guard flag: an index outside the
dim raises after the kernel, like eager.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from neuron_compile.lowering import space as sp
from neuron_compile.lowering.decomp_scatter import GATHER_LINES, SCATTER_LINES, index_shared_by_lines
from neuron_compile.lowering.ir import (
    Access,
    ArgSpec,
    BufferRef,
    DeviceCheck,
    KernelCall,
    LineGatherKernel,
    ScatterKernel,
)
from neuron_compile.lowering.mathlib import NARROW_INTS
from neuron_compile.lowering.ops.index import emit_index_add
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.views import View
from torch import fx

from neuron_compile.errors import LoweringError, source_line

log = logging.getLogger(__name__)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def _val(a: Any) -> torch.Tensor | None:
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _lines(index: View, dim: int, others: list[tuple[int, ...]]) -> tuple[sp.Canonical, list[tuple[int, ...]]]:
    """Canonical (outer..., lines, j) space of the index with ``dim`` last; ``others``: stride vectors over the
    index's shape whose entry at ``dim`` is the operand's own stride along ``dim`` (kept as the last entry)."""
    shape = index.shape
    roles = ["red" if d == dim else "keep" for d in range(len(shape))]
    over = [tuple(0 if d == dim else s for d, s in enumerate(st)) for st in others]
    canon = sp.canonicalize(shape, roles, [index.strides, *over], part_role="keep", free_role="red",
                            split_limit=1 << 30)
    return canon, [sp.canonical_strides(canon, o)[:-1] + (st[dim],) for o, st in zip(over, others, strict=True)]


def _strides_over(view: View, shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """``view``'s strides over the index's shape: its own per dim (same rank), along ``dim`` too."""
    return tuple(view.strides[d] if view.shape[d] > 1 else 0 for d in range(len(shape))) if view.shape else (0,)


def _line(view: View | None) -> View | None:
    """A one-element operand of a 0-d/1-element line as a 1-D view of that element (no view op needed)."""
    if view is None or len(view.shape) == 1:
        return view
    return View(view.buffer, (1,), (1,), view.offset, view.torch_dtype)


def _flat(gl: Any, view: View, name: str) -> View:
    """Any-shape operand as one 1-D run (a dense copy first when its elements are not one strided run)."""
    n = view.numel
    if n <= 1:
        return View(view.buffer, (n,), (1,), view.offset, view.torch_dtype)
    from neuron_compile.lowering.ops.index import collapse

    sizes, (strides,) = collapse(view.shape, [view.strides])
    if len(sizes) > 1:
        view = gl.copy_contiguous(view, name)
        sizes, (strides,) = collapse(view.shape, [view.strides])
    return View(view.buffer, (n,), (strides[0],), view.offset, view.torch_dtype)


def check_flag(gl: Any, node: fx.Node, kernel_index: int, slot: int, message: str, kind: str) -> int:
    """A kernel's check output (one int32, 1 = passed) as a ``DeviceCheck`` the runner reads after the kernels:
    ``kind`` 'index' raises IndexOutOfRangeError (an IndexError and a RuntimeError), 'assert'
    DeviceAssertionError; the message names the user's source line."""
    buf = gl._buffer(BufferRef("kernel", kernel_index, slot, 1, "int32"))
    where = source_line(node)
    text = message if where == "<unknown source line>" else f"{message} (at {where})"
    gl.checks.append(DeviceCheck(buf, 0, text, kind))
    return buf


def _message(op: str, dim: int, size: int, lo: int) -> str:
    return (f"index out of range in aten.{op}: an index is outside [{lo}, {size}) for dimension {dim} of size "
            f"{size}; fix the indices")


def _dtype_check(node: fx.Node, what: str) -> str | None:
    x = _val(node.args[0])
    if x is not None and x.dtype not in _FLOATS + _INTS:
        return f"{what} of {x.dtype} is not supported"
    if x is not None and x.dim() and x.shape[int(node.args[1]) % x.dim()] == 0:
        return f"{what} along an empty dim is not supported"
    return None


def _gather_check(node: fx.Node) -> str | None:
    return _dtype_check(node, "gather")


@register_lowering(GATHER_LINES, family="index", kind="copy", check=_gather_check)
def lower_gather_lines(gl: Any, node: fx.Node) -> None:
    """gather with any index shape: nc_n_gather from each line of self in SBUF; out-of-range indices raise."""
    x, index = gl.view_of(node.args[0]), gl.view_of(node.args[2])
    dim = int(node.args[1])
    lo = int(node.args[3])
    flat = not x.shape and math.prod(index.shape) > 0
    if flat:  # a 0-d self: one line of one element; index and (dense) result as 1-D runs
        x, index = _line(x), _flat(gl, index, f"{node.name}_index")
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    if math.prod(index.shape) == 0:
        gl.buffers[buf] = BufferRef("empty", 0, 0, 0, gl.buffers[buf].dtype)
        return
    if flat:
        out = View(buf, index.shape, (1,), 0, out.torch_dtype)
    size = x.shape[dim]
    flag = check_flag(gl, node, kernel_index, 1, _message("gather", dim, size, lo), "index")
    canon, (x_acc, out_acc) = _lines(index, dim, [_strides_over(x, index.shape, dim), out.strides])
    args: list[int] = []
    for v in (x, index):
        if v.buffer not in args:
            args.append(v.buffer)
    kernel = LineGatherKernel(
        f"k{kernel_index}_gather", "line_gather", tuple(ArgSpec(gl.buffers[a].numel, gl.buffers[a].dtype) for a in args),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype), ArgSpec(1, "int32")),
        canon.space, canon.n_outer, Access(args.index(x.buffer), x.offset, x_acc),
        Access(args.index(index.buffer), index.offset, sp.canonical_strides(canon, index.strides)),
        Access(0, 0, out_acc), size, lo, "float" if x.torch_dtype.is_floating_point else "int",
        ("aten.gather.default",), 1)
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf, flag)))


def _scatter_check(node: fx.Node) -> str | None:
    reason = _dtype_check(node, "scatter")
    if reason:
        return reason
    x = _val(node.args[0])
    reduce = str(node.args[5])
    if reduce not in ("assign", "sum", "prod", "mean", "amax", "amin"):
        return f"scatter with reduce={reduce!r} is not supported"
    if x is not None and x.dtype in NARROW_INTS and reduce == "sum":
        # decomp_scatter widens these to int32 first; a direct one would saturate where torch wraps
        return (f"scatter-add into {x.dtype} is not supported: torch wraps the sums at {x.dtype.itemsize * 8} bits "
                f"and the scatter kernel accumulates in wider types; accumulate in int32 (x.int()) and cast back")
    if x is not None and not x.dtype.is_floating_point and reduce in ("prod", "mean"):
        # decomp_scatter computes these exactly; only integer products whose one-hot table is too large get here
        return (f"scatter_reduce(reduce={reduce!r}) on {x.dtype} is not supported at this size: integer products "
                f"are computed exactly as a [targets x indices] table per line, limited to 2**22 elements; "
                f"scatter into a float tensor or scatter fewer indices per call")
    return None


def _row_scatter_add(base: View, dim: int, index: View, src: View | None, reduce: str, include_self: bool) -> bool:
    """A float scatter-add whose index is the same for every line (index_add, index_select's backward, scatter_add
    with an expanded index) and spans ``self`` on every other dim: a row scatter (:func:`emit_index_add`)."""
    if reduce != "sum" or not include_self or src is None or not base.torch_dtype.is_floating_point:
        return False
    return index_shared_by_lines(base.shape, dim, index.shape, index.strides)


@register_lowering(SCATTER_LINES, family="index", kind="copy", check=_scatter_check)
def lower_scatter_lines(gl: Any, node: fx.Node) -> None:
    """scatter family with any index shape: per line, every index against every target; duplicates reduce
    (sum/prod/mean/amax/amin, include_self) or the last write wins (assign); out-of-range indices raise."""
    base, index = gl.view_of(node.args[0]), gl.view_of(node.args[2])
    src_node = node.args[3]
    # args[8] names eager's exception type; IndexOutOfRangeError is both an IndexError and a RuntimeError
    dim, fill, reduce, include_self, lo = (int(node.args[1]), float(node.args[4]), str(node.args[5]),
                                           bool(node.args[6]), int(node.args[7]))
    src = gl.view_of(src_node) if isinstance(src_node, fx.Node) else None
    if len(base.shape) <= 1:  # a 0-d / 1-D self is one line: index and src (any shape) as 1-D runs
        base = _line(base) if not base.shape else base
        index = _flat(gl, index, f"{node.name}_index")
        src = _flat(gl, src, f"{node.name}_src") if src is not None else None
        if src is not None and src.shape[0] != index.shape[0]:  # one value for every index, or a longer src's head
            step = 0 if src.shape[0] == 1 else src.strides[0]
            src = View(src.buffer, index.shape, (step,), src.offset, src.torch_dtype)
    op = {"assign": "scatter", "sum": "scatter_add"}.get(reduce, f"scatter_reduce({reduce})")
    if _row_scatter_add(base, dim, index, src, reduce, include_self):
        # every row along ``dim`` shares the index: a DMA scatter-add of whole rows, O(indices x row)
        assert src is not None
        values = View(src.buffer, index.shape, _strides_over(src, index.shape, dim), src.offset, src.torch_dtype)
        idx = View(index.buffer, (index.shape[dim],), (index.strides[dim],), index.offset, index.torch_dtype)
        emit_index_add(gl, node, base, dim, idx, values, f"aten.{op}", wrap=lo < 0,
                       flag_message=_message(op, dim, base.shape[dim], lo))
        return
    kernel_index = len(gl.kernels)
    covered = all(index.shape[d] == base.shape[d] for d in range(len(base.shape)) if d != dim)
    if not covered and not base.is_contiguous():
        base = gl.copy_contiguous(base, f"{node.name}_self")
        kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    out = _line(out) if not out.shape else out
    size = base.shape[dim]
    flag = check_flag(gl, node, kernel_index, 1, _message(op, dim, size, lo), "index")
    others = [_strides_over(base, index.shape, dim), out.strides]
    if src is not None:
        others.append(_strides_over(src, index.shape, dim))
    canon, accs = _lines(index, dim, others)
    args: list[int] = []
    for v in (base, index, src):
        if v is not None and v.buffer not in args:
            args.append(v.buffer)
    key = "float" if base.torch_dtype.is_floating_point else "int"
    wide = key == "int" and reduce == "sum" and node.meta["val"].dtype == torch.int64
    outputs = [ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype), ArgSpec(1, "int32")]
    results = [buf, flag]
    if wide:  # torch sums int64 exactly: a result beyond the int32 NeuronCores store raises
        outputs.append(ArgSpec(1, "int32"))
        results.append(check_flag(gl, node, kernel_index, 2, f"aten.{op}: an int64 sum left the int32 range that "
                                  f"NeuronCores store (values beyond +-2**31)", "assert"))
    kernel = ScatterKernel(
        f"k{kernel_index}_scatter", "scatter", tuple(ArgSpec(gl.buffers[a].numel, gl.buffers[a].dtype) for a in args),
        tuple(outputs), canon.space, canon.n_outer, Access(args.index(base.buffer), base.offset, accs[0]),
        Access(args.index(index.buffer), index.offset, sp.canonical_strides(canon, index.strides)),
        Access(args.index(src.buffer), src.offset, accs[2]) if src is not None else None,
        Access(0, 0, accs[1]), size, reduce, include_self, fill if key == "float" else float(int(fill)), lo,
        0 if covered else math.prod(base.shape), key, (f"aten.{op}",), 1, 2 if wide else -1)
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), tuple(results)))


def _bag_backward_check(node: fx.Node) -> str | None:
    sparse = bool(node.args[9]) if len(node.args) > 9 else False
    if not sparse and not bool(node.args[7]):
        return None  # decomposed before lowering (lowering/decomp_bag.py)
    what = "sparse=True" if sparse else "scale_grad_by_freq=True"
    return (f"EmbeddingBag backward with {what} is not supported: sparse gradients have no NeuronCore layout, and "
            f"CPU torch's frequency scaling divides by counts that do not match each index's frequency (so no "
            f"kernel can reproduce it); use sparse=False / scale_grad_by_freq=False")


@register_lowering(torch.ops.aten._embedding_bag_backward.default, family="index", kind="copy",
                   check=_bag_backward_check)
def lower_bag_backward(gl: Any, node: fx.Node) -> None:
    """aten._embedding_bag_backward: decomposed (lowering/decomp_bag.py); sparse / scale_grad_by_freq refused."""
    raise LoweringError(f"{node.name}: _embedding_bag_backward reached lowering; it is decomposed first "
                        f"(lowering/decomp_bag.py)")
