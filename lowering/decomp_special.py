"""Special functions of ``torch.special`` as compositions of lowered ops (decompositions).

The classical orthogonal polynomials take their degree ``n`` as a tensor (truncated to an integer, as
torch does). Their three-term recurrences are unrolled to :data:`MAX_DEGREE` and each element selects its
own degree's value. Beyond the unrolled range the value is eager's where it is known without the
recurrence (closed forms, overflow); anything else raises on device instead of returning a wrong value.
Bessel-type functions with a closed form in lowered ops are written through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
MAX_DEGREE = 48


def _degree(x: torch.Tensor, n: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, n) broadcast, in fp32, n as eager's ``static_cast<int64_t>``: truncated, and -1 (a degree whose value
    is 0) where it is not finite or beyond int64 (x86 converts those to INT64_MIN)."""
    if not isinstance(n, torch.Tensor):  # the n_scalar overload
        n = torch.full_like(x, float(n), dtype=torch.float32)
    x, n = torch.broadcast_tensors(x, n)
    n = n.to(torch.float32)
    n = torch.where(n.isfinite() & (n.abs() < 2.0**63), n.trunc(), -1.0)
    return x.to(torch.float32), n


def _recurrence(x: torch.Tensor, n: torch.Tensor, p0: torch.Tensor, p1: torch.Tensor,
                step: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_n selected per element, 0 for negative degrees; p at the last unrolled degree), p_{k+1} =
    step(k, p_{k-1}, p_k)."""
    out = torch.where(n == 0, p0, torch.zeros_like(x))
    out = torch.where(n == 1, p1, out)
    prev, cur = p0, p1
    for k in range(1, MAX_DEGREE):
        prev, cur = cur, step(k, prev, cur)
        out = torch.where(n == k + 1, cur, out)
    return out, cur


def _odd(n: torch.Tensor) -> torch.Tensor:
    return n - 2 * torch.floor(n * 0.5) == 1


def _ends(at_plus_one: Callable[[torch.Tensor], Any], at_minus_one_even: Callable[[torch.Tensor], Any]
          ) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """A Chebyshev-type polynomial's closed form at x = +-1 (eager's own special case): (where, value)."""
    def ends(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        minus = torch.as_tensor(at_minus_one_even(n), dtype=x.dtype).expand_as(x)
        minus = torch.where(_odd(n), -minus, minus)
        plus = torch.as_tensor(at_plus_one(n), dtype=x.dtype).expand_as(x)
        return x.abs() == 1, torch.where(x > 0, plus, minus)
    return ends


def _poly(name: str, first: Callable[[torch.Tensor], torch.Tensor],
          step: Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor],
          ends: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None,
          shift: bool = False, limit: int | None = None) -> Callable[..., torch.Tensor]:
    """The degree-``n`` polynomial of a three-term recurrence, as eager computes it. Beyond the unrolled degrees the
    value is still eager's where it is known without the recurrence: ``ends`` (the closed form where eager has
    one), NaN past ``limit`` (eager's limit for Hermite), and NaN where the recurrence has overflowed into NaN by
    the last unrolled degree (eager's loop stops there). Anything else there raises on device."""
    what = f"torch.special.{name}"

    def fn(x: Any, n: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):  # the x_scalar overload: a Python number takes the degree's float dtype
            x = torch.full_like(n, float(x), dtype=n.dtype if n.dtype.is_floating_point else torch.get_default_dtype())
        dtype = torch.promote_types(x.dtype, n.dtype) if isinstance(n, torch.Tensor) else x.dtype
        xf, nf = _degree(x, n)
        if shift:
            xf = xf * 2 - 1
        out, last = _recurrence(xf, nf, torch.ones_like(xf), first(xf), lambda k, p, q: step(xf, k, p, q))
        beyond = nf > MAX_DEGREE
        known = last.isnan()
        out = torch.where(beyond & known, float("nan"), out)
        if ends is not None:
            at_end, value = ends(xf, nf)
            out = torch.where(beyond & at_end, value, out)
            known = known | at_end
        if limit is not None:
            out = torch.where(nf > limit, float("nan"), out)
            known = known | (nf > limit)
        aten._assert_async.msg((known | ~beyond).all(),
                               f"{what}: a degree above {MAX_DEGREE} (where the value has no closed form and has not "
                               f"overflowed) is not supported by the neuron backend: the recurrence is unrolled to "
                               f"degree {MAX_DEGREE}")
        return out.to(dtype if dtype.is_floating_point else torch.float32)

    return fn


def _cheb(x: torch.Tensor, k: int, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (x + x) * q - p


# eager's values at x = +1 and at x = -1 for an even degree (the odd degree's is its negative)
_T_ENDS = _ends(lambda n: 1.0, lambda n: 1.0)
_U_ENDS = _ends(lambda n: n + 1, lambda n: n + 1)
_V_ENDS = _ends(lambda n: 1.0, lambda n: n + n + 1)
_W_ENDS = _ends(lambda n: n + n + 1, lambda n: 1.0)


def _laguerre_at_zero(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x == 0, torch.ones_like(x)


HERMITE_LIMIT = 128  # eager's fp32 Hermite polynomials are NaN beyond this degree


SPECIAL: dict[Any, Any] = {
    aten.special_chebyshev_polynomial_t.default: _poly("chebyshev_polynomial_t", lambda x: x, _cheb, _T_ENDS),
    aten.special_chebyshev_polynomial_u.default: _poly("chebyshev_polynomial_u", lambda x: x + x, _cheb, _U_ENDS),
    aten.special_chebyshev_polynomial_v.default: _poly("chebyshev_polynomial_v", lambda x: x + x - 1, _cheb,
                                                       _V_ENDS),
    aten.special_chebyshev_polynomial_w.default: _poly("chebyshev_polynomial_w", lambda x: x + x + 1, _cheb,
                                                       _W_ENDS),
    aten.special_shifted_chebyshev_polynomial_t.default: _poly("shifted_chebyshev_polynomial_t", lambda x: x, _cheb,
                                                               _T_ENDS, shift=True),
    aten.special_shifted_chebyshev_polynomial_u.default: _poly("shifted_chebyshev_polynomial_u", lambda x: x + x,
                                                               _cheb, _U_ENDS, shift=True),
    aten.special_shifted_chebyshev_polynomial_v.default: _poly("shifted_chebyshev_polynomial_v",
                                                               lambda x: x + x - 1, _cheb, _V_ENDS, shift=True),
    aten.special_shifted_chebyshev_polynomial_w.default: _poly("shifted_chebyshev_polynomial_w",
                                                               lambda x: x + x + 1, _cheb, _W_ENDS, shift=True),
    aten.special_hermite_polynomial_h.default: _poly("hermite_polynomial_h", lambda x: x + x,
                                                     lambda x, k, p, q: (x + x) * q - 2.0 * k * p, None,
                                                     limit=HERMITE_LIMIT),
    aten.special_hermite_polynomial_he.default: _poly("hermite_polynomial_he", lambda x: x,
                                                      lambda x, k, p, q: x * q - float(k) * p, None,
                                                      limit=HERMITE_LIMIT),
    aten.special_laguerre_polynomial_l.default: _poly(
        "laguerre_polynomial_l", lambda x: 1 - x, lambda x, k, p, q: ((2 * k + 1 - x) * q - k * p) / (k + 1),
        _laguerre_at_zero),
    aten.special_legendre_polynomial_p.default: _poly(
        "legendre_polynomial_p", lambda x: x, lambda x, k, p, q: ((2 * k + 1) * x * q - k * p) / (k + 1), _T_ENDS),
    aten.special_modified_bessel_i0.default: lambda x: aten.i0.default(x),
    aten.special_modified_bessel_i1.default: lambda x: aten.special_i1.default(x),
    aten.special_spherical_bessel_j0.default: lambda x: torch.where(x == 0, torch.ones_like(x),
                                                                    torch.sin(x) / torch.where(x == 0, 1, x)),
}

# the overloads with a Python number for x or for n take the same decomposition
SPECIAL.update({getattr(op.overloadpacket, overload): fn for op, fn in list(SPECIAL.items())
                if "polynomial" in op.__name__ for overload in ("x_scalar", "n_scalar")})
