"""``Tensor.view(dtype)`` compiles to a DMA that reads the source's bytes as the new dtype
(``lowering/ops/movement.py::lower_view_dtype``), of the same element size or another (the last dim scales, as
torch's); bitcasts to or from int64/float64/bool (stored otherwise than torch's bits) are refused by name. ``frexp`` and
``nextafter`` are integer arithmetic on such bitcasts (``lowering/decomp_bits.py``).

The bits must be eager's exactly: float exponent extraction, the "fast inverse square root" integer trick,
bf16 sign masking, NaN payloads, strided and sliced sources, 0-d and empty tensors, subnormals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import neuron_compile.backend
from neuron_compile.errors import UnsupportedOpError
from neuron_compile.nki_api.checker import check_source_against_api

X = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


CASES: dict[str, tuple[Callable[..., Any], torch.Tensor]] = {
    "float_exponent": (lambda x: (x.view(torch.int32) >> 23) & 0xFF, X),
    "next_float_up": (lambda x: (x.view(torch.int32) + 1).view(torch.float32), X.abs()),
    "fast_inverse_sqrt": (lambda x: (0x5F3759DF - (x.view(torch.int32) >> 1)).view(torch.float32), X.abs() + 0.5),
    "bf16_abs_by_mask": (lambda x: (x.view(torch.int16) & 0x7FFF).view(torch.bfloat16), X.bfloat16()),
    "int16_as_fp16": (lambda x: x.view(torch.float16) * 2, torch.arange(0, 30000, 1000, dtype=torch.int16)),
    "transposed_source": (lambda x: x.t().view(torch.int32), X),
    "sliced_source": (lambda x: x[1:, 2:].view(torch.int32) - 5, X),
    "uint8_as_int8": (lambda x: x.view(torch.int8), torch.arange(0, 256, dtype=torch.int32).to(torch.uint8)),
    "nan_payloads": (lambda x: x.view(torch.float32).view(torch.int32) + 0,
                     torch.tensor([0x7FC00001, 0x7F800001, -1, 1, 0x00000001], dtype=torch.int32)),
    "zero_d": (lambda x: x.view(torch.int32) + 0, torch.tensor(1.5)),
    "empty": (lambda x: x.view(torch.int32), torch.randn(0, 3)),
    # another element size: the last dim scales (bytes of a float, packed bf16 pairs, int8 quads)
    "float_bytes": (lambda x: x.view(torch.uint8), X),
    "float_bytes_math": (lambda x: (x * 2).view(torch.int8).to(torch.int32) + 1, X),
    "float_as_bf16_halves": (lambda x: x.view(torch.bfloat16), X),
    "bf16_pairs_as_float": (lambda x: x.view(torch.float32), X.bfloat16()),
    "bytes_as_float": (lambda x: x.view(torch.float32), torch.arange(0, 96, dtype=torch.int32).to(torch.uint8).view(3, 32)),
    "int8_as_bf16": (lambda x: x.view(torch.bfloat16), torch.arange(-48, 48, dtype=torch.int32).to(torch.int8).view(4, 24)),
    "permuted_source_to_bytes": (lambda x: x.transpose(0, 1).view(torch.uint8), X.view(2, 2, 8)),
    "sliced_bytes_as_float": (lambda x: x[1:, 4:].view(torch.float32),
                              torch.arange(0, 36, dtype=torch.int32).to(torch.uint8).view(3, 12)),
    "materialised_then_int16": (lambda x: (x.t() * 2).contiguous().view(torch.int16), X),
    "bytes_roundtrip": (lambda x: x.view(torch.uint8).view(torch.float32) + 0, X),
    "empty_to_bytes": (lambda x: x.view(torch.uint8), torch.randn(0, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bitcast_matches_eager_bit_for_bit(name: str) -> None:
    fn, x = CASES[name]
    want = fn(x)
    got = _compile(fn)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(torch.uint8) if got.dtype.is_floating_point else got,
                       want.view(torch.uint8) if want.dtype.is_floating_point else want)


def test_bitcast_kernel_reads_the_source_through_a_typed_access_pattern() -> None:
    _compile(lambda x: x.t().view(torch.int32) >> 23)(X)
    sources = [s for g in neuron_compile.backend.compiled_graphs()
               for name, s in (g["sources"] if isinstance(g["sources"], list) else g["sources"].items())
               if "bitcast" in name]
    assert len(sources) == 1
    assert "dtype=nl.int32)" in sources[0] and "nisa.dma_copy(" in sources[0]
    assert check_source_against_api(sources[0]) == []


@pytest.mark.parametrize(("fn", "x", "why"), [
    (lambda x: x.view(torch.float64), torch.arange(3), "int64/float64 are stored as 32-bit values"),
    (lambda x: x.view(torch.uint8), torch.tensor([True, False]), "bool"),
])
def test_other_bitcasts_are_refused_by_name(fn: Callable[..., Any], x: torch.Tensor, why: str) -> None:
    with pytest.raises(BackendCompilerFailed) as info:
        _compile(fn)(x)
    assert isinstance(info.value.inner_exception, UnsupportedOpError)
    assert "aten.view.dtype" in str(info.value) and why in str(info.value)


EDGES = torch.tensor([0.0, -0.0, 1.0, -3.5, 1e-40, -1e-45, 6e-39, float("inf"), -float("inf"), float("nan"), 3.4e38,
                      1.17549435e-38, 2.0**-127, 123456.789, -7e-3])
TOWARDS = torch.tensor([1.0, 1.0, 2.0, -4.0, 0.0, 1.0, -1.0, 0.0, 0.0, 1.0, float("inf"), 0.0, 1.0, -1e9, 5.0])


def _bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit for bit, except that any NaN matches any NaN (its sign and payload are not specified)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.is_floating_point():
        assert torch.equal(got.isnan(), want.isnan())
        keep = ~want.isnan()
        ints = {4: torch.int32, 2: torch.int16}[want.element_size()]
        got, want = got[keep].view(ints), want[keep].view(ints)
    assert torch.equal(got, want), f"\n got {got}\nwant {want}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_frexp_matches_eager_on_subnormals_zeros_and_specials(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.cat([EDGES, torch.randn(500, generator=g) * 10.0 ** torch.randint(-40, 38, (500,), generator=g)])
    x = x.to(dtype)
    want = torch.frexp(x)
    got = _compile(torch.frexp)(x)
    _bits_equal(got.mantissa, want.mantissa)
    _bits_equal(got.exponent, want.exponent)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nextafter_matches_eager_bit_for_bit(dtype: torch.dtype) -> None:
    x, y = EDGES.to(dtype), TOWARDS.to(dtype)
    for a, b in ((x, y), (y, x), (x, x), (x, -y)):
        _bits_equal(_compile(torch.nextafter)(a, b), torch.nextafter(a, b))
