"""Elementwise lowerings: arithmetic, transcendental, comparison, logical, select and cast ops.

Each rule computes in fp32 tiles (NeuronCore Vector/Scalar engines compute in fp32 and round on
write); broadcasting and type promotion are already explicit in the ATen graph's shapes/dtypes.

bf16/fp16 rounding policy (as Inductor's fused kernels): a low-precision value consumed only inside
its fused kernel stays fp32 (no per-op round trip); it is rounded (RNE) where it leaves the kernel
(the store DMA casts to the buffer dtype), at an explicit cast node (``.to(torch.bfloat16)``), and
where rounding changes a result's meaning: a comparison or a bool cast of a bf16/fp16 intermediate
sees the rounded value, as in eager. Values differ from eager's per-op rounding only within bf16
tolerance (an fp16 intermediate beyond 65504 stays finite until it is stored).
Nodes computing in integers (see :mod:`lowering.intmath`) get exact int32 tiles instead: add, sub,
mul, neg, abs, maximum/minimum, clamp, where/masked_fill, comparisons and logical ops are exact for
the whole int32 range (wrapping like int32); integer ops without an exact form are refused.
"""

from __future__ import annotations

import math

import torch
from neuron_compile.lowering import mathlib
from neuron_compile.lowering.builder import TileVal
from neuron_compile.lowering.dtypes import narrow_float
from neuron_compile.lowering.intmath import INTS, int_refusal, is_int_compute
from neuron_compile.lowering.mathlib import NARROW_INTS, wrap_int_scalar
from neuron_compile.lowering.ranges import lower_bound
from neuron_compile.lowering.registry import register_lowering
from torch import fx

aten = torch.ops.aten

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _dtype(node: fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _float_only(node: fx.Node) -> str | None:
    d = _dtype(node)
    if d is not None and d not in FLOATS:
        return int_refusal(str(node.target), d, "floating point only (ScalarE/VectorE compute in fp32)",
                           "cast to float first (x.float())")
    return None


def _no_int_div(node: fx.Node) -> str | None:
    d = _dtype(node)
    if d is not None and d not in FLOATS:
        return int_refusal(f"integer {node.target}", d, "NeuronCores have no exact integer divide (fp32 only)",
                           "divide float tensors (x.float() / y) and round explicitly")
    return None


def _low_precision(node: fx.Node) -> str | None:
    return narrow_float(_dtype(node))


def _finish(ctx, node: fx.Node, val):
    """An op's result: kept in fp32 inside the kernel (rounded at the store; see the module docstring)."""
    return val


def _rounded(ctx, arg: object, val):
    """``val`` as eager sees it: an in-kernel intermediate of a bf16/fp16 node rounded to that dtype.

    Loaded values are already exact in their storage dtype and are returned as they are.
    """
    low = _low_precision(arg) if isinstance(arg, fx.Node) else None
    if low is None or not isinstance(val, TileVal) or val.dtype != "float32":
        return val
    producer = producer_of(ctx.b, val)
    if producer is None or producer.opcode in ("load", "round"):
        return val
    return ctx.b.round_to(val, low)


def producer_of(b, val: TileVal):
    """The op of ``b``'s program that made the tile ``val`` (None for one made elsewhere)."""
    return next((op for op in reversed(b.ops) if op.out == val.name), None)


def _binary(op: str):
    def rule(ctx, node, a, b, *, alpha=1, **_):
        if alpha != 1:
            b = ctx.b.binary("multiply", b, float(alpha))
        return _finish(ctx, node, ctx.b.binary(op, a, b))

    rule.__doc__ = f"aten {op}: elementwise with broadcasting; scalars fold into tensor_scalar immediates."
    return rule


register_lowering(aten.add.Tensor, aten.add.Scalar, family="elementwise")(_binary("add"))
register_lowering(aten.sub.Tensor, aten.sub.Scalar, family="elementwise")(_binary("subtract"))
register_lowering(aten.mul.Tensor, aten.mul.Scalar, family="elementwise")(_binary("multiply"))
register_lowering(aten.maximum.default, family="elementwise")(_binary("maximum"))
register_lowering(aten.minimum.default, family="elementwise")(_binary("minimum"))


@register_lowering(aten.rsub.Scalar, aten.rsub.Tensor, family="elementwise")
def lower_rsub(ctx, node, a, b, *, alpha=1):
    """aten.rsub: ``b - alpha * a``."""
    if alpha != 1:
        a = ctx.b.binary("multiply", a, float(alpha))
    return _finish(ctx, node, ctx.b.binary("subtract", b, a))


@register_lowering(aten.div.Tensor, aten.div.Scalar, family="elementwise", check=_no_int_div)
def lower_div(ctx, node, a, b):
    """aten.div (true division): multiply by the VectorE reciprocal (no divide instruction on NeuronCores)."""
    return _finish(ctx, node, ctx.b.divide(a, b))


_COMPARE = {
    aten.eq.Tensor: "equal", aten.eq.Scalar: "equal", aten.ne.Tensor: "not_equal", aten.ne.Scalar: "not_equal",
    aten.lt.Tensor: "less", aten.lt.Scalar: "less", aten.le.Tensor: "less_equal", aten.le.Scalar: "less_equal",
    aten.gt.Tensor: "greater", aten.gt.Scalar: "greater", aten.ge.Tensor: "greater_equal",
    aten.ge.Scalar: "greater_equal",
}


@register_lowering(*_COMPARE, family="elementwise")
def lower_compare(ctx, node, a, b):
    """aten comparisons: 1.0/0.0 tiles (stored as bool); bf16/fp16 intermediates compared rounded; a Python int
    compared with an 8/16-bit tensor as torch converts it to that dtype first (``uint8 == -1`` is ``== 255``)."""
    b = _as_torch_converts(_dtype(node.args[0]) if isinstance(node.args[0], fx.Node) else None, b)
    a, b = _rounded(ctx, node.args[0], a), _rounded(ctx, node.args[1], b)
    return ctx.b.binary(_COMPARE[node.target], a, b)


def _truth(ctx, x):
    return ctx.b.binary("not_equal", x, 0.0) if isinstance(x, TileVal) else float(bool(x))


@register_lowering(aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default, family="elementwise")
def lower_logical(ctx, node, a, b):
    """aten.logical_and/or/xor: on 0/1 truth values."""
    op = {aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or",
          aten.logical_xor.default: "logical_xor"}[node.target]
    return ctx.b.binary(op, _truth(ctx, a), _truth(ctx, b))


@register_lowering(aten.logical_not.default, family="elementwise")
def lower_logical_not(ctx, node, a):
    """aten.logical_not: ``a == 0``."""
    return ctx.b.binary("equal", a, 0.0)


def _bitwise_check(node: fx.Node) -> str | None:
    d = _dtype(node)
    if d == torch.bool:
        return None
    if d is None or d.is_floating_point or d.is_complex:
        return f"bitwise ops of {d} tensors (torch allows them on integers and bools only)"
    return None


@register_lowering(aten.bitwise_not.default, family="elementwise", check=_bitwise_check)
def lower_bitwise_not(ctx, node, a):
    """bitwise not: logical not of bools; ``~x`` of integers as ``x ^ -1`` in int32, exact.

    NeuronCores hold integers as sign-extended int32, whose low bits are the int64 ones; narrow results wrap like
    torch."""
    if _dtype(node) == torch.bool:
        return ctx.b.binary("equal", a, 0.0)
    return ctx.b.binary("bitwise_xor", a, -1)


_BITWISE_OPS = {aten.bitwise_and.Tensor: "and", aten.bitwise_and.Scalar: "and", aten.bitwise_or.Tensor: "or",
                aten.bitwise_or.Scalar: "or", aten.bitwise_xor.Tensor: "xor", aten.bitwise_xor.Scalar: "xor"}


@register_lowering(*_BITWISE_OPS, family="elementwise", check=_bitwise_check)
def lower_bitwise(ctx, node, a, b):
    """bitwise and/or/xor: logical ops on bools, the int32 ALU ops on integers (exact).

    The result of two int32-range values stays in that range, so no int64 overflow guard is needed."""
    op = _BITWISE_OPS[node.target]
    if _dtype(node) == torch.bool:
        return ctx.b.binary(f"logical_{op}", a, b)
    return ctx.b.binary(f"bitwise_{op}", a, b)


_LSHIFT = (aten.__lshift__.Scalar, aten.__lshift__.Tensor, aten.bitwise_left_shift.Tensor,
           aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor)
_RSHIFT = (aten.__rshift__.Scalar, aten.__rshift__.Tensor, aten.bitwise_right_shift.Tensor,
           aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor)


def _as_torch_converts(d: torch.dtype | None, v: object) -> object:
    """A Python int operand of an 8/16-bit shift or comparison as torch converts it to the tensor's dtype ``d``
    (300 -> 44 in int8, -1 -> 255 in uint8)."""
    if not isinstance(v, int) or isinstance(v, bool) or d not in NARROW_INTS:
        return v
    return wrap_int_scalar(v, d)


def _shift_check(node: fx.Node) -> str | None:
    d = _dtype(node)
    if d is None or d not in INTS:
        return f"shifts of {d} tensors (torch shifts integers only)"
    return None


def _shift_amount(b, s, lo: int, hi: int):  # type: ignore[no-untyped-def]
    """The shift clamped to [lo, hi] (an int32 tile, or a Python int)."""
    if not isinstance(s, TileVal):
        return min(max(int(s), lo), hi)
    return b.binary("minimum", b.binary("maximum", s, lo), hi)


@register_lowering(*_LSHIFT, family="elementwise", check=_shift_check)
def lower_left_shift(ctx, node, x, s):
    """``x << s`` as torch computes it: ``x * 2**s`` wrapped to the result's width, 0 for a shift below 0 or of the
    width or more. int32's ALU left_shift (s clamped to 0..31, the rest selected to 0); narrow results wrap like
    torch (the emitter); int64 results outside int32 raise (lowering.intguard, whose fp32 replay of this rule is
    ``x * 2**s``)."""
    b = ctx.b
    width = torch.iinfo(_dtype(node)).bits
    x, s = _as_torch_converts(_dtype(node), x), _as_torch_converts(_dtype(node), s)
    if not isinstance(x, TileVal):  # a Python int shifted by a tensor
        x = b.fill(x, s.kind)
    if not isinstance(s, TileVal):
        if not 0 <= int(s) < width:
            return b.binary("multiply", x, 0)
        return b.binary("left_shift", x, int(s)) if b.int_mode else b.binary("multiply", x, float(2 ** int(s)))
    valid = b.binary("logical_and", b.binary("greater_equal", s, 0), b.binary("less", s, width))
    if b.int_mode:
        return b.select(valid, b.binary("left_shift", x, _shift_amount(b, s, 0, 31)), 0)
    power = b.activation("exp", _shift_amount(b, s, 0, 127), scale=math.log(2.0))  # the replay: x * 2**s
    return b.select(valid, b.binary("multiply", x, power), 0.0)


@register_lowering(*_RSHIFT, family="elementwise", check=_shift_check)
def lower_right_shift(ctx, node, x, s):
    """``x >> s``: torch's arithmetic shift, floor(x / 2**s), the sign for a shift below 0 or of the width or more.

    The ALU shifts logically, so a negative x shifts its complement: ``~(~x >> s)``. Values live as int32, so a shift
    of 31 already gives the sign (0 for unsigned values)."""
    b = ctx.b
    x, s = _as_torch_converts(_dtype(node), x), _as_torch_converts(_dtype(node), s)
    if not isinstance(x, TileVal):  # a Python int shifted by a tensor
        x = b.fill(x, s.kind)
    if isinstance(s, TileVal):
        s = b.select(b.binary("less", s, 0), 31, _shift_amount(b, s, 0, 31))
    else:
        s = 31 if int(s) < 0 else min(int(s), 31)
    if _dtype(node) == torch.uint8:
        return b.binary("right_shift", x, s)
    down = b.binary("bitwise_xor", b.binary("right_shift", b.binary("bitwise_xor", x, -1), s), -1)
    return b.select(b.binary("less", x, 0), down, b.binary("right_shift", x, s))


def _act(func: str, scale: float = 1.0):
    def rule(ctx, node, x, *_, **__):
        return _finish(ctx, node, ctx.b.activation(func, x, scale=scale))

    rule.__doc__ = f"aten -> ScalarE activation {func}."
    return rule


for _op, _func in [(aten.exp.default, "exp"), (aten.sigmoid.default, "sigmoid"), (aten.tanh.default, "tanh"),
                   (aten.erf.default, "erf"), (aten.silu.default, "silu")]:
    register_lowering(_op, family="elementwise", check=_float_only)(_act(_func))


@register_lowering(aten.relu.default, aten.sign.default, family="elementwise")
def lower_relu_sign(ctx, node, x):
    """aten.relu/sign: ScalarE activation; integers exactly as max(x, 0) and (x > 0) - (x < 0)."""
    b = ctx.b
    if not b.int_mode:
        if node.target == aten.relu.default:
            return _finish(ctx, node, b.activation("relu", x))
        return _finish(ctx, node, b.select(mathlib.isnan(b, x), 0.0, b.activation("sign", x)))  # torch: sign(NaN) = 0
    if node.target == aten.relu.default:
        return b.binary("maximum", x, 0)
    return b.binary("subtract", b.binary("greater", x, 0), b.binary("less", x, 0))


@register_lowering(aten.neg.default, aten._neg_view.default, family="elementwise")
def lower_neg(ctx, node, x):
    """aten.neg (and ``_neg_view``, the lazily negated view ``z.conj().imag`` reads): ``x * -1`` on VectorE
    (integers: int32 tensor_tensor, exact)."""
    return ctx.b.binary("multiply", x, -1.0)


@register_lowering(aten.abs.default, family="elementwise")
def lower_abs(ctx, node, x):
    """aten.abs: |x| as max(x, -x) (exact)."""
    return ctx.b.binary("maximum", x, ctx.b.binary("multiply", x, -1.0))


@register_lowering(aten.log.default, family="elementwise", check=_float_only)
def lower_log(ctx, node, x):
    """aten.log: ScalarE log inside its valid range [2^-64, 2^64] (scaled by 2^+-64 beyond; 0, inf, <0 exact)."""
    return _finish(ctx, node, mathlib.log(ctx.b, ctx.b.cast(x, "float32")))


def _sqrt(ctx, node, x):
    """sqrt of ``x``: a scaled ScalarE sqrt when the argument is provably >= 2^-96 (e.g. var + eps,
    mathlib.sqrt_of_bounded), else the full-range composition (mathlib.sqrt)."""
    if not isinstance(x, TileVal):
        return math.sqrt(float(x)) if float(x) >= 0 else math.nan
    lb = lower_bound(node.args[0])
    if lb is not None and lb >= 2.0**-96:
        return mathlib.sqrt_of_bounded(ctx.b, ctx.b.cast(x, "float32"))
    return mathlib.sqrt(ctx.b, ctx.b.cast(x, "float32"))


@register_lowering(aten.sqrt.default, family="elementwise", check=_float_only)
def lower_sqrt(ctx, node, x):
    """aten.sqrt: ScalarE sqrt inside its valid range [2^-116, 2^118] (scaled beyond; 0, inf, NaN exact)."""
    return _finish(ctx, node, _sqrt(ctx, node, x))


@register_lowering(aten.rsqrt.default, family="elementwise", check=_float_only)
def lower_rsqrt(ctx, node, x):
    """aten.rsqrt: VectorE reciprocal of sqrt (the fused rsqrt activation is too coarse near 0)."""
    return _finish(ctx, node, ctx.b.reciprocal(_sqrt(ctx, node, x)))


@register_lowering(aten.reciprocal.default, family="elementwise", check=_float_only)
def lower_reciprocal(ctx, node, x):
    """aten.reciprocal: VectorE reciprocal (full fp32 precision)."""
    return _finish(ctx, node, ctx.b.reciprocal(x))


def _pow_scalar_check(node: fx.Node) -> str | None:
    """Integer powers with a non-negative int exponent are exact products; other integer powers are refused."""
    e = node.args[1] if len(node.args) > 1 else None
    if is_int_compute(node) and isinstance(e, int) and not isinstance(e, bool) and e >= 0:
        return None
    return _float_only(node)


def _int_power(b, x, e: int):  # type: ignore[no-untyped-def]
    """x ** e by squaring and multiplying: exact in int32, wrapping like torch's int32 (int64 results are checked by
    lowering.intguard, which replays this in fp32); in fp32 (that replay) the same products."""
    result, base = None, x
    while e:
        if e & 1:
            result = base if result is None else b.binary("multiply", result, base)
        e >>= 1
        if e:
            base = b.binary("multiply", base, base)
    return result


@register_lowering(aten.pow.Tensor_Scalar, family="elementwise", check=_pow_scalar_check)
def lower_pow_scalar(ctx, node, x, exponent):
    """aten.pow(tensor, scalar): squares/cubes/roots as exact products, otherwise exp(e * log x).

    Integer tensors to a non-negative int power by squaring (exact)."""
    b = ctx.b
    if is_int_compute(node):
        return b.fill(1, x.kind) if exponent == 0 else _int_power(b, x, int(exponent))
    e = float(exponent)
    if e == 0.0:
        return b.fill(1.0, x.kind)
    if e == 1.0:
        return x
    if e == 2.0:
        return _finish(ctx, node, b.binary("multiply", x, x))
    if e == 3.0:
        return _finish(ctx, node, b.binary("multiply", b.binary("multiply", x, x), x))
    if e == 0.5:
        return _finish(ctx, node, mathlib.sqrt(b, b.cast(x, "float32")))
    if e == -0.5:
        return _finish(ctx, node, b.reciprocal(mathlib.sqrt(b, b.cast(x, "float32"))))
    if e == -1.0:
        return _finish(ctx, node, b.reciprocal(x))
    return _finish(ctx, node, b.binary("power", x, e))


@register_lowering(aten.pow.Tensor_Tensor, family="elementwise", check=_float_only)
def lower_pow_tensor(ctx, node, x, e):
    """aten.pow(tensor, tensor): ALU power."""
    return _finish(ctx, node, ctx.b.binary("power", x, e))


@register_lowering(aten.pow.Scalar, family="elementwise", check=_float_only)
def lower_pow_base(ctx, node, base, e):
    """aten.pow(scalar, tensor): exp(e * ln(base))."""
    return _finish(ctx, node, ctx.b.activation("exp", e, scale=math.log(float(base))))


@register_lowering(aten.sin.default, aten.cos.default, family="elementwise", check=_float_only)
def lower_sin_cos(ctx, node, x):
    """aten.sin/cos: Cody-Waite reduction to [-pi, pi] (ScalarE sin is only valid there), then ScalarE sin.

    NaN for +-inf; arguments past the exact reduction (2**24 * 2 pi) are marked and raise (graph emitter)."""
    fn = mathlib.cos if node.target == aten.cos.default else mathlib.sin
    return _finish(ctx, node, fn(ctx.b, ctx.b.cast(x, "float32"), inf_is_nan=True))


@register_lowering(aten.gelu.default, family="elementwise", check=_float_only)
def lower_gelu(ctx, node, x, approximate="none"):
    """aten.gelu: ScalarE gelu (erf form) or gelu_apprx_tanh (approximate='tanh')."""
    func = "gelu_apprx_tanh" if approximate == "tanh" else "gelu"
    return _finish(ctx, node, ctx.b.activation(func, x))


@register_lowering(aten.softplus.default, family="elementwise", check=_float_only)
def lower_softplus(ctx, node, x, beta=1, threshold=20):
    """aten.softplus: log(1 + exp(beta x)) / beta, linear above ``threshold`` as torch."""
    b = ctx.b
    bx = b.binary("multiply", x, float(beta))
    soft = b.binary("multiply", b.activation("softplus", bx), 1.0 / float(beta))
    return _finish(ctx, node, b.select(b.binary("greater", bx, float(threshold)), x, soft))


@register_lowering(aten.clamp.default, family="elementwise")
def lower_clamp(ctx, node, x, min=None, max=None):
    """aten.clamp with scalar bounds: max then min in one tensor_scalar."""
    out = x
    if min is not None:
        out = ctx.b.binary("maximum", out, float(min))
    if max is not None:
        out = ctx.b.binary("minimum", out, float(max))
    return out


@register_lowering(aten.clamp.Tensor, family="elementwise")
def lower_clamp_tensor(ctx, node, x, min=None, max=None):
    """aten.clamp with tensor bounds."""
    out = x
    if min is not None:
        out = ctx.b.binary("maximum", out, min)
    if max is not None:
        out = ctx.b.binary("minimum", out, max)
    return out


@register_lowering(aten.where.self, family="elementwise")
def lower_where(ctx, node, cond, a, b):
    """aten.where: predicated copy (exact for inf/nan operands)."""
    if not isinstance(cond, TileVal):
        return a if cond else b
    if not isinstance(a, TileVal) and not isinstance(b, TileVal):
        b = ctx.b.fill(float(b), cond.kind)
    return ctx.b.select(cond, a, b)


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor, family="elementwise")
def lower_masked_fill(ctx, node, x, mask, value):
    """aten.masked_fill: where(mask, value, x)."""
    return ctx.b.select(mask, value, x)


@register_lowering(aten._to_copy.default, torch.ops.prims.convert_element_type.default, family="elementwise")
def lower_to_copy(ctx, node, x, *args, **kwargs):
    """aten._to_copy (dtype casts): a cast to bf16/fp16 rounds (RNE) in the kernel, as the user asked.

    Integer results keep exact int32 tiles (int64 <-> int32, bool -> int); float -> int truncates toward
    zero first as torch does (NeuronCore casts round); int -> float rounds RNE in fp32 as eager does; a
    bool cast tests the (rounded) source value; 8/16-bit results wrap (LoopGroupEmitter)."""
    if _dtype(node) == torch.bool:
        return ctx.b.binary("not_equal", _rounded(ctx, node.args[0], x), 0.0)
    if is_int_compute(node) or _dtype(node) in INTS:
        if isinstance(x, TileVal) and x.dtype == "float32":
            mode, ctx.b.int_mode = ctx.b.int_mode, False
            x = _rounded(ctx, node.args[0], x)  # a bf16 intermediate truncates as the bf16 value eager holds
            x = ctx.b.cast(mathlib.trunc(ctx.b, x), "int32")
            ctx.b.int_mode = mode
        elif not isinstance(x, TileVal):
            return int(float(x))
        return ctx.b.coerce(x)
    low = _low_precision(node)
    x = ctx.b.coerce(_rounded(ctx, node.args[0], x))
    return ctx.b.round_to(x, low) if low and isinstance(x, TileVal) else x


@register_lowering(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
                   aten.resolve_neg.default, aten.resolve_conj.default, family="elementwise")
def lower_clone(ctx, node, x, *args, **kwargs):
    """aten.clone/alias/detach/resolve_neg/resolve_conj: the value itself (materialized only if used outside the
    kernel)."""
    return x
