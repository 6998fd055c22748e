"""Bessel J0/J1/Y0/Y1, modified Bessel K0/K1 (plain and scaled by e^x) and Airy Ai as fp32 tile ops.

Each function is split where its behaviour changes, every piece a Chebyshev expansion of a smooth function
(``lowering/bessel_tables.py``, fitted by ``tools/fit_bessel.py``) summed by Clenshaw's recurrence, whose fp32
rounding error stays within a few ulp of the function's scale:

- J/Y up to 5: J0 and J1/x are series in x^2; Y0 and Y1 are ``2/pi log(x/2) J(x)`` (and ``-2/(pi x)``) plus
  series in x^2. Above 5: Hankel's form ``sqrt(2/(pi x)) (P cos(th) -+ Q sin(th))`` with amplitudes P, Q in
  ``(5/x)^2`` and the phase ``th = x - pi/4`` (``x - 3pi/4``) rounded in fp32 exactly as eager rounds it;
- K below 2: ``-log(x/2) I0(x)`` (``1/x + log(x/2) I1(x)``) plus series in x^2; above 2: ``e^-x / sqrt(x)``
  times an expansion in 2/x (the scaled variants leave out e^-x);
- Ai: one expansion on [-5, 2]; beyond 2 ``e^-zeta / (2 sqrt(pi) x^(1/4))`` times an expansion in 1/zeta
  (zeta = 2/3 x^(3/2)); below -5 the oscillating form with amplitudes in 1/zeta and phase ``zeta + pi/4``,
  zeta rounded in fp32 as eager rounds it (a correctly rounded division by 3: the phase is large there).

Special values follow eager (CPU, Cephes): J and Y of +-inf, Ai of +-inf are NaN; Y and K of a negative x
are NaN and of 0 are -inf / inf; K of +inf is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from neuron_compile.lowering import bessel_tables as tab
from neuron_compile.lowering.builder import ProgramBuilder, TileVal
from neuron_compile.lowering.mathlib import INF, NAN, absval, cos, exp, keep_nan, log, sin, sqrt, with_sign_of

_TWO_OVER_PI = 2.0 / math.pi
_PHASE = (float(np.float32(math.pi / 4)), float(np.float32(3 * math.pi / 4)))  # the fp32 constants eager subtracts


def clenshaw(b: ProgramBuilder, t: TileVal, coeffs: Sequence[float]) -> TileVal:
    """sum_k coeffs[k] T_k(t) for t in [-1, 1] (Clenshaw's recurrence: stable in fp32)."""
    t2 = b.binary("multiply", t, 2.0)
    b1: TileVal = b.fill(0.0, t.kind)
    b2: TileVal = b.fill(0.0, t.kind)
    for c in reversed(coeffs[1:]):
        b1, b2 = b.binary("add", b.binary("subtract", b.binary("multiply", t2, b1), b2), c), b1  # type: ignore[assignment]
    return b.binary("add", b.binary("subtract", b.binary("multiply", t, b1), b2), coeffs[0])  # type: ignore[return-value]


def _in_square(b: ProgramBuilder, a: TileVal, top: float) -> TileVal:
    """t = 2 a^2 / top^2 - 1 for 0 <= a <= top."""
    return b.binary("subtract", b.binary("multiply", b.binary("multiply", a, a), 2.0 / (top * top)), 1.0)  # type: ignore[return-value]


def _hankel(b: ProgramBuilder, a: TileVal, order: int, second_kind: bool) -> TileVal:
    """J_n (Y_n with ``second_kind``) for a >= 5 from the amplitudes P, Q and eager's fp32 phase."""
    r = b.reciprocal(a)
    t = b.binary("subtract", b.binary("multiply", b.binary("multiply", r, r), 2.0 * tab.J_SPLIT**2), 1.0)
    p = clenshaw(b, t, tab.P1 if order else tab.P0)  # type: ignore[arg-type]
    q = b.binary("multiply", clenshaw(b, t, tab.Q1 if order else tab.Q0), b.binary("multiply", r, tab.J_SPLIT))  # type: ignore[arg-type]
    th = b.binary("subtract", a, _PHASE[order])
    c, s = cos(b, th), sin(b, th)  # type: ignore[arg-type]
    if second_kind:
        wave = b.binary("add", b.binary("multiply", p, s), b.binary("multiply", q, c))
    else:
        wave = b.binary("subtract", b.binary("multiply", p, c), b.binary("multiply", q, s))
    return b.divide(b.binary("multiply", wave, math.sqrt(2.0 / math.pi)), sqrt(b, a))  # type: ignore[return-value]


def bessel_j(b: ProgramBuilder, x: TileVal, order: int) -> TileVal:
    """J0 (even) or J1 (odd) of the first kind."""
    a = absval(b, x)
    big = b.binary("greater", a, tab.J_SPLIT)
    if order == 0:
        small = clenshaw(b, _in_square(b, b.binary("minimum", a, tab.J_SPLIT), tab.J_SPLIT), tab.J0_SMALL)  # type: ignore[arg-type]
        large = _hankel(b, b.binary("maximum", a, tab.J_SPLIT), 0, False)  # type: ignore[arg-type]
    else:
        xs = b.binary("minimum", b.binary("maximum", x, -tab.J_SPLIT), tab.J_SPLIT)  # x J1(x)/x keeps x's sign (and -0)
        small = b.binary("multiply", clenshaw(b, _in_square(b, absval(b, xs), tab.J_SPLIT), tab.J1_SMALL), xs)  # type: ignore[arg-type]
        large = with_sign_of(b, _hankel(b, b.binary("maximum", a, tab.J_SPLIT), 1, False), x)  # type: ignore[arg-type]
    r = b.select(big, large, small)
    r = b.select(b.binary("equal", a, INF), NAN, r)
    return keep_nan(b, x, r)


def bessel_y(b: ProgramBuilder, x: TileVal, order: int) -> TileVal:
    """Y0 or Y1 of the second kind: NaN for x < 0, -inf at 0 (either sign), NaN at inf as eager."""
    s = b.binary("minimum", b.binary("maximum", x, 2.0**-149), tab.J_SPLIT)
    t = _in_square(b, s, tab.J_SPLIT)
    # log(s) - log 2, not log(s / 2): half the least subnormal rounds to 0
    log_half = b.binary("multiply", b.binary("subtract", log(b, s), math.log(2.0)), _TWO_OVER_PI)  # type: ignore[arg-type]
    if order == 0:
        small = b.binary("add", clenshaw(b, t, tab.Y0_SMALL), b.binary("multiply", log_half, clenshaw(b, t, tab.J0_SMALL)))
    else:
        j1 = b.binary("multiply", clenshaw(b, t, tab.J1_SMALL), s)
        small = b.binary("add", b.binary("multiply", clenshaw(b, t, tab.Y1_SMALL), s),
                         b.binary("subtract", b.binary("multiply", log_half, j1),
                                  b.binary("multiply", b.reciprocal(s), _TWO_OVER_PI)))  # type: ignore[arg-type]
    large = _hankel(b, b.binary("maximum", x, tab.J_SPLIT), order, True)  # type: ignore[arg-type]
    r = b.select(b.binary("greater", x, tab.J_SPLIT), large, small)
    r = b.select(b.binary("equal", x, 0.0), -INF, r)
    r = b.select(b.binary("less", x, 0.0), NAN, r)
    r = b.select(b.binary("equal", x, INF), NAN, r)
    return keep_nan(b, x, r)  # type: ignore[arg-type]


def bessel_k(b: ProgramBuilder, x: TileVal, order: int, scaled: bool) -> TileVal:
    """K0 or K1 (``scaled``: times e^x): NaN for x < 0, inf at 0, 0 at inf."""
    s = b.binary("minimum", b.binary("maximum", x, 2.0**-149), tab.K_SPLIT)
    t = _in_square(b, s, tab.K_SPLIT)
    lg = b.binary("subtract", log(b, s), math.log(2.0))  # type: ignore[arg-type]  # not log(s / 2), as bessel_y
    if order == 0:
        small = b.binary("subtract", clenshaw(b, t, tab.K0_SMALL), b.binary("multiply", lg, clenshaw(b, t, tab.I0_SMALL)))
    else:
        series = b.binary("multiply", b.binary("add", clenshaw(b, t, tab.K1_SMALL),
                                               b.binary("multiply", lg, clenshaw(b, t, tab.I1_SMALL))), s)
        small = b.binary("add", series, b.reciprocal(s))  # type: ignore[arg-type]
    if scaled:
        small = b.binary("multiply", small, exp(b, s))  # type: ignore[arg-type]
    big = b.binary("maximum", x, tab.K_SPLIT)
    tl = b.binary("subtract", b.binary("multiply", b.reciprocal(big), 2.0 * tab.K_SPLIT), 1.0)  # type: ignore[arg-type]
    large = b.divide(clenshaw(b, tl, tab.K1_LARGE if order else tab.K0_LARGE), sqrt(b, big))  # type: ignore[arg-type]
    if not scaled:
        large = b.binary("multiply", large, exp(b, big, scale=-1.0))  # type: ignore[arg-type]
    r = b.select(b.binary("greater", x, tab.K_SPLIT), large, small)
    r = b.select(b.binary("equal", x, 0.0), INF, r)
    r = b.select(b.binary("less", x, 0.0), NAN, r)
    return keep_nan(b, x, r)  # type: ignore[arg-type]


def _third(b: ProgramBuilder, a: TileVal) -> TileVal:
    """a / 3 correctly rounded: q = a * fl(1/3), then the exact remainder a - 2q - q (each subtraction exact by
    Sterbenz's lemma) corrects q."""
    q = b.binary("multiply", a, 1.0 / 3.0)
    r = b.binary("subtract", b.binary("subtract", a, b.binary("multiply", q, 2.0)), q)
    return b.binary("add", q, b.binary("multiply", r, 1.0 / 3.0))  # type: ignore[return-value]


def _zeta(b: ProgramBuilder, y: TileVal, root: TileVal) -> TileVal:
    """2/3 y^(3/2) from y and sqrt(y), in eager's order of fp32 operations (2y * sqrt(y) / 3)."""
    return _third(b, b.binary("multiply", b.binary("multiply", y, 2.0), root))  # type: ignore[arg-type]


def airy_ai(b: ProgramBuilder, x: TileVal) -> TileVal:
    """Airy Ai: oscillating below -5, one expansion on [-5, 2], decaying as e^-zeta beyond 2; NaN at +-inf."""
    lo, hi = tab.AI_LOW, tab.AI_HIGH
    xm = b.binary("minimum", b.binary("maximum", x, lo), hi)
    mid = clenshaw(b, b.binary("subtract", b.binary("multiply", b.binary("subtract", xm, lo), 2.0 / (hi - lo)), 1.0),  # type: ignore[arg-type]
                   tab.AI_MID)
    # x > 2: Ai = F(t) e^-zeta / (2 sqrt(pi) x^(1/4)), t = 2 zeta(2) / zeta - 1
    xp = b.binary("minimum", b.binary("maximum", x, hi), 1e6)  # Ai(1e6) underflows to 0 already; zeta stays finite
    rp = sqrt(b, xp)  # type: ignore[arg-type]
    zp = _zeta(b, xp, rp)  # type: ignore[arg-type]
    tp = b.binary("subtract", b.binary("multiply", b.reciprocal(zp), 2.0 * (2.0 / 3.0) * hi**1.5), 1.0)
    pos = b.binary("multiply", clenshaw(b, tp, tab.AI_RIGHT), exp(b, zp, scale=-1.0))  # type: ignore[arg-type]
    pos = b.divide(pos, b.binary("multiply", sqrt(b, rp), 2.0 * math.sqrt(math.pi)))
    # x < -5, y = -x: Ai = (f sin(phi) - g cos(phi)) / (sqrt(pi) y^(1/4)), phi = zeta + pi/4, g's table / (5/(72 zeta))
    y = b.binary("maximum", b.binary("multiply", x, -1.0), -lo)
    ry = sqrt(b, y)  # type: ignore[arg-type]
    zn = _zeta(b, y, ry)  # type: ignore[arg-type]
    inv_z = b.reciprocal(zn)
    tn = b.binary("subtract", b.binary("multiply", inv_z, 2.0 * (2.0 / 3.0) * (-lo) ** 1.5), 1.0)
    f = clenshaw(b, tn, tab.AI_LEFT_F)  # type: ignore[arg-type]
    g = b.binary("multiply", clenshaw(b, tn, tab.AI_LEFT_G), b.binary("multiply", inv_z, 5.0 / 72.0))  # type: ignore[arg-type]
    phi = b.binary("add", zn, _PHASE[0])
    wave = b.binary("subtract", b.binary("multiply", f, sin(b, phi)), b.binary("multiply", g, cos(b, phi)))  # type: ignore[arg-type]
    neg = b.divide(wave, b.binary("multiply", sqrt(b, ry), math.sqrt(math.pi)))  # type: ignore[arg-type]
    r = b.select(b.binary("greater", x, hi), pos, b.select(b.binary("less", x, lo), neg, mid))
    r = b.select(b.binary("equal", absval(b, x), INF), NAN, r)
    return keep_nan(b, x, r)
