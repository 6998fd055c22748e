"""The regularized incomplete gamma functions ``igamma`` (P(a, x), ``torch.special.gammainc``) and ``igammac``
(Q = 1 - P, ``gammaincc``) as unrolled elementwise compositions (decompositions).

Where ``x < a + 1`` P comes from its power series, ``P = x^a e^-x / Gamma(a + 1) * sum_n x^n / ((a + 1)..(a + n))``,
elsewhere Q from its continued fraction (modified Lentz), and the other as one minus it: each where it converges
fast and the value it gives is not a difference of near-equal numbers. Both are unrolled to :data:`TERMS` steps,
enough for ``a <= A_MAX`` (the series' terms fall like ``exp(-n^2 / 2a)`` at worst, ``x = a + 1``); a larger finite
``a`` with a finite positive ``x`` raises on device instead of returning an unconverged value. The special values
are eager's: NaN for a negative argument, ``a = 0`` gives P = 1 for ``x > 0``, ``x = 0`` gives P = 0, an infinite
``x`` P = 1, an infinite ``a`` P = 0 (NaN if both are infinite). Computed in fp32 (bf16/fp16 inputs are widened).

Accuracy against eager over a in [1e-3, 100], x in [1e-4, 316] (tests/backend/test_incomplete_gamma.py): within 2e-5
absolute, and 1e-3 relative wherever the value exceeds 1e-2. Below that, a Q taken as 1 - P (a < 1, x < a + 1) keeps
its absolute accuracy but not its relative one (eager switches to a dedicated small-a series there).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
TERMS = 96
A_MAX = 100.0
TINY = 1e-30  # Lentz's floor for a vanishing denominator


def _p_and_q(a: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, Q) for finite a > 0, x > 0 (other elements give values that the callers replace)."""
    series = x < a + 1
    log_front = a * torch.log(x) - x  # x^a e^-x, as a logarithm
    # P by its series, where x < a + 1
    ap, term = a.clone(), 1.0 / a
    total = term
    for _ in range(TERMS):
        ap = ap + 1
        term = term * x / ap
        total = total + term
    p_series = total * torch.exp(log_front - torch.lgamma(a))
    # Q by its continued fraction, elsewhere
    b = x + 1 - a
    c = torch.full_like(x, 1.0 / TINY)
    d = 1.0 / b
    h = d
    for i in range(1, TERMS + 1):
        an = -i * (i - a)
        b = b + 2
        d = an * d + b
        d = torch.where(d.abs() < TINY, TINY, d)
        c = b + an / c
        c = torch.where(c.abs() < TINY, TINY, c)
        d = 1.0 / d
        h = h * d * c
    q_fraction = torch.exp(log_front - torch.lgamma(a)) * h
    p = torch.where(series, p_series, 1 - q_fraction)
    q = torch.where(series, 1 - p_series, q_fraction)
    return p, q


def _incomplete_gamma(upper: bool) -> Any:
    name = "torch.igammac (torch.special.gammaincc)" if upper else "torch.igamma (torch.special.gammainc)"

    def fn(a: Any, x: Any) -> torch.Tensor:
        if not isinstance(a, torch.Tensor) or not isinstance(x, torch.Tensor):
            return NotImplemented
        dtype = torch.promote_types(a.dtype, x.dtype)
        if not dtype.is_floating_point:
            return NotImplemented
        a, x = torch.broadcast_tensors(a.to(torch.float32), x.to(torch.float32))
        ok = (a > 0) & (x > 0) & a.isfinite() & x.isfinite()
        one = torch.ones_like(x)
        a_in, x_in = torch.where(ok, a, one), torch.where(ok, x, one)  # keep the unrolled steps finite elsewhere
        aten._assert_async.msg((~ok | (a <= A_MAX)).all(),
                               f"{name}: a > {A_MAX:g} (with a finite positive x) is not supported by the neuron "
                               f"backend: its series and continued fraction are unrolled for a <= {A_MAX:g}")
        p, q = _p_and_q(a_in, x_in)
        out = q if upper else p
        lower = {"a0": 1.0, "x0": 0.0, "xinf": 1.0, "ainf": 0.0}
        pick = {k: (1.0 - v if upper else v) for k, v in lower.items()}
        out = torch.where(x.isinf() & (x > 0), pick["xinf"], out)
        out = torch.where(a.isinf() & (a > 0), torch.where(x.isinf(), float("nan"), pick["ainf"]), out)
        out = torch.where(x == 0, pick["x0"], out)
        out = torch.where(a == 0, torch.where(x > 0, pick["a0"], float("nan")), out)
        out = torch.where((a < 0) | (x < 0) | a.isnan() | x.isnan(), float("nan"), out)
        return out.to(dtype)

    return fn


IGAMMA: dict[Any, Any] = {
    aten.igamma.default: _incomplete_gamma(upper=False),
    aten.igammac.default: _incomplete_gamma(upper=True),
}
