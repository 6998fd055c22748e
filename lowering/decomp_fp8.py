"""``torch._scaled_mm``: FP8 matmuls with tensor-wise or row-wise scales, as eager computes them on CPU.

Eager (CPU) computes ``(a * scale_a) @ (b * scale_b)`` in fp32, adds ``bias``, divides by ``scale_result`` when the
output is FP8 (and ignores it otherwise), then casts to ``out_dtype`` (default: ``a``'s dtype). The scales are
fp32: one value each (tensor-wise), or ``scale_a`` of shape ``(M, 1)`` and ``scale_b`` of ``(1, N)`` (row-wise).

Here the product is taken first and scaled after, ``(a @ b) * scale_a * scale_b``: the same value up to fp32
rounding (a scale is constant along the reduction, so it factors out), and the matmul reads the FP8 operands as
they are (as bfloat16 tiles: exact) instead of scaled fp32 copies. The casts to fp32 below are read only by the
matmul, which loads their FP8 sources directly (``partition.widened_matmul_operand``). Other scalings (block-wise,
MX) are not decomposed and so are refused by name.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _scales(scale_a: torch.Tensor, scale_b: torch.Tensor, m: int, n: int) -> bool:
    """Tensor-wise (one value each) or row-wise ((M, 1) and (1, N)) fp32 scales."""
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        return False
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return True
    return tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n)


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               bias: torch.Tensor | None = None, scale_result: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None, use_fast_accum: bool = False) -> Any:
    if a.dtype not in FP8 or b.dtype not in FP8 or a.dim() != 2 or b.dim() != 2 \
            or not _scales(scale_a, scale_b, a.shape[0], b.shape[1]):
        return NotImplemented
    out_dtype = out_dtype or a.dtype
    out = torch.mm(a.to(torch.float32), b.to(torch.float32))
    out = out * (scale_a.reshape(()) if scale_a.numel() == 1 else scale_a)
    out = out * (scale_b.reshape(()) if scale_b.numel() == 1 else scale_b)
    if bias is not None:  # fp32 + bf16 promotes to fp32 exactly: no cast node (a kernel of its own, after the matmul's)
        out = out + bias
    if scale_result is not None and out_dtype in FP8:
        out = out / scale_result.reshape(())
    return out.to(out_dtype)


FP8_DECOMPOSITIONS: dict[Any, Any] = {aten._scaled_mm.default: _scaled_mm}
