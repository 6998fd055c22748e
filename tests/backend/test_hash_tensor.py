"""torch.hash_tensor (lowering/decomp_hash.py): bit-exact against eager, uint64 results from int32 word pairs."""

from __future__ import annotations

import pytest
import torch
from cnn_helpers import unsupported


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def _bits(*patterns: int) -> torch.Tensor:
    return torch.tensor([p - 2**32 if p >= 2**31 else p for p in patterns], dtype=torch.int32).view(torch.float32)


# float32 bit patterns whose float64 widening needs care: zeros, subnormals (normal in float64), the largest
# normal, inf, quiet and signalling NaN (quieted by the conversion), negative ones
SPECIAL = _bits(0, 0x80000000, 1, 2, 3, 0x7FFFFF, 0x400000, 0x100000, 0x00800000, 0x7F7FFFFF, 0x7F800000,
                0xFF800000, 0x7FC00000, 0x7F800001, 0x7FA00000, 0xFFFFFFFF, 0x80000001, 0x807FFFFF, 0x3FC00000)


def test_every_float32_pattern_widens_bit_exactly() -> None:
    """One hash per element (dim over a size-1 axis), so each element's float64 pattern is compared alone."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([SPECIAL, torch.randint(-2**31, 2**31 - 1, (2000,), dtype=torch.int32, generator=g).view(
        torch.float32)]).unsqueeze(-1)
    got, want = _compile(lambda t: torch.hash_tensor(t, dim=1))(x), torch.hash_tensor(x, dim=1)
    assert got.dtype == torch.uint64 and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
                                   torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("kwargs", [{}, {"dim": 0, "keepdim": True}, {"dim": -1}, {"dim": (0, 2)},
                                    {"dim": (1, 2), "keepdim": True}, {"dim": ()}])
def test_matches_eager_for_every_dtype_and_reduction(dtype: torch.dtype, kwargs: dict) -> None:
    x = (torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1)) * 60).to(dtype)
    got, want = _compile(lambda t: torch.hash_tensor(t, **kwargs))(x), torch.hash_tensor(x, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_zero_dim_and_empty_batch() -> None:
    for x, kw in [(torch.tensor(2.5), {}), (torch.zeros(0, 3), {"dim": 1})]:
        torch._dynamo.reset()
        got, want = _compile(lambda t, kw=kw: torch.hash_tensor(t, **kw))(x), torch.hash_tensor(x, **kw)
        assert got.shape == want.shape and torch.equal(got, want)


def _refusal(fn, *args) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 (Dynamo wraps it: the UnsupportedOpError is its cause)
        _compile(fn)(*args)
    return str(unsupported(info.value))


def test_float64_and_hashes_used_inside_the_graph_are_refused_by_name() -> None:
    msg = _refusal(torch.hash_tensor, torch.randn(4, dtype=torch.float64))
    assert "aten.hash_tensor.default(float64[4]): float64 runs as float32 on NeuronCores" in msg
    torch._dynamo.reset()
    msg = _refusal(lambda t: torch.hash_tensor(t) == 0, torch.randn(4))
    assert "aten.hash_tensor.default(float32[4]): only a hash the graph returns is compiled" in msg


def test_a_hash_returned_beside_a_loss_trains() -> None:
    """The training graph's check lets a returned hash through (the forward compiler rewrites it)."""
    x = torch.randn(4, 3, requires_grad=True)
    loss, h = _compile(lambda t: ((t.sin() ** 2).sum(), torch.hash_tensor(t.detach(), dim=1)))(x)
    loss.backward()
    assert h.dtype == torch.uint64 and torch.equal(h, torch.hash_tensor(x.detach(), dim=1))
    torch.testing.assert_close(x.grad, (2 * x.sin() * x.cos()).detach())
