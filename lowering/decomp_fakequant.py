"""Fake quantization (quantization-aware training's ``FakeQuantize``) as elementwise float math, eager's values.

``fake_quantize_per_tensor_affine`` and its per-channel and tensor-qparams forms round ``x / scale`` to the
quantization grid and back: with ``inv = 1 / scale`` in fp32, ``q = round_half_even(x * inv) + zero_point``, the
output ``(clamp(q, qmin, qmax) - zero_point) * scale`` and the mask (the straight-through gradient's) ``qmin <= q <=
qmax``. The math runs in fp32 (half/bfloat16 inputs are widened and the output cast back, as eager's kernel does). A
NaN takes ``qmin`` (eager's integer cast of NaN) and is outside the mask, as is every value past the grid; past
int64 the per-channel form also takes ``qmin`` (its plain cast), the per-tensor one saturates. The
backward is autograd's own (``grad * mask``). The tensor-qparams form's ``fake_quant_enabled < 1`` returns ``x``
and an all-true mask, as a select. A floating-point per-channel zero point (a different eager formula) is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

aten = torch.ops.aten


def _fake_quant(x: torch.Tensor, scale: Any, inv: Any, zero_point: Any, qmin: int, qmax: int,
                saturate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``saturate``: values past int64 clamp to the grid (the per-tensor kernel); else they take ``qmin`` like NaN
    (the per-channel kernel's plain integer cast gives INT64_MIN for both)."""
    xf = x.to(torch.float32)
    q = torch.round(xf * inv) + zero_point
    mask = (q >= qmin) & (q <= qmax)
    lost = torch.isnan(q) if saturate else ~(q.abs() < 2.0**63)
    q = torch.where(lost, float(qmin), q).clamp(qmin, qmax)
    return ((q - zero_point) * scale).to(x.dtype), mask


def _per_tensor(x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int) -> Any:
    sc = np.float32(scale)
    return _fake_quant(x, float(sc), float(np.float32(1.0) / sc), int(zero_point), int(quant_min), int(quant_max))


def _per_tensor_qparams(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                        fake_quant_enabled: torch.Tensor, quant_min: int, quant_max: int) -> Any:
    sc = scale.to(torch.float32).reshape(())
    out, mask = _fake_quant(x, sc, 1.0 / sc, zero_point.reshape(()).to(torch.float32), int(quant_min),
                            int(quant_max))
    on = fake_quant_enabled.reshape(()) >= 1.0
    return torch.where(on, out, x), torch.where(on, mask, True)


def _per_channel(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, quant_min: int,
                 quant_max: int) -> Any:
    if zero_point.is_floating_point():
        return NotImplemented
    shape = [1] * x.dim()
    shape[axis % x.dim()] = -1
    sc = scale.to(torch.float32).reshape(shape)
    return _fake_quant(x, sc, 1.0 / sc, zero_point.to(torch.float32).reshape(shape), int(quant_min), int(quant_max),
                       saturate=False)


FAKEQUANT: dict[Any, Any] = {
    aten.fake_quantize_per_tensor_affine_cachemask.default: _per_tensor,
    aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default: _per_tensor_qparams,
    aten.fake_quantize_per_channel_affine_cachemask.default: _per_channel,
}
