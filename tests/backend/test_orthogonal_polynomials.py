"""torch.special's orthogonal polynomials (degree as a tensor) compiled vs eager, including degrees beyond the
unrolled recurrence (``lowering/decomp_special.py``): there the value is eager's wherever eager's own answer is
known without running the recurrence, and anything else raises on device by name instead of being wrong."""

from __future__ import annotations

import re

import pytest
import torch
from neuron_compile.lowering.decomp_special import HERMITE_LIMIT, MAX_DEGREE

from neuron_compile.errors import DeviceAssertionError

CHEBYSHEV = [f"{s}chebyshev_polynomial_{k}" for s in ("", "shifted_") for k in "tuvw"]
ALL = CHEBYSHEV + ["hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]


def _fn(name: str):
    return getattr(torch.special, name)


def _compiled(name: str):
    return torch.compile(_fn(name), backend="neuron", dynamic=False)


def _end_points(name: str) -> list[float]:
    """x where eager has a closed form (the ends of [-1, 1], [0, 1] for the shifted ones; 0 for Laguerre)."""
    if name.startswith("shifted"):
        return [0.0, 1.0]
    return [0.0] if name.startswith("laguerre") else [-1.0, 1.0]


@pytest.mark.parametrize("name", ALL)
def test_degrees_within_the_recurrence_and_eager_conversions_of_the_degree(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(6, 40, generator=gen) * 2.4 - 1.2
    n = torch.randint(-3, MAX_DEGREE + 1, (6, 40), generator=gen).float() + 0.7  # truncated toward zero
    # degrees eager converts with static_cast<int64_t>: non-finite and out-of-range ones become negative (value 0)
    n[0, :6] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e20, -1e20, -0.5])
    got = _compiled(name)(x, n)
    # Hermite's recurrence cancels, and eager's compiler contracts it into fused multiply-adds: both fp32 results
    # are ~1e-4 from the float64 value at degree 40-48
    rtol = 2e-4 if name.startswith("hermite") else 2e-5
    torch.testing.assert_close(got, _fn(name)(x, n), rtol=rtol, atol=1e-4)
    assert torch.equal(got[0, :5], torch.zeros(5))


@pytest.mark.parametrize("name", ALL)
def test_large_degrees_where_eager_overflows_or_has_a_closed_form(name: str) -> None:
    """Degrees up to millions: where the recurrence overflowed into NaN within the unrolled degrees eager's loop
    stops with NaN, at the ends of the interval eager returns its closed form, Hermite is NaN past its limit."""
    big = [MAX_DEGREE + 1.0, 501.0, 1001.2, 13437.7, 4988429.0]
    xs = [-1e20, -501.0, -1e4, 1e4, 501.0, 4988429.2] + ([] if name.startswith("hermite") else _end_points(name))
    x = torch.tensor(xs).repeat_interleave(len(big))
    n = torch.tensor(big).repeat(len(xs))
    got = _compiled(name)(x, n)
    want = _fn(name)(x, n)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=0)
    assert want.isnan().sum() >= 6 * len(big) - 1  # the overflowing points really are eager's NaN (not a copy of 0)
    if not name.startswith("hermite"):
        assert not want[-len(_end_points(name)) * len(big):].isnan().any()  # the end points: finite, exact values


@pytest.mark.parametrize("name", ["hermite_polynomial_h", "hermite_polynomial_he"])
def test_hermite_past_eagers_limit_is_nan(name: str) -> None:
    x = torch.tensor([0.0, 0.5, -2.0, 1e-3])
    n = torch.full((4,), HERMITE_LIMIT + 1.0)
    assert _fn(name)(x, n).isnan().all()
    assert _compiled(name)(x, n).isnan().all()


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "legendre_polynomial_p", "hermite_polynomial_he"])
def test_a_large_degree_without_a_known_value_raises_by_name(name: str) -> None:
    f = _compiled(name)
    x = torch.tensor([0.3, 0.5])
    torch.testing.assert_close(f(x, torch.tensor([3.0, 40.0])), _fn(name)(x, torch.tensor([3.0, 40.0])))
    with pytest.raises(DeviceAssertionError) as info:
        f(x, torch.tensor([3.0, MAX_DEGREE + 2.0]))
    assert re.search(rf"torch\.special\.{name}: a degree above {MAX_DEGREE} \(where the value has no closed form "
                     r"and has not overflowed\) is not supported by the neuron backend", str(info.value))


@pytest.mark.parametrize("name", ["chebyshev_polynomial_u", "hermite_polynomial_he", "legendre_polynomial_p"])
def test_python_number_for_x_or_for_n(name: str) -> None:
    """The x_scalar and n_scalar overloads (a Python number for either) take the same decomposition."""
    fn = _fn(name)
    x = torch.tensor([0.0, 2.0, -0.4, 1.0])
    n = torch.tensor([0.0, 3.0, 5.9, 7.0])
    for f, arg in ((lambda t: fn(t, 3.5), x), (lambda t: fn(0.3, t), n), (lambda t: fn(t.int(), 4), x)):
        got = torch.compile(f, backend="neuron", dynamic=False)(arg)
        want = f(arg)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
