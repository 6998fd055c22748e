"""Overflow guards for int64 arithmetic computed in int32 (NeuronCores hold integers as int32).

torch computes int64 results in 64 bits; the kernels compute them exactly in int32, which agrees unless
a result leaves the int32 range. For every int64 add/sub/mul/neg/abs/sum/left-shift/power node, :func:`overflow` replays
the rule in fp32 on the same operands (a shadow value within 2^9 of the true result) and marks where
the int32 result differs from it by more than 2^30: a wrapped result is off by a multiple of 2^32, so
the test never misses an overflow and never fires without one. The lowering stores the marks as a flag
buffer; the runner raises :class:`~neuron_compile.errors.DeviceAssertionError` if any is set.
Decompositions that build an int64 result from int32 pieces (integer matmuls, powers) make the same test in torch
ops with :func:`assert_shadow`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from neuron_compile.lowering.builder import ProgramBuilder, TileVal
from torch import fx

aten = torch.ops.aten

GUARDED = {aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor, aten.mul.Scalar,
           aten.rsub.Tensor, aten.rsub.Scalar, aten.neg.default, aten.abs.default, aten.sum.dim_IntList,
           aten.sum.default, aten.__lshift__.Scalar, aten.__lshift__.Tensor, aten.bitwise_left_shift.Tensor,
           aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor, aten.pow.Tensor_Scalar}
_SHADOW_SLACK = 2.0**30


def guarded(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return node.target in GUARDED and isinstance(val, torch.Tensor) and val.dtype == torch.int64


def overflow_message(op: str, where: str) -> str:
    """The DeviceAssertionError text when :func:`overflow`'s mark is set for ``op`` (at ``where``)."""
    return (f"integer overflow in {op}: an int64 result left the int32 range NeuronCores compute integers in "
            f"(at {where}); compute in float or keep values below 2**31")


def assert_shadow(result: torch.Tensor, shadow: torch.Tensor, what: str, valid: torch.Tensor | None = None) -> None:
    """In a decomposition: a device-side assertion that the int32 ``result`` of an int64 ``what`` is its true value,
    given an fp32 ``shadow`` within 2^29 of the true value (the caller's bound; ``valid`` marks where the bound
    holds, when it does not everywhere). Within 2^30 of the shadow, a result is within 2^32 of the true value and
    congruent to it modulo 2^32, so equal."""
    ok = (result.to(torch.float32) - shadow).abs() <= _SHADOW_SLACK
    if valid is not None:
        ok = ok & valid
    aten._assert_async.msg(ok.all(), f"integer overflow in an int64 {what}: a result left the int32 range "
                                     "NeuronCores compute integers in; compute in float or keep the values smaller")


def overflow(b: ProgramBuilder, rule: Callable[..., Any], ctx: Any, node: fx.Node, args: list[Any],
             kwargs: dict[str, Any], result: TileVal) -> TileVal | None:
    """1.0 where the int32 ``result`` of an int64 node wrapped (None when nothing can)."""
    if not isinstance(result, TileVal) or result.dtype != "int32":
        return None
    mode, b.int_mode = b.int_mode, False
    try:
        fargs = [b.cast(a, "float32") if isinstance(a, TileVal) else a for a in args]
        shadow = rule(ctx, node, *fargs, **kwargs)
        if not isinstance(shadow, TileVal):
            return None
        diff = b.binary("subtract", b.cast(result, "float32"), shadow)
        far = b.binary("maximum", diff, b.binary("multiply", diff, -1.0))
        return b.binary("greater", far, _SHADOW_SLACK)  # type: ignore[return-value]
    finally:
        b.int_mode = mode
