"""Which graph nodes compute in exact int32, and why integer ops that can't be exact are refused.

NeuronCore Vector/Scalar arithmetic runs in fp32, which is exact for integers only up to 2**24.
``nisa.tensor_tensor`` whose tiles are all int32 runs on GpSimd with native (exact, wrapping)
integer arithmetic (REFERENCE 1.7, 3.3), so integer graph values (int64 stored as int32, int32,
and 0/1 bools promoted to ints) are computed with int32 tiles and ``tensor_tensor`` only; see
:class:`~neuron_compile.lowering.builder.ProgramBuilder`.

:func:`is_int_compute` decides a node's compute mode from its dtypes, following torch type
promotion: a float output (or any float operand) means fp32 compute, an integer output (or
integer operands of a comparison/logical op) means int32 compute. The ``*_check`` helpers are
``check=`` functions for registry rules whose integer form would be inexact.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from neuron_compile.lowering.mathlib import NARROW_INTS
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# torch converts a scalar operand to an 8/16-bit tensor's dtype before computing; these ops may take any scalar:
# ring operations (their low 8/16 bits don't depend on whether it wrapped first), and shifts, whose lowering
# converts it as torch does (lowering/ops/elementwise.py)
_WRAP_SAFE = frozenset(("add", "sub", "rsub", "mul", "bitwise_and", "bitwise_or", "bitwise_xor", "__lshift__",
                        "__rshift__", "bitwise_left_shift", "bitwise_right_shift"))
_COMPARISONS = frozenset(("eq", "ne", "lt", "le", "gt", "ge"))  # a narrow operand's scalar is wrapped when lowered
# Ops whose compute dtype is their input's, not their output's (the output is an index).
_INDEX_OUT = (aten.argmax.default, aten.argmin.default)
_CASTS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def dtype_of(a: Any) -> torch.dtype | None:
    val = a.meta.get("val") if isinstance(a, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _operands(node: fx.Node) -> list[Any]:
    out: list[Any] = []
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, (list, tuple)):
            out += [x for x in a if isinstance(x, fx.Node)]
        else:
            out.append(a)
    return out


def is_int_compute(node: fx.Node) -> bool:
    """True when ``node`` computes in exact int32 tiles (torch promotion gives an integer dtype)."""
    out = dtype_of(node)
    if node.target in _INDEX_OUT:
        src = dtype_of(node.args[0])
        return src in INTS
    if out is not None and out.is_floating_point:
        return False
    if out in INTS:
        return True
    if out is not torch.bool or node.target in _CASTS:
        return False
    # A bool result (comparison, logical op, any/all): integer compute iff the operands promote to an int.
    saw_int = False
    for a in _operands(node):
        d = dtype_of(a)
        if isinstance(a, float) or (d is not None and d.is_floating_point):
            return False
        saw_int = saw_int or d in INTS
    return saw_int


def int_refusal(op: str, dtype: torch.dtype | None, why: str, fix: str) -> str:
    """One refusal message: the op, the dtype, why it can't be exact, how to get past it."""
    return f"{op} on {dtype} is not supported: {why}; {fix}"


def int_scalars_in_range(node: fx.Node, narrow: bool = False) -> str | None:
    """A refusal when ``node`` computes in integers and one of its scalar operands (a value, a fill) is outside
    int32: NeuronCores hold integers as int32, so the constant itself can't be represented. With ``narrow`` (the
    scalar is an operand of an elementwise op) it must also fit an int8/uint8/int16 operand's own dtype: torch
    converts it to that dtype first (300 becomes 44 in ``int8 == 300``, ``clamp`` raises), where int32 keeps it."""
    if not is_int_compute(node):
        return None
    dtype = dtype_of(node)
    if dtype == torch.bool:  # a comparison: name its integer operand's dtype
        dtype = next((dtype_of(a) for a in node.args if isinstance(a, fx.Node)), dtype)
    lo, hi, name = -(2**31), 2**31 - 1, "int32"
    if narrow and dtype in NARROW_INTS and node.target.overloadpacket.__name__ in _COMPARISONS:
        return None  # the lowering converts the scalar as torch does (lowering/ops/elementwise.py, lower_compare)
    if narrow and dtype in NARROW_INTS and node.target.overloadpacket.__name__ not in _WRAP_SAFE:
        lo, hi, name = torch.iinfo(dtype).min, torch.iinfo(dtype).max, str(dtype).removeprefix("torch.")
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, (int, float)) and not isinstance(a, bool) and not lo <= a <= hi:
            if name != "int32":
                return int_refusal(str(node.target), dtype, f"the integer scalar {a} is outside {name}, which torch "
                                   f"converts it to first (wrapping it, or raising an overflow error)",
                                   f"use a constant within {name}, or cast the tensor to int32 first")
            return int_refusal(str(node.target), dtype, f"the integer scalar {a} is outside int32, the range "
                               "NeuronCores compute integers in", "keep integer constants below 2**31")
    return None


def no_int(op: str, why: str, fix: str = "cast to float first (x.float()) if fp32 rounding is acceptable"):
    """A ``check=`` refusing ``op`` whenever the node computes in integers."""

    def check(node: fx.Node) -> str | None:
        if is_int_compute(node):
            src = dtype_of(node.args[0]) if node.args else None
            return int_refusal(op, dtype_of(node) if dtype_of(node) in INTS else src, why, fix)
        return None

    return check


def _holds(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Whether every value of integer dtype ``wide`` is a value of ``narrow`` too."""
    a, b = torch.iinfo(wide), torch.iinfo(narrow)
    return b.min <= a.min and a.max <= b.max


def _wide_operands(node: fx.Node) -> tuple[torch.dtype, list[int]] | None:
    """``(compute dtype, positions)`` of an 8/16-bit elementwise op's integer operands torch narrows first."""
    from neuron_compile.lowering.registry import lookup
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    if node.op != "call_function" or not is_int_compute(node):
        return None
    rule = lookup(node.target)
    if rule is None or rule.family != "elementwise":
        return None
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in node.args]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    if not tensors or any(v.dtype.is_floating_point or v.dtype.is_complex for v in tensors):
        return None
    try:
        dtype = elementwise_dtypes(*[v for v in vals if isinstance(v, (torch.Tensor, int))],
                                   type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[0]
    except (TypeError, ValueError, RuntimeError):
        return None
    if dtype not in NARROW_INTS:
        return None
    wide = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor) and v.dtype not in (torch.bool, dtype)
            and not _holds(v.dtype, dtype)]
    return (dtype, wide) if wide else None


def convert_wide_int_operands(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` (``gm`` if nothing changes) in which an elementwise op's wider integer operands are
    converted to its int8/uint8/int16 compute dtype first.

    Only a 0-d tensor is left wider by torch's promotion (``int8 > torch.tensor(300)`` compares in int8); torch
    converts its value (300 becomes 44) before computing, where int32 tiles would keep 300. The conversion is an
    explicit ``convert_element_type`` node, which wraps as torch does."""
    todo = [(n, found) for n in gm.graph.nodes if (found := _wide_operands(n)) is not None]
    if not todo:
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for old, (dtype, wide) in todo:
        node = remap[old]
        args = list(node.args)
        for i in wide:
            with graph.inserting_before(node):
                conv = graph.call_function(torch.ops.prims.convert_element_type.default, (args[i], dtype))
            conv.meta = {"val": args[i].meta["val"].to(dtype), "stack_trace": node.meta.get("stack_trace")}
            args[i] = conv
        node.args = tuple(args)
    return fx.GraphModule(gm, graph)
