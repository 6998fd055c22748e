"""``torch.segment_reduce`` (lowering/decomp_segment.py) and its backward against eager.

Every reduction (sum, mean, max, min, prod) with lengths and with offsets (including offsets that skip data
before the first segment and after the last), empty segments with and without ``initial``, NaN data, a batched
axis with trailing dims, and the gradients: ties of max/min share it, a zero in a product segment.
"""

from __future__ import annotations

import pytest
import torch

REDUCTIONS = ["sum", "mean", "max", "min", "prod"]


def _check(data: torch.Tensor, reduce: str, cot: torch.Tensor | None = None, **kwargs) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.segment_reduce(x, reduce, **kwargs)

    torch._dynamo.reset()
    got_x = data.detach().clone().requires_grad_()
    want_x = data.detach().clone().requires_grad_()
    got = torch.compile(fn, backend="neuron", dynamic=False)(got_x)
    want = fn(want_x)
    torch.testing.assert_close(got, want, equal_nan=True)
    if cot is None:
        cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    (g_got,) = torch.autograd.grad(got, got_x, cot)
    (g_want,) = torch.autograd.grad(want, want_x, cot)
    torch.testing.assert_close(g_got, g_want, equal_nan=True)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_lengths_with_empty_segments_and_initial(reduce: str) -> None:
    data = torch.tensor([1.0, 3.0, 3.0, -2.0, 0.0, 4.0, 0.5])
    lengths = torch.tensor([3, 0, 3, 1])
    _check(data, reduce, lengths=lengths)
    _check(data, reduce, lengths=lengths, initial=2.0)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_offsets_batched_axis_with_trailing_dims(reduce: str) -> None:
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(2, 9, 3, generator=gen)
    offsets = torch.tensor([[1, 1, 4, 8], [0, 2, 2, 9]])  # row 0 skips position 0 and position 8
    _check(data, reduce, offsets=offsets, axis=1)


def test_nan_and_unsafe() -> None:
    data = torch.tensor([1.0, float("nan"), 2.0, 5.0, 1.0])
    for reduce in REDUCTIONS:
        _check(data, reduce, lengths=torch.tensor([2, 3]), unsafe=True)


def test_ties_zeros_and_nans_in_the_gradient() -> None:
    """Eager's backward: max/min ties share a positive gradient and each take a negative one whole; NaNs count as
    the maximum; prod's zero and NaN elements get the product of the others and ``initial``."""
    lengths = torch.tensor([3, 3, 2])
    ties = torch.tensor([3.0, 3.0, 1.0, 2.0, float("nan"), float("nan"), -1.0, -1.0])
    for reduce in ("max", "min"):
        _check(ties, reduce, cot=torch.tensor([-0.6, 0.9, 0.4]), lengths=lengths)
    products = torch.tensor([0.0, 2.0, 0.0, 3.0, 0.0, 5.0, float("nan"), 0.0])
    _check(products, "prod", cot=torch.tensor([-0.6, 0.9, 1.0]), lengths=lengths, initial=2.0)
