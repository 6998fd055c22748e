"""Elementwise math the NeuronCore has no single instruction for, composed from the ones it has.

Input: fp32 :class:`~neuron_compile.lowering.builder.TileVal` operands and a
:class:`~neuron_compile.lowering.builder.ProgramBuilder`; output: the result tile. Every function
records ordinary tile ops (VectorE ALU ops in fp32, ScalarE activations fed only inside their
documented valid ranges (REFERENCE 2.6), predicated selects), so results are the same on the
simulator and on hardware, and the ops fuse into whatever kernel the caller is building.

Techniques (all exact or within a few ulp of the correctly rounded result):

- rounding: ``(x + 2^23) - 2^23`` rounds an fp32 of magnitude below 2^23 to an integer (half to even)
  because the sum has no fraction bits left; larger magnitudes are integers already;
- logarithms: the argument is scaled by 2^+-64 into the activation's range, the scale added back;
- ``log1p``/``expm1``: Goldberg's ``log(u) * x / (u - 1)`` with ``u = 1 + x`` and Kahan's
  ``(u - 1) * x / log(u)`` with ``u = e^x`` cancel the rounding error of ``u``;
- ``atan``: reduced to [0, 1] with ``atan(x) = pi/2 - atan(1/x)``; the inverse trig and hyperbolic
  functions are written through atan, log1p and expm1 in their cancellation-free forms;
- ``lgamma``/``digamma``: the argument is shifted past 8 (recurrence), then Stirling's series;
  negative arguments use the reflection formula with an exactly range-reduced sin(pi x).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from neuron_compile.lowering.builder import Operand, ProgramBuilder, TileVal

TWO23 = 8388608.0  # 2**23: fp32 values at least this large have no fraction bits
LN2 = math.log(2.0)
INF = math.inf
NAN = math.nan


# -- basics ----------------------------------------------------------------------------------------


def absval(b: ProgramBuilder, x: TileVal) -> TileVal:
    """|x| as max(x, -x): exact, NaN stays NaN."""
    return b.binary("maximum", x, b.binary("multiply", x, -1.0))  # type: ignore[return-value]


def neg(b: ProgramBuilder, x: TileVal) -> TileVal:
    return b.binary("multiply", x, -1.0)  # type: ignore[return-value]


def where(b: ProgramBuilder, cond: TileVal, t: Operand, f: Operand) -> TileVal:
    return b.select(cond, t, f)


def isnan(b: ProgramBuilder, x: TileVal) -> TileVal:
    return b.binary("not_equal", x, x)  # type: ignore[return-value]


def keep_nan(b: ProgramBuilder, x: TileVal, y: TileVal) -> TileVal:
    """``y``, but NaN wherever ``x`` is NaN (for results built from ops whose NaN behaviour varies)."""
    return b.select(isnan(b, x), x, y)


def signbit(b: ProgramBuilder, x: TileVal) -> TileVal:
    """1.0 where the sign bit of the fp32 tile ``x`` is set: negative values, -0.0 and NaNs with the bit set (as
    eager: ``torch.signbit(-nan)`` is True). ``x``'s bits read as an int32 tile, compared with 0."""
    bits = b.emit("bitcast", x.kind, (x,), dtype="int32")
    return b.emit("tensor_scalar", x.kind, (bits, 0), {"op0": "less"})


def with_sign_of(b: ProgramBuilder, magnitude: TileVal, x: TileVal) -> TileVal:
    """``magnitude`` (>= 0) negated where ``x`` is negative (NaN x keeps the magnitude)."""
    return b.select(b.binary("less", x, 0.0), neg(b, magnitude), magnitude)


# -- rounding -------------------------------------------------------------------------------------


def rint(b: ProgramBuilder, x: TileVal) -> TileVal:
    """Round half to even (torch.round), exact for every fp32 incl. +-inf and NaN."""
    up = b.binary("subtract", b.binary("add", x, TWO23), TWO23)
    down = b.binary("add", b.binary("subtract", x, TWO23), TWO23)
    r = b.select(b.binary("greater_equal", x, 0.0), up, down)
    return b.select(b.binary("greater_equal", absval(b, x), TWO23), x, r)


def floor(b: ProgramBuilder, x: TileVal) -> TileVal:
    r = rint(b, x)
    return b.binary("subtract", r, b.binary("greater", r, x))  # type: ignore[return-value]


def ceil(b: ProgramBuilder, x: TileVal) -> TileVal:
    r = rint(b, x)
    return b.binary("add", r, b.binary("less", r, x))  # type: ignore[return-value]


def trunc(b: ProgramBuilder, x: TileVal) -> TileVal:
    r = rint(b, x)
    down = b.binary("subtract", r, b.binary("greater", r, x))
    up = b.binary("add", r, b.binary("less", r, x))
    return b.select(b.binary("less", x, 0.0), up, down)


# -- exp / log ------------------------------------------------------------------------------------


def log(b: ProgramBuilder, x: TileVal) -> TileVal:
    """Natural log over the whole fp32 range, subnormals included (ScalarE log is valid on [2^-64, 2^64] only)."""
    big = b.binary("greater", x, 2.0**63)
    small = b.binary("less", x, 2.0**-63)
    tiny = b.binary("less", x, 2.0**-126)  # subnormals down to 2^-149 land in [2^-49, 2^-26)
    scale = b.select(big, 2.0**-64, b.select(tiny, 2.0**100, b.select(small, 2.0**64, b.fill(1.0, x.kind))))
    xs = b.binary("multiply", x, scale)
    xs = b.binary("minimum", b.binary("maximum", xs, 2.0**-64), 2.0**64)  # 0, negatives, inf: fixed below
    offset = b.select(big, 64 * LN2, b.select(tiny, -100 * LN2, b.select(small, -64 * LN2, b.fill(0.0, x.kind))))
    y = b.binary("add", b.activation("log", xs), offset)
    y = b.select(b.binary("equal", x, 0.0), -INF, y)
    y = b.select(b.binary("equal", x, INF), INF, y)
    y = b.select(b.binary("less", x, 0.0), NAN, y)
    return keep_nan(b, x, y)  # type: ignore[arg-type]


def sqrt(b: ProgramBuilder, x: TileVal) -> TileVal:
    """sqrt over the whole fp32 range (ScalarE sqrt is valid on [2^-116, 2^118] only): scaled by an even
    power of two into range; sqrt(0) = 0, sqrt(inf) = inf, negative -> NaN."""
    small = b.binary("less", x, 2.0**-100)
    big = b.binary("greater", x, 2.0**100)
    one = b.fill(1.0, x.kind)
    xs = b.binary("multiply", x, b.select(small, 2.0**100, b.select(big, 2.0**-100, one)))
    xs = b.binary("minimum", b.binary("maximum", xs, 2.0**-116), 2.0**118)
    y = b.binary("multiply", b.activation("sqrt", xs), b.select(small, 2.0**-50, b.select(big, 2.0**50, one)))
    y = b.select(b.binary("equal", x, 0.0), x, y)  # keeps -0.0
    y = b.select(b.binary("equal", x, INF), INF, y)
    y = b.select(b.binary("less", x, 0.0), NAN, y)
    return keep_nan(b, x, y)  # type: ignore[arg-type]


def sqrt_of_bounded(b: ProgramBuilder, x: TileVal) -> TileVal:
    """sqrt of an ``x`` proven >= 2^-96 (``var + eps``): ScalarE takes ``x * 2^-20`` (its own scale operand), in
    its valid range [2^-116, 2^118] for every finite fp32 ``x``, and the result is scaled back by 2^10 (one VectorE
    instruction on the per-row statistics). inf stays out of range: the simulator warns there, as for any input
    ScalarE doesn't define."""
    return b.binary("multiply", b.activation("sqrt", x, scale=2.0**-20), 2.0**10)


def exp(b: ProgramBuilder, x: TileVal, scale: float = 1.0) -> TileVal:
    return b.activation("exp", x, scale=scale)


def log1p(b: ProgramBuilder, x: TileVal) -> TileVal:
    u = b.binary("add", x, 1.0)
    d = b.binary("subtract", u, 1.0)
    y = b.binary("multiply", log(b, u), b.divide(x, d))  # type: ignore[arg-type]
    y = b.select(b.binary("equal", d, 0.0), x, y)
    return b.select(b.binary("equal", x, INF), INF, y)


def expm1(b: ProgramBuilder, x: TileVal) -> TileVal:
    u = exp(b, x)
    d = b.binary("subtract", u, 1.0)
    y = b.binary("multiply", d, b.divide(x, log(b, u)))  # type: ignore[arg-type]
    y = b.select(b.binary("equal", u, 1.0), x, y)
    y = b.select(b.binary("equal", d, -1.0), -1.0, y)
    y = b.select(b.binary("equal", u, INF), INF, y)
    return keep_nan(b, x, y)


# -- trigonometric and hyperbolic -------------------------------------------------------------------


_PIO2_HI = float(np.float32(math.pi / 2))
_PIO2_LO = float(np.float32(math.pi / 2 - _PIO2_HI))


def _twelve_bits(v: float) -> float:
    """``v`` rounded to 12 significant bits (so that its product with a 12-bit integer is exact in fp32)."""
    e = math.floor(math.log2(abs(v))) - 11
    return round(v / 2.0**e) * 2.0**e


# 2 pi for long reductions: 8, 12 and 12 significant bits, then the rest. The quotient k (up to 2**24) is split
# into two 12-bit halves, so every partial product with the first three parts is exact.
_P1 = 6.28125
_P2 = _twelve_bits(2 * math.pi - _P1)
_P3 = _twelve_bits(2 * math.pi - _P1 - _P2)
_P4 = float(np.float32(2 * math.pi - _P1 - _P2 - _P3))
_P4_12 = _twelve_bits(2 * math.pi - _P1 - _P2 - _P3)  # tan's reduction: one more exact part, then the rest
_P5 = float(np.float32(2 * math.pi - _P1 - _P2 - _P3 - _P4_12))
_TWO_PI_REST = float(np.float32(2 * math.pi - _P1))


def _reduce_2pi_terms(b: ProgramBuilder, x: TileVal, exact_parts: tuple[float, ...] = (_P1, _P2, _P3),
                      rest: float = _P4) -> list[tuple[TileVal, float]]:
    """The products k * part to take from x, as (factor, part), k = round(x / 2 pi) in two 12-bit halves and 2 pi
    as 12-bit ``exact_parts`` and their ``rest``: every product but the last (k * rest) is exact, and so are the
    first four subtractions."""
    k = rint(b, b.binary("multiply", x, 1.0 / (2 * math.pi)))  # type: ignore[arg-type]
    # beyond the exact range the result is only kept finite (in [-pi, pi]): k is capped so its split cannot overflow
    k = b.binary("minimum", b.binary("maximum", k, -(2.0**30)), 2.0**30)
    kh, kl = split(b, k)  # type: ignore[arg-type]
    return [(half, part) for part in exact_parts for half in (kh, kl)] + [(k, rest)]  # type: ignore[list-item]


def _wrap_pi(b: ProgramBuilder, r: TileVal) -> TileVal:
    """r (at most a period beyond [-pi, pi], where the fp32 quotient estimate was off by one) back into it."""
    over = b.binary("subtract", b.binary("subtract", r, _P1), _TWO_PI_REST)
    under = b.binary("add", b.binary("add", r, _P1), _TWO_PI_REST)
    r = b.select(b.binary("greater", r, math.pi), over, r)
    r = b.select(b.binary("less", r, -math.pi), under, r)
    return b.binary("minimum", b.binary("maximum", r, -math.pi), math.pi)  # type: ignore[return-value]


def reduce_2pi(b: ProgramBuilder, x: TileVal) -> TileVal:
    """x - 2 pi k in [-pi, pi], k = round(x / 2 pi), to ~1e-7 absolute for |x| < 2**24 * 2 pi (1.05e8): Cody and
    Waite's reduction with exact partial products, then one step back into [-pi, pi]."""
    r: TileVal = x
    for factor, part in _reduce_2pi_terms(b, x):
        r = b.binary("subtract", r, b.binary("multiply", factor, part))  # type: ignore[assignment]
    return _wrap_pi(b, r)


def reduce_2pi_pair(b: ProgramBuilder, x: TileVal) -> tuple[TileVal, TileVal]:
    """x - 2 pi k as an unevaluated pair (hi, lo), to ~1e-13 for |x| < 1.05e8 (for functions that magnify the
    reduction's error): 2 pi in five parts, the subtractions after the fourth are two-sums whose rounding errors
    collect in lo."""
    terms = _reduce_2pi_terms(b, x, (_P1, _P2, _P3, _P4_12), _P5)
    hi: TileVal = x
    for factor, part in terms[:4]:
        hi = b.binary("subtract", hi, b.binary("multiply", factor, part))  # type: ignore[assignment]
    lo: TileVal | None = None
    for factor, part in terms[4:]:
        hi, err = two_sum(b, hi, b.binary("multiply", factor, -part))  # type: ignore[arg-type]
        lo = err if lo is None else b.binary("add", lo, err)  # type: ignore[assignment]
    assert lo is not None
    return hi, lo


def two_sum(b: ProgramBuilder, a: TileVal, c: TileVal) -> tuple[TileVal, TileVal]:
    """Knuth's two-sum: s = fl(a + c) and its rounding error e, a + c = s + e exactly."""
    s = b.binary("add", a, c)
    cc = b.binary("subtract", s, a)
    e = b.binary("add", b.binary("subtract", a, b.binary("subtract", s, cc)), b.binary("subtract", c, cc))
    return s, e  # type: ignore[return-value]


# The reductions above are exact for |x| < 2**24 * 2 pi; beyond it sin/cos/tan results are O(1) wrong, so the
# emitter stores a mark per element (beyond_trig_reduction) and the runner raises instead of returning them.
TRIG_LIMIT = 2**24 * 2 * math.pi
TRIG_GUARDED = frozenset((torch.ops.aten.sin.default, torch.ops.aten.cos.default, torch.ops.aten.tan.default))


def beyond_trig_reduction(b: ProgramBuilder, x: TileVal) -> TileVal:
    """1.0 where |x| is finite and at least TRIG_LIMIT (inf and NaN give NaN, as eager's)."""
    a = absval(b, x)
    return b.binary("logical_and", b.binary("greater_equal", a, TRIG_LIMIT), b.binary("less", a, math.inf))


def trig_guard_message(op: str, where: str) -> str:
    """The DeviceAssertionError text when :func:`beyond_trig_reduction`'s mark is set for ``op`` (at ``where``)."""
    return (f"{op} of an argument of magnitude {TRIG_LIMIT:.4g} or more (at {where}): NeuronCores reduce "
            f"trigonometric arguments exactly only below 2**24 * 2 pi; reduce it first "
            f"(torch.remainder(x.double(), 2 * math.pi) on the host) or compute it eagerly")


def _special_values(b: ProgramBuilder, x: TileVal, y: TileVal, inf_is_nan: bool) -> TileVal:
    """``y`` with NaN where x is NaN, and with ``inf_is_nan`` also where x is +-inf (eager's sin, cos of an
    infinity; the reductions give a number there, which the Bessel functions' vanishing amplitude relies on)."""
    if inf_is_nan:
        return b.select(b.binary("less", absval(b, x), math.inf), y, math.nan)
    return keep_nan(b, x, y)


def sin(b: ProgramBuilder, x: TileVal, inf_is_nan: bool = False) -> TileVal:
    """sin(x): Cody-Waite reduction to [-pi, pi], where ScalarE sin is valid."""
    return _special_values(b, x, b.activation("sin", reduce_2pi(b, x)), inf_is_nan)


def cos(b: ProgramBuilder, x: TileVal, inf_is_nan: bool = False) -> TileVal:
    """cos(x) = sin(pi/2 - |r|), r the reduced x, pi/2 in two parts (no cancellation near the zeros)."""
    r = absval(b, reduce_2pi(b, x))
    t = b.binary("add", b.binary("subtract", _PIO2_HI, r), _PIO2_LO)
    return _special_values(b, x, b.activation("sin", t), inf_is_nan)  # type: ignore[arg-type]


def sinpi(b: ProgramBuilder, x: TileVal) -> TileVal:
    """sin(pi x) = (-1)^k sin(pi (x - k)), k = round(x): exactly 0 at integers, full relative precision next to
    them (the reduced argument is exact and within [-1/2, 1/2])."""
    k = rint(b, x)
    r = b.binary("subtract", x, k)  # exact, [-0.5, 0.5]; NaN for +-inf and NaN
    s = b.activation("sin", b.binary("minimum", b.binary("maximum", r, -0.5), 0.5), scale=math.pi)  # type: ignore[arg-type]
    half = b.binary("multiply", k, 0.5)
    odd = b.binary("not_equal", half, floor(b, half))  # type: ignore[arg-type]
    return keep_nan(b, r, b.select(odd, neg(b, s), s))  # type: ignore[arg-type]


def cotpi(b: ProgramBuilder, x: TileVal) -> TileVal:
    """cot(pi x) = sin(pi (x + 1/2)) / sin(pi x): exactly 0 at half-integers, +-inf at integers."""
    return b.divide(sinpi(b, b.binary("add", x, 0.5)), sinpi(b, x))  # type: ignore[arg-type,return-value]


def atan(b: ProgramBuilder, x: TileVal) -> TileVal:
    """atan over the whole line: ScalarE arctan on [0, 1], ``pi/2 - atan(1/|x|)`` beyond."""
    a = absval(b, x)
    inv = b.binary("greater", a, 1.0)
    t = b.select(inv, b.reciprocal(b.binary("maximum", a, 1.0)), b.binary("minimum", a, 1.0))
    at = b.activation("arctan", t)
    r = b.select(inv, b.binary("subtract", math.pi / 2, at), at)
    return keep_nan(b, x, with_sign_of(b, r, x))  # type: ignore[arg-type]


def atan2(b: ProgramBuilder, y: TileVal, x: TileVal) -> TileVal:
    """atan2 with torch's (C's) conventions for zeros of either sign and infinities."""
    ax, ay = absval(b, x), absval(b, y)
    hi = b.binary("maximum", ax, ay)
    lo = b.binary("minimum", ax, ay)
    safe_hi = b.select(b.binary("equal", hi, 0.0), 1.0, hi)
    t = b.binary("multiply", lo, b.reciprocal(safe_hi))  # type: ignore[arg-type]
    both_inf = b.binary("logical_and", b.binary("equal", ax, INF), b.binary("equal", ay, INF))
    t = b.select(both_inf, 1.0, t)
    t = b.binary("minimum", b.binary("maximum", t, 0.0), 1.0)
    a = b.activation("arctan", t)  # type: ignore[arg-type]
    a = b.select(b.binary("greater", ay, ax), b.binary("subtract", math.pi / 2, a), a)
    a = b.select(signbit(b, x), b.binary("subtract", math.pi, a), a)
    a = b.select(signbit(b, y), neg(b, a), a)
    a = keep_nan(b, x, a)
    return keep_nan(b, y, a)


def asin(b: ProgramBuilder, x: TileVal) -> TileVal:
    a = absval(b, x)
    den = sqrt(b, b.binary("maximum", b.binary("multiply", b.binary("subtract", 1.0, a),
                                                            b.binary("add", a, 1.0)), 0.0))
    r = atan(b, b.divide(a, den))  # type: ignore[arg-type]
    r = b.select(b.binary("greater", a, 1.0), NAN, r)
    return keep_nan(b, x, with_sign_of(b, r, x))


def acos(b: ProgramBuilder, x: TileVal) -> TileVal:
    ratio = b.divide(b.binary("subtract", 1.0, x), b.binary("add", x, 1.0))
    r = b.binary("multiply", atan(b, sqrt(b, b.binary("maximum", ratio, 0.0))), 2.0)  # type: ignore[arg-type]
    r = b.select(b.binary("greater", absval(b, x), 1.0), NAN, r)
    return keep_nan(b, x, r)  # type: ignore[arg-type]


# pi in three parts for the last step of tan's reduction (a multiple m of at most 3): m * _PI_A is exact
_PI_A = _P1 / 2
_PI_B = float(np.float32(math.pi - _PI_A))
_PI_C = float(np.float32(math.pi - _PI_A - _PI_B))


def reduce_pi_pair(b: ProgramBuilder, x: TileVal) -> tuple[TileVal, TileVal]:
    """(hi, lo): x - pi j = hi + lo (to ~1e-13 for |x| < 1.05e8), |hi| <= pi/2: the 2 pi reduction's pair, then an
    exact step by pi (a multiple of at most 3; tan, and sin up to sign, of x are those of hi + lo)."""
    hi, lo = reduce_2pi_pair(b, x)
    m = rint(b, b.binary("multiply", hi, 1.0 / math.pi))  # type: ignore[arg-type]
    hi = b.binary("subtract", hi, b.binary("multiply", m, _PI_A))  # type: ignore[assignment]  # exact (Sterbenz)
    hi, err = two_sum(b, hi, b.binary("multiply", m, -_PI_B))  # type: ignore[arg-type]
    lo = b.binary("subtract", b.binary("add", lo, err), b.binary("multiply", m, _PI_C))  # type: ignore[assignment]
    return hi, lo


def tan(b: ProgramBuilder, x: TileVal) -> TileVal:
    """tan(x) = tan(hi + lo) ~ tan(hi) + lo (1 + tan(hi)^2), with x - pi k kept as a pair (hi, lo), |hi| <= pi/2:
    near the poles tan magnifies the reduction's error by 1 + tan^2, near its zeros the value is the error's size."""
    hi, lo = reduce_pi_pair(b, x)
    hi = b.binary("minimum", b.binary("maximum", hi, -math.pi), math.pi)  # type: ignore[assignment]  # inf, nan
    s_ = b.activation("sin", hi)
    c_ = b.activation("sin", b.binary("add", b.binary("subtract", _PIO2_HI, absval(b, hi)), _PIO2_LO))
    t = b.divide(s_, c_)
    t = b.binary("add", t, b.binary("multiply", lo, b.binary("add", b.binary("multiply", t, t), 1.0)))
    return keep_nan(b, x, t)  # type: ignore[arg-type]


def split(b: ProgramBuilder, x: TileVal) -> tuple[TileVal, TileVal]:
    """Veltkamp split of an fp32 into two 12-bit halves with x = hi + lo exactly."""
    c = b.binary("multiply", x, 4097.0)
    hi = b.binary("subtract", c, b.binary("subtract", c, x))
    return hi, b.binary("subtract", x, hi)  # type: ignore[return-value]


def sinh(b: ProgramBuilder, x: TileVal) -> TileVal:
    a = absval(b, x)
    e = expm1(b, b.binary("minimum", a, 88.0))  # type: ignore[arg-type]
    small = b.binary("multiply", b.binary("add", e, b.divide(e, b.binary("add", e, 1.0))), 0.5)
    h = exp(b, a, scale=0.5)  # sinh(a) ~ e^a / 2 = (e^(a/2) / 2) e^(a/2), no overflow below 89.4
    big = b.binary("multiply", b.binary("multiply", h, 0.5), h)
    r = b.select(b.binary("greater", a, 20.0), big, small)
    return keep_nan(b, x, with_sign_of(b, r, x))  # type: ignore[arg-type]


def cosh(b: ProgramBuilder, x: TileVal) -> TileVal:
    a = absval(b, x)
    e = exp(b, b.binary("minimum", a, 80.0))  # type: ignore[arg-type]
    small = b.binary("add", b.binary("multiply", e, 0.5), b.binary("multiply", b.reciprocal(e), 0.5))
    h = exp(b, a, scale=0.5)
    big = b.binary("multiply", b.binary("multiply", h, 0.5), h)
    return keep_nan(b, x, b.select(b.binary("greater", a, 20.0), big, small))  # type: ignore[arg-type]


def asinh(b: ProgramBuilder, x: TileVal) -> TileVal:
    a = absval(b, x)
    a2 = b.binary("multiply", a, a)
    inner = b.binary("add", a, b.divide(a2, b.binary("add", sqrt(b, b.binary("add", a2, 1.0)), 1.0)))
    small = log1p(b, inner)  # type: ignore[arg-type]
    big = b.binary("add", log(b, a), LN2)
    r = b.select(b.binary("greater", a, 2.0**28), big, small)
    return keep_nan(b, x, with_sign_of(b, r, x))  # type: ignore[arg-type]


def acosh(b: ProgramBuilder, x: TileVal) -> TileVal:
    t = b.binary("subtract", x, 1.0)
    root = sqrt(b, b.binary("maximum", b.binary("add", b.binary("multiply", t, 2.0),
                                                             b.binary("multiply", t, t)), 0.0))
    small = log1p(b, b.binary("add", t, root))  # type: ignore[arg-type]
    big = b.binary("add", log(b, x), LN2)
    r = b.select(b.binary("greater", x, 2.0**28), big, small)
    r = b.select(b.binary("less", x, 1.0), NAN, r)
    return keep_nan(b, x, r)  # type: ignore[arg-type]


def atanh(b: ProgramBuilder, x: TileVal) -> TileVal:
    a = absval(b, x)
    r = b.binary("multiply", log1p(b, b.divide(b.binary("multiply", a, 2.0), b.binary("subtract", 1.0, a))), 0.5)  # type: ignore[arg-type]
    r = b.select(b.binary("equal", a, 1.0), INF, r)
    r = b.select(b.binary("greater", a, 1.0), NAN, r)
    return keep_nan(b, x, with_sign_of(b, r, x))  # type: ignore[arg-type]


def hypot(b: ProgramBuilder, x: TileVal, y: TileVal) -> TileVal:
    ax, ay = absval(b, x), absval(b, y)
    hi = b.binary("maximum", ax, ay)
    lo = b.binary("minimum", ax, ay)
    safe_hi = b.select(b.binary("equal", hi, 0.0), 1.0, hi)
    q = b.binary("multiply", lo, b.reciprocal(safe_hi))  # type: ignore[arg-type]
    r = b.binary("multiply", hi, sqrt(b, b.binary("add", b.binary("multiply", q, q), 1.0)))  # type: ignore[arg-type]
    r = keep_nan(b, x, keep_nan(b, y, r))  # type: ignore[arg-type]
    inf = b.binary("logical_or", b.binary("equal", ax, INF), b.binary("equal", ay, INF))
    return b.select(inf, INF, r)


# -- special functions ---------------------------------------------------------------------------


_SQRT_PI = math.sqrt(math.pi)


def exp_neg_sq(b: ProgramBuilder, a: TileVal) -> TileVal:
    """e^(-a^2) to ~1 ulp: a^2 = hi + lo exactly (Dekker), e^(-hi) (1 - lo)."""
    hi = b.binary("multiply", a, a)
    ah, al = split(b, a)
    lo = b.binary("add", b.binary("add", b.binary("subtract", b.binary("multiply", ah, ah), hi),
                                  b.binary("multiply", b.binary("multiply", ah, al), 2.0)), b.binary("multiply", al, al))
    return b.binary("multiply", exp(b, hi, scale=-1.0), b.binary("subtract", 1.0, lo))  # type: ignore[return-value]


def erfc_cf(b: ProgramBuilder, a: TileVal) -> TileVal:
    """t(a) with erfc(a) = e^(-a^2) / (sqrt(pi) t), a >= 1: Laplace's continued fraction at depth 32
    (relative error < 2e-7 at a = 1, far less beyond)."""
    t = a
    for n in range(32, 0, -1):
        t = b.binary("add", a, b.binary("multiply", b.reciprocal(t), n / 2.0))  # type: ignore[assignment]
    return t


def erfc(b: ProgramBuilder, x: TileVal) -> TileVal:
    """erfc over the whole line: 1 - erf(|x|) below 1, the continued fraction above; 2 - erfc(-x) for x < 0."""
    a = absval(b, x)
    ac = b.binary("minimum", b.binary("maximum", a, 1.0), 11.0)  # erfc(11) = 1e-54: 0 in fp32, as beyond (inf too)
    tail = b.divide(exp_neg_sq(b, ac), b.binary("multiply", erfc_cf(b, ac), _SQRT_PI))  # type: ignore[arg-type]
    r = b.select(b.binary("less", a, 1.0), b.binary("subtract", 1.0, b.activation("erf", a)), tail)
    r = b.select(b.binary("less", x, 0.0), b.binary("subtract", 2.0, r), r)
    return keep_nan(b, x, r)  # type: ignore[arg-type]


def erfcx(b: ProgramBuilder, x: TileVal) -> TileVal:
    """e^(x^2) erfc(x): 1 / (sqrt(pi) t) from the continued fraction for x >= 1 (no overflow)."""
    xc = b.binary("maximum", x, 1.0)
    tail = b.reciprocal(b.binary("multiply", erfc_cf(b, xc), _SQRT_PI))  # type: ignore[arg-type]
    e2 = b.reciprocal(exp_neg_sq(b, b.binary("minimum", x, 1.0)))  # type: ignore[arg-type]
    body = b.binary("multiply", e2, erfc(b, b.binary("minimum", x, 1.0)))  # type: ignore[arg-type]
    r = b.select(b.binary("less", x, 1.0), body, tail)
    r = b.select(b.binary("less", x, -9.5), INF, r)  # 2 e^(x^2) > fp32 max (and no inf * 0 at -inf)
    return keep_nan(b, x, r)  # type: ignore[arg-type]


def log_erfc(b: ProgramBuilder, a: TileVal) -> TileVal:
    """log(erfc(a)) for a >= 1 without underflow: -a^2 - log(sqrt(pi) t)."""
    return b.binary("subtract", b.binary("multiply", b.binary("multiply", a, a), -1.0),  # type: ignore[return-value]
                    log(b, b.binary("multiply", erfc_cf(b, a), _SQRT_PI)))  # type: ignore[arg-type]


def erfcinv_pair(b: ProgramBuilder, a: TileVal, q: TileVal) -> TileVal:
    """x >= 0 with erf(x) = a, given q = 1 - a exactly as well: Halley on erf in the centre, Newton on
    log erfc (continued fraction) in the tail, both from Winitzki's closed-form guess."""
    k = 0.147
    w = log(b, b.binary("maximum", b.binary("multiply", q, b.binary("add", a, 1.0)), 1e-37))  # type: ignore[arg-type]
    c = b.binary("add", b.binary("multiply", w, 0.5), 2.0 / (math.pi * k))
    disc = b.binary("subtract", b.binary("multiply", c, c), b.binary("multiply", w, 1.0 / k))
    x = sqrt(b, b.binary("maximum", b.binary("subtract", sqrt(b, b.binary("maximum", disc, 0.0)), c), 0.0))  # type: ignore[arg-type]
    centre = x
    for _ in range(3):  # Halley: x -= f / (f' + x f), f = erf(x) - a, f' = 2/sqrt(pi) e^(-x^2)
        f = b.binary("subtract", b.activation("erf", centre), a)
        fp = b.binary("multiply", b.activation("exp", b.binary("multiply", centre, centre), scale=-1.0),
                      2.0 / _SQRT_PI)
        centre = b.binary("subtract", centre, b.divide(f, b.binary("add", fp, b.binary("multiply", centre, f))))
    tail = b.binary("maximum", x, 1.0)
    lq = log(b, b.binary("maximum", q, 1e-45))  # type: ignore[arg-type]
    for _ in range(4):  # Newton on h = log erfc(x) - log q, h' = -2 t
        t = erfc_cf(b, tail)  # type: ignore[arg-type]
        h = b.binary("subtract", b.binary("subtract", b.binary("multiply", b.binary("multiply", tail, tail), -1.0),
                                          log(b, b.binary("multiply", t, _SQRT_PI))), lq)  # type: ignore[arg-type]
        tail = b.binary("maximum", b.binary("add", tail, b.divide(h, b.binary("multiply", t, 2.0))), 1.0)
    r = b.select(b.binary("less", q, 0.15), tail, centre)
    return b.select(b.binary("equal", q, 0.0), INF, r)  # type: ignore[return-value]


def erfinv(b: ProgramBuilder, y: TileVal) -> TileVal:
    a = absval(b, y)
    x = erfcinv_pair(b, a, b.binary("subtract", 1.0, a))  # type: ignore[arg-type]
    x = b.select(b.binary("greater", a, 1.0), NAN, x)
    return keep_nan(b, y, with_sign_of(b, x, y))


def ndtri(b: ProgramBuilder, p: TileVal) -> TileVal:
    """Inverse normal CDF: sqrt(2) erfinv(2p - 1), with q = 2 min(p, 1 - p) kept exact for the tails."""
    q = b.binary("multiply", b.binary("minimum", p, b.binary("subtract", 1.0, p)), 2.0)
    x = b.binary("multiply", erfcinv_pair(b, b.binary("subtract", 1.0, q), q), math.sqrt(2.0))  # type: ignore[arg-type]
    x = b.select(b.binary("less", p, 0.5), neg(b, x), x)
    x = b.select(b.binary("logical_or", b.binary("less", p, 0.0), b.binary("greater", p, 1.0)), NAN, x)
    return keep_nan(b, p, x)


def log_ndtr(b: ProgramBuilder, x: TileVal) -> TileVal:
    """log of the normal CDF: log(erfc(-x / sqrt 2) / 2), the continued fraction's log form below -sqrt 2."""
    a = b.binary("multiply", x, -1.0 / math.sqrt(2.0))
    tail = b.binary("subtract", log_erfc(b, b.binary("maximum", a, 1.0)), LN2)  # type: ignore[arg-type]
    body = b.binary("subtract", log(b, erfc(b, b.binary("minimum", a, 1.0))), LN2)  # type: ignore[arg-type]
    return keep_nan(b, x, b.select(b.binary("greater", a, 1.0), tail, body))  # type: ignore[arg-type]


def _stirling_lgamma(b: ProgramBuilder, z: TileVal) -> TileVal:
    """lgamma(z) for z >= 8: (z - 1/2) log z - z + log(2 pi)/2 + 1/(12 z) - 1/(360 z^3) + 1/(1260 z^5)."""
    inv = b.reciprocal(z)
    inv2 = b.binary("multiply", inv, inv)
    series = b.binary("multiply", inv, b.binary("add", b.binary("multiply", inv2, b.binary(
        "add", b.binary("multiply", inv2, 1.0 / 1260), -1.0 / 360)), 1.0 / 12))
    lz = log(b, z)
    main = b.binary("add", b.binary("subtract", b.binary("multiply", b.binary("subtract", z, 0.5), lz), z),
                    0.5 * math.log(2 * math.pi))
    return b.binary("add", main, series)  # type: ignore[return-value]


def lgamma(b: ProgramBuilder, x: TileVal) -> TileVal:
    """log|Gamma(x)|: shift by 8 (product of the shifted terms), Stirling, reflection below 0.5."""
    refl = b.binary("less", x, 0.5)
    z = b.select(refl, b.binary("subtract", 1.0, x), x)  # z >= 0.5
    shift = b.binary("less", z, 8.0)
    prod = b.fill(1.0, z.kind)
    for k in range(8):
        prod = b.binary("multiply", prod, b.binary("add", z, float(k)))  # type: ignore[assignment]
    zs = b.select(shift, b.binary("add", z, 8.0), z)
    lg = _stirling_lgamma(b, zs)
    lg = b.select(shift, b.binary("subtract", lg, log(b, prod)), lg)
    # reflection: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x); below |x| = 2^-40 as log(1 / |x|) (pi x of a
    # subnormal x has lost its digits; the rest of lgamma, -0.577 x, is below an ulp there)
    a = absval(b, x)
    tiny = b.binary("less", a, 2.0**-40)
    s = b.select(tiny, a, absval(b, sinpi(b, x)))
    log_pi = b.select(tiny, 0.0, b.fill(math.log(math.pi), x.kind))
    lr = b.binary("subtract", b.binary("subtract", log_pi, log(b, s)), lg)
    r = b.select(refl, lr, lg)
    pole = b.binary("logical_and", b.binary("equal", x, floor(b, x)), b.binary("less_equal", x, 0.0))
    r = b.select(pole, INF, r)  # 0, -1, -2, ... and every float beyond -2^23 (all integers): inf, as eager
    r = b.select(b.binary("equal", a, INF), INF, r)
    return keep_nan(b, x, r)


def digamma(b: ProgramBuilder, x: TileVal) -> TileVal:
    """psi(x): shift by 8 (sum of reciprocals), the asymptotic series, reflection below 0.5."""
    refl = b.binary("less", x, 0.5)
    z = b.select(refl, b.binary("subtract", 1.0, x), x)
    shift = b.binary("less", z, 8.0)
    acc = b.fill(0.0, z.kind)
    for k in range(8):
        acc = b.binary("add", acc, b.reciprocal(b.binary("add", z, float(k))))  # type: ignore[assignment]
    zs = b.select(shift, b.binary("add", z, 8.0), z)
    inv = b.reciprocal(zs)
    inv2 = b.binary("multiply", inv, inv)
    tail = b.binary("multiply", inv2, b.binary("add", b.binary("multiply", inv2, b.binary(
        "add", b.binary("multiply", inv2, b.binary("add", b.binary("multiply", inv2, 1.0 / 240), -1.0 / 252)),
        1.0 / 120)), -1.0 / 12))
    psi = b.binary("add", b.binary("subtract", log(b, zs), b.binary("multiply", inv, 0.5)), tail)
    psi = b.select(shift, b.binary("subtract", psi, acc), psi)
    # reflection: psi(x) = psi(1 - x) - pi / tan(pi x)
    cot = cotpi(b, x)
    r = b.select(refl, b.binary("subtract", psi, b.binary("multiply", cot, math.pi)), psi)
    is_int = b.binary("logical_and", b.binary("equal", x, floor(b, x)), b.binary("less_equal", x, 0.0))
    r = b.select(is_int, NAN, r)
    r = b.select(b.binary("equal", x, 0.0), b.select(signbit(b, x), INF, -INF), r)  # copysign(inf, -x)
    r = b.select(b.binary("equal", x, INF), INF, r)
    return keep_nan(b, x, r)  # type: ignore[arg-type]


def bessel_i(b: ProgramBuilder, x: TileVal, order: int, scaled: bool) -> TileVal:
    """Modified Bessel I0/I1 (``scaled``: times e^-|x|): power series up to |x| = 20, asymptotic beyond."""
    a = absval(b, x)
    q = b.binary("multiply", b.binary("multiply", b.binary("minimum", a, 20.0), b.binary("minimum", a, 20.0)), 0.25)
    # sum_k q^k / (k! (k + order)!) in Horner form, 48 terms (converges to fp32 for |x| <= 20)
    acc = b.fill(1.0, x.kind)
    for k in range(48, 0, -1):
        acc = b.binary("add", b.binary("multiply", acc, b.binary("multiply", q, 1.0 / (k * (k + order)))), 1.0)  # type: ignore[assignment]
    series = acc if order == 0 else b.binary("multiply", acc, b.binary("multiply", b.binary("minimum", a, 20.0), 0.5))
    if scaled:
        series = b.binary("multiply", series, b.activation("exp", b.binary("minimum", a, 20.0), scale=-1.0))
    # asymptotic: e^a / sqrt(2 pi a) * sum_k (-1)^k prod_{j<=k} (mu - (2j-1)^2) / (k! (8a)^k)
    mu = 4.0 * order * order
    big_a = b.binary("maximum", a, 20.0)
    inv8a = b.reciprocal(b.binary("multiply", big_a, 8.0))
    term = b.fill(1.0, x.kind)
    total = b.fill(1.0, x.kind)
    for k in range(1, 8):
        term = b.binary("multiply", term, b.binary("multiply", inv8a, -(mu - (2 * k - 1) ** 2) / k))  # type: ignore[assignment]
        total = b.binary("add", total, term)  # type: ignore[assignment]
    # 1 / sqrt(2 pi a) as 1 / sqrt(a) times a constant: 2 pi a overflows for a > 5.4e37
    asym = b.binary("multiply", total, b.binary("multiply", b.reciprocal(sqrt(b, big_a)), 1.0 / math.sqrt(2 * math.pi)))
    if not scaled:  # e^a as (e^(a/2))^2: finite up to a ~ 177 like eager's fp32 result, inf beyond (not inf * 0)
        h = exp(b, b.binary("minimum", big_a, 200.0), scale=0.5)
        asym = b.binary("multiply", b.binary("multiply", asym, h), h)
    r = b.select(b.binary("greater", a, 20.0), asym, series)
    if order == 1:
        r = with_sign_of(b, r, x)  # type: ignore[arg-type]
    return keep_nan(b, x, r)  # type: ignore[arg-type]


NARROW_INTS = (torch.int8, torch.uint8, torch.int16)  # integers torch wraps at 8/16 bits (computed here in int32)


def wrap_int_scalar(value: int, dtype: torch.dtype) -> int:
    """A Python int as torch converts it to an 8/16-bit integer dtype (300 -> 44 in int8, -1 -> 255 in uint8)."""
    return int(torch.tensor(int(value), dtype=torch.int64).to(dtype).item())


def wrap_int(b: ProgramBuilder, x: TileVal, dtype: torch.dtype) -> TileVal:
    """An int32 tile wrapped to an 8/16-bit integer range, as torch's integer arithmetic wraps."""
    bits = torch.iinfo(dtype).bits
    mask, sign = (1 << bits) - 1, 1 << (bits - 1)
    low = b.binary("bitwise_and", x, mask)
    if dtype == torch.uint8:
        return low  # type: ignore[return-value]
    return b.binary("subtract", b.binary("bitwise_xor", low, sign), sign)  # type: ignore[return-value]


# Bernoulli numbers B_2j / (2j)! for the Euler-Maclaurin tail of the Hurwitz zeta function
_EM = (1.0 / 12, -1.0 / 720, 1.0 / 30240, -1.0 / 1209600, 1.0 / 47900160, -691.0 / 1307674368000)


def _pow_neg(b: ProgramBuilder, base: TileVal, s: TileVal | int) -> TileVal:
    """base^-s: repeated products for an integer s (any sign of base), the ALU's power otherwise (exp(-s log base)
    would lose |s log base| ulp: 2e-6 relative at q^-9 for q ~ 0.01)."""
    if isinstance(s, int):
        p = base
        for _ in range(s - 1):
            p = b.binary("multiply", p, base)  # type: ignore[assignment]
        return b.reciprocal(p)
    return b.binary("power", base, b.binary("multiply", s, -1.0))  # type: ignore[return-value]


def hurwitz_zeta(b: ProgramBuilder, s: TileVal | int, q: TileVal) -> TileVal:
    """zeta(s, q) = sum_k (q + k)^-s: 9 terms (20 for an integer s, whose powers of a negative q + k are
    exact products, so q down to -11 still ends the sum at a >= 9), then the Euler-Maclaurin tail."""
    n = 20 if isinstance(s, int) else 9
    acc = b.fill(0.0, q.kind)
    for k in range(n):
        acc = b.binary("add", acc, _pow_neg(b, b.binary("add", q, float(k)), s))  # type: ignore[assignment]
    a = b.binary("add", q, float(n))
    a_s = _pow_neg(b, a, s)  # type: ignore[arg-type]
    sf = s if isinstance(s, TileVal) else b.fill(float(s), q.kind)
    acc = b.binary("add", acc, b.divide(b.binary("multiply", a, a_s), b.binary("subtract", sf, 1.0)))  # type: ignore[assignment]
    acc = b.binary("add", acc, b.binary("multiply", a_s, 0.5))  # type: ignore[assignment]
    inv_a = b.reciprocal(a)  # type: ignore[arg-type]
    term = b.binary("multiply", b.binary("multiply", sf, a_s), inv_a)  # s a^(-s-1)
    for j, coeff in enumerate(_EM, start=1):
        acc = b.binary("add", acc, b.binary("multiply", term, coeff))  # type: ignore[assignment]
        rise = b.binary("multiply", b.binary("add", sf, 2.0 * j - 1), b.binary("add", sf, 2.0 * j))
        term = b.binary("multiply", b.binary("multiply", term, rise), b.binary("multiply", inv_a, inv_a))
    return acc  # type: ignore[return-value]


_LOG_F32_MAX = math.log(float(np.finfo(np.float32).max))
_LOG_F64_MAX = math.log(np.finfo(np.float64).max)


def zeta(b: ProgramBuilder, s: TileVal, q: TileVal) -> TileVal:
    """Hurwitz zeta with Cephes' conventions: inf at s == 1 and at non-positive integer q, NaN for s < 1 and for a
    negative q with a non-integer s. A negative q = -m + f (0 < f < 1) with an integer s sums its m terms below 0
    in closed form: zeta(s, q) = zeta(s, f) + (-1)^s (zeta(s, 1 - f) - zeta(s, 1 - q)) (eager sums the terms in
    float64)."""
    r = hurwitz_zeta(b, s, b.binary("maximum", q, 1e-30))  # type: ignore[arg-type]
    fq = floor(b, q)
    f = b.binary("maximum", b.binary("subtract", q, fq), 1e-30)
    g = b.binary("maximum", b.binary("subtract", b.binary("add", fq, 1.0), q), 1e-30)  # 1 - f, exactly
    zf = hurwitz_zeta(b, s, f)  # type: ignore[arg-type]
    zg = hurwitz_zeta(b, s, g)  # type: ignore[arg-type]
    zw = hurwitz_zeta(b, s, b.binary("subtract", 1.0, q))  # type: ignore[arg-type]
    half = b.binary("multiply", s, 0.5)
    sgn = b.select(b.binary("not_equal", half, floor(b, half)), -1.0, 1.0)  # (-1)^s
    below = b.binary("add", zf, b.binary("multiply", sgn, b.binary("subtract", zg, zw)))
    # beyond fp32 the term nearest 0 decides the sign; eager sums in float64, where both overflowing gives
    # inf + inf (s even) or NaN (s odd)
    lf = b.binary("multiply", s, neg(b, log(b, f)))  # log of f^-s
    lg = b.binary("multiply", s, neg(b, log(b, g)))
    signed_inf = b.binary("multiply", sgn, INF)
    big = b.select(b.binary("greater", lf, lg), INF, signed_inf)
    both = b.binary("logical_and", b.binary("greater", lf, _LOG_F64_MAX), b.binary("greater", lg, _LOG_F64_MAX))
    big = b.select(both, b.select(b.binary("greater", sgn, 0.0), INF, NAN), big)
    over = b.binary("logical_or", b.binary("greater", lf, _LOG_F32_MAX), b.binary("greater", lg, _LOG_F32_MAX))
    below = b.select(over, big, below)
    neg_q = b.binary("logical_and", b.binary("less", q, 0.0), b.binary("not_equal", q, fq))
    r = b.select(neg_q, b.select(b.binary("equal", s, floor(b, s)), below, NAN), r)
    r = keep_nan(b, s, keep_nan(b, q, r))
    # Cephes' tests, the first one applying last: s == 1, then s < 1, then the poles of q (-inf among them)
    r = b.select(b.binary("logical_and", b.binary("less_equal", q, 0.0), b.binary("equal", q, fq)), INF, r)
    r = b.select(b.binary("less", s, 1.0), NAN, r)
    return b.select(b.binary("equal", s, 1.0), INF, r)  # type: ignore[return-value]


def _cot_derivative_poly(n: int) -> list[float]:
    """Coefficients (in powers of c) of P_n with d^n/dx^n cot(pi x) = pi^n P_n(cot(pi x)): P_0 = c and
    P_{k+1} = -(1 + c^2) P_k'."""
    poly = [0.0, 1.0]
    for _ in range(n):
        deriv = [i * a for i, a in enumerate(poly)][1:]
        nxt = [0.0] * (len(deriv) + 2)
        for i, a in enumerate(deriv):
            nxt[i] -= a
            nxt[i + 2] -= a
        poly = nxt
    return poly


_PI_F = float(np.float32(math.pi))


def polygamma(b: ProgramBuilder, n: int, x: TileVal) -> TileVal:
    """psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 1 (integer powers: negative x works too). Below 0 the
    reflection psi^(n)(x) = (-1)^n psi^(n)(1 - x) - pi d^n/dx^n cot(pi x): the sum from a negative x would cancel
    and end its series far from convergence. Trigamma (n = 1) follows eager's own formula below 1/2, pi^2 /
    sin^2(x * fp32(pi)) - psi'(1 - x) with the fp32 product (its value at the poles, and its rounding)."""
    if n == 0:
        return digamma(b, x)
    sign = float((-1) ** (n + 1) * math.factorial(n))
    refl = b.binary("less", x, 0.5 if n == 1 else 0.0)
    z = b.select(refl, b.binary("subtract", 1.0, x), x)
    r = b.binary("multiply", hurwitz_zeta(b, n + 1, z), sign)  # type: ignore[arg-type]
    if n == 1:
        hi, lo = reduce_pi_pair(b, b.binary("multiply", x, _PI_F))  # type: ignore[arg-type]
        s = b.activation("sin", b.binary("minimum", b.binary("maximum", hi, -math.pi), math.pi))  # type: ignore[arg-type]
        s = b.binary("add", s, lo)  # sin(hi + lo); lo matters where hi is ~ the fp32 product's own rounding
        side = b.divide(_PI_F * _PI_F, b.binary("multiply", s, s))
        r = b.select(refl, b.binary("subtract", side, r), r)
        r = b.select(b.binary("equal", x, INF), 0.0, r)  # eager's series: 1 / (x * x) = 0
        return keep_nan(b, x, r)  # type: ignore[arg-type]
    cot = cotpi(b, x)
    c2 = b.binary("multiply", cot, cot)
    coeffs = _cot_derivative_poly(n)  # of parity n + 1 in c: Horner in c^2, times c when n is even
    acc: TileVal = b.fill(coeffs[-1], x.kind)
    for a in reversed(coeffs[(n + 1) % 2:-1:2]):
        acc = b.binary("add", b.binary("multiply", acc, c2), a)  # type: ignore[assignment]
    if n % 2 == 0:
        acc = b.binary("multiply", acc, cot)  # type: ignore[assignment]
    side = b.binary("multiply", acc, math.pi ** (n + 1))
    r = b.select(refl, b.binary("subtract", b.binary("multiply", r, float((-1) ** n)), side), r)
    is_pole = b.binary("logical_and", b.binary("less_equal", x, 0.0), b.binary("equal", x, floor(b, x)))
    r = b.select(is_pole, INF if n % 2 else -INF, r)  # eager: (-1)^(n+1) n! zeta(n + 1, pole) = (-1)^(n+1) inf
    return keep_nan(b, x, r)  # type: ignore[arg-type]
