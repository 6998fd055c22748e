"""Integer division and 8/16-bit integer operands behave as eager's or are refused by name.

* An integer division by zero (``//``, ``%``, ``fmod``, ``div(rounding_mode=...)``) raises, as eager's
  "RuntimeError: ZeroDivisionError" does: a NeuronCore would return a value.
* 8/16-bit quotients and remainders are computed in int32; a quotient wraps at the store as torch's does
  (``-128 // -1 == -128`` in int8), a remainder always fits.
* torch converts a scalar operand to an 8/16-bit tensor's dtype before comparing, dividing or clamping (300
  becomes 44 in int8); such a scalar is refused, except in add/sub/mul/bitwise ops, whose low bits don't depend on it.
* A wider 0-d integer tensor operand is converted the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from neuron_compile.errors import DeviceAssertionError, UnsupportedOpError


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


def _same(fn: Callable[..., Any], *xs: torch.Tensor) -> None:
    want = fn(*xs)
    got = _compile(fn)(*xs)
    assert got.dtype == want.dtype
    assert torch.equal(got, want), f"\n got {got}\nwant {want}"


DIVISIONS = {
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "trunc_div": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "scalar_remainder": lambda a, b: 7 % b,
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("name", list(DIVISIONS))
def test_integer_division_by_zero_raises_like_eager(name: str, dtype: torch.dtype) -> None:
    fn = DIVISIONS[name]
    a = torch.tensor([7, -9, 12, 5], dtype=dtype)
    b = torch.tensor([2, -4, 0, 3], dtype=dtype)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    compiled = _compile(fn)
    with pytest.raises(DeviceAssertionError, match=r"ZeroDivisionError: integer division by zero in aten\.\w+ "
                       r"\(the divisor holds a 0\)") as info:
        compiled(a, b)
    if name != "fmod":  # torch.fmod itself is the compiled function: no line of this file calls it
        assert "(at " in str(info.value) and "test_int_division.py" in str(info.value)
    b[2] = -5  # the same compiled graph, no zero: eager's values
    assert torch.equal(compiled(a, b), fn(a, b))


def test_a_zero_scalar_divisor_fails_the_compile() -> None:
    a = torch.tensor([3, 4])
    with pytest.raises(BackendCompilerFailed) as info:
        _compile(lambda a: a // 0)(a)
    assert isinstance(info.value.inner_exception, DeviceAssertionError)
    assert "ZeroDivisionError: integer division by zero in aten.div" in str(info.value)


def test_float_division_by_zero_is_not_checked() -> None:
    a = torch.tensor([3.0, -4.0, 0.0])
    fn = lambda a: torch.stack([a // (a - a), torch.fmod(a, a - a), a / (a - a)])  # noqa: E731
    want = fn(a)
    got = _compile(fn)(a)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8], ids=str)
def test_every_8_bit_quotient_and_remainder_matches_eager(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    v = torch.arange(info.min, info.max + 1, dtype=torch.int32)
    a, b = torch.cartesian_prod(v, v[v != 0]).T.to(dtype)
    _same(lambda a, b: torch.stack([a // b, torch.div(a, b, rounding_mode="trunc"), a % b, torch.fmod(a, b)]), a, b)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16], ids=str)
def test_8_and_16_bit_remainders_match_eager(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(info.min, info.max + 1, (256,), dtype=dtype, generator=g)
    b = torch.randint(info.min, info.max + 1, (256,), dtype=dtype, generator=g)
    b[b == 0] = 3
    a[:3] = torch.tensor([info.min, info.max, 0], dtype=dtype)
    b[:3] = torch.tensor([info.max, info.min if info.min else 1, 5], dtype=dtype)
    _same(lambda a, b: a % b, a, b)
    _same(torch.fmod, a, b)
    _same(lambda a, b: a % 7, a, b)
    _same(lambda a, b: 100 % b, a, b)
    _same(lambda a, b: a // b, a, b)
    _same(lambda a, b: torch.div(a, 7, rounding_mode="trunc"), a, b)


@pytest.mark.parametrize(("name", "fn"), [
    ("clamp", lambda b: b.clamp(max=300)),
    ("remainder", lambda b: b % 300),
    ("scalar_remainder", lambda b: 300 % b),
])
def test_a_scalar_outside_an_8_bit_dtype_is_refused_by_name(name: str, fn: Callable[..., Any]) -> None:
    b = torch.tensor([7, -5, 44, 100], dtype=torch.int8)
    with pytest.raises(BackendCompilerFailed) as info:
        _compile(fn)(b)
    assert isinstance(info.value.inner_exception, UnsupportedOpError)
    msg = str(info.value)
    assert "on torch.int8 is not supported: the integer scalar 300 is outside int8, which torch converts it to " \
           "first (wrapping it, or raising an overflow error); use a constant within int8, or cast the tensor to " \
           "int32 first" in msg
    assert "test_int_division.py" in msg


@pytest.mark.parametrize("fn", [lambda b: b + 300, lambda b: b * -3, lambda b: b & 300, lambda b: b ^ 257,
                                lambda b: b - 1000])
def test_ring_ops_with_any_scalar_wrap_like_eager(fn: Callable[..., Any]) -> None:
    _same(fn, torch.tensor([7, -5, 44, 100, -128, 127], dtype=torch.int8))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8])
@pytest.mark.parametrize("value", [300, -1, -300, 70000, 2**31 + 5])
def test_comparisons_with_any_scalar_wrap_it_like_eager(dtype: torch.dtype, value: int) -> None:
    """torch converts the scalar to the 8/16-bit dtype first (``uint8 == -1`` is ``== 255``, ``int8 < 300`` is
    ``< 44``), even past int32; cosine_embedding_loss compares a uint8 target with -1."""
    info = torch.iinfo(dtype)
    every = torch.arange(info.min, info.max + 1, 97 if dtype == torch.int16 else 1, dtype=torch.int32).to(dtype)
    _same(lambda b: torch.stack((b == value, b != value, b < value, b <= value, b > value, b >= value)), every)


@pytest.mark.parametrize(("name", "fn", "dtype"), [
    ("gt", lambda b: b > torch.tensor(300), torch.int8),
    ("eq", lambda b: b == torch.tensor(-212), torch.int8),
    ("maximum", lambda b: torch.maximum(b, torch.tensor(300)), torch.int8),
    ("minimum", lambda b: torch.minimum(b, torch.tensor(-100000)), torch.int8),
    ("uint8_lt_int8", lambda u: u < torch.tensor(-1, dtype=torch.int8), torch.uint8),
    ("uint8_where", lambda u: torch.where(u > 3, u, torch.tensor(-2)), torch.uint8),
    ("int16_maximum", lambda s: torch.maximum(s, torch.tensor(70000)), torch.int16),
])
def test_a_wider_0d_operand_is_converted_like_torch(name: str, fn: Callable[..., Any], dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    x = torch.tensor([7, 44, 100, 0, info.max, info.min, 3], dtype=dtype)
    _same(fn, x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16], ids=str)
@pytest.mark.parametrize("amount", [-300, -1, 9, 257, 300, 65537])
def test_shift_amounts_outside_the_dtype_convert_like_torch(dtype: torch.dtype, amount: int) -> None:
    info = torch.iinfo(dtype)
    x = torch.arange(info.min, info.max + 1, 7).to(dtype)
    _same(lambda x: torch.stack([x >> amount, x << amount]), x)
    s = torch.tensor([0, 1, 3, 7], dtype=dtype)
    _same(lambda s: torch.bitwise_left_shift(300, s), s)
