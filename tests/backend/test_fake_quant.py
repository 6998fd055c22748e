"""Fake quantization (quantization-aware training) against eager, bit for bit: per tensor, per channel, tensor
qparams (enabled and disabled), bf16, the grid's edges (round half to even, values past the grid, inf, NaN), and a
QAT ``FakeQuantize`` module's straight-through gradients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.ao.quantization as tq

SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 0.25, 0.35, 0.45, -0.05, 12.7,
                        12.75, -12.85, 3e9, -0.15, 0.05])


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _same(fn: Callable[..., Any], *xs: torch.Tensor) -> None:
    got, want = _compile(fn)(*xs), fn(*xs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)  # exactly (dtype and shape too)


def _x(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.cat([SPECIAL, torch.randn(200, generator=torch.Generator().manual_seed(0)) * 8]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("scale", "zero_point", "qmin", "qmax"), [(0.1, 3, -128, 127), (0.037, 128, 0, 255)])
def test_per_tensor(dtype: torch.dtype, scale: float, zero_point: int, qmin: int, qmax: int) -> None:
    _same(lambda x: torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, qmin, qmax),
          _x(dtype))


@pytest.mark.parametrize("enabled", [0.0, 1.0])
def test_tensor_qparams(enabled: float) -> None:
    _same(lambda x, s, z, e: torch.ops.aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
        x, s, z, e, -128, 127), _x(), torch.tensor([0.07]), torch.tensor([2], dtype=torch.int32),
        torch.tensor([enabled]))


@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel(axis: int) -> None:
    x = _x()[:200].reshape(4, 50)  # the special values (past int64 too) in channel 0
    x = x if axis == 0 else x.t().contiguous()
    _same(lambda x, s, z: torch.ops.aten.fake_quantize_per_channel_affine_cachemask(x, s, z, axis, -128, 127), x,
          torch.tensor([0.1, 0.05, 0.2, 0.013]), torch.tensor([0, 3, -2, 1], dtype=torch.int32))


def test_qat_fake_quantize_module_forward_and_gradients() -> None:
    torch.manual_seed(0)
    fq = tq.FakeQuantize(observer=tq.MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=torch.qint8)
    fq.disable_observer()
    fq.scale.fill_(0.05)
    fq.zero_point.fill_(1)
    lin = torch.nn.Linear(16, 8)

    def model(x: torch.Tensor) -> torch.Tensor:
        return (fq(lin(x)).relu() * torch.arange(8.0)).sum()

    x = torch.randn(4, 16) * 4  # some outputs past the grid: their gradient is zero (the mask)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    _compile(model)(xc).backward()
    wc = lin.weight.grad.clone()
    lin.zero_grad()
    model(xe).backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(wc, lin.weight.grad, rtol=1e-6, atol=1e-6)
