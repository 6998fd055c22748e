"""Graph rewrites before partitioning that remove kernels without changing any value.

Input: the ATen FX graph AOTAutograd hands the backend. Output: a rewritten copy (the caller's graph
is never mutated; a graph with nothing to rewrite is returned as is).

- :func:`embedding_of_arange_to_slice`: ``embedding(weight, arange(start, end))`` (position embeddings)
  gathers rows ``start..end-1`` in order, i.e. it *is* ``weight[start:end]``. As a slice view the
  consumer loads the rows directly, so neither the ``arange`` (iota) kernel nor the gather kernel is
  emitted. Only exact cases are rewritten: 1-D integer arange with step 1, ``0 <= start <= end <=
  weight rows`` (out-of-range indices must still fail like eager), 2-D weight.
"""

from __future__ import annotations

import logging

import torch
from torch import fx

log = logging.getLogger(__name__)

aten = torch.ops.aten
_ARANGES = (aten.arange.start_step, aten.arange.start, aten.arange.default)


def _arange_range(node: object) -> tuple[int, int] | None:
    """``(start, end)`` of a step-1 integer ``aten.arange`` node, else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in _ARANGES:
        return None
    args = list(node.args)
    if node.target == aten.arange.default:
        args = [0, *args]
    start, end = args[0], args[1]
    step = args[2] if len(args) > 2 else 1
    dtype = node.kwargs.get("dtype")
    if dtype not in (None, torch.int64, torch.int32):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)) or step != 1:
        return None
    return start, end


def embedding_of_arange_to_slice(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with ``embedding(w, arange(s, e))`` replaced by ``slice(w, 0, s, e)`` (or ``gm``)."""
    def matches(n: fx.Node) -> bool:
        if n.op != "call_function" or n.target != aten.embedding.default or len(n.args) < 2:
            return False
        w, rng = n.args[0], _arange_range(n.args[1])
        val = w.meta.get("val") if isinstance(w, fx.Node) else None
        return rng is not None and isinstance(val, torch.Tensor) and val.dim() == 2 \
            and 0 <= rng[0] <= rng[1] <= val.shape[0]

    if not any(matches(n) for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for node in [n for n in graph.nodes if matches(n)]:
        start, end = _arange_range(node.args[1])  # type: ignore[misc]
        with graph.inserting_before(node):
            new = graph.call_function(aten.slice.Tensor, (node.args[0], 0, start, end, 1))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        log.debug("embedding(arange(%d, %d)) -> slice of rows: no iota and no gather kernel", start, end)
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)
