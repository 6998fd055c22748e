"""Bessel J0/J1/Y0/Y1, modified Bessel K0/K1 (plain and scaled) and Airy Ai compiled vs eager (CPU, Cephes).

The lowerings (``lowering/mathlib_bessel.py``) sum Chebyshev expansions fitted by ``tools/fit_bessel.py``; every
value is checked with torch's default fp32 tolerances, across each range split, at eager's special values (0 of
either sign, negatives, +-inf, NaN, underflow), and against mpmath (ours may be no worse than eager's own fp32 error
plus a few units in the last place of the function's scale: ScalarE's sin is accurate to 3e-7). Eager's float64
results are not a reference: its asymptotic forms are off by up to 3e-6 near their range splits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mpmath
import pytest
import torch
from cnn_helpers import unsupported

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1",
             "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "airy_ai"]
MPMATH = {
    "bessel_j0": lambda v: mpmath.besselj(0, v), "bessel_j1": lambda v: mpmath.besselj(1, v),
    "bessel_y0": lambda v: mpmath.bessely(0, v), "bessel_y1": lambda v: mpmath.bessely(1, v),
    "modified_bessel_k0": lambda v: mpmath.besselk(0, v), "modified_bessel_k1": lambda v: mpmath.besselk(1, v),
    "scaled_modified_bessel_k0": lambda v: mpmath.besselk(0, v) * mpmath.exp(v),
    "scaled_modified_bessel_k1": lambda v: mpmath.besselk(1, v) * mpmath.exp(v),
    "airy_ai": mpmath.airyai,
}
SPECIAL = [0.0, -0.0, 1e-38, 1e-30, 1e-5, 1.9999, 2.0, 2.0001, -4.9999, -5.0, -5.0001, 7.999, 8.0, 8.001, 30.0,
           88.0, 104.0, 150.0, -105.0, 1e4, 3e38, float("inf"), -float("inf"), float("nan")]


def _inputs() -> torch.Tensor:
    return torch.cat([torch.linspace(-40.0, 40.0, 2001), torch.tensor(SPECIAL)])


@pytest.mark.parametrize("name", FUNCTIONS)
def test_matches_eager_across_ranges_and_special_values(name: str) -> None:
    fn = getattr(torch.special, name)
    x = _inputs()
    got = torch.compile(lambda t: fn(t), backend="neuron", dynamic=False)(x)
    want = fn(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got[torch.isinf(got)], want[torch.isinf(want)])
    # as accurate as eager where both are finite and representable
    ok = torch.isfinite(want) & (x.abs() < 1e3) & (want.abs() > 1e-30)  # past 1e3 fp32's phase rounding dominates
    ref = torch.tensor([float(MPMATH[name](v)) for v in x[ok].double().tolist()], dtype=torch.float64)
    ours, eager = ((r[ok].double() - ref).abs() for r in (got, want))
    assert (ours <= 2 * eager + 8 * 1.2e-7 * ref.abs().clamp(min=1.0)).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_refused_as_eager_has_no_kernel(dtype: torch.dtype) -> None:
    x = torch.linspace(0.05, 12.0, 30).to(dtype)
    with pytest.raises(NotImplementedError):
        torch.special.bessel_j0(x)
    with pytest.raises(Exception) as info:
        torch.compile(lambda t: torch.special.bessel_j0(t), backend="neuron", dynamic=False)(x)
    err = unsupported(info.value)
    assert f"aten.special_bessel_j0.default({str(dtype).removeprefix('torch.')}[30]): eager has no" in str(err)
    assert "cast the input to float32" in str(err)


def test_integer_inputs_are_promoted_like_eager() -> None:
    x = torch.arange(-3, 40)
    for name in ("bessel_j1", "bessel_y0", "modified_bessel_k1", "airy_ai"):
        fn = getattr(torch.special, name)
        torch._dynamo.reset()
        got = torch.compile(lambda t, fn=fn: fn(t), backend="neuron", dynamic=False)(x)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, fn(x), equal_nan=True)


def test_inside_a_larger_graph() -> None:
    """Fused with other elementwise work and a reduction, on a 2-D input."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return (torch.special.bessel_j1(x) * torch.special.scaled_modified_bessel_k1(x.abs() + 0.1)).sum(-1)

    x = torch.randn(64, 48) * 6
    torch.testing.assert_close(torch.compile(f, backend="neuron", dynamic=False)(x), f(x))


def test_tables_are_generated_from_the_fitting_script() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "fit_bessel.py"), "--check"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
