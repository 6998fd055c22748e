"""Integer powers (``pow`` of an integer tensor exponent, ``int ** tensor``) by exact binary exponentiation.

ScalarE and VectorE raise floats to powers, which is exact for integers only below 2^24. Integer ``pow`` is
instead unrolled as square-and-multiply over the exponent's bits in int32, whose multiplications wrap exactly as
torch's int32 (and narrower, after the cast back) arithmetic does; one step per bit the exponent's dtype can hold
(31 for int32/int64). A negative exponent gives what eager gives: 1 for base 1, +-1 for base -1 (by the
exponent's parity), 0 for every other base (0 included).

int64 results are exact in torch to 2^63; NeuronCores hold int64 as int32. An fp32 shadow ``|b|^e`` (within a
relative 2^-18 of the true result, or inf) decides: a result that wrapped differs from it by more than 2^30, as
for the other int64 ops (lowering/intguard.py), and the runner raises a DeviceAssertionError.
"""

from __future__ import annotations

from typing import Any

import torch
from neuron_compile.lowering.intguard import assert_shadow

aten = torch.ops.aten

_EXPONENT_BITS = {torch.int8: 7, torch.uint8: 8, torch.int16: 15, torch.int32: 31, torch.int64: 31}


def _int_pow(base: Any, exponent: Any) -> Any:
    if not isinstance(base, torch.Tensor) and not isinstance(exponent, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(base, exponent)
    if dtype not in _EXPONENT_BITS:
        return NotImplemented
    ref = base if isinstance(base, torch.Tensor) else exponent
    b = base.to(torch.int32) if isinstance(base, torch.Tensor) else torch.full_like(ref, int(base), dtype=torch.int32)
    e = exponent.to(torch.int32) if isinstance(exponent, torch.Tensor) else torch.full_like(
        ref, int(exponent), dtype=torch.int32)
    b, e = torch.broadcast_tensors(b, e)
    bits = _EXPONENT_BITS[exponent.dtype if isinstance(exponent, torch.Tensor) else dtype]
    negative = e < 0
    rest = torch.where(negative, 0, e)
    result = torch.ones_like(b)
    square = b
    for bit in range(bits):
        result = torch.where((rest >> bit) & 1 == 1, result * square, result)
        if bit < bits - 1:
            square = square * square
    odd = (e & 1) == 1
    at_negative = torch.where(b == 1, 1, torch.where(b == -1, torch.where(odd, -1, 1), 0))
    result = torch.where(negative, at_negative, result)
    if dtype == torch.int64:
        magnitude = torch.exp(rest.to(torch.float32) * torch.log(b.abs().to(torch.float32)))
        magnitude = torch.where(rest == 0, 1.0, magnitude)  # 0 ** 0 (and b ** 0) is 1; 0 * log 0 is NaN
        shadow = torch.where(odd & (b < 0), -magnitude, magnitude)
        assert_shadow(torch.where(negative, 0, result), torch.where(negative, 0.0, shadow), "pow")
    return result.to(dtype)


INTPOW: dict[Any, Any] = {
    aten.pow.Tensor_Tensor: _int_pow,
    aten.pow.Scalar: _int_pow,
}
