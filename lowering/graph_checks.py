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
    """An index whose values are known to lie in ``[lo, size)`` needs no check: built from aranges (position ids)
    and tensor literals (``torch.tensor([...])`` in the model, a decomposition's gather indices) by shifts, scales
    and views (lowering/value_ranges.py). A literal out of range keeps its check: eager raises on every call, so
    the compiled graph does too."""
    from neuron_compile.lowering.value_ranges import int_range

    rng = int_range(idx)
    return rng is not None and lo <= rng[0] and rng[1] < size


# integer divisions eager refuses with "RuntimeError: ZeroDivisionError": the divisor is args[1]
INT_DIVISIONS = (aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default, aten.floor_divide.Scalar,
                 aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, aten.fmod.Tensor,
                 aten.fmod.Scalar)
ZERO_DIVISION = "ZeroDivisionError"
CHECKED = "neuron_checked"  # node.meta key: the node's checks are in the graph already (lowering.decomp_cond)


def _op_name(node: fx.Node) -> str:
    return str(node.target).split(".")[1] if "." in str(node.target) else str(node.target)


def _meta(node: fx.Node, shape: tuple[int, ...], trace: Any) -> fx.Node:
    node.meta = {"val": torch.empty(shape, dtype=torch.bool, device="meta"), "stack_trace": trace}
    return node


def _assert(graph: fx.Graph, ok: Any, msg: str, trace: Any) -> fx.Node:
    check = graph.call_function(aten._assert_async.msg, (ok, msg))
    check.meta = {"stack_trace": trace}
    return check


def _divisor(node: fx.Node) -> list[Any]:
    """``[divisor]`` when ``node`` is an integer division whose divisor may hold a 0 (a tensor, or the number 0)."""
    out = _val(node)
    if node.op != "call_function" or node.target not in INT_DIVISIONS or out is None or out.dtype == torch.bool \
            or out.dtype.is_floating_point or out.dtype.is_complex or not out.numel() or node.meta.get(CHECKED):
        return []
    div = node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
    dv = _val(div)
    if isinstance(div, fx.Node) and (dv is None or not dv.numel()) or not isinstance(div, fx.Node) and div != 0:
        return []
    return [div]


def division_checks(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    """The check, inserted before ``node`` if it is an integer division, that its divisor holds no 0.

    The NeuronCore's integer division by zero gives a value, not an error; eager raises. A divisor that is a
    number is checked here: 0 makes the check a constant ``False``, which fails the compile as eager fails
    every call; any other number needs no check."""
    checks = []
    trace = node.meta.get("stack_trace")
    for div in _divisor(node):
        msg = f"{ZERO_DIVISION}: integer division by zero in aten.{_op_name(node)} (the divisor holds a 0)"
        with graph.inserting_before(node):
            ok: Any = False
            if isinstance(div, fx.Node):
                ne = _meta(graph.call_function(aten.ne.Scalar, (div, 0)), tuple(_val(div).shape), trace)
                ok = _meta(graph.call_function(aten.all.default, (ne,)), (), trace)
            checks.append(_assert(graph, ok, msg, trace))
    return checks


def _indices(node: fx.Node) -> list[tuple[fx.Node, int, int]]:
    """``(index tensor, lo, size)`` of each index of ``node`` that needs a bounds check."""
    if node.op != "call_function" or node.meta.get(CHECKED):
        return []
    out = []
    for idx, size, negative in index_operands(node):
        iv = _val(idx)
        lo = -size if negative else 0
        if isinstance(idx, fx.Node) and iv is not None and iv.numel() and not _provably_in_range(idx, lo, size):
            out.append((idx, lo, size))
    return out


def index_checks(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    """The bounds checks, inserted before ``node``, of each of its index tensors not provably in range."""
    checks = []
    trace = node.meta.get("stack_trace")
    for idx, lo, size in _indices(node):
        shape = tuple(_val(idx).shape)
        with graph.inserting_before(node):
            ge = _meta(graph.call_function(aten.ge.Scalar, (idx, lo)), shape, trace)
            lt = _meta(graph.call_function(aten.lt.Scalar, (idx, size)), shape, trace)
            ok = _meta(graph.call_function(aten.logical_and.default, (ge, lt)), shape, trace)
            every = _meta(graph.call_function(aten.all.default, (ok,)), (), trace)
            msg = (f"{INDEX_PREFIX} in aten.{_op_name(node)}: an index is outside [{lo}, {size}) for a dimension "
                   f"of size {size}")
            checks.append(_assert(graph, every, msg, trace))
    return checks


def device_checks(graph: fx.Graph, node: fx.Node) -> list[fx.Node]:
    """Every check of ``node`` (bounds, zero divisor), inserted before it; ``node`` is marked as checked."""
    checks = index_checks(graph, node) + division_checks(graph, node)
    node.meta[CHECKED] = True
    return checks


def insert_device_checks(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with the checks of every indexing op and integer division before it (``gm`` if none)."""
    if not any(_indices(n) or _divisor(n) for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    count = sum(len(device_checks(graph, node)) for node in list(graph.nodes))
    log.debug("inserted %d device-side check(s)", count)
    return fx.GraphModule(gm, graph)
