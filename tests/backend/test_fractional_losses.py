"""Fractional max pooling, the multilabel margin loss and the chunked linear cross entropy against eager.

- ``F.fractional_max_pool2d/3d`` (lowering/decomp_pool.py) with explicit random samples, so eager and the
  compiled graph pool the same windows: values, indices (first maximum, the last NaN of a window with NaNs),
  unbatched inputs, bf16 (window starts computed in bf16 as eager does) and the backward.
- ``nn.MultiLabelMarginLoss`` (neuron_compile/torch_fixes.py): torch's own tracing kernel counts target slots
  after the first -1 and gives a 1-D input's unreduced loss the shape [1]; ours follows eager. Likewise
  ``F.multi_margin_loss`` without reduction takes the target's shape.
- ``F.linear_cross_entropy`` with batch chunking (lowering/decomp_lce.py): loss and gradients of the input, the
  linear weight and bias, with class weights and ignore_index.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cnn_helpers import check_grads

from neuron_compile import torch_fixes


def _compiled(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


@pytest.mark.parametrize("nd,shape,kernel,out", [
    (2, (2, 3, 9, 11), (2, 3), (4, 5)),
    (2, (3, 10, 7), (3, 2), (5, 4)),  # unbatched
    (2, (1, 2, 6, 6), (2, 2), (1, 3)),  # one output along H: its window is the last one
    (3, (2, 2, 7, 8, 9), (2, 2, 3), (3, 4, 4)),
])
def test_fractional_max_pool_matches_eager(nd: int, shape, kernel, out) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=gen)
    batch = shape[0] if len(shape) == nd + 2 else 1
    channels = shape[-nd - 1]
    samples = torch.rand(batch, channels, nd, generator=gen)
    pool = F.fractional_max_pool2d if nd == 2 else F.fractional_max_pool3d

    def fn(t: torch.Tensor):
        return pool(t, kernel, output_size=out, return_indices=True, _random_samples=samples)

    got, want = _compiled(fn)(x), fn(x)
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])
    check_grads(lambda t: fn(t)[0], x)


def test_fractional_max_pool_ties_nan_and_bf16() -> None:
    x = torch.zeros(1, 2, 8, 8)  # ties everywhere: the first position of each window
    x[0, 1, 3, 3] = float("nan")
    x[0, 1, 3, 4] = float("nan")  # two NaNs in one window: eager keeps the last
    x[0, 1, 6, 6] = float("-inf")
    samples = torch.tensor([[[0.3, 0.7], [0.9, 0.05]]])

    def fn(t: torch.Tensor, s: torch.Tensor):
        return F.fractional_max_pool2d(t, 2, output_size=5, return_indices=True, _random_samples=s)

    got, want = _compiled(fn)(x, samples), fn(x, samples)
    torch.testing.assert_close(got[0], want[0], equal_nan=True)
    assert torch.equal(got[1], want[1])
    xb = torch.randn(2, 3, 17, 13, generator=torch.Generator().manual_seed(5)).bfloat16()
    sb = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(6)).bfloat16()
    torch._dynamo.reset()
    got = _compiled(lambda t, s: F.fractional_max_pool2d(t, 3, output_size=(6, 5), return_indices=True,
                                                         _random_samples=s))(xb, sb)
    want = F.fractional_max_pool2d(xb, 3, output_size=(6, 5), return_indices=True, _random_samples=sb)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_multilabel_margin_loss_matches_eager() -> None:
    assert "aten.multilabel_margin_loss_forward.default" in torch_fixes.install()
    gen = torch.Generator().manual_seed(0)
    cases = [(torch.randn(10, generator=gen), torch.tensor([3, 0, -1, 1, 0, 0, 0, 0, 0, 0])),
             (torch.randn(4, 6, generator=gen), torch.tensor([[5, 2, -1, 0, 0, 0], [0, 1, 2, 3, 4, 5],
                                                              [-1, 3, 3, 3, 3, 3], [4, 4, -1, 2, 2, 2]]))]
    for x, target in cases:
        for reduction in ("none", "mean", "sum"):
            torch._dynamo.reset()
            fn = torch.nn.MultiLabelMarginLoss(reduction=reduction)
            want = fn(x, target)
            got = _compiled(fn)(x, target)
            assert got.shape == want.shape, (reduction, got.shape, want.shape)
            torch.testing.assert_close(got, want)
            if reduction != "none":
                check_grads(lambda t, fn=fn, target=target: fn(t, target), x)


@pytest.mark.parametrize("reduction,kwargs", [
    ("mean", {}),
    ("sum", dict(ignore_index=2)),
    ("mean", dict(class_weight=True, ignore_index=1)),
    ("none", dict(class_weight=True)),
])
def test_chunked_linear_cross_entropy_matches_eager(reduction: str, kwargs: dict) -> None:
    gen = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(7, 5, generator=gen), torch.randn(6, 5, generator=gen), torch.randn(6, generator=gen)
    target = torch.randint(0, 6, (7,), generator=gen)
    weight = torch.rand(6, generator=gen) + 0.5 if kwargs.pop("class_weight", False) else None
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=3, allow_retain_graph=reduction != "none")

    def loss(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.linear_cross_entropy(x, w, target, linear_bias=b, weight=weight, reduction=reduction,
                                      options=options, **kwargs)

    check_grads(loss, x, w, b)


def test_multi_margin_loss_unreduced_takes_the_targets_shape() -> None:
    assert "aten.multi_margin_loss.default" in torch_fixes.install()
    for x, target in ((torch.randn(5), torch.tensor(2)), (torch.randn(()), torch.tensor(0)),
                      (torch.randn(5), torch.tensor([3])), (torch.randn(3, 4), torch.tensor([0, 3, 1]))):
        for kwargs in (dict(reduction="none"), dict(reduction="none", p=2, margin=0.5), dict(reduction="sum")):
            torch._dynamo.reset()
            fn = lambda t, target=target, kwargs=kwargs: F.multi_margin_loss(t, target, **kwargs)  # noqa: E731
            got, want = _compiled(fn)(x), fn(x)
            assert got.shape == want.shape, (x.shape, target.shape, kwargs, got.shape, want.shape)
            torch.testing.assert_close(got, want)
