"""Constant lowerings: full/zeros/ones, arange, scalar_tensor (memset and iota tiles, fusable)."""

from __future__ import annotations

import math
from typing import Any

import torch
from neuron_compile.lowering.mathlib import NARROW_INTS, wrap_int, wrap_int_scalar
from neuron_compile.lowering.registry import register_lowering
from torch import fx

aten = torch.ops.aten


def as_stored(node: fx.Node, value: Any) -> float:
    """``value`` as the node's dtype holds it, converted as torch converts a Python scalar: wrapped to 8/16-bit
    integers (-5 as uint8 is 251), nonzero as True for bool (-5 is True). Used for every filled constant, so the
    fill (and an immediate operand made of it) is the stored value, not a saturating fp32 conversion of the literal."""
    val = node.meta.get("val")
    dtype = val.dtype if isinstance(val, torch.Tensor) else None
    if dtype is None or dtype.is_floating_point or dtype.is_complex or isinstance(value, float) and \
            not math.isfinite(value):
        return float(value)
    if dtype == torch.bool:
        return float(bool(value))
    if dtype in NARROW_INTS:
        return float(wrap_int_scalar(value, dtype))
    return float(value)


@register_lowering(aten.full.default, family="constant", kind="constant")
def lower_full(ctx, node, size, fill_value, **kwargs):
    """aten.full: memset of a full tile."""
    return ctx.b.fill(as_stored(node, fill_value), ctx.member_role(node))


@register_lowering(aten.scalar_tensor.default, family="constant", kind="constant")
def lower_scalar_tensor(ctx, node, value, **kwargs):
    """aten.scalar_tensor: a 0-d constant."""
    return ctx.b.fill(as_stored(node, value), ctx.member_role(node))


def _int_arange(node: fx.Node) -> str | None:
    for a in node.args:
        if isinstance(a, float) and not a.is_integer():
            return "arange with a fractional start/step is not supported"
    return None


@register_lowering(aten.arange.start_step, aten.arange.default, aten.arange.start, family="constant",
                   kind="constant", check=_int_arange)
def lower_arange(ctx, node, *args, **kwargs):
    """aten.arange with integer start/step: a GpSimd iota."""
    if node.target == aten.arange.default:
        start, step = 0, 1
    else:
        start = int(args[0])
        step = int(args[2]) if len(args) > 2 else int(kwargs.get("step", 1))
    val = ctx.iota_for(node, start, step)
    dtype = node.meta["val"].dtype
    if dtype in NARROW_INTS:  # torch computes the values in int64 and wraps them into the dtype (uint8 -1 is 255)
        last = start + step * (node.meta["val"].numel() - 1)
        info = torch.iinfo(dtype)
        if not info.min <= min(start, last) <= max(start, last) <= info.max:
            val = wrap_int(ctx.b, val, dtype)
    return val


@register_lowering(aten.full_like.default, family="constant", kind="constant")
def lower_full_like(ctx, node, x, fill_value, **kwargs):
    """aten.full_like: memset of a full tile (the input only gives the shape)."""
    return ctx.b.fill(as_stored(node, fill_value), ctx.member_role(node))
