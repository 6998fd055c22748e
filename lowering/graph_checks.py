"""Insert device-side bounds checks before every indexing op (eager raises IndexError for a bad index).

Input: an ATen FX graph; output: a copy in which each gather/scatter-like node is preceded by
``_assert_async(all(lo <= idx < hi), "index out of range ...")``. The check is one small reduction
over the index tensor (often fused with the index's producer); :mod:`lowering.ops.checks` turns the
assertion into a flag the runner reads after the kernels. Indices are never clamped or wrapped
silently: an out-of-range index raises :class:`~neuron_compile.errors.IndexOutOfRangeError`.
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
