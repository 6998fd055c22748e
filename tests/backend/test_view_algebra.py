"""Views in the lowering are decided by the sympy index algebra (lowering/index_algebra.py).

A view that no strided access reaches is copied with its reason in the plan summary (what explain
prints); a view chain that leaves the affine world and comes back (flatten then unflatten of a
permuted tensor) reads the original buffer with no copy.
"""

from __future__ import annotations

import logging

import torch
from neuron_compile.lowering.graph import GraphLowering
from torch import fx

from neuron_compile import backend
from neuron_compile.config import config
from neuron_compile.pipeline import build_artifacts, load_artifacts
from neuron_compile.runtime import CompiledGraph

log = logging.getLogger(__name__)
aten = torch.ops.aten


def _node(g: fx.Graph, target: object, args: tuple, val: torch.Tensor) -> fx.Node:
    n = g.call_function(target, args)
    n.meta["val"] = val
    return n


def _flatten_unflatten_graph() -> fx.GraphModule:
    """x (2, 3, 4) -> permute (2, 4, 3) -> view (2, 12) -> view (2, 4, 3) -> + 1, as ATen nodes."""
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, 4)
    p = _node(g, aten.permute.default, (x, [0, 2, 1]), torch.empty(2, 3, 4).permute(0, 2, 1))
    flat = _node(g, aten.view.default, (p, [2, 12]), torch.empty(2, 12))
    back = _node(g, aten.view.default, (flat, [2, 4, 3]), torch.empty(2, 4, 3))
    out = _node(g, aten.add.Tensor, (back, 1.0), torch.empty(2, 4, 3))
    g.output((out,))
    return fx.GraphModule(torch.nn.Module(), g)


def test_flatten_then_unflatten_of_a_permuted_input_reads_it_without_a_copy() -> None:
    x = torch.randn(2, 3, 4)
    with config.patch(cache=False):
        files, summary, plan = build_artifacts(_flatten_unflatten_graph(), [x])
        _, sources = load_artifacts(files)
        (got,) = CompiledGraph(plan, sources)(x)
    assert [k["family"] for k in summary["kernels"]] == ["pointwise"], summary["kernels"]
    (load,) = [op for op in plan.kernels[0].ops if op.opcode == "load"]
    arg, offset, strides = dict(load.attrs)["access"]
    assert plan.buffers[plan.calls[0].args[arg]].kind == "input" and offset == 0
    assert sorted(strides) == [1, 4, 12], strides  # the permuted input's own strides, no copy between
    torch.testing.assert_close(got, x.permute(0, 2, 1).reshape(2, 12).reshape(2, 4, 3) + 1)


def test_flatten_alone_still_copies_and_says_why() -> None:
    gm = _flatten_unflatten_graph()
    back = next(n for n in gm.graph.nodes if n.args and n.args[-1] == [2, 4, 3])
    add = next(iter(back.users))
    flat = back.args[0]
    add.replace_input_with(back, flat)  # the (2, 12) flatten is consumed directly now
    add.args = (flat, 1.0)
    add.meta["val"] = torch.empty(2, 12)
    gm.graph.erase_node(back)
    gm.recompile()
    x = torch.randn(2, 3, 4)
    plan = GraphLowering(gm, [x]).run()
    kinds = [(k["family"], k["reason"]) for k in plan.summary["kernels"]]
    assert kinds[0] == ("copy", "view_default (aten.view.default) needs a copy: reshape (2, 4, 3) -> (2, 12): result dim 1 "
                                "(size 12) indexes the source only through floor-division/modulo (index 12*i0 + "
                                "((i1//3)) + 4*(ModularIndexing(i1, 1, 3))): no single stride per dim"), kinds
    assert kinds[1][0] == "pointwise"


def test_argmax_of_a_transpose_copies_with_the_algebra_reason() -> None:
    """The flattened argmax (lowering.graph_degenerate) reshapes a transposed tensor: a stated copy."""
    torch._dynamo.reset()
    x = torch.randn(5, 7)
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(lambda t: t.t().argmax(), backend="neuron", dynamic=False)(x)
    assert got.item() == x.t().argmax().item()
    kernels = backend.compiled_graphs()[-1]["plan"].summary["kernels"]
    copies = [k for k in kernels if k["family"] == "copy"]
    assert len(copies) == 1, kernels
    assert "needs a copy: reshape (7, 5) -> (35,): result dim 0 (size 35) indexes the source only through " \
           "floor-division/modulo" in copies[0]["reason"], copies[0]
