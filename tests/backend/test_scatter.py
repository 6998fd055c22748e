"""Gather/scatter family vs eager: general gather, scatter/scatter_add/scatter_reduce, index_add/copy/fill/reduce,
put, masked_scatter (the LineGatherKernel and ScatterKernel).

Indices repeat (duplicates must reduce like eager; ``scatter``/``index_copy`` with duplicates keep CPU
torch's last write), index shapes smaller than self in every dim, dims other than the last, more than
128 lines, non-contiguous operands, NaN sources, fp32/bf16/int64; out-of-range indices raise the same
exception type as eager. Gradients of gather and scatter_add/scatter_reduce in strict mode.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from cnn_helpers import check_grads

from neuron_compile.errors import IndexOutOfRangeError

NAN = float("nan")


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _close(got: Any, want: Any, what: str = "", tol: float = 1e-5) -> None:
    if isinstance(want, (tuple, list)):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{what}[{i}]", tol)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)} != " \
                                                                f"{want.dtype}{tuple(want.shape)}"
    if want.is_floating_point():
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}:\n got {got}\nwant {want}"


def _check(fn: Callable[..., Any], *xs: Any, tol: float = 1e-5) -> None:
    with torch.no_grad():
        got = _compile(fn)(*xs)
        want = fn(*xs)
    _close(got, want, getattr(fn, "__name__", "fn"), tol)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("shape,ishape,dim", [((5, 9), (5, 4), 1), ((5, 9), (3, 9), 0), ((130, 7), (130, 12), 1),
                                              ((4, 6, 5), (2, 3, 5), 1), ((8,), (20,), 0), ((3, 5), (2, 2), 0)])
def test_gather_any_index_shape(shape: tuple[int, ...], ishape: tuple[int, ...], dim: int) -> None:
    x = torch.randn(shape, generator=_g(1))
    idx = torch.randint(0, shape[dim], ishape, generator=_g(2))
    _check(lambda x, i: torch.gather(x, dim, i), x, idx)


def test_gather_non_contiguous_bf16_int_and_long_lines() -> None:
    x = torch.randn(20, 40000, generator=_g(3))  # lines longer than one nc_n_gather chunk
    idx = torch.randint(0, 40000, (20, 9), generator=_g(4))
    xb = torch.randn(12, 10, generator=_g(5)).to(torch.bfloat16)
    xi = torch.randint(-(2**30), 2**30, (6, 7), generator=_g(6))
    ib, ii = idx[:10, :5] % 12, idx[:3, :7] % 6

    def f(x: torch.Tensor, i: torch.Tensor, xb: torch.Tensor, xi: torch.Tensor, ib: torch.Tensor,
          ii: torch.Tensor) -> Any:
        return torch.gather(x, 1, i), torch.gather(xb.t(), 1, ib), torch.gather(xi, 0, ii)

    _check(f, x, idx, xb, xi, ib, ii)


def _dup_index(shape: tuple[int, ...], size: int, seed: int) -> torch.Tensor:
    return torch.randint(0, size, shape, generator=_g(seed))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_with_duplicates(reduce: str, include_self: bool) -> None:
    x = torch.randn(6, 10, generator=_g(7))
    src = torch.randn(6, 15, generator=_g(8))
    src[0, 3] = NAN
    idx = _dup_index((6, 15), 10, 9)

    def f(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> Any:
        return x.scatter_reduce(1, i, s, reduce, include_self=include_self), \
            x.t().scatter_reduce(0, i.t()[:, :4], s.t()[:, :4], reduce, include_self=include_self)

    _check(f, x, idx, src)


def test_scatter_and_scatter_add_general_shapes_and_last_write_wins() -> None:
    x = torch.randn(140, 9, generator=_g(10))
    src = torch.randn(150, 12, generator=_g(11))
    idx = _dup_index((140, 12), 9, 12)
    idx0 = _dup_index((3, 9), 140, 13)

    def f(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor, i0: torch.Tensor) -> Any:
        return (x.scatter(1, i, s), x.scatter_add(1, i, s), x.scatter(0, i0, 2.5), x.scatter_add(0, i0, s[:3, :9]),
                x.scatter(1, i, s, reduce="add"), x.scatter(1, i[:, :3], 1.5, reduce="multiply"))

    _check(f, x, idx, src, idx0)


def test_scatter_where_index_covers_part_of_self() -> None:
    x = torch.randn(7, 8, 5, generator=_g(14))
    idx = _dup_index((3, 4, 2), 8, 15)
    src = torch.randn(3, 4, 2, generator=_g(16))
    _check(lambda x, i, s: x.scatter_add(1, i, s) * 1.0, x, idx, src)
    _check(lambda x, i, s: x.permute(2, 0, 1).scatter(2, i.permute(2, 0, 1), s.permute(2, 0, 1)), x, idx, src)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.int32])
def test_scatter_dtypes(dtype: torch.dtype) -> None:
    if dtype.is_floating_point:
        x, src = torch.randn(5, 8, generator=_g(17)).to(dtype), torch.randn(5, 6, generator=_g(18)).to(dtype)
    else:
        x = torch.randint(-(2**28), 2**28, (5, 8), generator=_g(17)).to(dtype)
        src = torch.randint(-(2**28), 2**28, (5, 6), generator=_g(18)).to(dtype)
    idx = _dup_index((5, 6), 8, 19)

    def f(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> Any:
        return (x.scatter(1, i, s), x.scatter_add(1, i, s), x.scatter_reduce(1, i, s, "amax", include_self=False),
                x.scatter_reduce(1, i, s, "amin"))

    _check(f, x, idx, src, tol=2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_index_ops_with_duplicates_and_negative_fill_indices() -> None:
    x = torch.randn(6, 9, generator=_g(20))
    src = torch.randn(6, 5, generator=_g(21))
    idx = torch.tensor([3, 0, 3, 8, 0])
    neg = torch.tensor([-1, 2, -9])

    def f(x: torch.Tensor, s: torch.Tensor, i: torch.Tensor, n: torch.Tensor) -> Any:
        return (x.index_add(1, i, s), x.index_add(1, i, s, alpha=-2.0), x.index_copy(1, i, s),
                x.index_fill(1, n, -7.5), x.index_fill(0, n[:2], float("inf")),
                x.index_reduce(1, i, s, "amax"), x.index_reduce(1, i, s, "mean", include_self=False),
                x.index_reduce(1, i, s, "prod"))

    _check(f, x, src, idx, neg)


def test_put_and_masked_scatter() -> None:
    x = torch.randn(4, 6, generator=_g(22))
    idx = torch.tensor([0, 23, -1, 5, 5])
    vals = torch.randn(5, generator=_g(23))
    mask = torch.rand(4, 6, generator=_g(24)) > 0.5
    source = torch.randn(30, generator=_g(25))

    def f(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> Any:
        return x.put(i, v, accumulate=True), x.masked_scatter(m, s), x.masked_scatter(m[0], s)

    _check(f, x, idx, vals, mask, source)


def _raises_like_eager(fn: Callable[..., Any], *xs: Any, ours: type, eager: type) -> str:
    with pytest.raises(eager):
        fn(*xs)
    with pytest.raises(ours) as info:
        _compile(fn)(*xs)
    assert isinstance(info.value, eager)
    return str(info.value)


def test_out_of_range_indices_raise_like_eager() -> None:
    x = torch.randn(3, 4)
    bad = torch.tensor([[0, 4], [1, 1], [2, 3]])
    neg = torch.tensor([[0, -1], [1, 1], [2, 3]])
    msg = _raises_like_eager(lambda x, i: torch.gather(x, 1, i), x, bad, ours=IndexOutOfRangeError, eager=RuntimeError)
    assert re.search(r"index out of range in aten.gather", msg), msg
    msg = _raises_like_eager(lambda x, i: x.scatter_add(1, i, torch.ones(3, 2)), x, neg, ours=IndexOutOfRangeError,
                             eager=RuntimeError)
    assert re.search(r"index out of range in aten.scatter_add: an index is outside \[0, 4\) for dimension 1 of "
                     r"size 4; fix the indices \(at .*test_scatter.py:\d+", msg), msg
    _raises_like_eager(lambda x, i: x.scatter_reduce(1, i, torch.ones(3, 2), "amax"), x, bad,
                       ours=IndexOutOfRangeError, eager=RuntimeError)
    _raises_like_eager(lambda x, i: x.index_copy(1, i, torch.ones(3, 2)), x, torch.tensor([0, 4]),
                       ours=IndexOutOfRangeError, eager=IndexError)
    _raises_like_eager(lambda x, i: x.index_fill(1, i, 1.0), x, torch.tensor([-5]), ours=IndexOutOfRangeError,
                       eager=IndexError)
    torch._dynamo.reset()
    ok = torch.tensor([[0, 3], [1, 1], [2, 3]])  # the same compiled kernel runs fine on good indices
    f = _compile(lambda x, i: torch.gather(x, 1, i))
    _close(f(x, ok), torch.gather(x, 1, ok), "gather after")


def _grads(fn: Callable[..., Any], *xs: torch.Tensor) -> None:
    xe = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
    xc = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]
    oe, oc = fn(*xe), _compile(fn)(*xc)
    _close(oc, oe, "forward")
    g = torch.randn(oe.shape, generator=_g(30))
    oe.backward(g)
    oc.backward(g)
    for a, b in zip(xc, xe, strict=True):
        if b.requires_grad:
            _close(a.grad, b.grad, "grad")


def test_gradients_of_gather_and_scatters() -> None:
    x = torch.randn(6, 11, generator=_g(26))
    s = torch.randn(6, 5, generator=_g(27))
    i = _dup_index((6, 5), 11, 28)
    _grads(lambda x, i: torch.gather(x, 1, i) * 3.0, x, i)
    torch._dynamo.reset()
    _grads(lambda x, s, i: x.scatter_add(1, i, s).sin(), x, s, i)
    torch._dynamo.reset()
    _grads(lambda x, s, i: x.scatter_reduce(1, i, s, "amax", include_self=False).sin(), x, s, i)
    torch._dynamo.reset()
    _grads(lambda x, s: x.index_add(1, torch.arange(5) * 2, s).cos(), x, s)


def test_int64_scatter_add_is_exact_near_the_int32_limit_and_raises_beyond() -> None:
    from neuron_compile.errors import DeviceAssertionError

    x = torch.zeros(3, 5, dtype=torch.int64)
    x[0, 0] = 2**31 - 10
    idx = torch.tensor([[0, 0, 1], [2, 2, 2], [4, 4, 4]])
    src = torch.tensor([[-5, -6, 7], [2**30, 2**30 - 1, -(2**30)], [-(2**30), -(2**30) + 10, -5]])
    f = _compile(lambda x, i, s: (x.scatter_add(1, i, s), x.index_add(1, i[1], s)))
    _close(f(x, idx, src), (x.scatter_add(1, idx, src), x.index_add(1, idx[1], src)), "near the limit")
    over = src.clone()
    over[0, 0] = 100  # 2**31 - 10 - 6 + 100 > 2**31 - 1
    with pytest.raises(DeviceAssertionError, match="an int64 sum left the int32 range"):
        f(x, idx, over)


@pytest.mark.parametrize("broadcast", [False, True])
def test_masked_scatter_gradients(broadcast: bool) -> None:
    """source's gradient is grad's masked elements in order, zeros past the mask's count (source has spare
    elements here); self's is grad where the mask is off. The mask may broadcast against self."""
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(3)) > 0.5
    if broadcast:
        mask = mask[:1]
    check_grads(lambda x, src: x.masked_scatter(mask, src * 3), torch.randn(4, 6), torch.randn(5, 7))


def test_one_dim_self_takes_the_head_of_a_longer_src() -> None:
    """A 1-D self scatters src's first index.numel() elements (eager allows a src longer than the index); this
    crashed at compile time ('expand: attempting to expand a dimension of length 10 -> 3')."""
    x, idx, src = torch.zeros(8), torch.tensor([1, 5, 1]), torch.arange(10.0)
    _check(lambda x, i, s: x.scatter_add(0, i, s), x, idx, src)
    torch._dynamo.reset()
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False), x, idx, src)
    torch._dynamo.reset()
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), x.long() + 1, idx, src.long())
