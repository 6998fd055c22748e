"""Integer matmuls (``mm``/``bmm``/``mv``/``dot`` and what decomposes into them: ``matmul``, ``addmm``, ``linear``,
``baddbmm``, ``tensordot``, ...) and convolutions computed exactly with float matmuls (convolutions) of 8-bit limbs.

TensorE multiplies floats. Every integer a NeuronCore holds is an int32 (int64 runs as int32 there), and an int32
is the sum of four 8-bit limbs, ``a = a0 + a1 2^8 + a2 2^16 + a3 2^24`` with ``a0, a1, a2`` in [0, 255] and the
top limb ``a3 = a >> 24`` signed, in [-128, 127]. A limb is exact in fp32 (and in bf16: 8 significant bits), a
product of two limbs is at most 255 * 255 < 2^16, and a sum of up to 258 such products stays below 2^24, so it is
exact in TensorE's fp32 accumulation. So, per block of <= ``_chunk`` reduction indices and per limb pair (i, j),
``A_i @ B_j`` is an exact integer; converted to int32 and shifted by ``8 (i + j)`` bits, the pairs add up to
``A @ B`` modulo 2^32 (int32 arithmetic wraps, as torch's does). Pairs with ``8 (i + j) >= `` the result's width
vanish modulo it and are not computed: int32 takes 10 pairs, int16 3, int8 and uint8 one (their values are one
limb each, signed for int8). A convolution is bilinear too: its reduction blocks are blocks of input channels
(all of a group's when there are several groups), and a kernel with more than 258 taps per block is refused.

That is torch's result exactly for int8/uint8/int16/int32, whose matmuls wrap at their own width. An int64 result
is exact modulo 2^64 in torch, so it must not have left int32: an fp32 shadow ``A @ B`` (within ``err`` of the
true result, ``err`` bounded from ``|A| @ |B|``) decides. When ``err <= 2^29`` and the int32 result is within
2^30 of the shadow, the true result is within 2^32 of it and congruent modulo 2^32, so equal. Otherwise the
runner raises a DeviceAssertionError naming the matmul (values that large are outside what NeuronCores compute
in int64 anyway).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from neuron_compile.lowering.intguard import assert_shadow

aten = torch.ops.aten

_LIMB_BITS = 8
_EXACT = 2**24  # fp32 integers are exact below this
_RESULT_BITS = {torch.int8: 8, torch.uint8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 32}


def _limbs(x: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """``x`` (an integer tensor) as fp32 limbs, low first, each with the largest magnitude it can hold: the low
    limbs unsigned bytes, the top one signed (int8 and uint8 are one limb, as they are)."""
    if x.dtype in (torch.int8, torch.uint8):
        return [(x.to(torch.float32), 128 if x.dtype == torch.int8 else 255)]
    n = 2 if x.dtype == torch.int16 else 4
    x = x.to(torch.int32)
    out = [(((x >> (_LIMB_BITS * i)) & 0xFF).to(torch.float32), 255) for i in range(n - 1)]
    out.append(((x >> (_LIMB_BITS * (n - 1))).to(torch.float32), 128))
    return out


def _exact_products(a: torch.Tensor, b: torch.Tensor, product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    units: int, per_unit: int, split: Callable[[torch.Tensor, torch.Tensor, int, int], Any],
                    what: str) -> Any:
    """``product(a, b)`` (bilinear, reducing over ``units`` slices of ``per_unit`` products each: a matmul's K, a
    convolution's input channels) exactly, in ``a``'s integer dtype; ``split(ai, bj, u0, u1)`` gives the operands
    of units u0..u1. NotImplemented when even one unit's products could leave fp32's exact range."""
    dtype = a.dtype
    bits = _RESULT_BITS.get(dtype)
    if bits is None or b.dtype != dtype:
        return NotImplemented
    la, lb = _limbs(a), _limbs(b)
    per_block = (_EXACT - 1) // (max(m for _, m in la) * max(m for _, m in lb))
    chunk = per_block // max(per_unit, 1)
    if chunk < 1:
        return NotImplemented
    acc: torch.Tensor | None = None
    for i, (ai, _) in enumerate(la):
        for j, (bj, _) in enumerate(lb):
            shift = _LIMB_BITS * (i + j)
            if shift >= bits:
                continue
            for u0 in range(0, max(units, 1), chunk):
                u1 = min(units, u0 + chunk)
                part = product(*split(ai, bj, u0, u1)) if u1 - u0 < units else product(ai, bj)
                term = part.to(torch.int32)
                if shift:
                    term = term * (1 << shift)
                acc = term if acc is None else acc + term
    assert acc is not None
    if dtype == torch.int64:
        _check_int32(a, b, acc, product, units * per_unit, what)
    return acc.to(dtype)


def _int_matmul(a: torch.Tensor, b: torch.Tensor) -> Any:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return NotImplemented
    mm = aten.bmm.default if a.dim() == 3 else aten.mm.default
    return _exact_products(a, b, mm, a.shape[-1], 1, lambda x, y, k0, k1: (x[..., k0:k1], y[..., k0:k1, :]),
                           "matmul")


def _int_convolution(x: torch.Tensor, w: torch.Tensor, bias: Any, stride: Any, padding: Any, dilation: Any,
                     transposed: bool, output_padding: Any, groups: int) -> Any:
    """An integer convolution (forward or transposed) as limb convolutions in fp32, reducing over blocks of input
    channels (one group; with several groups, only when a whole group's products fit one block)."""
    if x.dtype.is_floating_point or x.dtype.is_complex:
        return NotImplemented

    def conv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return aten.convolution.default(a, b, None, stride, padding, dilation, transposed, output_padding, groups)

    def split(a: torch.Tensor, b: torch.Tensor, c0: int, c1: int) -> Any:
        return a[:, c0:c1], (b[c0:c1] if transposed else b[:, c0:c1])

    taps = math.prod(w.shape[2:])
    if groups == 1:
        out = _exact_products(x, w, conv, x.shape[1], taps, split, "convolution")
    else:  # never split: one block must hold a whole group's products
        out = _exact_products(x, w, conv, 1, taps * (x.shape[1] // groups), split, "convolution")
    if out is NotImplemented or bias is None:
        return out
    shape = [1, -1] + [1] * (out.dim() - 2)
    return (out.to(torch.int32) + bias.to(torch.int32).reshape(shape)).to(out.dtype)


def _check_int32(a: torch.Tensor, b: torch.Tensor, result: torch.Tensor, product: Any, k: int, what: str) -> None:
    """A device-side check that the int64 product's true result is the int32 ``result`` (module docstring): ``k``
    products are summed into each result."""
    af, bf = a.to(torch.float32), b.to(torch.float32)
    # fp32 rounding of the operands (2^-24 each), of every product and of every partial sum: 2^-24 (k + 3) relative
    err = product(af.abs(), bf.abs()) * (4.0 * (k + 3) * 2.0**-24)
    assert_shadow(result, product(af, bf), what, valid=err <= 2.0**29)


def _int_mv(a: torch.Tensor, v: torch.Tensor) -> Any:
    """mv of integers through the matmul (the generic decomposition's sum would widen int32 to int64 and report an
    overflow where torch's int32 mv wraps)."""
    out = _int_matmul(a, v.unsqueeze(1))
    return out if out is NotImplemented else out.squeeze(1)


def _int_dot(a: torch.Tensor, b: torch.Tensor) -> Any:
    out = _int_matmul(a.unsqueeze(0), b.unsqueeze(1))
    return out if out is NotImplemented else out.reshape(())


INTMM: dict[Any, Any] = {
    aten.convolution.default: _int_convolution,
    aten.mm.default: _int_matmul,
    aten.bmm.default: _int_matmul,
    aten.mv.default: _int_mv,
    aten.dot.default: _int_dot,
    aten.vdot.default: _int_dot,
}
