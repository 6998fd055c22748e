"""Cumulative ops vs eager: cumsum, cumprod, cummax, cummin, logcumsumexp (the scan template).

Every dim, more than 128 rows, rows longer than one 512-element chunk, non-contiguous views, 0-d and
empty inputs, NaN/+-inf/ties; integer cumsum exact over int64 (a result outside int32 raises, int32
outputs wrap like torch). Gradients of cumsum/cumprod/cummax/logcumsumexp in strict mode.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from neuron_compile.errors import DeviceAssertionError, UnsupportedOpError

NAN, INF = float("nan"), float("inf")


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _close(got: Any, want: Any, what: str = "", tol: float = 1e-5) -> None:
    if isinstance(want, (tuple, list)):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{what}[{i}]", tol)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
    if want.is_floating_point():
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}:\n got {got}\nwant {want}"


def _check(fn: Callable[..., Any], *xs: Any, tol: float = 1e-5) -> None:
    with torch.no_grad():
        got = _compile(fn)(*xs)
        want = fn(*xs)
    _close(got, want, getattr(fn, "__name__", "fn"), tol)


def _x(shape: tuple[int, ...], seed: int = 0, specials: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if specials and x.numel() > 8:
        flat = x.view(-1)
        flat[3], flat[7] = NAN, INF
        flat[-2], flat[-5] = -INF, flat[-6]
    return x


@pytest.mark.parametrize("shape,dim", [((5, 700), 1), ((130, 9), 1), ((9, 130), 0), ((3, 4, 5), 1), ((17,), 0),
                                       ((4, 1), 1)])
def test_float_scans_every_dim(shape: tuple[int, ...], dim: int) -> None:
    x = _x(shape)
    xp = _x(shape, 1, specials=False) * 0.3 + 1.0  # products stay finite

    def f(x: torch.Tensor, xp: torch.Tensor) -> Any:
        return (torch.cumsum(x, dim), torch.cumprod(xp, dim), torch.logcumsumexp(x, dim),
                torch.cummax(x, dim), torch.cummin(x, dim))

    _check(f, x, xp, tol=2e-5)


def test_cummax_ties_nan_and_signed_zeros_like_eager() -> None:
    x = torch.tensor([[1.0, NAN, 2.0, NAN, 3.0], [1.0, 1.0, 0.0, -0.0, 1.0], [0.0, -0.0, 0.0, -1.0, -0.0]])

    def f(x: torch.Tensor) -> Any:
        return torch.cummax(x, 1), torch.cummin(x, 1)

    with torch.no_grad():
        got, want = _compile(f)(x), f(x)
    _close(got, want)
    for g, w in zip(got, want, strict=True):  # -0.0 / 0.0: the latest tie's own bits, as eager
        assert torch.equal(torch.signbit(g.values), torch.signbit(w.values))


def test_logcumsumexp_extremes() -> None:
    x = torch.tensor([[-INF, 1.0, INF, 2.0], [-INF, -INF, -1000.0, 0.0], [1.0, NAN, 2.0, 3.0], [5.0, -INF, -INF, 4.0],
                      [-3e38, 3e38, 1.0, -3e38]])
    _check(lambda x: torch.logcumsumexp(x, 1), x)


def test_bf16_and_non_contiguous_and_empty_and_0d() -> None:
    xb = _x((6, 600), 2, specials=False).to(torch.bfloat16)
    base = _x((40, 30), 3)

    def f(xb: torch.Tensor, base: torch.Tensor, e: torch.Tensor, s: torch.Tensor) -> Any:
        return (torch.cumsum(xb, 1), torch.cumsum(base.t()[::2], 1), torch.cummax(base[:, 1::3], 0),
                torch.cumsum(e, 1), torch.cummin(e, 0), torch.cumsum(s, 0), torch.cummax(s, 0))

    _check(f, xb, base, torch.empty(3, 0), torch.tensor(1.5), tol=2e-2)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_cumsum_exact(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(4)
    hi = 2**22 if dtype in (torch.int64, torch.int32) else 2
    x = torch.randint(-hi if dtype != torch.uint8 else 0, hi, (7, 900), generator=g).to(dtype)

    def f(x: torch.Tensor) -> Any:
        return torch.cumsum(x, 1), torch.cummax(x, 1), torch.cummin(x.t(), 0)

    _check(f, x)


def test_int64_cumsum_near_the_int32_limit_exact_and_beyond_raises() -> None:
    f = _compile(lambda x: torch.cumsum(x, 1))
    ok = torch.tensor([[2**30, 2**30 - 1, -5, -(2**30)], [-(2**31) + 5, -5, 3, -3]])
    _close(f(ok), torch.cumsum(ok, 1))  # partial sums touch +-(2**31 - 1) without leaving the range
    over = torch.tensor([[2**31 - 1, 1, -5, 0], [0, 0, 0, 0]])
    with pytest.raises(DeviceAssertionError) as info:
        f(over)
    assert isinstance(info.value, RuntimeError)
    assert re.search(r"cumsum: an int64 running sum left the int32 range", str(info.value))
    under = torch.tensor([[-(2**31), -1, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(DeviceAssertionError):
        f(under)


def test_int32_cumsum_with_int32_dtype_wraps_like_eager() -> None:
    x = torch.tensor([[2**31 - 1, 1, 5], [-(2**31), -1, 2]], dtype=torch.int32)
    _check(lambda x: torch.cumsum(x, 1, dtype=torch.int32), x)


def test_integer_cumsum_into_a_float_dtype_is_refused_by_name() -> None:
    """Integers summed into dtype=float32 would accumulate in fp32 (inexact past 2**24): refused by name.
    (Integer cumprod and narrow cumsums are exact: tests/backend/test_int_exact.py.)"""
    with pytest.raises(Exception) as info:
        _compile(lambda x: torch.cumsum(x, 1, dtype=torch.float32))(torch.ones(2, 3, dtype=torch.int64))
    seen: BaseException | None = info.value
    while seen is not None and not isinstance(seen, UnsupportedOpError):
        seen = seen.__cause__ or seen.__context__
    assert seen is not None and "aten.cumsum with a float dtype= on torch.int64 is not supported" in str(seen), \
        str(info.value)


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cummax", "logcumsumexp"])
def test_gradients(op: str) -> None:
    x = _x((6, 40), 5, specials=False) * 0.5 + (1.0 if op == "cumprod" else 0.0)

    def f(x: torch.Tensor) -> torch.Tensor:
        r = getattr(torch, op)(x, 1)
        return (r[0] if isinstance(r, tuple) else r).sin()

    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    oe, oc = f(xe), _compile(f)(xc)
    _close(oc, oe, "forward", 1e-4)
    g = torch.randn(oe.shape, generator=torch.Generator().manual_seed(6))
    oe.backward(g)
    oc.backward(g)
    _close(xc.grad, xe.grad, "grad", 1e-4)
