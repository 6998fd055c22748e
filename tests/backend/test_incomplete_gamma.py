"""``igamma`` / ``igammac`` (``torch.special.gammainc`` / ``gammaincc``) compile as an unrolled power series and
continued fraction (``lowering/decomp_igamma.py``): eager's values over a in [1e-3, 100] and x in [1e-4, 316],
eager's special values, and a device-side error (not an unconverged value) for a > 100."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from neuron_compile.errors import DeviceAssertionError

FNS = [torch.igamma, torch.igammac]


def _compile(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_matches_eager_over_a_grid(fn: Callable[..., torch.Tensor]) -> None:
    a, x = torch.meshgrid(torch.logspace(-3, 2, 41), torch.logspace(-4, 2.5, 53), indexing="ij")
    got, want = _compile(fn)(a, x), fn(a, x)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    # relative accuracy too, except where Q = 1 - P is the small remainder of a cancellation (a < 1, x near 1)
    big = want > 1e-2
    torch.testing.assert_close(got[big], want[big], rtol=1e-3, atol=0)


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_special_values_are_eagers(fn: Callable[..., torch.Tensor]) -> None:
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([-1.0, 1.0, 0.0, 0.0, 0.0, 2.0, inf, inf, 3.0, nan, 1.0, 2.0])
    x = torch.tensor([1.0, -1.0, 0.0, 2.0, inf, 0.0, 3.0, inf, inf, 1.0, nan, -inf])
    torch.testing.assert_close(_compile(fn)(a, x), fn(a, x), rtol=0, atol=0, equal_nan=True)


def test_bfloat16_and_broadcast_and_gradient_in_x() -> None:
    a = torch.tensor([[0.5], [4.0]], dtype=torch.bfloat16)
    x = torch.tensor([0.25, 3.0, 9.0], dtype=torch.bfloat16)
    torch.testing.assert_close(_compile(torch.igamma)(a, x), torch.igamma(a, x), rtol=1e-2, atol=1e-2)
    a32 = torch.tensor([0.5, 2.0, 7.0])
    xe = torch.tensor([0.3, 2.5, 6.0], requires_grad=True)
    xc = xe.detach().clone().requires_grad_()
    torch.igammac(a32, xe).sum().backward()
    _compile(torch.igammac)(a32, xc).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-5, atol=1e-6)


def test_a_beyond_the_unrolled_range_raises_on_device() -> None:
    compiled = _compile(torch.igamma)
    with pytest.raises(DeviceAssertionError, match=r"torch\.igamma \(torch\.special\.gammainc\): a > 100 \(with a "
                       r"finite positive x\) is not supported by the neuron backend"):
        compiled(torch.tensor([150.0, 2.0]), torch.tensor([140.0, 1.0]))
    # the same graph with every a in range runs
    torch.testing.assert_close(compiled(torch.tensor([90.0, 2.0]), torch.tensor([80.0, 1.0])),
                               torch.igamma(torch.tensor([90.0, 2.0]), torch.tensor([80.0, 1.0])), rtol=1e-4, atol=1e-5)
