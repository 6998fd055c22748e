"""Lower bounds of graph values, so range-restricted instructions can skip their range fix-ups.

ScalarE sqrt is valid on [2^-116, 2^118] only (REFERENCE 2.6): a general ``sqrt``/``rsqrt`` needs
scaling and fix-up selects, but ``rsqrt(var + eps)`` (every LayerNorm/RMSNorm) is provably at least
``eps``. :func:`lower_bound` proves such facts from the producing ops (no values are evaluated).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

aten = torch.ops.aten

_NONNEG = {aten.abs.default, aten.exp.default, aten.sigmoid.default, aten.sqrt.default, aten.rsqrt.default,
           aten.var.correction, aten.relu.default, aten.softmax.int, aten._softmax.default}
_PASS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.permute.default,
         aten.clone.default, aten.alias.default, aten.detach.default, aten.slice.Tensor, aten.select.int,
         aten._to_copy.default, aten.t.default, aten.transpose.int}
_SUMS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
         aten.amin.default}


def lower_bound(a: Any, depth: int = 0) -> float | None:
    """A proven lower bound of every element of ``a`` (a node or a Python number), or None."""
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return float(a)
    if not isinstance(a, fx.Node) or a.op != "call_function" or depth > 12:
        return None
    t, args = a.target, a.args
    if t in _PASS:
        return lower_bound(args[0], depth + 1)
    if t in _NONNEG:
        return 0.0
    if t in _SUMS:
        lb = lower_bound(args[0], depth + 1)
        return 0.0 if lb is not None and lb >= 0 else None
    if t in (aten.mul.Tensor, aten.mul.Scalar):
        if args[0] is args[1]:
            return 0.0  # a square
        la, lb = lower_bound(args[0], depth + 1), lower_bound(args[1], depth + 1)
        return 0.0 if la is not None and lb is not None and la >= 0 and lb >= 0 else None
    if t in (aten.add.Tensor, aten.add.Scalar):
        alpha = a.kwargs.get("alpha", 1)
        la, lb = lower_bound(args[0], depth + 1), lower_bound(args[1], depth + 1)
        if la is None or lb is None or not isinstance(alpha, (int, float)) or alpha < 0:
            return None
        return la + alpha * lb
    if t == aten.pow.Tensor_Scalar and isinstance(args[1], (int, float)) and float(args[1]) % 2 == 0:
        return 0.0
    if t == aten.clamp.default:
        lo = args[1] if len(args) > 1 else a.kwargs.get("min")
        return float(lo) if isinstance(lo, (int, float)) else lower_bound(args[0], depth + 1)
    if t == aten.maximum.default:
        bounds = [x for x in (lower_bound(args[0], depth + 1), lower_bound(args[1], depth + 1)) if x is not None]
        return max(bounds) if bounds else None
    return None
