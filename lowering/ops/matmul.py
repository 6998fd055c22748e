"""Matmul lowerings: mm and bmm as TensorE kernels with K accumulation in PSUM.

The matmul is the anchor of its kernel; elementwise consumers (bias add, activation, scaling,
residual add) fuse into the PSUM eviction as an epilogue. Operands are read through their strided
views, so transposed weights cost no copy.
"""

from __future__ import annotations

import torch
from neuron_compile.lowering.registry import register_lowering
from torch import fx

aten = torch.ops.aten

_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _mm_check(node: fx.Node) -> str | None:
    for a in node.args[:2]:
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dtype not in _MM_DTYPES:
            return f"matmul on {val.dtype} is not supported (TensorE takes fp32/bf16/fp16)"
    return None


@register_lowering(aten.mm.default, aten.bmm.default, family="matmul", kind="matmul", check=_mm_check)
def lower_mm(ctx, node):
    """aten.mm/bmm: ``out[b, m, n] = sum_k a[b, m, k] b[b, k, n]`` (lowered by the loop-kernel emitter)."""
    raise AssertionError("matmul nodes are lowered by LoopGroupEmitter._matmul")
