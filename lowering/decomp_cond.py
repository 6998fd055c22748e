"""``torch.cond`` inlined: both branches computed, each result selected by the predicate.

Input: an ATen FX graph (inference, forward, backward or the joint graph) whose ``higher_order.cond`` nodes call
branch subgraphs; output: the same graph (changed in place) with every cond replaced by the ops of both branches
and ``where(pred, true_result, false_result)`` per result. Kernels run without host control flow, so this is
how a data-dependent branch compiles; it costs both branches' work.

Why the values are eager's:

* ``where`` selects: a NaN or inf in the branch not taken never reaches the result. In training AOTAutograd
  hands over the backward of a cond as another cond (each branch's own gradient), so its gradients are selected
  the same way, never multiplied by the other branch's (a ``where`` over the forward would make ``0 * inf``).
* What raises in eager raises only in the branch taken: each inlined op's device-side checks (an index bound, a
  zero divisor: :mod:`lowering.graph_checks`; an assertion of the branch) are inserted as it is inlined, each
  made to hold whenever the branch is not taken (its *taken* flag is the predicate, and-ed with the enclosing
  branches' flags), and the op is marked as checked.
* A branch that draws random numbers is not inlined (drawing in both branches would move the generator unlike
  eager); that cond stays in the graph and is refused by name.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from neuron_compile.lowering.graph_checks import device_checks
from neuron_compile.lowering.registry import register_declined
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten
COND = torch.ops.higher_order.cond
TAKEN = "neuron_branch_taken"  # node.meta key: the 0-d bool node that is true when the op's branch runs


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _bool0(graph: fx.Graph, target: Any, args: tuple[Any, ...], trace: Any) -> fx.Node:
    node = graph.call_function(target, args)
    node.meta = {"val": torch.empty((), dtype=torch.bool, device="meta"), "stack_trace": trace}
    return node


def _draws_random(gm: fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        if n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
            return True
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), fx.GraphModule) \
                and _draws_random(getattr(gm, n.target)):
            return True
    return False


def _why_not(node: fx.Node) -> str | None:
    """Why a cond node can't be inlined, or None."""
    pred, branches = node.args[0], node.args[1:3]
    gm = node.graph.owning_module
    mods = [getattr(gm, b.target, None) if isinstance(b, fx.Node) and b.op == "get_attr" else None for b in branches]
    if any(not isinstance(m, fx.GraphModule) for m in mods):
        return "its branches are not graphs"
    if isinstance(pred, fx.Node):
        v = _val(pred)
        if not isinstance(v, torch.Tensor) or v.numel() != 1:
            return "its predicate is not a one-element tensor"
    if any(_draws_random(m) for m in mods):
        return ("a branch draws random numbers (computing both branches would advance the generator unlike "
                "eager); draw the numbers before torch.cond and pass them in")
    for user in node.users:
        if user.target is not operator.getitem or not isinstance(_val(user), torch.Tensor):
            return "a result is not a tensor"
    return None


register_declined(lambda node: _why_not(node) if node.target is COND else None, COND)


def _inline_branch(gm: fx.GraphModule, node: fx.Node, sub: fx.GraphModule, operands: list[Any],
                   taken: fx.Node | None) -> list[Any]:
    """Copy ``sub``'s ops before ``node``, its placeholders bound to ``operands``; returns its results."""
    graph = gm.graph
    env: dict[fx.Node, Any] = {}
    ops = iter(operands)
    results: list[Any] = []
    with graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(ops)
            elif n.op == "output":
                out = n.args[0]
                results = [env[a] if isinstance(a, fx.Node) else a for a in (out if isinstance(out, (list, tuple))
                                                                              else [out])]
            elif n.op == "get_attr":  # a nested branch or a constant: moved into gm under a fresh name
                name = f"_cond_{n.target}"
                i = 0
                while hasattr(gm, f"{name}_{i}"):
                    i += 1
                setattr(gm, f"{name}_{i}", getattr(sub, n.target))
                env[n] = graph.get_attr(f"{name}_{i}")
                env[n].meta = dict(n.meta)
            else:
                new = graph.node_copy(n, lambda a: env[a])
                env[n] = new
                if taken is not None:  # its checks now, each holding when the branch is not taken
                    new.meta[TAKEN] = taken
                    checks = device_checks(graph, new)
                    for check in checks + ([new] if new.target is aten._assert_async.msg else []):
                        _guard(graph, check, taken)
    return results


def inline_cond(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with every inlinable ``torch.cond`` replaced by both branches and a ``where`` per result."""
    count = 0
    while True:
        todo = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is COND and _why_not(n) is None]
        if not todo:
            break
        node = todo[0]
        pred, t_attr, f_attr, operands = node.args[:4]
        graph, trace, outer = gm.graph, node.meta.get("stack_trace"), node.meta.get(TAKEN)
        subs = [getattr(gm, t_attr.target), getattr(gm, f_attr.target)]
        if not isinstance(pred, fx.Node):  # a constant predicate: only its branch
            res = _inline_branch(gm, node, subs[0 if pred else 1], list(operands), outer)
            picked: list[Any] = res
        else:
            with graph.inserting_before(node):
                p = pred if not _val(pred).shape else graph.call_function(aten.view.default, (pred, []))
                if p is not pred:
                    p.meta = {"val": torch.empty((), dtype=_val(pred).dtype, device="meta"), "stack_trace": trace}
                if _val(pred).dtype != torch.bool:
                    p = _bool0(graph, aten.ne.Scalar, (p, 0), trace)
                not_p = _bool0(graph, aten.logical_not.default, (p,), trace)
                t_taken = p if outer is None else _bool0(graph, aten.logical_and.default, (outer, p), trace)
                f_taken = not_p if outer is None else _bool0(graph, aten.logical_and.default, (outer, not_p), trace)
            res_t = _inline_branch(gm, node, subs[0], list(operands), t_taken)
            res_f = _inline_branch(gm, node, subs[1], list(operands), f_taken)
            picked = []
            for a, b in zip(res_t, res_f, strict=True):
                with graph.inserting_before(node):
                    w = graph.call_function(aten.where.self, (p, a, b))
                w.meta = {"val": _val(a), "stack_trace": trace}
                if outer is not None:
                    w.meta[TAKEN] = outer
                picked.append(w)
        for user in list(node.users):
            user.replace_all_uses_with(picked[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        for attr in (t_attr, f_attr):
            if isinstance(attr, fx.Node) and not attr.users:
                graph.erase_node(attr)
        count += 1
    if count:
        graph = gm.graph
        graph.eliminate_dead_code()
        graph.lint()
        gm.recompile()
        log.debug("inlined %d torch.cond node(s)", count)
    return gm


def _guard(graph: fx.Graph, check: fx.Node, taken: fx.Node) -> None:
    """Make the device-side ``check`` of an inlined branch hold when the branch is not taken: ``ok or not taken``."""
    ok, trace = check.args[0], check.meta.get("stack_trace")
    with graph.inserting_before(check):
        skipped = _bool0(graph, aten.logical_not.default, (taken,), trace)
        if isinstance(ok, fx.Node):
            ok = _bool0(graph, aten.logical_or.default, (ok, skipped), trace)
        elif not ok:  # a check that always fails: fails exactly when the branch runs
            ok = skipped
    check.args = (ok, *check.args[1:])


register_declined(lambda node: "its trip count depends on tensor values, and kernels run a static schedule; run the "
                  "loop eagerly (under torch.compiler.disable) or unroll a fixed count in Python",
                  torch.ops.higher_order.while_loop)
