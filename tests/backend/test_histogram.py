"""``torch.histogram`` / ``torch.histogramdd`` (lowering/decomp_histogram.py) against eager, bit for bit.

Data-dependent edges must be eager's linspace exactly (one rounding of ``lo + step * i``), or elements that sit on
an edge change bins: integer-valued data with bin counts whose edges land on those integers checks that, next to
random scales and offsets. Also explicit ranges, bin tensors, weights, density, a single repeated value, NaNs and
values outside the range, and a 2-D histogramdd.
"""

from __future__ import annotations

import pytest
import torch


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


@pytest.mark.parametrize("seed", range(4))
def test_data_dependent_edges_are_eagers_bit_for_bit(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    scale = 10.0 ** (seed - 2)
    data = [torch.randn(300, generator=gen) * scale + 3.7 * seed,
            torch.randint(-9, 10, (200,), generator=gen).float()]  # edges on the integers for bins 18, 6, 9
    for x in data:
        for bins in (1, 6, 7, 9, 18, 33):
            got = _compiled(lambda t, b=bins: torch.histogram(t, b))(x)
            want = torch.histogram(x, bins)
            assert torch.equal(got.bin_edges, want.bin_edges), (bins, got.bin_edges - want.bin_edges)
            assert torch.equal(got.hist, want.hist), bins


def test_range_bins_tensor_weights_density_and_odd_values() -> None:
    x = torch.tensor([[0.5, float("nan"), 2.0, -3.0], [1.0, 1.0, 4.0, 2.5]])
    w = torch.rand(2, 4, generator=torch.Generator().manual_seed(1))
    cases = [
        lambda t: torch.histogram(t, 5, range=(0.0, 3.0)),
        lambda t: torch.histogram(t, 4, range=(1.0, 1.0)),
        lambda t: torch.histogram(t[:, 2:], 3, weight=w[:, 2:], density=True),  # eager refuses NaN data-ranges
        lambda t: torch.histogram(t, torch.tensor([-1.0, 0.0, 1.0, 2.5, 10.0]), weight=w),
        lambda t: torch.histogram(t[:, 2:], 3),
        lambda t: torch.histogram(torch.full((5,), 2.0), 4),
    ]
    for fn in cases:
        got, want = _compiled(fn)(x), fn(x)
        torch.testing.assert_close(got.hist, want.hist, equal_nan=True)
        assert torch.equal(got.bin_edges, want.bin_edges)


def test_histogramdd() -> None:
    gen = torch.Generator().manual_seed(2)
    pts = torch.randn(64, 2, generator=gen)
    w = torch.rand(64, generator=gen)
    cases = [
        lambda p: torch.histogramdd(p, [4, 3]),
        lambda p: torch.histogramdd(p, [5, 2], range=[-1.0, 1.0, 0.0, 2.0], weight=w, density=True),
        lambda p: torch.histogramdd(p, [torch.tensor([-2.0, 0.0, 2.0]), torch.tensor([-1.0, 1.0])]),
    ]
    for fn in cases:
        got, want = _compiled(fn)(pts), fn(pts)
        torch.testing.assert_close(got.hist, want.hist)
        for g, e in zip(got.bin_edges, want.bin_edges, strict=True):
            assert torch.equal(g, e)


@pytest.mark.parametrize("bins", [1000, 12345])
def test_narrow_data_and_many_bins_match_eagers_local_search(bins: int) -> None:
    """Data spread over a few ulps of its magnitude gives bins narrower than the data's spacing, so many edges
    repeat, and eager's bin is its linear guess corrected against the neighbouring edges only (not a search of
    every edge). With more than 4096 bins the edge index no longer fits the 12 bits a plain product split holds."""
    gen = torch.Generator().manual_seed(bins)
    fn = _compiled(lambda t: torch.histogram(t, bins))
    for trial in range(6):
        offset, spread = 6.5 * (trial - 2.5), 10.0 ** (trial - 4)
        x = offset + spread * torch.randn(2048, generator=gen)
        got, want = fn(x), torch.histogram(x, bins)
        assert torch.equal(got.bin_edges, want.bin_edges), trial
        assert torch.equal(got.hist, want.hist), (trial, (got.hist != want.hist).sum())
    pts = torch.stack([x, -2 * x + 1e-3 * torch.randn(2048, generator=gen)], 1)
    got, want = _compiled(lambda p: torch.histogramdd(p, [bins // 10, 7]))(pts), torch.histogramdd(pts, [bins // 10, 7])
    assert torch.equal(got.hist, want.hist)
