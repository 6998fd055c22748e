"""Insert device-side checks where eager raises on a bad value: indexing and integer division.

Input: an ATen FX graph; output: a copy in which each gather/scatter-like node is preceded by
``_assert_async(all(lo <= idx < hi), "index out of range ...")``, and each integer division (``//``, ``%``,
``fmod``, ``div(rounding_mode=...)``) by ``_assert_async(all(divisor != 0), "ZeroDivisionError ...")``. A
check is one small reduction over the index or divisor tensor (often fused with its producer);
:mod:`lowering.ops.checks` turns the assertion into a flag the runner reads after the kernels. Nothing is
clamped or wrapped silently: an out-of-range index raises :class:`~neuron_compile.errors.IndexOutOfRangeError`
(an ``IndexError``), an integer division by zero :class:`~neuron_compile.errors.DeviceAssertionError` (a
``RuntimeError`` saying ``ZeroDivisionError``, as eager's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from neuron_compile.lowering.ops.checks import INDEX_PREFIX
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten


def _val(a: Any) -> torch.Tensor | None:
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _dim(d: Any, rank: int) -> int:
    return int(d) % max(rank, 1)


def index_operands(node: fx.Node) -> Iterator[tuple[fx.Node, int, bool]]:
    """(index tensor, size of the indexed dim, negative indices allowed) of an indexing node."""
    t, a = node.target, node.args
    x = _val(a[0]) if a else None
    if x is None:
        return
    if t == aten.embedding.default:
        yield a[1], x.shape[0], False
    elif t in (aten.index_select.default, aten.index_add.default, aten.index_copy.default,
               aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, aten.index_reduce.default):
        yield a[2], x.shape[_dim(a[1], x.dim())] if x.dim() else 1, False
    elif t in (aten.gather.default, aten.scatter.src, aten.scatter.value, aten.scatter_add.default,
               aten.scatter_reduce.two, aten.scatter.reduce, aten.scatter.value_reduce):
        yield a[2], x.shape[_dim(a[1], x.dim())] if x.dim() else 1, False
    elif t in (aten.index.Tensor, aten.index_put.default, aten._unsafe_index.Tensor, aten._unsafe_index_put.default):
        for d, idx in enumerate(a[1]):
            v = _val(idx)
            if v is not None and v.dtype not in (torch.bool, torch.uint8):
                yield idx, x.shape[d], True


def _provably_in_range(idx: Any, lo: int, size: int) -> bool:
    """An ``arange(start, end)`` index (position ids) whose values lie in ``[lo, size)`` needs no check."""
    from neuron_compile.lowering.graph_passes import _arange_range

    while isinstance(idx, fx.Node) and idx.target in (aten.view.default, aten.unsqueeze.default,
                                                       aten.expand.default, aten.reshape.default):
        idx = idx.args[0]
    rng = _arange_range(idx)
    return rng is not None and lo <= rng[0] and rng[1] <= size


# integer divisions eager refuses with "RuntimeError: ZeroDivisionError": the divisor is args[1]
INT_DIVISIONS = (aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default, aten.floor_divide.Scalar,
                 aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, aten.fmod.Tensor,
                 aten.fmod.Scalar)
ZERO_DIVISION = "ZeroDivisionError"


def insert_division_checks(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with a check before each integer division that its divisor holds no 0 (changed in place).

    The NeuronCore's integer division by zero gives a value, not an error; eager raises. A divisor that is a
    number is checked here: 0 makes the check a constant ``False``, which fails the compile as eager fails
    every call; any other number needs no check."""
    count = 0
    for node in list(gm.graph.nodes):
        out = _val(node)
        if node.op != "call_function" or node.target not in INT_DIVISIONS or out is None or out.dtype == torch.bool \
                or out.dtype.is_floating_point or out.dtype.is_complex or not out.numel():
            continue
        div = node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
        dv = _val(div)
        if isinstance(div, fx.Node) and (dv is None or not dv.numel()):
            continue
        if not isinstance(div, fx.Node) and div != 0:
            continue
        where = str(node.target).split(".")[1] if "." in str(node.target) else str(node.target)
        msg = f"{ZERO_DIVISION}: integer division by zero in aten.{where} (the divisor holds a 0)"
        trace = node.meta.get("stack_trace")
        with gm.graph.inserting_before(node):
            if isinstance(div, fx.Node):
                ne = gm.graph.call_function(aten.ne.Scalar, (div, 0))
                ne.meta = {"val": torch.empty(tuple(dv.shape), dtype=torch.bool, device="meta"), "stack_trace": trace}
                ok: Any = gm.graph.call_function(aten.all.default, (ne,))
                ok.meta = {"val": torch.empty((), dtype=torch.bool, device="meta"), "stack_trace": trace}
            else:
                ok = False
            check = gm.graph.call_function(aten._assert_async.msg, (ok, msg))
            check.meta = {"stack_trace": trace}
        count += 1
    if count:
        gm.recompile()
        log.debug("inserted zero-divisor checks before %d integer division(s)", count)
    return gm


def insert_index_checks(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with a bounds check before each indexing node (``gm`` if there is none)."""
    todo = [(n, list(index_operands(n))) for n in gm.graph.nodes if n.op == "call_function"]
    todo = [(n, [(i, size, neg) for i, size, neg in ops
                 if isinstance(i, fx.Node) and _val(i) is not None and _val(i).numel()
                 and not _provably_in_range(i, -size if neg else 0, size)]) for n, ops in todo]
    todo = [(n, ops) for n, ops in todo if ops]
    if not todo:
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for old, ops in todo:
        node = remap[old]
        for idx_old, size, negative in ops:
            idx = remap.get(idx_old, idx_old)
            iv = _val(idx)
            if iv is None or not iv.numel():
                continue
            lo = -size if negative else 0
            with graph.inserting_before(node):
                ge = graph.call_function(aten.ge.Scalar, (idx, lo))
                lt = graph.call_function(aten.lt.Scalar, (idx, size))
                ok = graph.call_function(aten.logical_and.default, (ge, lt))
                every = graph.call_function(aten.all.default, (ok,))
                what = f"{str(old.target).split('.')[1] if '.' in str(old.target) else old.target}"
                msg = (f"{INDEX_PREFIX} in aten.{what}: an index is outside [{lo}, {size}) for a dimension of "
                       f"size {size}")
                check = graph.call_function(aten._assert_async.msg, (every, msg))
            for n in (ge, lt, ok):
                n.meta = {"val": torch.empty(tuple(iv.shape), dtype=torch.bool, device="meta"),
                          "stack_trace": old.meta.get("stack_trace")}
            every.meta = {"val": torch.empty((), dtype=torch.bool, device="meta"),
                          "stack_trace": old.meta.get("stack_trace")}
            check.meta = {"stack_trace": old.meta.get("stack_trace")}
    log.debug("inserted bounds checks before %d indexing op(s)", len(todo))
    return fx.GraphModule(gm, graph)
