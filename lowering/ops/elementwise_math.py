"""Elementwise math beyond the activation table: rounding, classification, inverse trig/hyperbolic,
log/exp variants, special functions, float and integer division modes.

Each rule composes exact (or few-ulp) sequences of primitive tile ops from :mod:`lowering.mathlib`;
integer inputs of rounding ops are returned as they are, integer division/remainder is exact over
int32 (an fp32 quotient estimate corrected twice with exact int32 products).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from neuron_compile.lowering import mathlib as m
from neuron_compile.lowering import mathlib_bessel as mb
from neuron_compile.lowering.builder import ProgramBuilder, TileVal
from neuron_compile.lowering.intmath import dtype_of, int_refusal, is_int_compute
from neuron_compile.lowering.ops.elementwise import _rounded, producer_of
from neuron_compile.lowering.registry import register_lowering
from torch import fx

aten = torch.ops.aten
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _float_out(node: fx.Node) -> str | None:
    d = dtype_of(node)
    if d is not None and d not in FLOATS and d is not torch.bool:
        return int_refusal(str(node.target), d, "floating point only", "cast to float first (x.float())")
    return None


def _tile(b: ProgramBuilder, x: Any, like: Any = None) -> TileVal:
    """A scalar operand as an fp32 tile (the math helpers take tiles)."""
    if isinstance(x, TileVal):
        return b.cast(x, "float32")
    kind = like.kind if isinstance(like, TileVal) else "full"
    return b.fill(float(x), kind)


def _unary(fn: Any, doc: str) -> Any:
    def rule(ctx: Any, node: fx.Node, x: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(ctx.b, _tile(ctx.b, x))

    rule.__doc__ = doc
    return rule


for _op, _fn, _doc in [
    (aten.log1p.default, m.log1p, "aten.log1p: log(u) * x / (u - 1), u = 1 + x (exact to a few ulp, no cancellation)."),
    (aten.expm1.default, m.expm1, "aten.expm1: (u - 1) * x / log(u), u = e^x (Kahan; no cancellation near 0)."),
    (aten.atan.default, m.atan, "aten.atan: ScalarE arctan on [0, 1] and pi/2 - atan(1/|x|) beyond."),
    (aten.asin.default, m.asin, "aten.asin: atan(x / sqrt((1 - x)(1 + x)))."),
    (aten.acos.default, m.acos, "aten.acos: 2 atan(sqrt((1 - x) / (1 + x)))."),
    (aten.tan.default, m.tan, "aten.tan: sin / cos, each range-reduced to [-pi, pi]."),
    (aten.sinh.default, m.sinh, "aten.sinh: from expm1 (small |x|) or (e^(|x|/2) / 2) e^(|x|/2) (large)."),
    (aten.cosh.default, m.cosh, "aten.cosh: (e^|x| + e^-|x|) / 2, or (e^(|x|/2) / 2) e^(|x|/2) for large |x|."),
    (aten.asinh.default, m.asinh, "aten.asinh: log1p(a + a^2 / (1 + sqrt(1 + a^2))), log(2a) for huge a."),
    (aten.acosh.default, m.acosh, "aten.acosh: log1p(t + sqrt(2t + t^2)), t = x - 1; log(2x) for huge x."),
    (aten.atanh.default, m.atanh, "aten.atanh: log1p(2a / (1 - a)) / 2."),
    (aten.erfinv.default, m.erfinv, "aten.erfinv: Winitzki's guess refined by three Halley steps on ScalarE erf."),
    (aten.lgamma.default, m.lgamma, "aten.lgamma: shift past 8, Stirling series; reflection below 1/2."),
    (aten.digamma.default, m.digamma, "aten.digamma: shift past 8, asymptotic series; reflection below 1/2."),
]:
    register_lowering(_op, family="elementwise", check=_float_out)(_unary(_fn, _doc))


@register_lowering(aten.log2.default, aten.log10.default, family="elementwise", check=_float_out)
def lower_log_base(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.log2/log10: full-range natural log times 1/ln(base)."""
    base = 2.0 if node.target == aten.log2.default else 10.0
    return ctx.b.binary("multiply", m.log(ctx.b, _tile(ctx.b, x)), 1.0 / math.log(base))


@register_lowering(aten.exp2.default, family="elementwise", check=_float_out)
def lower_exp2(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.exp2: ScalarE exp(x ln 2)."""
    return m.exp(ctx.b, _tile(ctx.b, x), scale=math.log(2.0))


@register_lowering(aten.erfc.default, family="elementwise", check=_float_out)
def lower_erfc(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.erfc: 1 - erf below 1, Laplace's continued fraction (no cancellation) above."""
    return m.erfc(ctx.b, _tile(ctx.b, x))


for _op, _fn, _doc in [
    (aten.special_erfcx.default, m.erfcx, "aten.special_erfcx: e^(x^2) erfc(x), 1 / (sqrt(pi) t) for x >= 1."),
    (aten.special_ndtri.default, m.ndtri, "aten.special_ndtri: sqrt(2) erfinv(2p - 1) with exact tails."),
    (aten.special_log_ndtr.default, m.log_ndtr, "aten.special_log_ndtr: log(erfc(-x / sqrt 2) / 2), log form in the tail."),
]:
    register_lowering(_op, family="elementwise", check=_float_out)(_unary(_fn, _doc))


@register_lowering(aten.special_i0e.default, aten.i0.default, aten.special_i1.default, aten.special_i1e.default,
                   family="elementwise", check=_float_out)
def lower_bessel_i(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.i0/special_i0e/i1/i1e: power series up to |x| = 20, the asymptotic expansion beyond."""
    order = 1 if node.target in (aten.special_i1.default, aten.special_i1e.default) else 0
    scaled = node.target in (aten.special_i0e.default, aten.special_i1e.default)
    return m.bessel_i(ctx.b, _tile(ctx.b, x), order, scaled)


_BESSEL = {
    aten.special_bessel_j0.default: lambda b, x: mb.bessel_j(b, x, 0),
    aten.special_bessel_j1.default: lambda b, x: mb.bessel_j(b, x, 1),
    aten.special_bessel_y0.default: lambda b, x: mb.bessel_y(b, x, 0),
    aten.special_bessel_y1.default: lambda b, x: mb.bessel_y(b, x, 1),
    aten.special_modified_bessel_k0.default: lambda b, x: mb.bessel_k(b, x, 0, False),
    aten.special_modified_bessel_k1.default: lambda b, x: mb.bessel_k(b, x, 1, False),
    aten.special_scaled_modified_bessel_k0.default: lambda b, x: mb.bessel_k(b, x, 0, True),
    aten.special_scaled_modified_bessel_k1.default: lambda b, x: mb.bessel_k(b, x, 1, True),
    aten.special_airy_ai.default: mb.airy_ai,
}


def _bessel_check(node: fx.Node) -> str | None:
    d = dtype_of(node)
    if d in (torch.bfloat16, torch.float16):  # eager raises NotImplementedError for these dtypes
        return f"eager has no {str(d).removeprefix('torch.')} kernel for this function; cast the input to float32"
    return _float_out(node)


@register_lowering(*_BESSEL, family="elementwise", check=_bessel_check)
def lower_bessel_jyk_airy(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.special_bessel_j0/j1/y0/y1, (scaled_)modified_bessel_k0/k1, airy_ai: Chebyshev expansions per range."""
    return _BESSEL[node.target](ctx.b, _tile(ctx.b, x))


@register_lowering(aten.polygamma.default, family="elementwise", check=_float_out)
def lower_polygamma(ctx: Any, node: fx.Node, n: int, x: Any) -> Any:
    """aten.polygamma(n, x): digamma for n = 0, else (-1)^(n+1) n! zeta(n + 1, x) (Euler-Maclaurin)."""
    return m.polygamma(ctx.b, int(n), _tile(ctx.b, x))


@register_lowering(aten.special_zeta.default, family="elementwise", check=_float_out)
def lower_zeta(ctx: Any, node: fx.Node, x: Any, q: Any) -> Any:
    """aten.special_zeta(x, q): Hurwitz zeta, nine terms and the Euler-Maclaurin tail."""
    b = ctx.b
    return m.zeta(b, _tile(b, x, q), _tile(b, q, x))


# -- rounding --------------------------------------------------------------------------------------


def _held(ctx: Any, node: fx.Node, *vals: Any) -> list[Any]:
    """The operands as eager holds them: a bf16/fp16 intermediate computed in the kernel (fp32 tiles) rounded to its
    dtype first, so a step function (floor, fmod, ...) steps where eager's does (floor(2.9995) is 2, of its bf16
    value 3)."""
    return [_rounded(ctx, a, v) for a, v in zip(node.args, vals, strict=False)]


def _rounding(fn: Any, doc: str) -> Any:
    def rule(ctx: Any, node: fx.Node, x: Any, *args: Any, **kwargs: Any) -> Any:
        if is_int_compute(node):
            return x  # integers are their own floor/ceil/round
        (x,) = _held(ctx, node, x)
        return fn(ctx.b, ctx.b.cast(x, "float32"))  # a constant operand comes as a fill tile (the emitter's rule)

    rule.__doc__ = doc
    return rule


register_lowering(aten.floor.default, family="elementwise")(
    _rounding(m.floor, "aten.floor: round half to even by (x + 2^23) - 2^23, minus 1 where that rounded up."))
register_lowering(aten.ceil.default, family="elementwise")(
    _rounding(m.ceil, "aten.ceil: round half to even by (x + 2^23) - 2^23, plus 1 where that rounded down."))
register_lowering(aten.trunc.default, torch.ops.prims.trunc.default, family="elementwise")(
    _rounding(m.trunc, "aten.trunc: ceil for negatives, floor otherwise (exact)."))
register_lowering(aten.round.default, family="elementwise")(
    _rounding(m.rint, "aten.round: half to even, as torch, by (x + 2^23) - 2^23 (exact)."))


@register_lowering(aten.round.decimals, family="elementwise", check=_float_out)
def lower_round_decimals(ctx: Any, node: fx.Node, x: Any, *, decimals: int = 0) -> Any:
    """aten.round(decimals=d): round(x * 10^d) / 10^d as torch computes it (10^-d scaling for d < 0)."""
    b = ctx.b
    x = _tile(b, *_held(ctx, node, x))
    if decimals >= 0:
        scale = 10.0 ** decimals
        return b.divide(m.rint(b, b.binary("multiply", x, scale)), scale)  # type: ignore[arg-type]
    scale = 10.0 ** -decimals
    return b.binary("multiply", m.rint(b, b.divide(x, scale)), scale)  # type: ignore[arg-type]


@register_lowering(aten.frac.default, family="elementwise", check=_float_out)
def lower_frac(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.frac: x - trunc(x)."""
    x = _tile(ctx.b, *_held(ctx, node, x))
    return ctx.b.binary("subtract", x, m.trunc(ctx.b, x))


# -- classification -----------------------------------------------------------------------------------


@register_lowering(aten.isnan.default, family="elementwise")
def lower_isnan(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.isnan: x != x (integers: never NaN)."""
    if x.dtype != "float32":  # a tensor operand is always a tile (constants come as fill tiles)
        return ctx.b.fill(0.0, x.kind)
    return m.isnan(ctx.b, x)


@register_lowering(aten.isinf.default, aten.isposinf.default, aten.isneginf.default, family="elementwise")
def lower_isinf(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.isinf/isposinf/isneginf: comparisons with +-inf (integers: never infinite)."""
    b = ctx.b
    if x.dtype != "float32":
        return b.fill(0.0, x.kind)
    if node.target == aten.isposinf.default:
        return b.binary("equal", x, math.inf)
    if node.target == aten.isneginf.default:
        return b.binary("equal", x, -math.inf)
    return b.binary("equal", m.absval(b, x), math.inf)


@register_lowering(aten.isfinite.default, family="elementwise")
def lower_isfinite(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.isfinite: |x| < inf (false for NaN)."""
    if x.dtype != "float32":
        return ctx.b.fill(1.0, x.kind)
    return ctx.b.binary("less", m.absval(ctx.b, x), math.inf)


def _sign_bit(ctx: Any, arg: Any, x: Any) -> TileVal:
    """1.0 where eager's value of ``arg`` has its sign bit set (``mathlib.signbit``: -0.0 and -nan included). A
    bfloat16 value an op computed has a positive NaN in eager (c10 narrows every NaN result to 0x7FC0); a loaded
    one keeps its bits."""
    b = ctx.b
    s = m.signbit(b, _tile(b, x))
    producer = producer_of(b, x) if isinstance(x, TileVal) else None
    if isinstance(arg, fx.Node) and dtype_of(arg) == torch.bfloat16 and producer is not None \
            and producer.opcode != "load":
        s = b.binary("logical_and", s, b.binary("equal", x, x))
    return s


@register_lowering(aten.signbit.default, family="elementwise")
def lower_signbit(ctx: Any, node: fx.Node, x: Any) -> Any:
    """aten.signbit: the sign bit, set for negative values, -0.0 and negative NaNs."""
    b = ctx.b
    if is_int_compute(node.args[0]) or (isinstance(x, TileVal) and x.dtype != "float32"):
        b.int_mode = True
        return b.binary("less", x, 0)
    return _sign_bit(ctx, node.args[0], x)


@register_lowering(aten.nan_to_num.default, family="elementwise")
def lower_nan_to_num(ctx: Any, node: fx.Node, x: Any, nan: Any = None, posinf: Any = None, neginf: Any = None) -> Any:
    """aten.nan_to_num: selects replacing NaN, +inf and -inf (defaults: 0 and the dtype's extremes)."""
    if not isinstance(x, TileVal) or x.dtype != "float32":
        return x
    b = ctx.b
    info = torch.finfo(dtype_of(node) or torch.float32)
    if dtype_of(node) == torch.float64:
        info = torch.finfo(torch.float32)  # float64 runs as float32
    out = b.select(m.isnan(b, x), 0.0 if nan is None else float(nan), x)
    out = b.select(b.binary("equal", x, math.inf), info.max if posinf is None else float(posinf), out)
    return b.select(b.binary("equal", x, -math.inf), info.min if neginf is None else float(neginf), out)


# -- two-operand float functions ---------------------------------------------------------------------


@register_lowering(aten.atan2.default, family="elementwise", check=_float_out)
def lower_atan2(ctx: Any, node: fx.Node, y: Any, x: Any) -> Any:
    """aten.atan2: octant reduction to arctan on [0, 1], C's conventions for signed zeros and infinities."""
    b = ctx.b
    return m.atan2(b, _tile(b, y, x), _tile(b, x, y))


@register_lowering(aten.hypot.default, family="elementwise", check=_float_out)
def lower_hypot(ctx: Any, node: fx.Node, x: Any, y: Any) -> Any:
    """aten.hypot: max * sqrt(1 + (min / max)^2) (no overflow), inf if either is inf."""
    b = ctx.b
    return m.hypot(b, _tile(b, x, y), _tile(b, y, x))


@register_lowering(aten.copysign.Tensor, aten.copysign.Scalar, family="elementwise", check=_float_out)
def lower_copysign(ctx: Any, node: fx.Node, x: Any, y: Any) -> Any:
    """aten.copysign: |x| with the sign bit of y (-0.0 and -nan included)."""
    b = ctx.b
    a = m.absval(b, _tile(b, x, y))
    if not isinstance(y, TileVal):  # copysign.Scalar
        return m.neg(b, a) if math.copysign(1.0, y) < 0 else a
    return b.select(_sign_bit(ctx, node.args[1], y), m.neg(b, a), a)


@register_lowering(aten.fmax.default, aten.fmin.default, family="elementwise")
def lower_fmax_fmin(ctx: Any, node: fx.Node, x: Any, y: Any) -> Any:
    """aten.fmax/fmin: maximum/minimum that ignore a NaN operand (NaN only if both are NaN)."""
    b = ctx.b
    op = "maximum" if node.target == aten.fmax.default else "minimum"
    if b.int_mode or is_int_compute(node):
        b.int_mode = True
        return b.binary(op, x, y)
    x, y = _tile(b, x, y), _tile(b, y, x)
    out = b.binary(op, x, y)
    out = b.select(m.isnan(b, x), y, out)
    return b.select(m.isnan(b, y), x, out)


# -- division modes, fmod, remainder ----------------------------------------------------------------


# Long division by 21-bit digits: the divisor is scaled by 2**k for k = 273, 252, ..., 0 (21 apart), so each step's
# quotient stays below 2**21 (exact in fp32, its product split exactly) and the reduction mod d * 2**k keeps
# fmod(a, d). 273 covers the widest fp32 ratio (2**128 over the smallest subnormal, 2**-149).
_FMOD_STEPS = tuple(range(273, -1, -21))


def _fmod_step(b: ProgramBuilder, r: TileVal, dk: TileVal) -> TileVal:
    """r mod dk for magnitudes with r < dk * 2**21: quotient estimate, exact residual, one correction (an estimate
    off by one), exact residual. Far from 1 both are scaled by a power of two first (exact), so that Dekker's
    split neither overflows nor loses bits among subnormals; r < dk (including dk = inf) keeps r."""
    big, tiny = b.binary("greater", dk, 2.0**100), b.binary("less", dk, 2.0**-100)
    s = b.select(big, 2.0**-60, b.select(tiny, b.fill(2.0**60, r.kind), b.fill(1.0, r.kind)))
    rs, ds = b.binary("multiply", r, s), b.binary("multiply", dk, s)
    q = m.trunc(b, b.divide(rs, ds))  # type: ignore[arg-type]
    r1 = _residual(b, rs, q, ds)
    q = b.select(b.binary("less", r1, 0.0), b.binary("subtract", q, 1.0), q)
    q = b.select(b.binary("greater_equal", r1, ds), b.binary("add", q, 1.0), q)
    back = b.select(big, 2.0**60, b.select(tiny, b.fill(2.0**-60, r.kind), b.fill(1.0, r.kind)))
    out = b.binary("multiply", _residual(b, rs, q, ds), back)
    return b.select(b.binary("less", r, dk), r, out)  # type: ignore[return-value]


def _float_fmod(b: ProgramBuilder, a: TileVal, d: TileVal) -> TileVal:
    """Exact fmod for fp32 over the whole range: |a| reduced modulo |d| * 2**k for k from 273 down to 0 (see
    _FMOD_STEPS), then a's sign; fmod(a, +-inf) = a, NaN for an infinite a or a zero d."""
    ad = m.absval(b, d)
    r = m.absval(b, a)
    for k in _FMOD_STEPS:
        dk = ad
        for part in (min(k, 127), min(max(k - 127, 0), 127), max(k - 254, 0)):
            if part:
                dk = b.binary("multiply", dk, 2.0**part)  # exact; inf past the range (the step keeps r)
        r = _fmod_step(b, r, dk)  # type: ignore[arg-type]
    r = b.select(m.signbit(b, a), m.neg(b, r), r)
    r = b.select(b.binary("equal", ad, math.inf), a, r)  # fmod(a, +-inf) = a for finite a
    r = b.select(b.binary("equal", m.absval(b, a), math.inf), math.nan, r)
    r = b.select(b.binary("equal", d, 0.0), math.nan, r)
    return m.keep_nan(b, d, m.keep_nan(b, a, r))


def _residual(b: ProgramBuilder, a: TileVal, q: TileVal, d: TileVal) -> TileVal:
    """a - q * d computed exactly when the true result is representable (Dekker's two-product)."""
    p = b.binary("multiply", q, d)
    qh, ql = m.split(b, q)
    dh, dl = m.split(b, d)
    err = b.binary("add", b.binary("add", b.binary("add", b.binary("subtract", b.binary("multiply", qh, dh), p),
                                                          b.binary("multiply", qh, dl)), b.binary("multiply", ql, dh)),
                   b.binary("multiply", ql, dl))
    return b.binary("subtract", b.binary("subtract", a, p), err)  # type: ignore[return-value]


def _int_divmod(b: ProgramBuilder, a: TileVal, d: TileVal, floor: bool) -> tuple[TileVal, TileVal]:
    """Exact int32 quotient (floor or trunc) and remainder: fp32 estimate, two exact corrections."""
    b.int_mode = True
    a, d = b.coerce(a), b.coerce(d)  # type: ignore[assignment]
    b.int_mode = False
    af, df = b.cast(a, "float32"), b.cast(d, "float32")
    q = b.cast(m.trunc(b, b.divide(af, df)), "int32")  # type: ignore[arg-type]
    for _ in range(2):  # the estimate can be off by up to 2^7 (fp32 holds 24 bits of a 31-bit a)
        b.int_mode = True
        r = b.binary("subtract", a, b.binary("multiply", q, d))
        b.int_mode = False
        step = b.cast(m.trunc(b, b.divide(b.cast(r, "float32"), df)), "int32")  # type: ignore[arg-type]
        b.int_mode = True
        q = b.binary("add", q, step)  # type: ignore[assignment]
    r = b.binary("subtract", a, b.binary("multiply", q, d))
    # truncation: r must have a's sign (or be 0) and |r| < |d|
    over = b.binary("logical_and", b.binary("not_equal", r, 0), b.binary("not_equal", b.binary("less", r, 0),
                                                                         b.binary("less", a, 0)))
    sgn = b.binary("subtract", b.binary("multiply", b.binary("equal", b.binary("less", a, 0), b.binary("less", d, 0)), 2), 1)
    q = b.binary("subtract", q, b.binary("multiply", over, sgn))  # type: ignore[assignment]
    r = b.binary("subtract", a, b.binary("multiply", q, d))
    ar = b.select(b.binary("less", r, 0), b.binary("multiply", r, -1), r)
    ad = b.select(b.binary("less", d, 0), b.binary("multiply", d, -1), d)
    under = b.binary("greater_equal", ar, ad)
    q = b.binary("add", q, b.binary("multiply", under, sgn))  # type: ignore[assignment]
    r = b.binary("subtract", a, b.binary("multiply", q, d))
    if floor:  # floor division: step down where the remainder's sign differs from the divisor's
        fix = b.binary("logical_and", b.binary("not_equal", r, 0),
                       b.binary("not_equal", b.binary("less", r, 0), b.binary("less", d, 0)))
        q = b.binary("subtract", q, fix)  # type: ignore[assignment]
        r = b.binary("add", r, b.binary("multiply", fix, d))
    return q, r  # type: ignore[return-value]


def _int_operands(b: ProgramBuilder, x: Any, y: Any) -> tuple[TileVal, TileVal]:
    b.int_mode = True
    if not isinstance(x, TileVal):
        x = b.fill(b.int_scalar(x), y.kind)
    if not isinstance(y, TileVal):
        y = b.fill(b.int_scalar(y), x.kind)
    return b.coerce(x), b.coerce(y)  # type: ignore[return-value]


@register_lowering(aten.fmod.Tensor, aten.fmod.Scalar, family="elementwise")
def lower_fmod(ctx: Any, node: fx.Node, x: Any, y: Any) -> Any:
    """aten.fmod: remainder with the dividend's sign; exact for floats (Dekker) and int32."""
    b = ctx.b
    if is_int_compute(node):
        return _int_divmod(b, *_int_operands(b, x, y), floor=False)[1]
    b.int_mode = False
    x, y = _held(ctx, node, x, y)
    return _float_fmod(b, _tile(b, x, y), _tile(b, y, x))


@register_lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, family="elementwise")
def lower_remainder(ctx: Any, node: fx.Node, x: Any, y: Any) -> Any:
    """aten.remainder: remainder with the divisor's sign (Python's %): fmod, plus d where the signs differ."""
    b = ctx.b
    if is_int_compute(node):
        return _int_divmod(b, *_int_operands(b, x, y), floor=True)[1]
    b.int_mode = False
    x, y = _held(ctx, node, x, y)
    a, d = _tile(b, x, y), _tile(b, y, x)
    r = _float_fmod(b, a, d)
    fix = b.binary("logical_and", b.binary("not_equal", r, 0.0),
                   b.binary("not_equal", b.binary("less", r, 0.0), b.binary("less", d, 0.0)))
    fix = b.binary("logical_and", fix, b.binary("equal", r, r))  # a NaN remainder (inf or NaN operands) stays
    out = b.select(fix, b.binary("add", r, d), r)
    # remainder(a, +-inf): a if the signs agree (or a is 0), else +-inf
    return b.select(b.binary("logical_and", b.binary("equal", m.absval(b, d), math.inf), fix), d, out)


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode, family="elementwise")
def lower_div_mode(ctx: Any, node: fx.Node, x: Any, y: Any, *, rounding_mode: str | None = None) -> Any:
    """aten.div(rounding_mode='trunc'|'floor'): exact int32 quotients (8/16-bit ones wrap at the store as torch's:
    ``-128 // -1 == -128`` in int8); floats as torch (trunc of the true
    quotient; floor as (a - fmod(a, d)) / d stepped down where fmod's sign differs from d's)."""
    b = ctx.b
    if rounding_mode is None:
        return b.divide(x, y)
    if is_int_compute(node):
        a, d = _int_operands(b, x, y)
        return _int_divmod(b, a, d, floor=rounding_mode == "floor")[0]
    b.int_mode = False
    x, y = _held(ctx, node, x, y)
    a, d = _tile(b, x, y), _tile(b, y, x)
    if rounding_mode == "trunc":
        return m.trunc(b, b.divide(a, d))  # type: ignore[arg-type]
    mod = _float_fmod(b, a, d)
    q = b.divide(b.binary("subtract", a, mod), d)
    fix = b.binary("logical_and", b.binary("not_equal", mod, 0.0),
                   b.binary("not_equal", b.binary("less", d, 0.0), b.binary("less", mod, 0.0)))
    q = b.select(fix, b.binary("subtract", q, 1.0), q)
    fq = m.floor(b, q)  # type: ignore[arg-type]
    q = b.select(b.binary("greater", b.binary("subtract", q, fq), 0.5), b.binary("add", fq, 1.0), fq)
    q = b.select(b.binary("equal", q, 0.0), b.binary("multiply", b.divide(a, d), 0.0), q)  # signed zero
    inf_q = b.divide(a, d)  # a / 0: the true quotient (+-inf or NaN)
    return b.select(b.binary("equal", d, 0.0), inf_q, q)
