"""Integer graphs are exact (int32 GpSimd tensor_tensor math) or refused at compile time, never silently wrong.

Values sit around and beyond 2**24 (where fp32 stops holding every integer) and up to 2**31 - 1.
int64 graph values are stored as int32, so int64 cases keep their results inside the int32 range;
int32 cases may overflow and must wrap exactly like eager.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import neuron_compile.backend
from neuron_compile.errors import DeviceAssertionError, UnsupportedOpError

sys.path.insert(0, str(Path(__file__).parent.parent))
from neuron_compile.nki_api.checker import check_source_against_api  # noqa: E402

B24 = 2**24
IMAX = 2**31 - 1
INTS = (torch.int32, torch.int64)


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _same(got: Any, want: Any, what: str = "") -> None:
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{what}[{i}]")
        return
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != eager {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != eager {tuple(want.shape)}"
    if want.is_floating_point():
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}:\n got {got}\nwant {want}"


def _check(fn: Callable[..., Any], *xs: Any) -> None:
    with torch.no_grad():
        got = _compile(fn)(*xs)
        want = fn(*xs)
    _same(got, want, getattr(fn, "__name__", "fn"))


def _sources() -> list[str]:
    out: list[str] = []
    for g in neuron_compile.backend.compiled_graphs():
        srcs = g["sources"]
        out += [s for _, s in srcs] if isinstance(srcs, list) else list(srcs.values())
    return out


def _big(dtype: torch.dtype, rows: int = 3) -> torch.Tensor:
    """Rows of values fp32 cannot hold (odd, above 2**24) next to small ones; |x| <= 2**30 + 7."""
    base = torch.tensor([B24 + 1, -(B24 + 3), 2**30 + 7, -(2**30) - 5, 7, 0, -1, B24, 123457, -98765431])
    return torch.stack([base + i for i in range(rows)]).to(dtype)


# -- elementwise -----------------------------------------------------------------------------------------

def _elementwise(x: torch.Tensor, y: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A batch of integer ops in one graph (x, y full; r a row broadcast over the last dim)."""
    return (x + 1, x - y, 3 - x, y * 2, y * 3, x * y.sign(), x.relu(), -x, x.abs(),
            torch.maximum(x, y), torch.minimum(x, y), x.clamp(-(2**30), B24 + 2), x.clamp(min=y, max=r),
            torch.where(x > y, x, y), torch.where(x > 0, x, -7), x.masked_fill(x < 0, 2**30 + 3),
            x - r, r - x, x + r * 2, torch.add(x, y, alpha=2))


@pytest.mark.parametrize("dtype", INTS)
def test_elementwise_exact_beyond_2_24(dtype: torch.dtype) -> None:
    x = _big(dtype)
    y = (x.flip(-1) // 2).to(dtype)
    r = torch.tensor([[B24 + 1], [-(B24 + 1)], [2**28 + 1]], dtype=dtype)
    _check(_elementwise, x, y, r)
    srcs = _sources()
    if dtype == torch.int32:  # int64 kernels also replay their arithmetic in fp32, only for the overflow flag
        assert srcs and all("tensor_scalar" not in s and "activation" not in s for s in srcs), \
            "integer kernels must not use the fp32 tensor_scalar/activation paths"
    assert any("dtype=nl.int32, buffer=nl.sbuf" in s for s in srcs)


def test_colleague_repro_int64_add_and_int32_sum() -> None:
    _check(lambda x: x + 1, torch.tensor([2**30 + 1, 5]))
    _check(lambda x: x.sum(), torch.full((4,), B24 + 1, dtype=torch.int32))


@pytest.mark.parametrize("dtype", INTS)
def test_comparisons_exact(dtype: torch.dtype) -> None:
    x = torch.tensor([[B24, B24 + 1, IMAX, -IMAX, 2**30 + 1, 0]], dtype=dtype)
    y = torch.tensor([[B24 + 1, B24, IMAX - 1, -IMAX, 2**30, 0]], dtype=dtype)

    def cmp(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x == y, x != y, x < y, x <= y, x > y, x >= y, x == B24 + 1, x > IMAX - 1, x < -IMAX + 1,
                (x > B24) & (y > B24), (x > B24) | (y < 0), torch.logical_and(x, y),
                torch.logical_not(x.clamp(-5, 5) - 5))

    _check(cmp, x, y)


def test_int32_overflow_wraps_like_eager() -> None:
    x = torch.tensor([[IMAX, -IMAX - 1, 2**30 + 1, 46341, -5]], dtype=torch.int32)
    _check(lambda x: (x + 1, x - 2, x * x, -x, x.abs(), x * 3 + IMAX), x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8], ids=str)
def test_integer_powers_by_a_python_int_are_exact(dtype: torch.dtype) -> None:
    """x ** e (square, pow) of integers by squaring: exact, wrapping like torch below int64; an int64 power past
    int32 raises (the overflow guard replays the products in fp32)."""
    x = torch.tensor([0, 1, 2, 3, 7, 100, 127] + ([] if dtype == torch.uint8 else [-1, -3, -100]), dtype=dtype)
    _check(lambda t: (t ** 0, t ** 1, torch.square(t), t ** 3, t.pow(4)), x)
    if dtype != torch.int64:
        _check(lambda t: (t ** 5, t ** 13), x)  # wraps at the dtype's width, as eager
        return
    _check(lambda t: t ** 4, x)
    with pytest.raises(DeviceAssertionError, match=r"integer overflow in aten\.pow\.Tensor_Scalar"):
        _compile(lambda t: t ** 5)(x)  # 100 ** 5 = 1e10


# -- mixed int / float (torch promotion) ----------------------------------------------------------------

def test_mixed_int_float_promotes_like_eager() -> None:
    x = _big(torch.int64)
    z = torch.randn(10)

    def mixed(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x * 0.5, x + z, x.float() - 1.0, x > 0.5, (x + 1).float() * z, (x == B24) * z, x + 0.25)

    with torch.no_grad():
        got = _compile(mixed)(x, z)
        want = mixed(x, z)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype, i
        if w.is_floating_point():
            # both sides round the int64 values to fp32 first; sums may differ by reassociation
            torch.testing.assert_close(g, w, rtol=1e-6, atol=0, msg=lambda m, i=i: f"output {i}: {m}")
        else:
            assert torch.equal(g, w), i


def test_int_true_division_is_float() -> None:
    x = torch.tensor([[7, -9, B24 + 1, 2**30]])
    y = torch.tensor([[2, 4, 3, 7]])
    with torch.no_grad():
        got = _compile(lambda x, y: x / y)(x, y)
    torch.testing.assert_close(got, x / y, rtol=2e-7, atol=0)


# -- reductions ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS)
def test_reductions_exact(dtype: torch.dtype) -> None:
    x = _big(dtype, rows=4)
    x[2, 3] = x[2, 2]  # a tie: argmax must take the first index
    s = x // 8  # column sums of 4 rows stay inside int32

    def reds(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.sum(-1), s.sum(0), s.sum(), x.amax(-1), x.amin(0), x.argmax(-1), x.argmin(-1), x.argmax(0),
                (x > B24).sum(-1), x.sum(-1, keepdim=True) - x[:, :1])

    _check(reds, x, s)
    srcs = _sources()
    # the int64 sums also reduce an fp32 shadow, which only feeds their overflow flag (lowering.intguard)
    assert all("tensor_reduce" not in s for s in srcs) or dtype == torch.int64 or any("uint8" in s for s in srcs), \
        "integer reductions must not use the fp32 tensor_reduce"
    assert any("dtype=nl.int32" in s for s in srcs)
    # any/all of integers: exact int32 compares; all() reduces 0/1 truth values (exact in fp32 too)
    _check(lambda x: ((x - B24).any(-1), (x - B24).all(-1), (x - B24).any(0), (x + 1).all()), x)


def test_int_sum_over_many_chunks_and_partition_tiles() -> None:
    # 3000 values per row (several free-dim chunks), 130 rows (two partition tiles); fp32 would round
    # every 2**24 + 1 to 2**24 and every partial sum above 2**24
    x = torch.full((130, 3000), B24 + 1, dtype=torch.int32)
    x[:, 1::2] = -(B24 - 3)
    x[5, 2999] = 2**20 + 1
    x[7, 1234] = B24 + 9
    _check(lambda x: (x.sum(-1), x.amax(-1), x.argmin(-1), x.argmax(-1)), x)
    y = torch.full((40, 3000), 1, dtype=torch.int64)
    y[:, 1::2] = 2**20 + 1  # row sums ~1.57e9: inside int32, far beyond fp32's 2**24
    _check(lambda y: y.sum(-1) - 3, y)


def test_argmax_close_values_above_2_24() -> None:
    x = torch.tensor([[B24, B24 + 1, B24 - 1], [IMAX - 1, IMAX, IMAX - 2], [-(IMAX), -(IMAX) + 1, -(IMAX)]])
    _check(lambda x: (x.argmax(-1), x.argmin(-1), x.max(-1).values, x.min(-1).values), x)


# -- cumsum and index arithmetic as models do it ---------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS)
def test_cumsum_exact(dtype: torch.dtype) -> None:
    x = torch.full((3, 1300), 0, dtype=dtype)
    x[:, ::3] = B24 + 1
    x[:, 1::3] = -(B24 - 1)
    x[1, 700] = 2**30
    _check(lambda x: (x.cumsum(-1), x.cumsum(0)), x)
    srcs = _sources()
    assert all("tensor_tensor_scan" not in s for s in srcs), "integer cumsum must not use the fp32 scan"


def test_int32_cumsum_wraps_like_eager() -> None:
    # int32 cumsum promotes to int64 in torch; dtype=torch.int32 keeps int32 and wraps on both sides
    _check(lambda x: x.cumsum(-1, dtype=torch.int32), torch.tensor([[IMAX, 1, 2**30, 2**30, -5]], dtype=torch.int32))


def test_position_ids_from_attention_mask() -> None:
    mask = torch.ones(2, 700, dtype=torch.int64)
    mask[0, :37] = 0
    mask[1, 650:] = 0

    def pos(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = m.long().cumsum(-1) - 1
        return p, p.masked_fill(m == 0, 1)

    _check(pos, mask)
    _check(lambda m: m.bool().long().cumsum(-1) - 1, mask)


def test_index_arithmetic_feeds_embedding() -> None:
    w = torch.randn(1000, 8)
    idx = torch.tensor([[0, 3, 17], [100, 250, 332]])

    def f(i: torch.Tensor, w: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        return F.embedding(i * 3 + off, w) * 2

    _check(f, idx, w, torch.tensor(2))
    # the same arithmetic on values beyond 2**24, brought back to valid rows: exact or the rows are wrong
    big = torch.tensor([[B24 + 1, B24 + 5, 2**30 + 3]])
    _check(lambda i, w: F.embedding(torch.where(i > 2**29, i - 2**30 + 10, i - B24), w), big, w)


# -- refusals ----------------------------------------------------------------------------------------------

def _refused(fn: Callable[..., Any], *xs: torch.Tensor) -> str:
    with pytest.raises(Exception) as info:
        _compile(fn)(*xs)
    seen: BaseException | None = info.value
    while seen is not None and not isinstance(seen, UnsupportedOpError):
        seen = seen.__cause__ or seen.__context__
    assert isinstance(seen, UnsupportedOpError), f"no UnsupportedOpError in {info.value!r}"
    assert not neuron_compile.backend.compiled_graphs(), "nothing may run for a refused graph"
    return str(seen)


@pytest.mark.parametrize(("fn", "parts"), [
    (lambda x: x.scatter_reduce(0, torch.zeros_like(x), x, "prod"),  # a 3000 x 3000 one-hot table of factors
     ("scatter_reduce(reduce='prod')", "torch.int64", "2**22 elements", "scatter into a float tensor")),
])
def test_refusals_name_op_dtype_and_fix(fn: Callable[..., Any], parts: tuple[str, ...]) -> None:
    msg = _refused(fn, torch.ones(3000, dtype=torch.int64))
    for p in parts:
        assert p in msg, f"{p!r} not in {msg}"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_bitwise_ops_are_exact(dtype: torch.dtype) -> None:
    """and/or/xor/not of integers in int32, at the int32 extremes too; narrow results wrap like torch."""
    info = torch.iinfo(dtype)
    x = torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), (4, 10), generator=torch.Generator().manual_seed(0),
                      dtype=torch.int64).to(dtype)
    x[0, :2] = torch.tensor([max(info.min, -(2**31)), min(info.max, 2**31 - 1)]).to(dtype)
    y = x.flip(0).roll(3, 1)

    def ops(a: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a & b, a | b, a ^ b, ~a, a & 0x5A, 0x33 | a, a ^ r, (a ^ b) & ~r, torch.bitwise_and(a, b) + 1

    _check(ops, x, y, y[1])


def test_int8_arithmetic_wraps() -> None:
    _check(lambda x: x + 100, torch.tensor([[100, 27, -128]], dtype=torch.int8))  # wraps at 8 bits like torch


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_int_index_put_accumulate_is_exact(dtype: torch.dtype) -> None:
    """Integer accumulation adds exactly (values past 2**24, duplicates, negative indices, several index tensors,
    an index after a slice) and narrow dtypes wrap at their width, as eager."""
    info = torch.iinfo(dtype) if dtype != torch.bool else None
    big = min(B24 + 3, info.max // 4) if info else 1
    x = torch.arange(30).reshape(5, 6).to(dtype)
    v = torch.tensor([big, big, 7, big]).to(dtype)
    _check(lambda x, i, v: x.reshape(-1).index_put((i,), v, accumulate=True), x, torch.tensor([4, 4, -1, 4]), v)
    _check(lambda x, i, v: x.index_put((i,), v, accumulate=True), x, torch.tensor([1, -4, 1]), (x[:3] * 3).to(dtype))
    _check(lambda x, i, j, v: x.index_put((i, j), v, accumulate=True), x, torch.tensor([[0], [2]]),
           torch.tensor([5, 5, 0]), v[:3])
    _check(lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v, True), x, torch.tensor([5, 5, 0]), v[:1])


def test_int64_index_put_accumulate_past_int32_raises() -> None:
    x = torch.full((4,), 2**30, dtype=torch.int64)
    f = torch.compile(lambda b, i, v: b.index_put((i,), v, accumulate=True), backend="neuron", dynamic=False)
    with pytest.raises(DeviceAssertionError, match="an int64 sum left the int32 range"):
        f(x, torch.tensor([0, 0, 0]), x[:3].clone())


def test_int_kernels_use_only_current_nki_api() -> None:
    x = _big(torch.int64) // 4
    _check(lambda x: (x.cumsum(-1), x.sum(-1), x.argmax(-1), x * 2 - x.amax(-1, keepdim=True)), x)
    for src in _sources():
        assert check_source_against_api(src) == [], src


@pytest.mark.parametrize("dtype", INTS)
def test_gcd_lcm_exact(dtype: torch.dtype) -> None:
    """Euclid's fixed step count covers the worst int32 pair (consecutive Fibonacci numbers F(46), F(45)); zeros,
    signs and values above 2**24 as eager."""
    a = torch.tensor([1836311903, 0, 0, -12, 2**30, B24 + 1, 46368, -(2**29) * 3, 7, 1])
    b = torch.tensor([1134903170, 0, 9, 18, 2**20 * 3, B24 + 3, -28657, 2**28, -7, 1])
    _check(lambda x, y: torch.gcd(x, y), a.to(dtype), b.to(dtype))
    small = (a % 5000 - 2000).to(dtype), (b % 3000 - 1500).to(dtype)  # lcm inside the int32 range
    _check(lambda x, y: torch.lcm(x, y), *small)


U8 = torch.tensor([5, 0, 3], dtype=torch.uint8)
NARROW_CASES = {
    "scalar_tensor_uint8_wraps": lambda: torch.scalar_tensor(-5, dtype=torch.uint8),
    "scalar_tensor_bool_nonzero": lambda: torch.scalar_tensor(-5, dtype=torch.bool),
    "full_uint8_wraps": lambda: torch.full((3,), -5, dtype=torch.uint8),
    "full_int8": lambda: torch.full((3,), -2, dtype=torch.int8),
    "wrapped_constant_feeds_int64": lambda: torch.scalar_tensor(-5, dtype=torch.uint8) + torch.ones(2).long(),
    "arange_uint8_from_minus_one": lambda: torch.arange(-1, 2, 2, dtype=torch.uint8),
    "arange_uint8_past_255": lambda: torch.arange(250, 260, dtype=torch.uint8),
    "arange_int8_in_range": lambda: torch.arange(-3, 3, dtype=torch.int8),
}


@pytest.mark.parametrize("name", list(NARROW_CASES))
def test_narrow_int_and_bool_constants_convert_like_torch(name: str) -> None:
    """A filled or iota constant of uint8/int8/bool holds what torch's conversion gives: -5 is 251 as uint8 and True
    as bool, and an arange wraps (not a saturating fp32 conversion)."""
    _check(NARROW_CASES[name])


@pytest.mark.parametrize("fn", [lambda t: torch.any(t.view(3, 1), 1), lambda t: torch.all(t[0]),
                                lambda t: torch.any(t)], ids=["any_dim", "all_0d", "any_full"])
def test_any_and_all_of_uint8_give_uint8(fn: Callable[..., Any]) -> None:
    _check(fn, U8)


SCATTER_WRAP = {
    "index_add_alpha_minus_one": (lambda t: t.index_add(0, torch.tensor([0]), torch.tensor([1], dtype=torch.uint8),
                                                        alpha=-1), U8),
    "scatter_add_uint8_overflows": (lambda t: t.scatter_add(0, torch.tensor([0, 0, 2]),
                                                            torch.tensor([200, 100, 255], dtype=torch.uint8)), U8),
    "scatter_reduce_sum_int8": (lambda t: t.scatter_reduce(0, torch.tensor([1, 1, 1]), torch.full((3,), 100,
                                                            dtype=torch.int8), "sum", include_self=False),
                                torch.tensor([1, 2, 3], dtype=torch.int8)),
    "put_accumulate_int16": (lambda t: t.put(torch.tensor([0, 0]), torch.tensor([30000, 30000], dtype=torch.int16),
                                             accumulate=True), torch.tensor([5, 6], dtype=torch.int16)),
}


@pytest.mark.parametrize("name", list(SCATTER_WRAP))
def test_scatter_add_into_8_and_16_bit_ints_wraps_like_torch(name: str) -> None:
    """Scatter sums into uint8/int8/int16 accumulate in int32 and wrap on the cast back, as torch's do (the kernel
    alone would saturate: 5 + 255 came out 255 instead of 4)."""
    fn, x = SCATTER_WRAP[name]
    _check(fn, x)


POW_BASES = [0, 1, -1, 2, -2, 3, 7, -5, 0, 2, 3, -3, 10, 46340, -2]
POW_EXPONENTS = [-1, -3, -3, -1, -2, 0, 3, 3, 0, 30, 19, 19, 9, 2, 31]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_integer_pow_is_exact_binary_exponentiation(dtype: torch.dtype) -> None:
    """pow with an integer tensor exponent (and int ** tensor): square-and-multiply in wrapping int32, eager's
    values for negative exponents (1, +-1, else 0); int32 and narrower wrap like torch (3 ** 19, 7 ** 3 in int8)."""
    b = torch.tensor(POW_BASES).to(dtype)
    e = torch.tensor(POW_EXPONENTS).to(dtype)
    if dtype == torch.uint8:
        e = torch.tensor(POW_EXPONENTS).abs().to(dtype)
    if dtype == torch.int64:  # keep int64 results inside int32 (beyond: the test below)
        b, e = b[:-1], e[:-1]
    _check(torch.pow, b, e)
    _check(lambda t: 3 ** t, e.clamp(max=19) if dtype == torch.int64 else e)
    _check(torch.pow, b.reshape(-1, 1)[:3], e[:4])  # broadcast


def test_int64_pow_beyond_int32_raises() -> None:
    _check(torch.pow, torch.tensor([-2, 2]), torch.tensor([31, 30]))  # -2**31 is the last int32
    f = torch.compile(torch.pow, backend="neuron", dynamic=False)
    with pytest.raises(DeviceAssertionError, match="integer overflow in an int64 pow"):
        f(torch.tensor([3, 2]), torch.tensor([25, 31]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_max_pool_values_and_indices_are_exact(dtype: torch.dtype) -> None:
    """A tap scan with int32 ``>`` (first largest wins, padding never does): values beyond 2**24, where an fp32
    compare would merge neighbours, keep their exact order; 1-D, 2-D (ceil_mode, dilation), 3-D, unbatched."""
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    x = torch.randint(lo, hi, (2, 3, 9, 8), dtype=torch.int64, generator=torch.Generator().manual_seed(1)).to(dtype)
    x[0, 0, :2, :2] = torch.tensor([[B24 + 1, B24], [B24 + 3, B24 + 2]]).to(dtype) if dtype in INTS else 7
    _check(lambda t: F.max_pool2d(t, 3, 2, 1, return_indices=True), x)
    _check(lambda t: F.max_pool2d(t, (2, 3), (2, 1), (1, 0), (2, 1), ceil_mode=True, return_indices=True), x)
    _check(lambda t: F.max_pool1d(t, 3, 2, 1, return_indices=True), x[:, :, 0])
    _check(lambda t: F.max_pool3d(t, 2, 1, 1, return_indices=True), x.reshape(2, 3, 3, 3, 8))
    _check(lambda t: F.max_pool2d(t, 3, 3, ceil_mode=True), x[0])
    _check(lambda t: F.max_pool2d(t, 3, 1, 1, return_indices=True), torch.zeros(1, 1, 4, 4, dtype=dtype))  # ties


def test_integer_avg_pool_truncates_like_eager() -> None:
    """int64 average pooling (eager's CPU kernel takes int64 only): the window sum over the divisor eager uses
    (padded window clipped to the padded input, the input itself without count_include_pad, divisor_override),
    truncated toward zero."""
    x = torch.randint(-500, 500, (2, 3, 9, 8), generator=torch.Generator().manual_seed(0))
    _check(lambda t: F.avg_pool2d(t, 3, 2, 1), x)
    _check(lambda t: F.avg_pool2d(t, (3, 2), (2, 3), (1, 1), ceil_mode=True, count_include_pad=False), x)
    _check(lambda t: F.avg_pool2d(t, 3, 2, 1, divisor_override=2), x)
    _check(lambda t: F.avg_pool1d(t, 3, 2, 1), x[:, :, 0])
    _check(lambda t: F.avg_pool3d(t, 2, 1, 1), x.reshape(2, 3, 3, 3, 8))
    _check(lambda t: F.avg_pool2d(t, 2), x[0])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_integer_prod_and_cumprod_are_exact(dtype: torch.dtype) -> None:
    """prod as a tree and cumprod as a scan of integer multiplications (int64 results guarded, an explicit int8
    dtype wrapping), zeros next to products past int32 included."""
    x = torch.randint(-3, 4, (4, 7, 5), generator=torch.Generator().manual_seed(0))
    x = (x > 0) if dtype == torch.bool else (x.abs() if dtype == torch.uint8 else x).to(dtype)
    _check(lambda t: t.prod(), x[0, :3])
    _check(lambda t: t.prod(1), x)
    _check(lambda t: t.prod(-1, keepdim=True, dtype=torch.int8), x)
    _check(lambda t: t.cumprod(1), x)
    _check(lambda t: t.cumprod(2, dtype=torch.int8), x)


def test_integer_products_past_int32_raise_unless_a_zero_decides() -> None:
    _check(lambda t: t.prod(), torch.tensor([2**20, 2**20, 0]))
    _check(lambda t: t.cumprod(0), torch.tensor([7, 0, 2**20, 2**20, 3]))
    with pytest.raises(DeviceAssertionError, match="integer overflow in aten.mul.Tensor"):
        _compile(lambda t: t.prod())(torch.tensor([2**20, 2**20]))


def test_sums_kept_in_a_narrow_integer_dtype_wrap_like_eager() -> None:
    """sum/cumsum with dtype=int8 (uint8, int16): eager wraps at that width, which is the int64 sum cast."""
    x = torch.tensor([[100, 100, 100, -7], [127, 127, -128, 3]], dtype=torch.int8)
    _check(lambda t: t.sum(dtype=torch.int8), x)
    _check(lambda t: t.sum(1, dtype=torch.int8), x)
    _check(lambda t: t.sum(0, keepdim=True, dtype=torch.int16), x.to(torch.int16) * 300)
    _check(lambda t: t.cumsum(1, dtype=torch.int8), x)
    _check(lambda t: t.cumsum(1, dtype=torch.uint8), x.abs().to(torch.uint8))
    _check(lambda a, b: torch.tensordot(a, b, dims=0), x, x)
