"""Graph rewrites before partitioning that remove kernels without changing any value.

Input: the ATen FX graph AOTAutograd hands the backend. Output: a rewritten copy (the caller's graph
is never mutated; a graph with nothing to rewrite is returned as is).

- :func:`embedding_of_arange_to_slice`: ``embedding(weight, arange(start, end))`` (position embeddings)
  gathers rows ``start..end-1`` in order, i.e. it *is* ``weight[start:end]``. As a slice view the
  consumer loads the rows directly, so neither the ``arange`` (iota) kernel nor the gather kernel is
  emitted. Only exact cases are rewritten: 1-D integer arange with step 1, ``0 <= start <= end <=
  weight rows`` (out-of-range indices must still fail like eager), 2-D weight.
- :func:`split_full_reductions`: an exact full reduction (all, any, amax, amin of a whole tensor) of many
  elements runs over 128 partitions first, then across their 128 results (one kernel lane did it all).
- :func:`mlp_hidden_feature_major`: ``h = act(x W1^T + b1)`` read only by ``h W2^T`` becomes
  ``h^T = act(W1 x^T + b1[:, None])`` passed on as the view ``(h^T)^T``: the second matmul's left
  operand is K-major as stored, so it needs no TensorE transposes (GPT-2 MLP down 319 -> 282 us).
- :func:`shift_aranges`: ``arange(s, e) + c`` (position ids past a cache offset of 0, Hugging Face's
  ``kv_arange``) is ``arange(s + c, e + c)``: no add kernel, and a position embedding of it becomes a slice.
- :func:`drop_value_copies`: ``lift_fresh_copy`` / ``alias`` / ``detach`` of a value no op writes, that is not a
  graph output and keeps its layout, is that value: a tensor literal feeding a gather (a decomposition's indices)
  is read where it is, not copied by a kernel of its own first.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from neuron_compile.lowering.value_ranges import arange_args, written
from torch import fx

log = logging.getLogger(__name__)

aten = torch.ops.aten


def _arange_range(node: object) -> tuple[int, int] | None:
    """``(start, end)`` of a step-1 integer ``aten.arange`` node, else None."""
    args = arange_args(node)
    if args is None or args[2] != 1:
        return None
    return (args[0], args[1]) if node.kwargs.get("dtype") in (None, torch.int64, torch.int32) else None  # type: ignore[union-attr]


_SHIFTS = (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)


def _shifted(n: fx.Node) -> tuple[int, int] | None:
    """``(start, end)`` of the arange that ``n`` (an arange plus or minus a number) equals, else None."""
    if n.op != "call_function" or n.target not in _SHIFTS or len(n.args) != 2 or n.kwargs.get("alpha", 1) != 1:
        return None
    rng, c = _arange_range(n.args[0]), n.args[1]
    out, src = _val(n), _val(n.args[0]) if isinstance(n.args[0], fx.Node) else None
    if rng is None or not isinstance(c, int) or isinstance(c, bool) or out is None or src is None \
            or out.dtype != src.dtype:
        return None
    c = -c if n.target in (aten.sub.Tensor, aten.sub.Scalar) else c
    return rng[0] + c, rng[1] + c


def shift_aranges(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with each ``arange(s, e) +/- c`` replaced by ``arange(s +/- c, e +/- c)`` (or ``gm``)."""
    if not any(_shifted(n) is not None for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node, (start, end) in [(n, r) for n in graph.nodes if (r := _shifted(n)) is not None]:
        with graph.inserting_before(node):
            new = graph.call_function(aten.arange.start_step, (start, end, 1), dict(node.args[0].kwargs))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)


_INDEX_RESHAPES = (aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _arange_index(idx: object) -> tuple[int, int] | None:
    """``(start, end)`` when ``idx`` is a step-1 arange, or one reshaped (``position_ids.unsqueeze(0)``)."""
    while isinstance(idx, fx.Node) and idx.op == "call_function" and idx.target in _INDEX_RESHAPES:
        idx = idx.args[0]
    return _arange_range(idx)


def embedding_of_arange_to_slice(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with ``embedding(w, arange(s, e))`` replaced by ``slice(w, 0, s, e)`` (viewed to the index's
    shape when the arange was reshaped first) (or ``gm``)."""
    def matches(n: fx.Node) -> bool:
        if n.op != "call_function" or n.target != aten.embedding.default or len(n.args) < 2:
            return False
        w, rng = n.args[0], _arange_index(n.args[1])
        val = w.meta.get("val") if isinstance(w, fx.Node) else None
        reshaped = _arange_range(n.args[1]) is None  # the slice is viewed to the embedding's shape: needs it
        return rng is not None and isinstance(val, torch.Tensor) and val.dim() == 2 \
            and 0 <= rng[0] <= rng[1] <= val.shape[0] and (not reshaped or isinstance(_val(n), torch.Tensor))

    if not any(matches(n) for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for node in [n for n in graph.nodes if matches(n)]:
        start, end = _arange_index(node.args[1])  # type: ignore[misc]
        with graph.inserting_before(node):
            new = graph.call_function(aten.slice.Tensor, (node.args[0], 0, start, end, 1))
            new.meta = dict(node.meta)
            if _arange_range(node.args[1]) is None:
                weight = node.args[0].meta["val"]  # type: ignore[union-attr]
                with getattr(weight, "fake_mode", None) or contextlib.nullcontext():
                    new.meta["val"] = weight[start:end]
                new = graph.call_function(aten.view.default, (new, list(_val(node).shape)))  # type: ignore[union-attr]
                new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        log.debug("embedding(arange(%d, %d)) -> slice of rows: no iota and no gather kernel", start, end)
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)


# -- full reductions in two stages ---------------------------------------------------------------------

SPLIT_REDUCTION_MIN = 2048  # elements: smaller full reductions stay one kernel on one partition
# a full reduction's overloads -> (its per-row form, reducing dim 1 of the [128, N / 128] view, that form's dim
# argument, its whole-tensor form)
_ALL, _ANY = (aten.all.dim, 1, aten.all.default), (aten.any.dim, 1, aten.any.default)
_FULL_REDUCTIONS = {aten.all.default: _ALL, aten.all.dim: _ALL, aten.all.dims: _ALL,
                    aten.any.default: _ANY, aten.any.dim: _ANY, aten.any.dims: _ANY,
                    aten.amax.default: (aten.amax.default, [1], aten.amax.default),
                    aten.amin.default: (aten.amin.default, [1], aten.amin.default)}


def _full_reduction_input(n: fx.Node) -> torch.Tensor | None:
    """The input value of an exact full reduction worth splitting (every dim reduced to a 0-d result, a contiguous
    input of >= SPLIT_REDUCTION_MIN elements, a multiple of 128), or None."""
    if n.op != "call_function" or n.target not in _FULL_REDUCTIONS or not isinstance(n.args[0], fx.Node):
        return None
    val, out = n.args[0].meta.get("val"), n.meta.get("val")  # every dim reduced: a 0-d result
    if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dim() != 0 \
            or val.numel() < SPLIT_REDUCTION_MIN or val.numel() % 128 or not val.is_contiguous():
        return None
    return val


_VALUE_COPIES = (aten.lift_fresh_copy.default, aten.alias.default, aten.detach.default)


def _same_value(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target not in _VALUE_COPIES or not isinstance(node.args[0], fx.Node):
        return False
    src, out = _val(node.args[0]), _val(node)
    outputs = next(n for n in reversed(node.graph.nodes) if n.op == "output")
    return src is not None and out is not None and src.dtype == out.dtype and src.shape == out.shape \
        and src.stride() == out.stride() and node not in outputs.all_input_nodes \
        and not written(node) and not written(node.args[0])


def drop_value_copies(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with each copy that only renames a value replaced by the value (or ``gm``): a copy that
    is a graph output (its caller owns a fresh tensor), or whose source or result some op writes in place, stays."""
    if not any(_same_value(n) for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in [n for n in graph.nodes if _same_value(n)]:
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
    return fx.GraphModule(gm, graph)


def split_full_reductions(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with exact full reductions (all, any, amax, amin of a whole tensor) done in two stages (or
    ``gm``): ``r(x.view(128, -1), dim=1)`` puts the elements on 128 partitions (each reducing its row), then ``r`` of
    those 128 values. As one stage the kernel lays the whole tensor along one partition's free axis, one engine lane
    doing all the work: an Embedding's index check (``all(0 <= idx < rows)``) of GPT-2's 4096 tokens took 42.9 us.
    Min, max, and, or are exact in any order, so the value is the same."""
    if not any(_full_reduction_input(n) is not None for n in gm.graph.nodes):
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    todo = [(n, val) for n in graph.nodes if (val := _full_reduction_input(n)) is not None]
    for node, val in todo:
        per_row, dim, whole = _FULL_REDUCTIONS[node.target]
        with graph.inserting_before(node):
            rows = graph.call_function(aten.view.default, (node.args[0], [128, val.numel() // 128]))
            part = graph.call_function(per_row, (rows, dim))
            last = graph.call_function(whole, (part,))
        with getattr(val, "fake_mode", None) or contextlib.nullcontext():
            rows.meta["val"] = val.view(128, -1)
            part.meta["val"] = per_row(rows.meta["val"], dim)
        last.meta = dict(node.meta)
        node.replace_all_uses_with(last)
        graph.erase_node(node)
        log.debug("%s of %d elements: 128 partitions, then across them", node.target, val.numel())
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)


# -- feature-major hidden activations ----------------------------------------------------------------

_ELEMENTWISE_UNARY = frozenset((aten.gelu.default, aten.relu.default, aten.silu.default, aten.tanh.default,
                                aten.sigmoid.default))
_ELEMENTWISE_BINARY = frozenset((aten.add.Tensor, aten.mul.Tensor))
_RESHAPES = frozenset((aten.view.default, aten._unsafe_view.default, aten.reshape.default))
MIN_FEATURE_MAJOR_ROWS = 512  # smaller products keep the row-major layout (nothing to win)


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _hidden_chain(mm: fx.Node) -> tuple[list[fx.Node], fx.Node] | None:
    """The single-user chain ``mm -> (reshape | +bias | *bias | unary)* -> mm2(., W)`` (elementwise ops and
    leading-dim reshapes only, every bias of shape [N] or [1, N]) and the consumer ``mm2``; else None."""
    out = _val(mm)
    if out is None or out.dim() != 2:
        return None
    m, n = out.shape
    chain: list[fx.Node] = []
    cur = mm
    while True:
        users = list(cur.users)
        if len(users) != 1 or users[0].op != "call_function":
            return None
        u = users[0]
        uval = _val(u)
        if u.target == aten.mm.default and u.args[0] is cur and len(u.args) == 2 and u.args[1] is not cur:
            return (chain, u) if chain and _val(cur) is not None and tuple(_val(cur).shape) == (m, n) else None
        if uval is None or uval.dtype != out.dtype or uval.numel() != m * n or uval.shape[-1] != n:
            return None
        if u.target in _RESHAPES:
            pass
        elif u.target in _ELEMENTWISE_UNARY:
            if u.args[0] is not cur or (u.target == aten.gelu.default and len(u.args) > 1) or \
                    set(u.kwargs) - {"approximate"}:
                return None
        elif u.target in _ELEMENTWISE_BINARY and len(u.args) == 2 and not u.kwargs:
            other = u.args[1] if u.args[0] is cur else u.args[0]
            oval = _val(other)
            if other is cur or not (isinstance(other, (int, float)) or (
                    oval is not None and tuple(oval.shape) in ((n,), (1, n)) and oval.dtype == out.dtype)):
                return None
        else:
            return None
        chain.append(u)
        cur = u


def mlp_hidden_feature_major(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` where ``h = act(x @ W^T + b)`` consumed only by another matmul ``h @ W2^T`` is computed
    as ``h^T = act(W x^T + b[:, None])`` and passed on as the view ``(h^T)^T`` (or ``gm``).

    ``h^T`` is stored features x tokens, so the second matmul reads its left operand already K-major (no
    transposes of ``h`` on TensorE), and the bias becomes a per-partition operand of the first kernel's
    epilogue. Same products and the same roundings (the accumulation order over K may differ, as between
    any two tilings). Only single-user chains of element-wise ops, [N] biases and leading-dim reshapes.
    """
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target == aten.mm.default:
            val = _val(node)
            hit = _hidden_chain(node) if val is not None and val.shape[0] >= MIN_FEATURE_MAJOR_ROWS else None
            if hit is not None:
                found.append(node)
    if not found:
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for old in found:
        mm = remap[old]
        chain, consumer = _hidden_chain(mm)  # type: ignore[misc]

        def add(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> fx.Node:
            new = graph.call_function(target, args, kwargs or {})
            vals = [(_val(a) if isinstance(a, fx.Node) else a) for a in args]
            new.meta["val"] = target(*vals, **(kwargs or {}))
            return new

        a, b = mm.args
        n = _val(mm).shape[1]
        with graph.inserting_before(consumer):
            w = b.args[0] if isinstance(b, fx.Node) and b.target == aten.t.default else add(aten.t.default, (b,))
            cur = add(aten.mm.default, (w, add(aten.t.default, (a,))))
            for op in chain:
                if op.target in _RESHAPES:
                    continue
                if op.target in _ELEMENTWISE_UNARY:
                    cur = add(op.target, (cur, *op.args[1:]), dict(op.kwargs))
                    continue
                other = op.args[1] if op.args[0] in (mm, *chain) else op.args[0]
                if isinstance(other, fx.Node):
                    other = add(aten.view.default, (other, [n, 1]))
                cur = add(op.target, (cur, other) if op.args[0] in (mm, *chain) else (other, cur))
            hidden = add(aten.t.default, (cur,))
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in chain[-1].meta:
                cur.meta[key] = hidden.meta[key] = chain[-1].meta[key]
        consumer.args = (hidden, *consumer.args[1:])
        log.debug("%s: hidden activations computed feature-major (%s), its consumer %s reads them K-major",
                  old.name, " -> ".join(str(op.target) for op in chain), consumer.name)
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)


def lift_constants(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """Tensor constants (``get_attr`` nodes: ``torch.tensor(...)`` literals, library masks) as trailing inputs.

    Returns a copy of ``gm`` whose constants are placeholders after the real inputs, and their values
    in that order (``gm`` itself when it has none). Callers pass the values after the real arguments,
    so every part of the backend (lowering, eager fallback, check mode) sees constants as inputs.
    """
    consts = [n for n in gm.graph.nodes if n.op == "get_attr"
              and isinstance(_resolve(gm, str(n.target)), torch.Tensor)]
    if not consts:
        return gm, []
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    values: list[torch.Tensor] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        remap[n] = graph.node_copy(n, lambda a: remap[a])
    taken = {str(n.target) for n in placeholders}  # a graph lifted before (its constants are _const0, ...) keeps them
    names = [name for name in (f"_const{k}" for k in range(len(taken) + len(consts))) if name not in taken]
    for n, name in zip(consts, names[:len(consts)], strict=True):
        value = _resolve(gm, str(n.target)).detach()
        ph = graph.placeholder(name)
        ph.meta = dict(n.meta)
        ph.meta["val"] = value
        ph.meta["neuron_constant"] = True  # the cache key hashes its value (cache.key.canonical_graph)
        remap[n] = ph
        values.append(value)
    for n in gm.graph.nodes:
        if n.op != "placeholder" and n not in remap:
            remap[n] = graph.node_copy(n, lambda a: remap[a])
    log.debug("lifted %d tensor constant(s) into graph inputs", len(values))
    return fx.GraphModule(gm, graph), values


def _resolve(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


_FOLD_LIMIT = 1 << 22  # elements: a larger constant is better computed on the device


def fold_scalar_ops(gm: fx.GraphModule) -> fx.GraphModule:
    """Ops of Python scalars only (no tensor input) that no lowering rule handles (or whose rule declines these
    arguments), as graph constants: their value depends on the compile-time sizes alone (``tril_indices(n, n)``,
    window functions, a fractional ``arange``). Random ops and
    uninitialized memory are left alone, and so is anything over ``_FOLD_LIMIT`` elements. Returns ``gm``
    (changed in place)."""
    from neuron_compile.lowering.registry import lookup
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._pytree import tree_leaves

    changed = False
    for node in list(gm.graph.nodes):
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        rule = lookup(op)
        if rule is not None and (rule.check is None or rule.check(node) is None):
            continue  # lowered on the device
        if torch.Tag.nondeterministic_seeded in op.tags or op._schema.name.startswith("aten::empty"):
            continue
        if any(isinstance(a, fx.Node) for a in tree_leaves((node.args, node.kwargs))):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.numel() > _FOLD_LIMIT:
            continue
        kwargs = {**node.kwargs, "device": torch.device("cpu")} if "device" in node.kwargs else node.kwargs
        try:
            with unset_fake_temporarily():  # AOTAutograd partitions under its FakeTensorMode: compute a real value
                value = op(*node.args, **kwargs)
        except Exception as e:  # leave it for the refusal, which names the op
            log.debug("%s: not folded (%s)", node.name, e)
            continue
        if value.layout != torch.strided or value._is_zerotensor():
            continue  # not a plain dense constant (a ZeroTensor has no storage to copy)
        name = f"_folded_{node.name}"
        gm.register_buffer(name, value, persistent=False)
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)
        changed = True
        log.debug("%s (%s) folded into a graph constant", node.name, op)
    if changed:
        gm.recompile()
    return gm
