"""Reduction lowerings: sum, mean, amax/amin, prod, any/all, argmax/argmin, var.

A reduction reduces the kernel's ``red`` dims of a full tile into a row (``[P, 1]``) with
``tensor_reduce`` per free-dim chunk, accumulated in fp32 across chunks. Elementwise producers fuse
in front (prologue) and consumers of the row fuse behind it (softmax, norms).

Integer sum/amax/amin/any/all/argmax/argmin reduce int32 tiles exactly (a log-step tree of GpSimd
``tensor_tensor`` ops per chunk, int32 accumulation across chunks; see ``ProgramBuilder.reduce``);
integer prod is refused (no exact form, and int64 products overflow int32 storage).
"""

from __future__ import annotations

import math

import torch
from neuron_compile.lowering.intmath import dtype_of, int_refusal, is_int_compute
from neuron_compile.lowering.ops.elementwise import _rounded
from neuron_compile.lowering.partition import node_shape, reduce_dims_of
from neuron_compile.lowering.registry import register_lowering
from torch import fx

aten = torch.ops.aten


def _count(node: fx.Node) -> int:
    shape = node_shape(node.args[0])
    dims = reduce_dims_of(node) or ()
    return math.prod(shape[d] for d in dims) if shape else 1


def _sum_check(node: fx.Node) -> str | None:
    out = dtype_of(node)
    if out in (torch.int8, torch.int16, torch.uint8):
        return int_refusal("aten.sum", out, "int32 accumulation is stored with a saturating cast, torch wraps",
                           "sum with dtype=torch.int64 (the default for integer inputs)")
    return None


@register_lowering(aten.sum.dim_IntList, aten.sum.default, family="reduction", kind="reduction", check=_sum_check)
def lower_sum(ctx, node, x, *args, **kwargs):
    """aten.sum over any dims (keepdim or not): fp32 accumulation (integers: exact int32)."""
    return ctx.b.reduce("add", x)


@register_lowering(aten.mean.dim, aten.mean.default, family="reduction", kind="reduction")
def lower_mean(ctx, node, x, *args, **kwargs):
    """aten.mean: sum times 1/count."""
    return ctx.b.binary("multiply", ctx.b.reduce("add", x), 1.0 / _count(node))


@register_lowering(aten.amax.default, family="reduction", kind="reduction")
def lower_amax(ctx, node, x, *args, **kwargs):
    """aten.amax over dims."""
    return ctx.b.reduce("maximum", x)


@register_lowering(aten.amin.default, family="reduction", kind="reduction")
def lower_amin(ctx, node, x, *args, **kwargs):
    """aten.amin over dims."""
    return ctx.b.reduce("minimum", x)


def _prod_check(node: fx.Node) -> str | None:
    if is_int_compute(node):
        return int_refusal("aten.prod", dtype_of(node.args[0]), "there is no exact integer product reduction "
                           "(tensor_reduce runs in fp32) and int64 products overflow int32 storage",
                           "take the product in float (x.double().prod() eagerly, or x.float().prod())")
    return None


@register_lowering(aten.prod.dim_int, aten.prod.default, family="reduction", kind="reduction", check=_prod_check)
def lower_prod(ctx, node, x, *args, **kwargs):
    """aten.prod over one dim (or all)."""
    return ctx.b.reduce("multiply", x)


@register_lowering(aten.any.dim, aten.any.dims, aten.any.default, family="reduction", kind="reduction")
def lower_any(ctx, node, x, *args, **kwargs):
    """aten.any: max of (x != 0)."""
    return ctx.b.reduce("maximum", ctx.b.binary("not_equal", x, 0.0))


@register_lowering(aten.all.dim, aten.all.dims, aten.all.default, family="reduction", kind="reduction")
def lower_all(ctx, node, x, *args, **kwargs):
    """aten.all: min of (x != 0)."""
    return ctx.b.reduce("minimum", ctx.b.binary("not_equal", x, 0.0))


@register_lowering(aten.var.correction, family="reduction", kind="reduction")
def lower_var(ctx, node, x, dims=None, *, correction=1, keepdim=False):
    """aten.var: two passes over SBUF-resident rows (mean, then mean of squared deviations)."""
    n = _count(node)
    b = ctx.b
    mean = b.binary("multiply", b.reduce("add", x), 1.0 / n)
    dev = b.binary("subtract", x, mean)
    ss = b.reduce("add", b.binary("multiply", dev, dev))
    corr = 1.0 if correction is None else float(correction)
    return b.binary("multiply", ss, 1.0 / max(n - corr, 0) if n - corr > 0 else math.inf)


def _arg_check(node: fx.Node) -> str | None:
    if _count(node) > 2**24:
        return (f"{node.target} along a dim of {_count(node)} elements is not supported: indices are "
                f"computed with an fp32 iota, exact up to 2**24")
    return None


def _arg_reduce(ctx, node, x, op: str):
    """First index of the max/min along the free dim: min over (x == best ? index : big).

    Integer inputs: the max/min, the compare and the index reduction are exact int32 ops. A bf16/fp16
    value computed in the kernel is rounded first, so ties resolve as in eager."""
    b = ctx.b
    x = _rounded(ctx, node.args[0], x)
    if b.int_mode:
        best = b.reduce(op, x)
        hit = b.binary("equal", x, best)
    else:  # torch: a NaN is the max and the min; its first index wins
        nan = b.binary("not_equal", x, x)
        clean = b.select(nan, -math.inf if op == "maximum" else math.inf, x)
        best = b.reduce(op, clean)
        hit = b.select(b.reduce("maximum", nan), nan, b.binary("equal", clean, best))
    idx = ctx.iota_along_reduced(node)
    big = float(2**24)
    cand = b.select(hit, idx, big)
    return b.reduce("minimum", cand)


@register_lowering(aten.argmax.default, family="reduction", kind="reduction", check=_arg_check)
def lower_argmax(ctx, node, x, dim=None, keepdim=False):
    """aten.argmax along one dim: the first index of the maximum (as torch)."""
    return _arg_reduce(ctx, node, x, "maximum")


@register_lowering(aten.argmin.default, family="reduction", kind="reduction", check=_arg_check)
def lower_argmin(ctx, node, x, dim=None, keepdim=False):
    """aten.argmin along one dim: the first index of the minimum (as torch)."""
    return _arg_reduce(ctx, node, x, "minimum")
