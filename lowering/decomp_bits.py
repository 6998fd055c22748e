"""Float ops defined on the bits of a value, as integer arithmetic on its bitcast (``Tensor.view(int)``).

* ``frexp(x)``: mantissa in [0.5, 1) and exponent with ``x == m * 2**e``. A normal number's exponent field
  gives ``e``, and the mantissa is ``x`` with that field replaced by 126's (``2**-1``). A subnormal's significand
  bits ``s`` are converted to float exactly (``s < 2**23``), so ``x == float(s) * 2**-149`` and frexp of that
  normal number gives the rest. 0, inf and NaN return ``(x, 0)``, as eager. bf16/fp16 go through float32 (exact).
* ``nextafter(x, y)``: the neighbour of ``x`` towards ``y`` is one step of its bit pattern (sign-magnitude, so
  a step away from 0 adds 1 whatever the sign); from +-0 it is the smallest subnormal with ``y``'s sign; ``y``
  when ``x == y``; NaN when either is. bf16 steps its own 16-bit pattern.

The ops only move bits and compare, so the results are eager's exactly, subnormals included.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _frexp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = x.dtype
    f = x.to(torch.float32)
    bits = f.view(torch.int32)
    field = (bits >> 23) & 0xFF
    sign = bits & -0x80000000  # bit 31
    sub = (field == 0) & (f != 0)
    # a subnormal as float(significand) * 2**-149: a normal number whose own frexp is exact
    s = (bits & 0x7FFFFF).to(torch.float32)
    s_bits = s.view(torch.int32)
    s_field = (s_bits >> 23) & 0xFF
    e = torch.where(sub, s_field - 126 - 149, field - 126)
    m_bits = torch.where(sub, s_bits, bits) & 0x7FFFFF | (126 << 23) | sign
    special = (f == 0) | (field == 0xFF)  # 0, inf, NaN: (x, 0)
    mant = torch.where(special, f, m_bits.view(torch.float32))
    return mant.to(dtype), torch.where(special, 0, e).to(torch.int32)


def _nextafter(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x, y = torch.broadcast_tensors(x, y)
    idt = _BITS.get(x.dtype)
    if idt is None:  # float64 runs as float32
        return _nextafter(x.to(torch.float32), y.to(torch.float32)).to(x.dtype)
    bits = x.view(idt).to(torch.int32)
    away = (y > x) == (x > 0)  # a step away from 0 is +1 on the magnitude bits
    step = torch.where(away, bits + 1, bits - 1)
    sign = torch.iinfo(idt).min  # the sign bit alone
    tiny = torch.where(y < 0, sign + 1, 1)  # +-the smallest subnormal
    out = torch.where(x == 0, tiny, step).to(idt).view(x.dtype)
    out = torch.where(x == y, y, out)
    return torch.where(x.isnan() | y.isnan(), x + y, out)


def _frexp_decomp(x: torch.Tensor) -> Any:
    if x.dtype not in _BITS and x.dtype != torch.float64:
        return NotImplemented
    return _frexp(x) if x.dtype != torch.float64 else tuple(
        t.to(torch.float64) if t.is_floating_point() else t for t in _frexp(x.to(torch.float32)))


def _nextafter_decomp(x: torch.Tensor, y: torch.Tensor) -> Any:
    if not x.is_floating_point() or x.dtype != y.dtype:
        return NotImplemented
    return _nextafter(x, y)


BITS: dict[Any, Any] = {
    aten.frexp.Tensor: _frexp_decomp,
    aten.nextafter.default: _nextafter_decomp,
}
