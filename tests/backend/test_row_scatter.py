"""Row scatter-adds (index_put accumulate, index_add, scatter_add with an expanded index) vs eager.

These lower to one :class:`~neuron_compile.lowering.ir.IndexAddKernel`: a DMA scatter-add of whole rows
(``nisa.dma_compute``). Duplicate indices within a 128-index tile are combined on TensorE first, so the kernel's
work is O(indices x row) however many rows the target has. The cases cover duplicates inside and across tiles,
the indexed dim first / in the middle / last, 1-D and 0-d targets, non-contiguous operands, bf16/fp16, bounds
errors like eager's, and the backward of index_select / grid_sample (3-D), which scatter their gradients this way.
A float scatter_add with an index per element along a long dim goes through the same kernel element by element.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from neuron_compile import backend as B
from neuron_compile.errors import IndexOutOfRangeError
from neuron_compile.nki_api.checker import check_source_against_api

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _families(first: int) -> list[str]:
    return [k.family for g in B.compiled_graphs()[first:] for k in g["plan"].kernels]


def _run(fn: Callable[..., Any], *xs: Any, tol: float = 1e-5) -> list[str]:
    """Compile ``fn`` alone, compare with eager, return the kernel families it ran (sources checked against the
    public NKI API)."""
    torch._dynamo.reset()
    first = len(B.compiled_graphs())
    with torch.no_grad():
        got = torch.compile(fn, backend="neuron", dynamic=False)(*xs)
        want = fn(*xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
    for g in B.compiled_graphs()[first:]:
        for (name, src), k in zip(g["sources"], g["plan"].kernels, strict=True):
            if k.family == "index_put":
                assert check_source_against_api(src) == [], name
    return _families(first)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,dim,n,distinct", [
    ((300, 7), 0, 500, 20),  # 4 index tiles, every index repeated ~25 times, within and across tiles
    ((4, 50, 6), 1, 333, 50),  # the indexed dim in the middle: outer loops over dim 0, rows of 6
    ((6, 40), 1, 200, 40),  # the last dim: rows of one element
    ((1000,), 0, 260, 1000),  # a 1-D target
    ((20, 600), 0, 130, 20),  # rows wider than one PSUM bank (512 fp32): two column chunks
])
def test_index_add_matches_eager_with_duplicates(dtype: torch.dtype, shape: tuple[int, ...], dim: int, n: int,
                                                 distinct: int) -> None:
    x = torch.randn(shape, generator=_g(1)).to(dtype)
    idx = torch.randint(0, distinct, (n,), generator=_g(2))
    src_shape = list(shape)
    src_shape[dim] = n
    src = torch.randn(src_shape, generator=_g(3)).to(dtype)
    # eager bf16/fp16 index_add rounds after every add; ours sums each tile's duplicates in fp32 first
    families = _run(lambda x, i, s: x.index_add(dim, i, s), x, idx, src, tol=TOL[dtype] * (4 if n > 300 else 1))
    assert "index_put" in families and "scatter" not in families, families


def test_nan_and_infinities_stay_in_their_own_rows() -> None:
    """The duplicate sums run through a TensorE matmul, where 0 x NaN would poison every row of the tile: a NaN, +inf,
    -inf and +inf with -inf in one group give NaN / inf / -inf / NaN there and leave the other rows finite."""
    x = torch.randn(10, 4, generator=_g(30))
    idx = torch.tensor([0, 1, 1, 2, 3, 3, 4, 5, 6, 7] * 20)
    src = torch.randn(200, 4, generator=_g(31))
    src[0, 0] = float("nan")
    src[1, 1] = float("inf")
    src[2, 1] = float("inf")
    src[4, 2] = float("inf")
    src[5, 2] = -float("inf")
    src[6, 3] = -float("inf")
    want = x.index_add(0, idx, src)
    assert want[0, 0].isnan() and want[3, 2].isnan() and want[4, 3] == -float("inf") and want[1, 1] == float("inf")
    assert want[8:].isfinite().all()
    _run(lambda x, i, s: x.index_add(0, i, s), x, idx, src)
    # an embedding's gradient with one NaN token: one NaN row (the one-hot matmul made all 300 rows NaN)
    grads = torch.ones(3, 4)
    grads[0, 0] = float("nan")
    _run(lambda w, i, g: w.index_put((i,), g, accumulate=True), torch.zeros(300, 4), torch.tensor([5, 7, 9]), grads)


def test_scatter_add_with_an_expanded_index_is_a_row_scatter() -> None:
    """Message passing (a GNN's aggregation): scatter_add along dim 0 with one edge index expanded over the features
    is a row scatter; a full index with its own value per element stays on the general scatter kernel."""
    x = torch.zeros(50, 16)
    edges = torch.randint(0, 50, (400,), generator=_g(4))
    msg = torch.randn(400, 16, generator=_g(5))
    fam = _run(lambda x, e, m: x.scatter_add(0, e.unsqueeze(1).expand(-1, 16), m), x, edges, msg)
    assert "index_put" in fam and "scatter" not in fam, fam
    full = torch.randint(0, 50, (400, 16), generator=_g(6))
    fam = _run(lambda x, i, m: x.scatter_add(0, i, m), x, full, msg)
    assert "scatter" in fam and "index_put" not in fam, fam


def test_scatter_add_along_long_lines_goes_element_by_element() -> None:
    """An index of its own per element along a long dim (bag-of-words counts over a vocabulary): each
    element's flat address, then one scatter-add of single elements; an index smaller than self in every dim, a
    transposed self, and an out-of-range index raising like eager."""
    counts = torch.zeros(32, 5000)
    tokens = torch.randint(0, 5000, (32, 700), generator=_g(20))
    fam = _run(lambda c, t: c.scatter_add(1, t, torch.ones(32, 700)), counts, tokens)
    assert "index_put" in fam and "scatter" not in fam, fam
    x = torch.randn(600, 6, 3, generator=_g(21))
    idx = torch.randint(0, 600, (4, 900, 2), generator=_g(22))
    src = torch.randn(5, 900, 3, generator=_g(23))
    fam = _run(lambda x, i, s: x.transpose(0, 1).scatter_add(1, i, s), x, idx, src)
    assert "index_put" in fam and "scatter" not in fam, fam
    bad = idx.clone()
    bad[3, 17, 1] = 600
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.transpose(0, 1).scatter_add(1, bad, src)
    torch._dynamo.reset()
    f = torch.compile(lambda x, i, s: x.transpose(0, 1).scatter_add(1, i, s), backend="neuron", dynamic=False)
    with pytest.raises(IndexOutOfRangeError, match=r"index out of range in aten.scatter_add: an index is outside "
                                                   r"\[0, 600\) for dimension 1 of size 600"):
        f(x, bad, src)
    g = torch.compile(lambda x, i, s: x.transpose(0, 1).scatter_reduce(1, i, s, "sum"), backend="neuron",
                      dynamic=False)
    with pytest.raises(IndexOutOfRangeError, match=r"index out of range in aten.scatter_reduce: an index is outside"):
        g(x, bad, src)


def test_row_scatter_of_non_contiguous_operands() -> None:
    base = torch.randn(9, 40, generator=_g(7))
    src = torch.randn(30, 9, 2, generator=_g(8))
    idx = torch.randint(0, 40, (30,), generator=_g(9))
    # self transposed (rows strided), values a strided slice of a permuted tensor
    _run(lambda b, i, s: b.t().index_add(0, i, s[:, :, 1]), base, idx, src)
    _run(lambda b, i, s: b[:, ::2].index_add(1, i[:7] // 2, s[:7, :, 0].t()), base, idx, src)


def test_index_put_accumulate_wraps_negative_indices_and_put_accumulates() -> None:
    w = torch.randn(300, 5, generator=_g(10))
    idx = torch.randint(-300, 300, (400,), generator=_g(11))
    vals = torch.randn(400, 5, generator=_g(12))
    assert "index_put" in _run(lambda w, i, v: w.index_put((i,), v, accumulate=True), w, idx, vals)
    flat = torch.randint(-1500, 1500, (700,), generator=_g(13))
    assert "index_put" in _run(lambda w, i, v: w.put(i, v, accumulate=True), w, flat, torch.randn(700))
    scalar = torch.tensor(2.0)  # a 0-d target: a line of one element
    _run(lambda s, i, v: s.put(i, v, accumulate=True), scalar, torch.tensor([0, -1, 0]), torch.randn(3))


def test_indices_beyond_2_24_stay_distinct() -> None:
    """Index math is int32: in fp32, 2**24 and 2**24 + 1 are one number, and the second row would be merged into the
    first as a duplicate."""
    n = 2**24 + 8
    idx = torch.tensor([n - 8, n - 7, n - 8, 5, -1])
    _run(lambda x, i, v: x.put(i, v, accumulate=True), torch.zeros(n), idx, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))


@pytest.mark.parametrize("bad", [40, -1])
def test_index_add_out_of_range_raises_like_eager(bad: int) -> None:
    x = torch.randn(3, 40)
    idx = torch.tensor([1, bad, 2])
    src = torch.ones(3, 3)
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.index_add(1, idx, src)
    torch._dynamo.reset()
    f = torch.compile(lambda x, i, s: x.index_add(1, i, s), backend="neuron", dynamic=False)
    with pytest.raises(IndexOutOfRangeError, match=r"index out of range in aten.scatter_add: an index is outside "
                                                   r"\[0, 40\) for dimension 1 of size 40; fix the indices"):
        f(x, idx, src)
    ok = torch.tensor([1, 39, 1])  # the same compiled kernel on good indices
    torch.testing.assert_close(f(x, ok, src), x.index_add(1, ok, src))


def test_backward_of_index_select_and_grid_sample_3d() -> None:
    """Both scatter their input gradient by rows: index_select's into the table, grid_sample's (trilinear, 8 corners
    per point) into the volume, with many points per voxel."""
    table = torch.randn(70, 33, generator=_g(14), requires_grad=True)
    idx = torch.randint(0, 70, (300,), generator=_g(15))
    vol = torch.randn(2, 3, 6, 7, 8, generator=_g(16), requires_grad=True)
    grid = (torch.rand(2, 5, 6, 7, 3, generator=_g(17)) * 2.2 - 1.1).requires_grad_()

    def f(t, i, v, g):
        return (t.index_select(0, i) ** 2).sum() + F.grid_sample(v, g, align_corners=False).square().sum()

    torch._dynamo.reset()
    first = len(B.compiled_graphs())
    want = torch.autograd.grad(f(table, idx, vol, grid), (table, vol, grid))
    got = torch.autograd.grad(torch.compile(f, backend="neuron", dynamic=False)(table, idx, vol, grid),
                              (table, vol, grid))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert _families(first).count("index_put") >= 2
