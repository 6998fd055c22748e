"""Integer value ranges of index computations, and the device checks and index wraps they make unnecessary.

Index tensors are often built from ``arange`` (position ids, Hugging Face's mask functions: ``batch_idx``,
``kv_idx``), shifted, scaled and broadcast. Their range is known at compile time, so a bounds check of them is
true on every call and a negative-index wrap never fires. :func:`int_range` follows such a computation back to its
aranges and tensor literals; :func:`truth` decides a comparison of it with a number (and ``and`` / ``or`` / ``not``
/ ``any`` / ``all`` of those); :func:`drop_proven_checks` removes the assertions that are always true and the
wraps that never apply. A value it can't follow keeps its check: nothing here guesses.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

_ARANGES = (aten.arange.start_step, aten.arange.start, aten.arange.default)
# ops whose result holds only values of their first argument
_SAME = frozenset((aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
                   aten.expand.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
                   aten.permute.default, aten.t.default, aten.transpose.int, aten.clone.default, aten.alias.default,
                   aten.detach.default, aten.lift_fresh_copy.default, aten.slice.Tensor, aten.select.int,
                   aten.flatten.using_ints))
_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_DEPTH = 64  # how far back a range is followed
Memo = dict[tuple[str, fx.Node], Any]  # one query's results per node: a shared subexpression is followed once


def _val(node: fx.Node) -> Any:
    return node.meta.get("val")


def _number(a: Any) -> int | None:
    return a if isinstance(a, int) and not isinstance(a, bool) else None


def int_range(node: Any, depth: int = 0, memo: Memo | None = None) -> tuple[int, int] | None:
    """``(lo, hi)``: every value of the integer tensor (or number) ``node`` lies in ``[lo, hi]``; None if unknown
    (or beyond int32, where the device's arithmetic would wrap)."""
    memo = {} if memo is None else memo
    if isinstance(node, fx.Node) and ("range", node) in memo:
        return memo["range", node]
    r = _range(node, depth, memo)
    r = r if r is not None and -(2**31) <= r[0] and r[1] < 2**31 else None
    if isinstance(node, fx.Node):
        memo["range", node] = r
    return r


def _range(node: Any, depth: int, memo: Memo) -> tuple[int, int] | None:
    n = _number(node)
    if n is not None:
        return n, n
    if not isinstance(node, fx.Node) or depth > _DEPTH:
        return None
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dtype not in _INTS or not val.numel():
        return None
    if node.op == "placeholder":
        return _constant_range(node, val)
    if node.op != "call_function":
        return None
    t, args = node.target, node.args
    if t in _ARANGES:
        return _arange(node)
    if t in _SAME:
        return int_range(args[0], depth + 1, memo)
    if t is aten.where.self:
        cond = truth(args[0], depth + 1, memo)
        if cond is not None:
            return int_range(args[1] if cond else args[2], depth + 1, memo)
        a, b = int_range(args[1], depth + 1, memo), int_range(args[2], depth + 1, memo)
        return (min(a[0], b[0]), max(a[1], b[1])) if a and b else None
    if t not in (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor,
                 aten.mul.Scalar) or len(args) < 2:
        return None
    a, b = int_range(args[0], depth + 1, memo), int_range(args[1], depth + 1, memo)
    if a is None or b is None:
        return None
    alpha = _number(node.kwargs.get("alpha", 1))
    if alpha is None:
        return None
    if t in (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar):
        if t in (aten.sub.Tensor, aten.sub.Scalar):
            alpha = -alpha
        b = sorted((b[0] * alpha, b[1] * alpha))  # type: ignore[assignment]
        return a[0] + b[0], a[1] + b[1]
    products = [x * y for x in a for y in b]
    return min(products), max(products)


def arange_args(node: Any) -> tuple[int, int, int] | None:
    """``(start, end, step)`` of an ``aten.arange`` node with integer arguments, else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in _ARANGES:
        return None
    args = list(node.args)
    if node.target == aten.arange.default:
        args = [0, *args]
    start, end = _number(args[0]), _number(args[1])
    step = _number(args[2]) if len(args) > 2 else 1
    return (start, end, step) if start is not None and end is not None and step else None


def _arange(node: fx.Node) -> tuple[int, int] | None:
    args = arange_args(node)
    if args is None:
        return None
    start, end, step = args
    count = len(range(start, end, step))
    if not count:
        return None
    last = start + step * (count - 1)
    return min(start, last), max(start, last)


def written(node: fx.Node) -> bool:
    """Whether an op of the graph writes ``node`` in place (any mutable schema among its users)."""
    return any(getattr(getattr(u.target, "_schema", None), "is_mutable", False) for u in node.users)


def _constant_range(node: fx.Node, val: torch.Tensor) -> tuple[int, int] | None:
    """A lifted tensor literal (graph_passes.lift_constants) no op writes: its smallest and largest value."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not node.meta.get("neuron_constant") or isinstance(val, FakeTensor) or val.device.type != "cpu" \
            or written(node):
        return None
    return int(val.min()), int(val.max())


_COMPARE = {aten.ge.Scalar: lambda r, s: (r[0] >= s, r[1] < s), aten.gt.Scalar: lambda r, s: (r[0] > s, r[1] <= s),
            aten.lt.Scalar: lambda r, s: (r[1] < s, r[0] >= s), aten.le.Scalar: lambda r, s: (r[1] <= s, r[0] > s)}
_AND = (aten.logical_and.default, aten.bitwise_and.Tensor)
_OR = (aten.logical_or.default, aten.bitwise_or.Tensor)
_NOT = (aten.logical_not.default, aten.bitwise_not.default)
_REDUCE = frozenset((aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims))


def truth(node: Any, depth: int = 0, memo: Memo | None = None) -> bool | None:
    """True when every element of the bool tensor ``node`` is true on every call, False when every element is
    false, None when that is not known."""
    if isinstance(node, bool):
        return node
    memo = {} if memo is None else memo
    if isinstance(node, fx.Node) and ("truth", node) in memo:
        return memo["truth", node]
    out = _truth(node, depth, memo)
    if isinstance(node, fx.Node):
        memo["truth", node] = out
    return out


def _truth(node: Any, depth: int, memo: Memo) -> bool | None:
    if not isinstance(node, fx.Node) or node.op != "call_function" or depth > _DEPTH:
        return None
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dtype != torch.bool:
        return None
    t, args = node.target, node.args
    if t in _SAME:
        return truth(args[0], depth + 1, memo)
    if t in _COMPARE:
        r, s = int_range(args[0], depth + 1, memo), args[1]
        if r is None or not isinstance(s, (int, float)) or isinstance(s, bool):
            return None
        always, never = _COMPARE[t](r, s)
        return True if always else False if never else None
    if t in _NOT:
        inner = truth(args[0], depth + 1, memo)
        return None if inner is None else not inner
    if t in _AND or t in _OR:
        a, b = truth(args[0], depth + 1, memo), truth(args[1], depth + 1, memo)
        decided = False if t in _AND else True
        if a is decided or b is decided:
            return decided
        return (not decided) if a is not None and b is not None else None
    if t in _REDUCE:
        source = _val(args[0]) if isinstance(args[0], fx.Node) else None
        if not isinstance(source, torch.Tensor) or not source.numel():
            return None
        return truth(args[0], depth + 1, memo)
    return None


def _kept_where(node: fx.Node) -> fx.Node | None:
    """The branch a ``where`` always takes, when it has the where's own shape and dtype (an index wrap
    ``where(i < 0, i + n, i)`` of an ``i`` that is never negative is ``i``)."""
    if node.target is not aten.where.self:
        return None
    cond = truth(node.args[0])
    if cond is None:
        return None
    kept = node.args[1] if cond else node.args[2]
    out, val = _val(node), _val(kept) if isinstance(kept, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    if val.shape != out.shape or val.dtype != out.dtype:
        return None
    if val.stride() != out.stride() and not _reads_values_only(node):
        return None  # a layout someone sees (a graph output, a view of it)
    return kept  # type: ignore[return-value]


def _reads_values_only(node: fx.Node) -> bool:
    """Whether every user of ``node`` is an elementwise op or a gather (which read values, not a layout)."""
    from neuron_compile.lowering.registry import lookup

    for user in node.users:
        rule = lookup(user.target) if user.op == "call_function" else None
        if rule is None or rule.kind not in ("pointwise", "reduction", "gather"):
            return False
    return True


def _proven(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten._assert_async.msg and truth(node.args[0]) is True


def drop_proven_checks(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` without the assertions that hold on every call and the index wraps that never apply, and
    without the computations only they read (``gm`` itself if there are none)."""
    if not any(_proven(n) or _kept_where(n) is not None for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    dropped = 0
    for node in list(graph.nodes):
        if _proven(node):
            graph.erase_node(node)
            dropped += 1
            continue
        kept = _kept_where(node)
        if kept is not None:
            node.replace_all_uses_with(kept)
            graph.erase_node(node)
    graph.eliminate_dead_code()
    log.debug("dropped %d device check(s) that hold on every call", dropped)
    return fx.GraphModule(gm, graph)
