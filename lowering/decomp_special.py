"""Special functions of ``torch.special`` as compositions of lowered ops (decompositions).

The classical orthogonal polynomials take their degree ``n`` as a tensor (truncated to an integer, as
torch does). Their three-term recurrences are unrolled to :data:`MAX_DEGREE` and each element selects its
own degree's value; a degree beyond the unrolled range raises on device instead of returning a wrong
value. Bessel-type functions with a closed form in lowered ops are written through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
MAX_DEGREE = 48


def _degree(x: torch.Tensor, n: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    x, n = torch.broadcast_tensors(x, n if isinstance(n, torch.Tensor) else torch.tensor(float(n), dtype=x.dtype))
    n = n.to(torch.float32).trunc()
    aten._assert_async.msg((n <= MAX_DEGREE).all(), f"{what}: a degree above {MAX_DEGREE} is not supported by the "
                                                     f"neuron backend (the recurrence is unrolled that far)")
    return x.to(torch.float32), n


def _recurrence(x: torch.Tensor, n: torch.Tensor, p0: torch.Tensor, p1: torch.Tensor,
                step: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """p_n selected per element, p_{k+1} = step(k, p_{k-1}, p_k); 0 for negative degrees."""
    out = torch.where(n == 0, p0, torch.zeros_like(x))
    out = torch.where(n == 1, p1, out)
    prev, cur = p0, p1
    for k in range(1, MAX_DEGREE):
        prev, cur = cur, step(k, prev, cur)
        out = torch.where(n == k + 1, cur, out)
    return out


def _poly(name: str, first: Callable[[torch.Tensor], torch.Tensor],
          step: Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor],
          shift: bool = False) -> Callable[..., torch.Tensor]:
    def fn(x: torch.Tensor, n: Any) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, n.dtype) if isinstance(n, torch.Tensor) else x.dtype
        xf, nf = _degree(x, n, f"torch.special.{name}")
        if shift:
            xf = xf * 2 - 1
        out = _recurrence(xf, nf, torch.ones_like(xf), first(xf), lambda k, p, q: step(xf, k, p, q))
        return out.to(dtype if dtype.is_floating_point else torch.float32)

    return fn


def _cheb(x: torch.Tensor, k: int, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (x + x) * q - p


SPECIAL: dict[Any, Any] = {
    aten.special_chebyshev_polynomial_t.default: _poly("chebyshev_polynomial_t", lambda x: x, _cheb),
    aten.special_chebyshev_polynomial_u.default: _poly("chebyshev_polynomial_u", lambda x: x + x, _cheb),
    aten.special_chebyshev_polynomial_v.default: _poly("chebyshev_polynomial_v", lambda x: x + x - 1, _cheb),
    aten.special_chebyshev_polynomial_w.default: _poly("chebyshev_polynomial_w", lambda x: x + x + 1, _cheb),
    aten.special_shifted_chebyshev_polynomial_t.default: _poly("shifted_chebyshev_polynomial_t", lambda x: x, _cheb,
                                                               shift=True),
    aten.special_shifted_chebyshev_polynomial_u.default: _poly("shifted_chebyshev_polynomial_u", lambda x: x + x,
                                                               _cheb, shift=True),
    aten.special_shifted_chebyshev_polynomial_v.default: _poly("shifted_chebyshev_polynomial_v",
                                                               lambda x: x + x - 1, _cheb, shift=True),
    aten.special_shifted_chebyshev_polynomial_w.default: _poly("shifted_chebyshev_polynomial_w",
                                                               lambda x: x + x + 1, _cheb, shift=True),
    aten.special_hermite_polynomial_h.default: _poly("hermite_polynomial_h", lambda x: x + x,
                                                     lambda x, k, p, q: (x + x) * q - 2.0 * k * p),
    aten.special_hermite_polynomial_he.default: _poly("hermite_polynomial_he", lambda x: x,
                                                      lambda x, k, p, q: x * q - float(k) * p),
    aten.special_laguerre_polynomial_l.default: _poly(
        "laguerre_polynomial_l", lambda x: 1 - x, lambda x, k, p, q: ((2 * k + 1 - x) * q - k * p) / (k + 1)),
    aten.special_legendre_polynomial_p.default: _poly(
        "legendre_polynomial_p", lambda x: x, lambda x, k, p, q: ((2 * k + 1) * x * q - k * p) / (k + 1)),
    aten.special_modified_bessel_i0.default: lambda x: aten.i0.default(x),
    aten.special_modified_bessel_i1.default: lambda x: aten.special_i1.default(x),
    aten.special_spherical_bessel_j0.default: lambda x: torch.where(x == 0, torch.ones_like(x),
                                                                    torch.sin(x) / torch.where(x == 0, 1, x)),
}
