"""Bit shifts (``<<``, ``>>``, ``torch.bitwise_left_shift`` / ``bitwise_right_shift``) against eager torch.

torch's semantics, which the kernels follow exactly: a left shift is ``x * 2**s`` wrapped to the result's width and
0 for a shift below 0 or of the width or more; a right shift is arithmetic (floor(x / 2**s)), the sign (-1 or 0)
for such shifts. int64 values live as int32 on NeuronCores: a left shift whose int64 result leaves int32 raises.
The int4-unpacking pattern of quantized checkpoints, ``(w >> 4 * i) & 15``, is the motivating use.
"""

from __future__ import annotations

import pytest
import torch

from neuron_compile.errors import DeviceAssertionError

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
SHIFTS = [-3, -1, 0, 1, 3, 7, 8, 15, 16, 31, 32, 63, 64, 100]


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def _values(dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.tensor([0, 1, -1, 5, -5, 100, -100, 127, lo, hi, lo + 1, hi - 1]).clamp(lo, hi).to(dtype)


def _left_in_range(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int64 left shifts whose exact result x * 2**s is an int32 value (the others raise, tested below; torch's
    own int64 result may have wrapped back into range, as 100 << 63 == 0)."""
    keep = [not 0 <= b < 64 or -(2**31) <= a * 2**b < 2**31 for a, b in zip(x.tolist(), s.tolist(), strict=True)]
    keep = torch.tensor(keep)
    return x[keep], s[keep]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shift_by_a_tensor_matches_torch(dtype):
    x = _values(dtype).repeat_interleave(len(SHIFTS))
    s = torch.tensor(SHIFTS).repeat(len(_values(dtype))).to(dtype if dtype != torch.uint8 else torch.int64)
    if dtype == torch.uint8:
        s = s.clamp(0, 255).to(torch.uint8)  # a uint8 shift can't be negative
    torch.testing.assert_close(_compile(lambda a, b: a >> b)(x, s), x >> s, rtol=0, atol=0)
    xl, sl = _left_in_range(x, s) if dtype == torch.int64 else (x, s)
    torch.testing.assert_close(_compile(lambda a, b: torch.bitwise_left_shift(a, b))(xl, sl), xl << sl, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shift", [-1, 0, 3, 8, 31, 40, 64])
def test_shift_by_a_python_int_matches_torch(dtype, shift):
    x = _values(dtype)
    torch.testing.assert_close(_compile(lambda a: torch.bitwise_right_shift(a, shift))(x), x >> shift, rtol=0, atol=0)
    if dtype == torch.int64 and 0 <= shift < 64:
        x = x[(x.abs() < 2**31 >> min(shift, 31)) | (x == 0)]
    torch.testing.assert_close(_compile(lambda a: a << shift)(x), x << shift, rtol=0, atol=0)


def test_a_scalar_shifted_by_a_tensor():
    s = torch.tensor([0, 1, 5, 30, 40, -2], dtype=torch.int32)
    torch.testing.assert_close(_compile(lambda t: 1 << t)(s), 1 << s, rtol=0, atol=0)
    torch.testing.assert_close(_compile(lambda t: -(2**20) >> t)(s), -(2**20) >> s, rtol=0, atol=0)


def test_int4_unpacking_of_a_packed_weight():
    """A GPTQ/AWQ-style int32 word of eight 4-bit codes, unpacked and dequantized."""
    torch.manual_seed(0)
    codes = torch.randint(0, 16, (64, 8), dtype=torch.int32)
    packed = (codes << (4 * torch.arange(8, dtype=torch.int32))).sum(-1, dtype=torch.int32)
    scale = torch.rand(64, 1)

    def dequant(w, scale):
        nib = (w.unsqueeze(-1) >> (4 * torch.arange(8, dtype=torch.int32))) & 15
        return (nib.float() - 8.0) * scale

    torch.testing.assert_close(_compile(dequant)(packed, scale), dequant(packed, scale))


def test_int64_left_shift_beyond_int32_raises():
    with pytest.raises(DeviceAssertionError, match=r"integer overflow in aten\.__lshift__\.Scalar: an int64 result "
                                                   r"left the int32 range"):
        _compile(lambda t: t << 20)(torch.tensor([1, 2**12]))
    with pytest.raises(DeviceAssertionError, match="integer overflow in aten.bitwise_left_shift.Tensor"):
        _compile(lambda t, s: torch.bitwise_left_shift(t, s))(torch.tensor([1, 3]), torch.tensor([2, 35]))

