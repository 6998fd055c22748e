"""digamma / polygamma / lgamma compiled vs eager and vs mpmath, across negative arguments, next to their poles
and at their half-integer zeros of cot(pi x) (``lowering/mathlib.py``)."""

from __future__ import annotations

import mpmath
import pytest
import torch

mpmath.mp.dps = 30


def _compiled(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def _negative_points() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    spread = -torch.pow(10.0, torch.rand(300, generator=gen) * 4)  # -1 .. -1e4
    near_poles = -torch.arange(1.0, 40.0) + torch.tensor(1e-3)
    halves = -torch.arange(0.0, 40.0) - 0.5
    return torch.cat([spread, near_poles, halves, torch.tensor([-30.3, -501.3, -10000.5, -0.3, 2.5])])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_polygamma_of_negative_arguments_matches_mpmath(n: int) -> None:
    """Below 0 the series from a negative x cancels and stops far from converging (psi''(-30.3) came out -0.001,
    not 68.8): the reflection formula gives every value to a few ulp of the exact one (next to a pole, the ulp of
    cot(pi x) to the power n + 1)."""
    x = _negative_points()
    x = x[x != torch.floor(x)]
    got = _compiled(lambda t: torch.polygamma(n, t))(x)
    exact = torch.tensor([float(mpmath.polygamma(n, mpmath.mpf(float(v)))) for v in x], dtype=torch.float64)
    torch.testing.assert_close(got.double(), exact, rtol=4e-6, atol=1e-5)
    torch.testing.assert_close(got, torch.polygamma(n, x), rtol=2e-5, atol=1e-4)  # eager sums ~|x| terms


def test_trigamma_below_one_half_follows_eagers_formula() -> None:
    """Eager's trigamma reflects with sin of the fp32 product x * pi, whose rounding (k ulp of pi at x ~ -k) moves
    values next to a pole by up to 8%, and gives huge finite values at the negative integers: the compiled op
    computes the same formula (exactly reduced), the old series gave psi'(-30.3) = -0.03 instead of 15.05."""
    x = torch.cat([_negative_points(), torch.tensor([0.0, -1.0, -7.0, -40.0, 0.25, 0.4999])])
    got = _compiled(lambda t: torch.polygamma(1, t))(x)
    torch.testing.assert_close(got, torch.polygamma(1, x), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_polygamma_at_poles_and_positive_arguments(n: int) -> None:
    x = torch.tensor([0.0, -1.0, -7.0, 1e-3, 0.25, 1.0, 3.5, 40.0, 1e4, float("inf"), float("nan")])
    torch.testing.assert_close(_compiled(lambda t: torch.polygamma(n, t))(x), torch.polygamma(n, x),
                               equal_nan=True, rtol=2e-6, atol=1e-5)


def test_digamma_zeros_of_either_sign_and_negative_arguments() -> None:
    """digamma(+-0) = copysign(inf, -x), as eager; the reflection's cot is exact at half-integers."""
    x = torch.cat([_negative_points(), torch.tensor([0.0, -0.0, -3.0, float("inf"), float("nan")])])
    got = _compiled(torch.digamma)(x)
    torch.testing.assert_close(got, torch.digamma(x), equal_nan=True, rtol=2e-6, atol=1e-5)
    assert got[-5].item() == -float("inf") and got[-4].item() == float("inf")


def test_lgamma_of_negative_arguments() -> None:
    x = _negative_points()
    x = x[x != torch.floor(x)]
    torch.testing.assert_close(_compiled(torch.lgamma)(x), torch.lgamma(x), rtol=2e-6, atol=1e-5)


def test_zeta_of_negative_q_with_integer_s_and_eagers_special_cases() -> None:
    """A negative non-integer q with an integer s sums its terms below 0 (in closed form here; eager sums them in
    float64): values, the sign of an overflow (the term nearest 0 decides; both overflowing float64 gives inf + inf
    or NaN), and Cephes' order of tests (s == 1 before everything, a pole of q before a NaN s)."""
    s = torch.tensor([2.0, 3.0, 4.0, 5.0, 2.0, 3.0, 8.0, 501.0, 501.0, 4988429.0, 1e20, 2.5, 1.0, float("nan"), 0.5, 3.0])
    q = torch.tensor([-0.3, -1.7, -2.25, -0.999, -30.3, -11.5, -4.8, -1001.2, -13437.7, -1001.2, -1001.2, -0.5,
                      -3.0, -float("inf"), 2.0, 0.0])
    got = _compiled(torch.special.zeta)(s, q)
    want = torch.special.zeta(s, q)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=2e-6, atol=1e-5)
    assert want[7].item() == -float("inf") and want[8].item() == float("inf") and want[9].isnan()


def test_zeta_of_a_small_q_keeps_full_precision() -> None:
    """q^-s by the ALU's power: exp(-s log q) lost |s log q| ulp (2e-6 relative at s ~ 9, q ~ 0.01)."""
    gen = torch.Generator().manual_seed(0)
    s = torch.rand(400, generator=gen) * 8 + 1.5
    q = torch.pow(10.0, -torch.rand(400, generator=gen) * 3)
    torch.testing.assert_close(_compiled(torch.special.zeta)(s, q), torch.special.zeta(s, q), rtol=1.3e-6, atol=1e-5)
