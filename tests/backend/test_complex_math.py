"""Complex functions, powers, products and scatters as real pairs (lowering/complex_math.py and the scatter rules
of lowering/complex_more.py) match eager: on ordinary values at float32 precision, and on every edge value (signed
zeros, tiny and huge parts, infinities, NaN) with eager's infinities and NaNs in the same places."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from neuron_compile.errors import UnsupportedOpError


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _cz(*shape: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.complex64, generator=torch.Generator().manual_seed(seed)) * scale


_Z, _W = _cz(4, 6), _cz(4, 6, seed=1)
_IDX = torch.tensor([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 2]])

CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "log1p_expm1": lambda z, w: (torch.log1p(z), torch.expm1(z), torch.log1p(z * 1e-4), torch.expm1(z * 1e-4)),
    "inverse_trig": lambda z, w: (torch.asin(z), torch.acos(z), torch.atan(z)),
    "inverse_hyperbolic": lambda z, w: (torch.asinh(z), torch.acosh(z), torch.atanh(z)),
    "inverse_near_zero": lambda z, w: (torch.asin(z * 1e-5), torch.atan(z * 1e-5), torch.asinh(z * 1e-5),
                                       torch.atanh(z * 1e-5)),
    "pow_tensor": lambda z, w: (torch.pow(z, w * 0.3), torch.pow(z.real, w * 0.3), torch.pow(z, w.real)),
    "pow_scalar_exponent": lambda z, w: (z ** 1.7, z ** (0.5 + 1j), z ** 3, z ** -2, z ** 0.5, z ** -0.5, z ** -1,
                                         z ** 0, z ** 1),
    "pow_scalar_base": lambda z, w: (2 ** z, (1 + 2j) ** z, 1 ** z),
    "logaddexp_silu": lambda z, w: (torch.logaddexp(z, w), torch.nn.functional.silu(z)),
    "prod": lambda z, w: (torch.prod(z * 0.5), torch.prod(z * 0.5, 1), torch.prod(z * 0.5, 0, keepdim=True)),
    "cumprod": lambda z, w: (torch.cumprod(z * 0.5, 1), torch.cumprod(z * 0.5, 0), torch.cumsum(z, 0, dtype=z.dtype)),
    "scatter": lambda z, w: (torch.zeros_like(z).scatter(0, _IDX, z[:2]), z.scatter_add(0, _IDX, w[:2]),
                             z.scatter(0, _IDX, 1 + 2j), z.scatter_reduce(0, _IDX, w[:2], "mean")),
    "index_ops": lambda z, w: (z.index_add(0, torch.tensor([0, 2, 2]), w[:3], alpha=2 - 1j),
                               z.index_copy(1, torch.tensor([5, 0]), w[:, :2]),
                               z.index_fill(1, torch.tensor([1, 3]), 2 - 1j), z.index_fill(0, torch.tensor([1]), 0.5)),
    "index_put_put": lambda z, w: (z.index_put((torch.tensor([0, 0, 3]),), w[:3], accumulate=True),
                                   z.index_put((torch.tensor([0, 1]), torch.tensor([2, 3])), w[0, :2]),
                                   z.put(torch.tensor([0, 7, 23]), w[0, :3]),
                                   z.put(torch.tensor([1, 1]), w[0, :2], accumulate=True)),
    "masked_and_strided_scatter": lambda z, w: (z.masked_scatter(z.real > 0, w),
                                                torch.as_strided_scatter(z, w[:2, :2], (2, 2), (6, 1), 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_complex_functions_match_eager(name: str) -> None:
    fn = CASES[name]
    got, want = _compile(fn)(_Z, _W), fn(_Z, _W)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5)


_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-6, -1e-20, 50.0, math.inf, -math.inf, math.nan]
_GRID = torch.tensor([complex(a, b) for a in _EDGES for b in _EDGES], dtype=torch.complex64)

EDGE_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "log1p": torch.log1p, "expm1": torch.expm1, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "silu": torch.nn.functional.silu,
    "pow_1.7": lambda z: z ** 1.7, "two_to_the_z": lambda z: 2 ** z, "log": torch.log,
    # every base against every exponent of the grid without 50 (50 * log z leaves float32's digits for sin and cos)
    "pow_tensor": lambda z: torch.pow(z[(z.real.abs() != 50) & (z.imag.abs() != 50)].unsqueeze(1),
                                      z[(z.real.abs() != 50) & (z.imag.abs() != 50)]),
}


def _assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    """Infinite and NaN parts exactly where eager has them (an infinity of the same sign); finite values within
    1e-5 of eager's relative to its modulus (a part much smaller than the modulus carries the modulus' rounding)."""
    g, w = torch.view_as_real(got), torch.view_as_real(want)
    nan_differs = (g.isnan() != w.isnan()).any(-1)
    assert not nan_differs.any(), (got[nan_differs], want[nan_differs])
    inf = w.isinf()
    assert torch.equal(g.isinf(), inf) and torch.equal(g[inf], w[inf]), (got[(g.isinf() != inf).any(-1)],
                                                                         want[(g.isinf() != inf).any(-1)])
    finite = w.isfinite().all(-1)
    err = (got[finite] - want[finite]).abs()
    bound = 1e-5 * want[finite].abs() + 1e-5
    assert bool((err <= bound).all()), (got[finite][err > bound], want[finite][err > bound])


@pytest.mark.parametrize("name", list(EDGE_FUNCTIONS))
def test_complex_functions_match_eager_on_edge_values(name: str) -> None:
    """Infinite and NaN parts exactly where eager's are, finite ones at float32's precision: C's Annex G limits (cexp
    of -inf is 0, a product of an infinity and a zero recovers its infinity, catanh at infinity is +-pi/2), and
    accuracy beside 0 and the branch points (log1p(1e-20i), asinh(1e-6 + i), atanh(1 - 1e-20i))."""
    fn = EDGE_FUNCTIONS[name]
    _assert_matches(_compile(fn)(_GRID), fn(_GRID))


ACCURACY_CASES = {  # each part of these results is far smaller than a float32 ulp of 1
    "log_near_1": (torch.log, [1 + 1e-6j, 1 - 1e-3j, 1.0001 + 0j]),
    "log1p_near_0": (torch.log1p, [1e-20j, 1e-6 + 1e-6j, -1e-7 + 3e-7j]),
    "expm1_near_0": (torch.expm1, [1e-7 + 1e-7j, -2e-6 + 0j]),
    "asinh_beside_i": (torch.asinh, [1e-6 + 1j, 1e-6 - 1j, 2e-5 + 1.00001j]),
    "asin_acos_beside_1": (lambda z: torch.stack((torch.asin(z), torch.acos(z))), [1 + 1e-6j, -1 + 1e-6j]),
    "atanh_beside_1": (torch.atanh, [1 - 1e-20j, 1 + 1e-6j]),
    "atan_near_0": (torch.atan, [1e-7 + 0j, 1e-8j]),
}


@pytest.mark.parametrize("name", list(ACCURACY_CASES))
def test_accuracy_beside_zero_and_the_branch_points(name: str) -> None:
    """Each part within 1e-4 of eager's relative to that part itself: log |z| beside z = 1 (log(1 + 1e-6 i) has a real
    part of 5e-13, not 0), and no cancellation beside the branch points. (Elsewhere on |z| = 1, as at 0.6 + 0.8i,
    where glibc's clog computes |z|^2 - 1 exactly, the real part is within ~1e-8 of eager's, not relative.)"""
    fn, values = ACCURACY_CASES[name]
    z = torch.tensor(values, dtype=torch.complex64)
    got, want = torch.view_as_real(_compile(fn)(z)), torch.view_as_real(fn(z))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=0.0)


def test_zero_to_a_power_is_eager_s():
    """0 ** w: 0 for Re w > 0, inf + NaN i for Re w < 0, NaN for w = 0 (cexp of w * clog 0)."""
    z = torch.zeros(4, dtype=torch.complex64)
    w = torch.tensor([2 + 0j, 1 + 1j, -1 + 0j, 0j])
    got = _compile(torch.pow)(z, w)
    torch.testing.assert_close(got, torch.pow(z, w), rtol=0, atol=0, equal_nan=True)


def test_a_complex_scatter_product_is_refused_by_name():
    with pytest.raises(Exception) as info:
        _compile(lambda z, w: z.scatter_reduce(0, _IDX, w[:2], "prod"))(_Z, _W)
    exc = info.value
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None
    line = next(ln for ln in str(exc).splitlines() if "scatter_lines" in ln)
    assert line.startswith("  - neuron_compile.scatter_lines.default(complex64[4, 6], 0, int64[2, 6], complex64[2, 6], "
                           "0.0, 'prod', True, 0, 'runtime'): not compiled on complex values (they compile as pairs of "
                           "reals, op by op, and this op has no real form: a complex scatter with reduce='prod') at ")
