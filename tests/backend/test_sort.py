"""Sort family vs eager: sort/argsort/msort, topk, kthvalue, median/nanmedian (the SortKernel).

Rows hold ties, NaN, -0.0, +-inf; sizes that are not powers of two, dims of size 1, more than 128 rows,
non-contiguous inputs, every dim, 0-d and empty inputs; fp32, bf16, fp16 and integer dtypes. Where
eager's result is specified (stable sort, values of every op) it must match exactly; where PyTorch
leaves the order of equal elements unspecified (unstable sort, topk, kthvalue) the indices must select
exactly the returned values and be a permutation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import neuron_compile.backend
from neuron_compile.errors import UnsupportedOpError

NAN, INF = float("nan"), float("inf")


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _special(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Random values with many ties and, for floats, NaN, -0.0, 0.0, +-inf sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-6, 7, shape, generator=g).to(torch.float32) * 0.5
    if dtype.is_floating_point:
        flat = x.view(-1)
        n = flat.numel()
        picks = torch.randperm(n, generator=g)[: max(n // 6, 1)] if n else torch.tensor([], dtype=torch.long)
        specials = torch.tensor([NAN, -0.0, 0.0, INF, -INF, NAN])
        flat[picks] = specials[torch.arange(len(picks)) % len(specials)]
        x = x + torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < 0.3)
        return x.to(dtype)
    if dtype == torch.bool:
        return x > 0
    if dtype == torch.uint8:
        return (x + 3).clamp(min=0).to(dtype)
    return (x * 1000).to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor, what: str, zero_signs: bool = True) -> None:
    """Exactly eager's values; ``zero_signs=False`` where eager's tie order (so which of -0.0 / 0.0 comes
    first) is unspecified."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != eager {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != eager {tuple(want.shape)}"
    if want.is_floating_point():
        # bit-exact, NaN where eager has NaN, and -0.0 kept where eager keeps it
        assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN positions differ\n{got}\n{want}"
        ok = ~want.isnan()
        assert torch.equal(got[ok], want[ok]), f"{what}:\n got {got}\nwant {want}"
        if zero_signs:
            assert torch.equal(torch.signbit(got[ok]), torch.signbit(want[ok])), f"{what}: signs of zeros differ"
    else:
        assert torch.equal(got, want), f"{what}:\n got {got}\nwant {want}"


def _consistent_indices(x: torch.Tensor, dim: int, values: torch.Tensor, indices: torch.Tensor, what: str) -> None:
    """Unspecified tie order: the indices must pick exactly the values, each source element at most once."""
    if x.dim() == 0:
        assert int(indices) == 0
        return
    picked = torch.gather(x, dim, indices)
    _same(picked, values, f"{what}: x.gather(indices)")
    srt = indices.sort(dim).values
    assert bool((srt.diff(dim=dim) != 0).all()), f"{what}: an index repeats\n{indices}"


SORT_CASES = [
    ((7,), -1), ((5, 9), 1), ((5, 9), 0), ((3, 4, 6), 1), ((130, 33), 1), ((2, 1, 5), 1), ((4, 1), 1),
    ((16, 64), -1), ((200, 5), 0),
]


@pytest.mark.parametrize("shape,dim", SORT_CASES)
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_matches_eager_exactly(shape: tuple[int, ...], dim: int, descending: bool) -> None:
    x = _special(shape)

    def f(x: torch.Tensor) -> Any:
        return torch.sort(x, dim=dim, descending=descending, stable=True)

    got, want = _compile(f)(x), f(x)
    _same(got.values, want.values, "values")
    _same(got.indices, want.indices, "indices")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64,
                                   torch.int16, torch.uint8, torch.bool])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_dtypes(dtype: torch.dtype, descending: bool) -> None:
    x = _special((6, 37), dtype, seed=3)

    def f(x: torch.Tensor) -> Any:
        return torch.sort(x, dim=1, descending=descending, stable=True)

    got, want = _compile(f)(x), f(x)
    _same(got.values, want.values, f"{dtype} values")
    _same(got.indices, want.indices, f"{dtype} indices")


def test_unstable_sort_values_exact_and_indices_consistent() -> None:
    x = _special((9, 300), seed=5)

    def f(x: torch.Tensor) -> Any:
        return torch.sort(x, dim=1)

    got, want = _compile(f)(x), f(x)
    _same(got.values, want.values, "values", zero_signs=False)
    _consistent_indices(x, 1, got.values, got.indices, "sort")


def test_argsort_and_msort_of_non_contiguous_views() -> None:
    base = _special((12, 40), seed=7)

    def f(x: torch.Tensor) -> Any:
        v = x.t()[::2]  # (20, 12) view with strides (2, 40)
        return torch.argsort(v, dim=1, stable=True, descending=True), torch.msort(x[:, 1::3]), torch.sort(v, 0)[0]

    got, want = _compile(f)(base), f(base)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, w, f"output {i}")


def test_sort_of_0d_and_empty_inputs() -> None:
    def f(x: torch.Tensor, e: torch.Tensor, e2: torch.Tensor) -> Any:
        return torch.sort(x), torch.sort(e, dim=1), torch.sort(e2, dim=0), torch.topk(e2, 0, dim=1)

    x, e, e2 = torch.tensor(2.5), torch.empty(3, 0), torch.empty(0, 4)
    got, want = _compile(f)(x, e, e2), f(x, e, e2)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g[0], w[0], f"output {i} values")
        _same(g[1], w[1], f"output {i} indices")


@pytest.mark.parametrize("k,dim,largest", [(1, 1, True), (3, 1, False), (5, 0, True), (40, -1, True),
                                            (40, -1, False), (2, 0, False)])
def test_topk_values_exact_and_indices_consistent(k: int, dim: int, largest: bool) -> None:
    x = _special((8, 40), seed=11)

    def f(x: torch.Tensor) -> Any:
        return torch.topk(x, k, dim=dim, largest=largest)

    got, want = _compile(f)(x), f(x)
    _same(got.values, want.values, "values", zero_signs=False)
    _consistent_indices(x, dim, got.values, got.indices, "topk")


def test_topk_distinct_values_exact_indices_bf16_and_int() -> None:
    g = torch.Generator().manual_seed(2)
    xs = [(torch.randperm(300, generator=g).reshape(3, 100) - 150).to(torch.bfloat16),
          torch.randperm(300, generator=g).reshape(3, 100).to(torch.int64) - 150]

    def f(a: torch.Tensor, b: torch.Tensor) -> Any:
        return torch.topk(a, 7), torch.topk(b, 9, largest=False)

    got, want = _compile(f)(*xs), f(*xs)
    for i, (gv, wv) in enumerate(zip(got, want, strict=True)):
        _same(gv.values, wv.values, f"{i} values")
        _same(gv.indices, wv.indices, f"{i} indices")


@pytest.mark.parametrize("k,keepdim", [(1, False), (4, True), (9, False)])
def test_kthvalue(k: int, keepdim: bool) -> None:
    x = _special((140, 9), seed=13)

    def f(x: torch.Tensor) -> Any:
        return torch.kthvalue(x, k, dim=1, keepdim=keepdim)

    got, want = _compile(f)(x), f(x)
    _same(got.values, want.values, "values", zero_signs=False)
    idx = got.indices if keepdim else got.indices.unsqueeze(1)
    vals = got.values if keepdim else got.values.unsqueeze(1)
    _consistent_indices(x, 1, vals, idx, "kthvalue")


def _cause(exc: BaseException, cls: type) -> BaseException:
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, cls):
        seen = seen.__cause__ or seen.__context__
    assert seen is not None, f"no {cls.__name__} in {exc!r}"
    return seen


def test_sort_refuses_rows_longer_than_128_partitions_by_name() -> None:
    x = torch.randn(1, 600000)
    with pytest.raises(Exception) as info:
        _compile(lambda x: torch.sort(x, dim=1))(x)
    err = _cause(info.value, UnsupportedOpError)
    assert re.search(r"aten\.sort\.default\(float32\[1, 600000\].*along a dim of 600000 elements is not supported: "
                     r"a row is sorted in at most 128 partitions of 4096 elements \(524288\)", str(err)), str(err)
    with pytest.raises(Exception) as info:  # the selections keep one partition per row
        _compile(lambda x: torch.median(x, dim=1))(torch.randn(2, 5000))
    assert "at most 4096 elements" in str(_cause(info.value, UnsupportedOpError))


@pytest.mark.parametrize("shape,dim,descending,dtype", [((2, 9000), 1, False, torch.float32),
                                                        ((3, 5000), 1, True, torch.float32),
                                                        ((8000,), 0, False, torch.float32),
                                                        ((2, 8192), 1, False, torch.int64),
                                                        ((9000, 2), 0, True, torch.bfloat16)])
def test_sort_of_rows_spanning_several_partitions(shape: tuple[int, ...], dim: int, descending: bool,
                                                  dtype: torch.dtype) -> None:
    x = _special(shape, dtype, seed=47)

    def f(x: torch.Tensor) -> Any:
        return torch.sort(x, dim=dim, descending=descending, stable=True)

    got, want = _compile(f)(x), f(x)
    _same(got.values, want.values, "values")
    _same(got.indices, want.indices, "indices")


def test_sort_kernel_is_one_kernel_per_sort() -> None:
    x = _special((4, 10))
    _compile(lambda x: torch.sort(x, 1))(x)
    kinds = [k["family"] for g in neuron_compile.backend.compiled_graphs() for k in g["plan"].summary["kernels"]]
    assert kinds == ["sort"], kinds


@pytest.mark.parametrize("op", ["median", "nanmedian"])
@pytest.mark.parametrize("shape,dim", [((9, 8), 1), ((130, 7), 1), ((5, 6), 0), ((4, 1), 1)])
def test_median_along_a_dim(op: str, shape: tuple[int, ...], dim: int) -> None:
    x = _special(shape, seed=17)
    x[0] = NAN  # an all-NaN row
    fn = getattr(torch, op)

    def f(x: torch.Tensor) -> Any:
        return fn(x, dim)

    got, want = _compile(f)(x), f(x)
    _same(got.values, want.values, "values", zero_signs=False)
    _consistent_indices(x, dim, got.values.unsqueeze(dim), got.indices.unsqueeze(dim), op)
    nan_rows = want.values.isnan()
    if op == "median":  # eager: the index of the row's first NaN
        assert torch.equal(got.indices[nan_rows], want.indices[nan_rows])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_median_of_all_elements(dtype: torch.dtype) -> None:
    x = _special((7, 9), dtype, seed=19)
    y = x.t()  # non-contiguous: flattened through a copy

    def f(x: torch.Tensor, y: torch.Tensor) -> Any:
        out = [torch.median(x), torch.median(y)]
        if dtype.is_floating_point:
            out += [torch.nanmedian(x), torch.nanmedian(y)]
        return out

    got, want = _compile(f)(x, y), f(x, y)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, w, f"output {i}", zero_signs=False)


def test_median_without_nan_matches_eager_indices() -> None:
    g = torch.Generator().manual_seed(23)
    x = torch.randperm(96, generator=g).reshape(8, 12).float()  # distinct values: indices are specified
    got, want = _compile(lambda x: torch.median(x, 1))(x), torch.median(x, 1)
    _same(got.values, want.values, "values")
    _same(got.indices, want.indices, "indices")


def test_searchsorted_and_bucketize_nan_and_infinities_like_eager() -> None:
    b = torch.tensor([-INF, 1.0, 2.0, 2.0, 3.0, INF, NAN])
    v = torch.tensor([NAN, -INF, 2.0, INF, 0.0, 5.0, -0.0, 1.5]).repeat(3, 1)

    def f(b: torch.Tensor, v: torch.Tensor) -> Any:
        return (torch.searchsorted(b, v), torch.searchsorted(b, v, right=True), torch.bucketize(v, b),
                torch.bucketize(v, b, right=True, out_int32=True), torch.searchsorted(b, v, side="right"))

    got, want = _compile(f)(b, v), f(b, v)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, w, f"output {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
def test_bucketize_many_values_non_contiguous(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(29)
    scale = 1 if dtype.is_floating_point else (1 << 28)  # integers beyond 2**24 compare exactly
    bounds = (torch.randn(37, generator=g) * scale).sort().values.to(dtype)
    x = (torch.randn(300, 70, generator=g) * scale).to(dtype)
    x[5, :10] = bounds[:10]  # values equal to boundaries

    def f(x: torch.Tensor, b: torch.Tensor) -> Any:
        return torch.bucketize(x.t(), b), torch.bucketize(x[::3], b, right=True)

    got, want = _compile(f)(x, bounds), f(x, bounds)
    for i, (gv, wv) in enumerate(zip(got, want, strict=True)):
        _same(gv, wv, f"output {i}")


def test_searchsorted_per_row_sequences_sorter_and_edge_shapes() -> None:
    g = torch.Generator().manual_seed(31)
    seq = torch.randn(130, 20, generator=g).sort(1).values
    perm = torch.argsort(torch.rand(130, 20, generator=g), 1)
    shuffled = torch.gather(seq, 1, perm)
    sorter = torch.argsort(shuffled, 1)
    q = torch.randn(130, 9, generator=g)
    q[:, 0] = seq[:, 3]

    def f(seq: torch.Tensor, shuffled: torch.Tensor, sorter: torch.Tensor, q: torch.Tensor) -> Any:
        return (torch.searchsorted(seq, q), torch.searchsorted(shuffled, q, sorter=sorter, right=True),
                torch.bucketize(q[0, 0], seq[0]), torch.bucketize(q, seq[0, :0]), torch.searchsorted(seq[0], q[:0]))

    got, want = _compile(f)(seq, shuffled, sorter, q), f(seq, shuffled, sorter, q)
    for i, (gv, wv) in enumerate(zip(got, want, strict=True)):
        _same(gv, wv, f"output {i}")


@pytest.mark.parametrize("largest", [True, False])
def test_topk_of_rows_longer_than_sbuf_in_chunks(largest: bool) -> None:
    x = _special((2, 9000), seed=37)  # ties, NaN, infinities; the last chunk is ragged
    x1 = torch.randn(5000, generator=torch.Generator().manual_seed(38))

    def f(x: torch.Tensor, x1: torch.Tensor) -> Any:
        return torch.topk(x, 20, largest=largest), torch.topk(x1, 3, largest=largest)

    got, want = _compile(f)(x, x1), f(x, x1)
    _same(got[0].values, want[0].values, "values", zero_signs=False)
    _consistent_indices(x, 1, got[0].values, got[0].indices, "topk")
    _same(got[1].values, want[1].values, "1-D values")
    _same(got[1].indices, want[1].indices, "1-D indices")


@pytest.mark.parametrize(("n", "k"), [(6720, 1000), (20000, 1500)])
def test_topk_of_long_rows_with_a_large_k_in_chunks_of_4096(n: int, k: int) -> None:
    """An RPN's pre-NMS top 1000 of 6720 anchors (Mask R-CNN), and a row needing three rounds."""
    x = _special((2, n), seed=39)
    got, want = _compile(lambda x: torch.topk(x, k))(x), torch.topk(x, k)
    _same(got.values, want.values, "values", zero_signs=False)
    _consistent_indices(x, 1, got.values, got.indices, "topk")


def test_topk_of_long_rows_with_a_k_above_half_a_chunk_is_refused_by_name() -> None:
    with pytest.raises(Exception) as info:
        _compile(lambda x: torch.topk(x, 2100))(torch.randn(2, 5000))
    err = _cause(info.value, UnsupportedOpError)
    assert ("aten.topk with k=2100 of rows of 5000 elements is not supported: rows longer than 4096 are reduced "
            "chunk by chunk, which keeps at most k=2048") in str(err), str(err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_mode_values_exact_and_index_an_occurrence(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(41)
    x = torch.randint(-3, 4, (130, 37), generator=g).to(dtype)
    if dtype.is_floating_point:
        x[3, 5], x[3, 6] = -0.0, 0.0

    def f(x: torch.Tensor) -> Any:
        return torch.mode(x, 1), torch.mode(x.t(), 0, keepdim=True)

    got, want = _compile(f)(x), f(x)
    _same(got[0].values, want[0].values, "values", zero_signs=False)
    _consistent_indices(x, 1, got[0].values.unsqueeze(1), got[0].indices.unsqueeze(1), "mode")
    _same(got[1].values, want[1].values, "keepdim values", zero_signs=False)


def test_mode_of_a_row_with_nan_raises() -> None:
    from neuron_compile.errors import DeviceAssertionError

    x = torch.randint(0, 3, (4, 6)).float()
    f = _compile(lambda x: torch.mode(x, 1))
    _same(f(x).values, torch.mode(x, 1).values, "values")
    x[2, 1] = NAN
    with pytest.raises(DeviceAssertionError, match="mode of a row containing NaN is not supported"):
        f(x)


@pytest.mark.parametrize("op", ["sort", "topk", "kthvalue", "median", "msort"])
def test_gradients_flow_to_the_selected_positions(op: str) -> None:
    g = torch.Generator().manual_seed(43)
    x0 = torch.randperm(6 * 40, generator=g).reshape(6, 40).float() / 7  # distinct: eager's indices are specified
    fns = {"sort": lambda x: torch.sort(x, 1, descending=True).values[:, :5],
           "topk": lambda x: torch.topk(x, 4, 1).values,
           "kthvalue": lambda x: torch.kthvalue(x, 3, 1).values,
           "median": lambda x: torch.median(x, 0).values,
           "msort": lambda x: torch.msort(x)[:3]}
    f = fns[op]
    xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    oe, oc = f(xe), _compile(f)(xc)
    _same(oc.detach(), oe.detach(), "forward")
    grad = torch.randn(oe.shape, generator=g)
    (oe * grad).sum().backward()
    (oc * grad).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=0, atol=0)


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_of_a_python_number(right: bool) -> None:
    """``torch.searchsorted(seq, 1.5)``: the Scalar overload, a 0-d result like eager's."""
    seq = torch.tensor([0.5, 1.0, 1.5, 1.5, 2.0, 7.0])

    def fn(s: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(s, 1.5, right=right) + torch.searchsorted(s * 2, 3, right=right)

    got = torch.compile(fn, backend="neuron", dynamic=False)(seq)
    assert got.shape == () and torch.equal(got, fn(seq))
