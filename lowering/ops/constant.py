"""Constant lowerings: full/zeros/ones, arange, scalar_tensor (memset and iota tiles, fusable)."""

from __future__ import annotations

import torch
from neuron_compile.lowering.registry import register_lowering
from torch import fx

aten = torch.ops.aten


@register_lowering(aten.full.default, family="constant", kind="constant")
def lower_full(ctx, node, size, fill_value, **kwargs):
    """aten.full: memset of a full tile."""
    return ctx.b.fill(float(fill_value), ctx.member_role(node))


@register_lowering(aten.scalar_tensor.default, family="constant", kind="constant")
def lower_scalar_tensor(ctx, node, value, **kwargs):
    """aten.scalar_tensor: a 0-d constant."""
    return ctx.b.fill(float(value), ctx.member_role(node))


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
    return ctx.iota_for(node, start, step)


@register_lowering(aten.full_like.default, family="constant", kind="constant")
def lower_full_like(ctx, node, x, fill_value, **kwargs):
    """aten.full_like: memset of a full tile (the input only gives the shape)."""
    return ctx.b.fill(float(fill_value), ctx.member_role(node))
