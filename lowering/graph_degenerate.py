"""Graph rewrites for degenerate shapes, so every kernel family sees only ordinary ones.

Input: an ATen FX graph; output: an equivalent copy (or the same graph when nothing applies).

- A reduction whose reduced dims all have size 1 (or whose input is 0-d) changes no value: it becomes
  a reshape (plus the dtype cast torch applies, e.g. int32 -> int64 sums), ``x != 0`` for any/all,
  zeros for argmax/argmin, and ``(x - x) / (1 - correction)`` for var (0, or NaN like eager).
- A reduction over an empty dim with a non-empty result is its identity: 0 for sum, 1 for prod, NaN
  for mean/var, False/True for any/all (amax/argmax of nothing raise in eager before reaching us).
- ``argmax``/``argmin`` without ``dim`` over a multi-dim tensor reduce its flattened view.
- A matmul with an empty contraction dim is zeros.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from neuron_compile.lowering.partition import reduce_dims_of
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

_VALUE = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
          aten.amin.default, aten.prod.dim_int, aten.prod.default}
_TRUTH = {aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims, aten.all.default}
_ARG = {aten.argmax.default, aten.argmin.default}
_EMPTY_FILL = {aten.sum.dim_IntList: 0, aten.sum.default: 0, aten.prod.dim_int: 1, aten.prod.default: 1,
               aten.mean.dim: math.nan, aten.mean.default: math.nan, aten.var.correction: math.nan,
               aten.any.dim: False, aten.any.dims: False, aten.any.default: False,
               aten.all.dim: True, aten.all.dims: True, aten.all.default: True}
_MATMULS = {aten.mm.default, aten.bmm.default}


def _val(a: Any) -> torch.Tensor | None:
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _meta(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


class _Rewriter:
    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.changed = False

    def call(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], shape: Any,
             dtype: torch.dtype) -> fx.Node:
        n = self.graph.call_function(target, args, kwargs)
        n.meta["val"] = _meta(shape, dtype)
        return n

    def full(self, shape: Any, value: Any, dtype: torch.dtype) -> fx.Node:
        return self.call(aten.full.default, (list(shape), value),
                         {"dtype": dtype, "layout": torch.strided, "device": torch.device("cpu"),
                          "pin_memory": False}, shape, dtype)

    def replace(self, node: fx.Node, new: fx.Node, why: str) -> None:
        new.meta = {**node.meta, "val": new.meta["val"]}
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        self.changed = True
        log.debug("%s (%s): %s", node.name, node.target, why)

    def reduction(self, node: fx.Node) -> None:
        x, xv, out = node.args[0], _val(node.args[0]), _val(node)
        if xv is None or out is None:
            return
        t = node.target
        if xv.numel() == 0 and out.numel() > 0 and t in _EMPTY_FILL:
            with self.graph.inserting_before(node):
                new = self.full(out.shape, _EMPTY_FILL[t], out.dtype)
            self.replace(node, new, "reduction over an empty dim: its identity")
            return
        dims = reduce_dims_of(node) or ()
        if xv.dim() and any(xv.shape[d] != 1 for d in dims):
            if t in _ARG and node.args[1:2] in ((), (None,)) and xv.dim() > 1:
                with self.graph.inserting_before(node):
                    flat = self.call(aten.reshape.default, (x, [-1]), {}, (xv.numel(),), xv.dtype)
                    arg = self.call(t, (flat, 0), {}, (), out.dtype)
                    new = self.call(aten.reshape.default, (arg, list(out.shape)), {}, out.shape, out.dtype)
                self.replace(node, new, "argmax/argmin of the flattened tensor")
            return
        if xv.numel() == 0:
            return
        with self.graph.inserting_before(node):
            if t in _VALUE:
                new = self.call(aten.reshape.default, (x, list(out.shape)), {}, out.shape, xv.dtype)
                if out.dtype != xv.dtype:
                    new = self.call(aten._to_copy.default, (new,), {"dtype": out.dtype}, out.shape, out.dtype)
            elif t in _TRUTH:
                ne = self.call(aten.ne.Scalar, (x, 0), {}, xv.shape, torch.bool)
                new = self.call(aten.reshape.default, (ne, list(out.shape)), {}, out.shape, torch.bool)
                if out.dtype != torch.bool:  # any / all of uint8 give uint8
                    new = self.call(aten._to_copy.default, (new,), {"dtype": out.dtype}, out.shape, out.dtype)
            elif t in _ARG:
                new = self.full(out.shape, 0, out.dtype)
            elif t == aten.var.correction:
                corr = node.kwargs.get("correction")
                corr = 1.0 if corr is None else float(corr)
                factor = 1.0 / (1.0 - corr) if 1.0 - corr > 0 else math.inf
                diff = self.call(aten.sub.Tensor, (x, x), {}, xv.shape, xv.dtype)
                scaled = self.call(aten.mul.Tensor, (diff, factor), {}, xv.shape, xv.dtype)
                new = self.call(aten.reshape.default, (scaled, list(out.shape)), {}, out.shape, xv.dtype)
            else:
                return
        self.replace(node, new, "reduction over size-1 dims: no values change")

    def matmul(self, node: fx.Node) -> None:
        a, out = _val(node.args[0]), _val(node)
        if a is None or out is None or a.shape[-1] != 0 or out.numel() == 0:
            return
        with self.graph.inserting_before(node):
            new = self.full(out.shape, 0, out.dtype)
        self.replace(node, new, "matmul over an empty contraction: zeros")


def rewrite_degenerate(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with degenerate reductions and matmuls rewritten (or ``gm`` itself)."""
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    rw = _Rewriter(graph)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _VALUE or node.target in _TRUTH or node.target in _ARG or node.target == aten.var.correction:
            rw.reduction(node)
        elif node.target in _MATMULS:
            rw.matmul(node)
    if not rw.changed:
        return gm
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)
