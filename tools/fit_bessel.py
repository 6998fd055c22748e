"""Regenerate ``lowering/bessel_tables.py``: Chebyshev expansions behind the Bessel J/Y/K and Airy lowerings.

Usage: ``python tools/fit_bessel.py`` (writes the module) or ``python tools/fit_bessel.py --check`` (exit 1 when
it is stale). Each table is a smooth function on [-1, 1] (the variable substitution is in its docstring below),
interpolated at Chebyshev nodes from mpmath values at 40 digits and truncated where the coefficients fall below
``TOL`` of the function's size: far under fp32's rounding, so the fp32 Clenshaw sums in
``lowering/mathlib_bessel.py`` are limited by fp32 alone. mpmath is a dependency of sympy (always installed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import mpmath as mp

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "lowering" / "bessel_tables.py"
NODES = 96
TOL = 1e-10
mp.mp.dps = 40

# where the expansions change (fp32 needs no more; the ranges overlap nothing, a select picks one)
J_SPLIT = 5.0  # J/Y: series in x^2 below, Hankel's P/Q amplitudes in (5/x)^2 above
K_SPLIT = 2.0  # K: series with the log term below, e^x sqrt(x) K(x) in 2/x above
AI_LOW, AI_HIGH = -5.0, 2.0  # Ai: direct expansion between, the oscillating / decaying asymptotic forms outside


def _hankel(n: int, a: mp.mpf) -> tuple[mp.mpf, mp.mpf]:
    """P_n, Q_n with J_n = sqrt(2/(pi a)) (P cos th - Q sin th), Y_n = sqrt(2/(pi a)) (P sin th + Q cos th)."""
    th = a - (2 * n + 1) * mp.pi / 4
    j, y = mp.besselj(n, a), mp.bessely(n, a)
    s = mp.sqrt(mp.pi * a / 2)
    return s * (j * mp.cos(th) + y * mp.sin(th)), s * (y * mp.cos(th) - j * mp.sin(th))


def _ai_left(v: mp.mpf) -> tuple[mp.mpf, mp.mpf]:
    """f, g with Ai(-y) = (f sin(phi) - g cos(phi)) / (sqrt(pi) y^(1/4)), phi = zeta + pi/4, zeta = 2/3 y^(3/2)."""
    zeta = _zeta(-AI_LOW) / v
    y = (3 * zeta / 2) ** (mp.mpf(2) / 3)
    phi = zeta + mp.pi / 4
    m = mp.sqrt(mp.pi) * y ** (mp.mpf(1) / 4)
    ai, bi = mp.airyai(-y), mp.airybi(-y)
    return m * (ai * mp.sin(phi) + bi * mp.cos(phi)), m * (bi * mp.sin(phi) - ai * mp.cos(phi))


def _zeta(x: float) -> mp.mpf:
    return 2 * mp.mpf(x) ** mp.mpf(1.5) / 3


def _ai_right(v: mp.mpf) -> mp.mpf:
    """Ai(x) 2 sqrt(pi) x^(1/4) e^zeta, zeta = 2/3 x^(3/2) = zeta(AI_HIGH) / v."""
    zeta = _zeta(AI_HIGH) / v
    x = (3 * zeta / 2) ** (mp.mpf(2) / 3)
    return mp.airyai(x) * 2 * mp.sqrt(mp.pi) * x ** (mp.mpf(1) / 4) * mp.exp(zeta)


def _a2(t: mp.mpf, top: float) -> mp.mpf:
    """x for t in [-1, 1] mapped to x^2 in [0, top]."""
    return mp.sqrt((t + 1) * top / 2)


def _w(t: mp.mpf, split: float) -> mp.mpf:
    """x for t in [-1, 1] mapped to (split / x)^2 in [0, 1]."""
    return split / mp.sqrt((t + 1) / 2)


def _u(t: mp.mpf, split: float) -> mp.mpf:
    """x for t in [-1, 1] mapped to split / x in [0, 1]."""
    return split / ((t + 1) / 2)


def _y_log(n: int, a: mp.mpf) -> mp.mpf:
    return 2 / mp.pi * mp.log(a / 2) * mp.besselj(n, a)


JS2, KS2 = J_SPLIT**2, K_SPLIT**2
TABLES: dict[str, tuple[str, Callable[[mp.mpf], mp.mpf]]] = {
    "J0_SMALL": ("J0(x), t = 2 x^2 / 25 - 1", lambda t: mp.besselj(0, _a2(t, JS2))),
    "J1_SMALL": ("J1(x) / x, t = 2 x^2 / 25 - 1", lambda t: mp.besselj(1, _a2(t, JS2)) / _a2(t, JS2)),
    "Y0_SMALL": ("Y0(x) - 2/pi log(x/2) J0(x), t = 2 x^2 / 25 - 1",
                 lambda t: mp.bessely(0, _a2(t, JS2)) - _y_log(0, _a2(t, JS2))),
    "Y1_SMALL": ("(Y1(x) - 2/pi (log(x/2) J1(x) - 1/x)) / x, t = 2 x^2 / 25 - 1",
                 lambda t: (mp.bessely(1, _a2(t, JS2)) - _y_log(1, _a2(t, JS2)) + 2 / (mp.pi * _a2(t, JS2)))
                 / _a2(t, JS2)),
    "P0": ("Hankel amplitude P0(x), t = 2 (5/x)^2 - 1", lambda t: _hankel(0, _w(t, J_SPLIT))[0]),
    "Q0": ("Hankel amplitude Q0(x) x / 5, t = 2 (5/x)^2 - 1",
           lambda t: _hankel(0, _w(t, J_SPLIT))[1] * _w(t, J_SPLIT) / J_SPLIT),
    "P1": ("Hankel amplitude P1(x), t = 2 (5/x)^2 - 1", lambda t: _hankel(1, _w(t, J_SPLIT))[0]),
    "Q1": ("Hankel amplitude Q1(x) x / 5, t = 2 (5/x)^2 - 1",
           lambda t: _hankel(1, _w(t, J_SPLIT))[1] * _w(t, J_SPLIT) / J_SPLIT),
    "I0_SMALL": ("I0(x), t = 2 x^2 / 4 - 1", lambda t: mp.besseli(0, _a2(t, KS2))),
    "I1_SMALL": ("I1(x) / x, t = 2 x^2 / 4 - 1", lambda t: mp.besseli(1, _a2(t, KS2)) / _a2(t, KS2)),
    "K0_SMALL": ("K0(x) + log(x/2) I0(x), t = 2 x^2 / 4 - 1",
                 lambda t: mp.besselk(0, _a2(t, KS2)) + mp.log(_a2(t, KS2) / 2) * mp.besseli(0, _a2(t, KS2))),
    "K1_SMALL": ("(K1(x) - 1/x - log(x/2) I1(x)) / x, t = 2 x^2 / 4 - 1",
                 lambda t: (mp.besselk(1, _a2(t, KS2)) - 1 / _a2(t, KS2)
                            - mp.log(_a2(t, KS2) / 2) * mp.besseli(1, _a2(t, KS2))) / _a2(t, KS2)),
    "K0_LARGE": ("K0(x) e^x sqrt(x), t = 2 (2/x) - 1",
                 lambda t: mp.besselk(0, _u(t, K_SPLIT)) * mp.exp(_u(t, K_SPLIT)) * mp.sqrt(_u(t, K_SPLIT))),
    "K1_LARGE": ("K1(x) e^x sqrt(x), t = 2 (2/x) - 1",
                 lambda t: mp.besselk(1, _u(t, K_SPLIT)) * mp.exp(_u(t, K_SPLIT)) * mp.sqrt(_u(t, K_SPLIT))),
    "AI_MID": (f"Ai(x) on [{AI_LOW}, {AI_HIGH}], t linear in x",
               lambda t: mp.airyai(AI_LOW + (t + 1) * (AI_HIGH - AI_LOW) / 2)),
    "AI_RIGHT": ("Ai(x) 2 sqrt(pi) x^(1/4) e^zeta, zeta = 2/3 x^(3/2), t = 2 zeta(2) / zeta - 1",
               lambda t: _ai_right((t + 1) / 2)),
    "AI_LEFT_F": ("f of Ai(-y) = (f sin(zeta + pi/4) - g cos(zeta + pi/4)) / (sqrt(pi) y^(1/4)), "
                 "t = 2 zeta(5) / zeta - 1", lambda t: _ai_left((t + 1) / 2)[0]),
    "AI_LEFT_G": ("g of the same, divided by 5 / (72 zeta) (its leading term)",
                 lambda t: _ai_left((t + 1) / 2)[1] * 72 * (_zeta(-AI_LOW) / ((t + 1) / 2)) / 5),
}


def chebyshev(f: Callable[[mp.mpf], mp.mpf], n: int = NODES, tol: float = TOL) -> list[float]:
    """Coefficients c_k of f(t) ~ sum c_k T_k(t) on [-1, 1], truncated below ``tol`` of max |f|."""
    ts = [mp.cos(mp.pi * (j + mp.mpf(1) / 2) / n) for j in range(n)]
    fs = [f(t) for t in ts]
    cs = []
    for k in range(n):
        s = mp.fsum(fv * mp.cos(mp.pi * k * (j + mp.mpf(1) / 2) / n) for j, fv in enumerate(fs))
        cs.append(float(2 * s / n) / (2 if k == 0 else 1))
    scale = max(abs(float(v)) for v in fs)
    last = max(k for k, c in enumerate(cs) if abs(c) > tol * scale)
    return cs[: last + 1]


def render() -> str:
    lines = [
        '"""Chebyshev coefficients for the Bessel J/Y/K and Airy lowerings (``lowering/mathlib_bessel.py``).',
        "",
        "GENERATED by ``python tools/fit_bessel.py`` from mpmath at 40 digits; do not edit. Each table T",
        "evaluates as sum_k T[k] T_k(t) (Chebyshev polynomials of the first kind) of the variable t named in its",
        'comment, t in [-1, 1]."""',
        "",
        f"J_SPLIT = {J_SPLIT!r}",
        f"K_SPLIT = {K_SPLIT!r}",
        f"AI_LOW = {AI_LOW!r}",
        f"AI_HIGH = {AI_HIGH!r}",
    ]
    for name, (doc, f) in TABLES.items():
        cs = chebyshev(f)
        lines += ["", f"# {doc}", f"{name} = ("]
        lines += [f"    {c!r}," for c in cs]
        lines.append(")")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when lowering/bessel_tables.py is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not OUT.exists() or OUT.read_text() != text
        print(f"{OUT.relative_to(ROOT)} is {'stale' if stale else 'current'}")
        return int(stale)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
