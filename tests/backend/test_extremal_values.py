"""Extremal inputs through the special functions and the step functions, against eager.

Subnormals, +-inf, NaN, +-0 and values near the fp32 limits are normal inputs: each op either matches eager
there or is refused by name. The float32 table runs every op on one vector of such values; the bf16 cases check
that a step function (floor, fmod, an int cast, ...) of a bf16 value computed in the kernel steps where eager's
does, i.e. on the value rounded to bf16 as eager holds it, not on the kernel's fp32 intermediate.
"""

from __future__ import annotations

import pytest
import torch

from neuron_compile.config import config

_VALUES = [float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e30, -1e30, 1e-40, -1e-40, 1.4e-45, 3.4e38,
           -3.4e38, 88.7, -88.7, 100.0, -100.0, 0.5, -0.5, 1.0, -1.0, 20.0, -20.0, -9.4, -9.6, 2.0, -2.0, -3.0]

_S = torch.special
_UNARY = {
    "log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "logit": torch.logit,
    "lgamma": torch.lgamma, "digamma": torch.digamma, "erfc": torch.erfc, "erfcx": _S.erfcx, "i0": torch.i0,
    "i0e": _S.i0e, "i1": _S.i1, "bessel_y0": _S.bessel_y0, "bessel_y1": _S.bessel_y1,
    "modified_bessel_k0": _S.modified_bessel_k0, "log_ndtr": _S.log_ndtr, "entr": _S.entr,
    "xlogy": lambda x: torch.xlogy(x.flip(0), x), "softplus": torch.nn.functional.softplus,
}


def _compiled(fn, *args: torch.Tensor) -> torch.Tensor:
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        return torch.compile(fn, backend="neuron", dynamic=False)(*args)


@pytest.mark.parametrize("name", sorted(_UNARY))
def test_special_functions_at_extremal_values_match_eager(name: str) -> None:
    """Found wrong before: log of a subnormal (-88.7 for log(1e-40), eager -92.1: the range scaling clamped it),
    so logit, xlogy, lgamma and Y0 there too; erfc(+-inf) and erfcx(-inf) NaN (inf * 0 in the tail); i0(+-3.4e38)
    NaN and i0e(3.4e38) 0 (2 pi x overflowed); lgamma(-3.4e38) NaN (a pole: inf)."""
    x = torch.tensor(_VALUES)
    fn = _UNARY[name]
    torch.testing.assert_close(_compiled(fn, x), fn(x), equal_nan=True, rtol=1e-5, atol=1e-6)


def _bf16_pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(4096, generator=g) * 8).bfloat16()
    return a, (torch.rand(4096, generator=g) * 0.02).bfloat16()


@pytest.mark.parametrize("name", ["floor", "ceil", "round", "trunc", "frac", "fmod", "remainder", "floor_divide",
                                  "round_decimals"])
def test_step_functions_of_a_bf16_intermediate_step_on_its_bf16_value(name: str) -> None:
    """a + b is computed in fp32 in the kernel; eager holds it rounded to bf16. floor(a + b) differed from eager
    by 1 at 64 of 4096 elements before the rounding (a sum just below an integer that rounds up to it)."""
    fns = {"floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "frac": torch.frac,
           "fmod": lambda v: torch.fmod(v, 1.0), "remainder": lambda v: torch.remainder(v, 1.0),
           "floor_divide": lambda v: torch.floor_divide(v, 0.5), "round_decimals": lambda v: torch.round(v, decimals=1)}

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fns[name](a + b)

    a, b = _bf16_pair()
    torch.testing.assert_close(_compiled(fn, a, b), fn(a, b), rtol=0, atol=0)


def test_int_cast_of_a_bf16_intermediate_truncates_its_bf16_value() -> None:
    """clamp(x, -1e9, 1e9).to(int32) of a bf16 x: eager's clamp result is bf16 (1e9 rounds to 998244352), the
    kernel's was the fp32 bound 1000000000, a value no bf16 tensor holds."""
    x = torch.tensor([float("inf"), -float("inf"), 1e30, 3.7, -2.5, 255.9, 7e8]).bfloat16()

    def fn(t: torch.Tensor) -> torch.Tensor:
        return t.clamp(-1e9, 1e9).to(torch.int32)

    a, b = _bf16_pair()
    torch.testing.assert_close(_compiled(fn, x), fn(x), rtol=0, atol=0)
    torch.testing.assert_close(_compiled(lambda p, q: (p + q).to(torch.int32), a, b),
                               (a + b).to(torch.int32), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sign_bit_of_negative_zero_and_negative_nan_is_eagers(dtype: torch.dtype) -> None:
    """signbit, copysign and fmod read the sign bit itself: -0.0 and a NaN with its sign bit set (-nan, and x86's
    0/0 as eager computes it) count as negative, as in eager, whose results are compared bit for bit."""
    x = torch.tensor([1.0, -1.0, 0.0, -0.0, 1e-40, -1e-40, float("inf"), -float("inf"), 0.0, 0.0], dtype=dtype)
    x[-2] = float("nan")
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    x[-1:] = (x[-2:-1].view(bits) | torch.iinfo(bits).min).view(dtype)  # -nan: nan with its sign bit set
    assert torch.signbit(x[-1]) and not torch.signbit(x[-2])
    cases = [
        (torch.signbit, (x,)),
        (lambda z: torch.signbit(z / z), (torch.zeros(4, dtype=dtype),)),  # eager's 0/0 carries x86's sign
        (lambda a, s: torch.copysign(a, s), (torch.full((10,), 2.0, dtype=dtype), x)),
        (lambda a, s: torch.copysign(a, s * 3), (torch.full((10,), 2.0, dtype=dtype), x)),  # s * 3 in the kernel
        (lambda a: torch.copysign(a, -0.0), (x.nan_to_num(1.0),)),  # copysign.Scalar
    ]
    for fn, args in cases:
        got, want = _compiled(fn, *args), fn(*args)
        assert got.dtype == want.dtype
        assert torch.equal(torch.signbit(got) if got.is_floating_point() else got,
                           torch.signbit(want) if want.is_floating_point() else want), (got, want)
        if got.is_floating_point():
            assert torch.equal(got.abs().nan_to_num(7.0), want.abs().nan_to_num(7.0))
