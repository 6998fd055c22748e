"""Integer scatter means and products and index_add/index_reduce argument checks, against eager.

An integer ``mean`` is eager's: the sum (wrapping at the dtype's width, int64 exact) floor-divided by a count kept
in the same dtype (which wraps too; a count that wraps to 0 divides by 1). An integer ``prod`` multiplies exactly
(values past 2**24; narrow dtypes wrap, int64 raises past int32). index_add/index_reduce reject mismatched source
shapes and 2-D indices as eager does (their meta functions do not, so these used to compile).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from neuron_compile.errors import DeviceAssertionError

INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _check(fn: Callable[..., Any], *xs: torch.Tensor) -> None:
    got, want = _compile(fn)(*xs), fn(*xs)
    assert got.dtype == want.dtype and torch.equal(got, want), f"\n got {got}\nwant {want}"


def _ints(shape: tuple[int, ...], dtype: torch.dtype, seed: int, lo: int = -9, hi: int = 10) -> torch.Tensor:
    lo = 0 if dtype == torch.uint8 else lo
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("reduce", ["mean", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_and_index_reduce_of_integers(dtype: torch.dtype, reduce: str, include_self: bool) -> None:
    x, src = _ints((10, 5), dtype, 1), _ints((5, 5), dtype, 2)
    idx = torch.randint(0, 10, (5, 5), generator=torch.Generator().manual_seed(3))  # duplicates and untouched rows
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self), x, idx, src)
    torch._dynamo.reset()  # an index covering part of the other dim: the rest of x is kept
    _check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self), x, idx[:3, :2] % 5, src)
    torch._dynamo.reset()
    _check(lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self), x,
           torch.tensor([1, 1, 9, 3]), src[:4])
    torch._dynamo.reset()  # a 0-d self is one line
    _check(lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self), torch.tensor(7, dtype=dtype),
           torch.tensor([0]), torch.tensor(3, dtype=dtype))


@pytest.mark.parametrize(("dtype", "n", "fill"), [(torch.int8, 300, 1), (torch.int8, 200, 3), (torch.uint8, 200, 3),
                                                  (torch.uint8, 256, 3), (torch.int16, 40000, 1)])
def test_narrow_integer_mean_wraps_sum_and_count_like_eager(dtype: torch.dtype, n: int, fill: int) -> None:
    src = torch.full((n,), fill, dtype=dtype)
    src[0] += 1  # with 256 uint8 values the count wraps to 0 while the sum does not: eager divides by 1
    x = torch.tensor([0, 5], dtype=dtype)
    for include_self in (True, False):
        torch._dynamo.reset()
        _check(lambda x, i, s, inc=include_self: x.scatter_reduce(0, i, s, "mean", include_self=inc), x,
               torch.zeros(n, dtype=torch.int64), src)


def test_integer_mean_floors_and_products_are_exact_past_2_24() -> None:
    x = torch.tensor([0, 5, 3])
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, "mean", include_self=False), x, torch.tensor([0, 0, 1]),
           torch.tensor([-7, 2, 2**30 + 1]))  # -5 / 2 floors to -3
    torch._dynamo.reset()
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), x, torch.tensor([0, 2, 2, 1]),
           torch.tensor([2**20, 2**12 + 1, 2**9 - 1, -(2**24) - 1]))
    torch._dynamo.reset()  # int32 products wrap like eager's
    x32 = x.to(torch.int32)
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), x32, torch.tensor([2, 2, 2]),
           torch.tensor([2**20 + 3, 2**12 + 5, 7], dtype=torch.int32))


def test_scatter_of_a_value_with_reduce_multiply_on_integers() -> None:
    x, i = torch.arange(6).reshape(2, 3), torch.tensor([[0, 1], [1, 1]])
    _check(lambda x, i: x.scatter(1, i, 3, reduce="multiply"), x, i)
    torch._dynamo.reset()
    _check(lambda x, i: x.scatter(1, i, -2, reduce="multiply"), x.to(torch.int8), i)


def test_int64_product_past_int32_raises() -> None:
    f = _compile(lambda x, i, s: x.scatter_reduce(0, i, s, "prod"))
    x = torch.tensor([3, 1])
    assert torch.equal(f(x, torch.tensor([0, 0]), torch.tensor([2**20, 2**9])), torch.tensor([3 * 2**29, 1]))
    with pytest.raises(DeviceAssertionError, match="integer overflow"):
        f(x, torch.tensor([0, 0]), torch.tensor([2**20, 2**12]))


@pytest.mark.parametrize(("op", "x", "index", "source", "eager", "message"), [
    ("index_add", torch.tensor(7.0), torch.tensor([0]), torch.tensor([3.0]), RuntimeError,
     r"source tensor shape must match self tensor shape, excluding the specified dimension\. Got self\.shape = \[\] "
     r"source\.shape = \[1\]"),
    ("index_reduce", torch.ones(3), torch.tensor([1]), torch.tensor(3.0), RuntimeError,
     "source tensor shape must match self tensor shape"),
    ("index_add", torch.ones(3, 4), torch.tensor([0, 1]), torch.ones(2, 5), RuntimeError,
     r"Got self\.shape = \[3, 4\] source\.shape = \[2, 5\]"),
    ("index_reduce", torch.ones(3, 4), torch.tensor([0, 1]), torch.ones(2, 4, 1), RuntimeError,
     "source tensor shape must match self tensor shape"),
    ("index_reduce", torch.ones(3, 4), torch.tensor([0, 1, 2]), torch.ones(2, 4), RuntimeError,
     r"index_reduce_\(\): Number of indices \(3\) should be equal to source\.size\(dim\): \(2\), for dim: 0"),
    ("index_reduce", torch.ones(3, 4), torch.tensor([[0], [1]]), torch.ones(2, 4), IndexError,
     r"index_reduce_\(\): Index is supposed to be a vector, but got dim: 2"),
])
def test_index_add_and_reduce_check_their_arguments_like_eager(op: str, x: torch.Tensor, index: torch.Tensor,
                                                               source: torch.Tensor, eager: type,
                                                               message: str) -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x.index_add(0, i, s) if op == "index_add" else x.index_reduce(0, i, s, "prod")

    with pytest.raises(eager, match=message):
        fn(x, index, source)
    with pytest.raises(Exception) as info:
        _compile(fn)(x, index, source)
    seen: BaseException | None = info.value
    while seen is not None and not isinstance(seen, eager):
        seen = seen.__cause__
    assert seen is not None, f"no {eager.__name__} in {info.value!r}"
    assert re.search(message, str(seen)), str(seen)
