"""Integer matmuls and convolutions (lowering/decomp_intmm.py): exact, with eager's wrap-around, from fp32 products
of 8-bit limbs.

Values span each dtype's whole range and the reductions are long enough (K = 700 > the 256 products an fp32
accumulation holds exactly) that a plain fp32 matmul would be wrong in the low bits: every result must equal
eager's bit for bit. int64 results are checked against the int32 range NeuronCores hold them in: beyond it, a
DeviceAssertionError names the matmul; never a wrong number.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.exc import BackendCompilerFailed

from neuron_compile import backend as B
from neuron_compile.errors import DeviceAssertionError

RANGES = {torch.int8: (-128, 128), torch.uint8: (0, 256), torch.int16: (-2**15, 2**15),
          torch.int32: (-2**31, 2**31 - 1), torch.int64: (-2**10, 2**10)}


def _ints(dtype: torch.dtype, *shape: int, seed: int = 0) -> torch.Tensor:
    lo, hi = RANGES[dtype]
    return torch.randint(lo, hi, shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _same(fn: Callable[..., Any], *xs: torch.Tensor) -> None:
    want = fn(*xs)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="neuron", dynamic=False)(*xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), f"max difference {(got.double() - want.double()).abs().max()}"


@pytest.mark.parametrize("dtype", list(RANGES), ids=str)
def test_mm_and_bmm_match_eager_exactly(dtype: torch.dtype) -> None:
    k = 700 if dtype != torch.int64 else 60  # int64: results stay inside int32 (checked below)
    a, b = _ints(dtype, 5, k), _ints(dtype, k, 3, seed=1)
    _same(torch.mm, a, b)
    _same(torch.bmm, torch.stack([a, a.flip(0)]), torch.stack([b, b.flip(1)]))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64], ids=str)
def test_what_decomposes_into_integer_matmuls(dtype: torch.dtype) -> None:
    """matmul (vector and batched), addmm/addbmm/baddbmm with integer and float (truncated) scalars, linear, mv,
    dot, tensordot and einsum."""
    a, b, v = _ints(dtype, 4, 300), _ints(dtype, 300, 6, seed=1), _ints(dtype, 300, seed=2)
    bias = _ints(dtype, 4, 6, seed=3)
    _same(torch.matmul, a, v)
    _same(torch.mv, a, v)
    _same(torch.dot, v, v.flip(0))
    _same(lambda x, y, z: torch.addmm(x, y, z, beta=2, alpha=3), bias, a, b)
    _same(lambda x, y, z: torch.addmm(x, y, z, beta=1.7, alpha=2.6), bias, a, b)  # eager truncates: 1 and 2
    _same(lambda x, y, z: torch.addbmm(x, y, z, beta=0.2, alpha=0.6), bias, torch.stack([a, a]), torch.stack([b, b]))
    _same(lambda x, y, z: torch.baddbmm(x, y, z, alpha=2), bias.expand(2, 4, 6), torch.stack([a, a]),
          torch.stack([b, b]))
    _same(lambda x, w: F.linear(x, w), a, b.t())
    _same(lambda x, y: torch.tensordot(x, y, dims=([1], [0])), a, b)
    _same(lambda x, y: torch.einsum("ik,kj->ij", x, y), a, b)


def test_int64_matmul_beyond_int32_raises_instead_of_wrapping() -> None:
    """torch's int64 matmul is exact to 2**63; NeuronCores hold int64 as int32. A result past int32 raises."""
    a = torch.full((2, 8), 2**20, dtype=torch.int64)
    b = torch.full((8, 3), 2**12, dtype=torch.int64)
    f = torch.compile(torch.mm, backend="neuron", dynamic=False)
    with pytest.raises(DeviceAssertionError, match="integer overflow in an int64 matmul"):
        f(a, b)
    # large operands whose products cancel are exact: the check is on the result, not the operands
    c = torch.tensor([[2**20, -2**20]], dtype=torch.int64)
    d = torch.tensor([[2**11], [2**11]], dtype=torch.int64)
    _same(torch.mm, c, d)


def test_empty_reduction_and_float_matmuls_unchanged() -> None:
    _same(torch.mm, torch.zeros(3, 0, dtype=torch.int32), torch.zeros(0, 2, dtype=torch.int32))
    x, y = torch.randn(5, 7), torch.randn(7, 3)
    torch.testing.assert_close(torch.compile(torch.mm, backend="neuron", dynamic=False)(x, y), x @ y)
    srcs = B.compiled_graphs()[-1]["sources"]
    text = "".join(s for _, s in srcs) if isinstance(srcs, list) else "".join(srcs.values())
    assert "nisa.nc_matmul" in text


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8], ids=str)
def test_integer_convolutions_match_eager_exactly(dtype: torch.dtype) -> None:
    """Convolutions of integers reduce over blocks of input channels (40 channels of 3x3 taps: two blocks for
    4-limb int64) with the bias added in int32; grouped, 1-D, 3-D and (int64, as eager) transposed ones too."""
    lo, hi = (-300, 300) if dtype == torch.int64 else RANGES[dtype]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(lo, hi, (2, 40, 9, 9), dtype=dtype, generator=g)
    w = torch.randint(lo, hi, (6, 40, 3, 3), dtype=dtype, generator=g)
    b = torch.randint(lo, hi, (6,), dtype=dtype, generator=g)
    _same(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), x, w, b)
    _same(lambda x, w: F.conv1d(x, w, padding=2), x[:, :, 0], w[:, :, 0])
    _same(lambda x, w: F.conv2d(x, w, groups=2), x, w[:, :20])
    _same(lambda x, w: F.conv3d(x, w), x[:, :8].reshape(2, 8, 9, 3, 3), w[:, :8, :2].reshape(6, 8, 2, 3, 1))
    if dtype == torch.int64:  # eager's CPU transposed convolution takes int64 only
        _same(lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1), x, w.transpose(0, 1).contiguous())


def test_integer_convolution_with_too_many_taps_is_refused() -> None:
    """300 taps of 4-limb products exceed what one fp32 accumulation holds exactly: refused by name."""
    x, w = torch.ones(1, 1, 400, dtype=torch.int64), torch.ones(2, 1, 300, dtype=torch.int64)
    with pytest.raises(BackendCompilerFailed, match="convolution of torch.int64 x torch.int64 is not supported"):
        torch.compile(lambda a, b: F.conv1d(a, b), backend="neuron", dynamic=False)(x, w)
