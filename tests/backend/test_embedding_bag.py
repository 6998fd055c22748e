"""EmbeddingBag (sum/mean/max, offsets or 2-D bags, per_sample_weights, padding_idx, include_last_offset,
empty bags) and one_hot vs eager, forward and backward in strict mode; one_hot's class checks raise like eager.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.errors import DeviceAssertionError


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


BAGS = [
    ("sum", {}), ("mean", {}), ("max", {}), ("sum", {"per_sample_weights": True}), ("mean", {"padding_idx": 2}),
    ("max", {"padding_idx": 9}), ("sum", {"include_last_offset": True}),
]


@pytest.mark.parametrize("mode,kw", BAGS, ids=[f"{m}-{'-'.join(k) or 'plain'}" for m, k in BAGS])
def test_embedding_bag_forward_and_backward(mode: str, kw: dict[str, Any]) -> None:
    w0 = torch.randn(10, 6, generator=_g(1))
    idx = torch.tensor([0, 1, 2, 3, 2, 9, 9, 5, 2])
    offsets = torch.tensor([0, 2, 2, 5, 9]) if kw.get("include_last_offset") else torch.tensor([0, 2, 2, 5])
    psw = torch.rand(9, generator=_g(2)) if kw.pop("per_sample_weights", False) else None

    def f(w: torch.Tensor, i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(i, w, o, mode=mode, per_sample_weights=psw, **kw)

    we, wc = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    oe, oc = f(we, idx, offsets), _compile(f)(wc, idx, offsets)
    torch.testing.assert_close(oc, oe, rtol=1e-5, atol=1e-5)
    g = torch.randn(oe.shape, generator=_g(3))
    oe.backward(g)
    oc.backward(g)
    torch.testing.assert_close(wc.grad, we.grad, rtol=1e-5, atol=1e-5)


def test_embedding_bag_module_2d_bags_and_per_sample_weight_grads() -> None:
    bag = torch.nn.EmbeddingBag(50, 8, mode="sum")
    idx = torch.randint(0, 50, (6, 4), generator=_g(4))
    psw0 = torch.rand(6, 4, generator=_g(5))
    pe, pc = psw0.clone().requires_grad_(), psw0.clone().requires_grad_()
    oe = bag(idx, per_sample_weights=pe)
    oc = _compile(lambda i, p: bag(i, per_sample_weights=p))(idx, pc)
    torch.testing.assert_close(oc, oe, rtol=1e-5, atol=1e-5)
    oe.sum().backward()
    ge = bag.weight.grad.clone()
    bag.weight.grad = None
    oc.sum().backward()
    torch.testing.assert_close(bag.weight.grad, ge, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-5, atol=1e-5)


def test_embedding_bag_max_ties_send_the_gradient_to_the_first_row() -> None:
    w0 = torch.tensor([[1.0, 2.0], [1.0, 5.0], [0.5, 5.0]])
    idx = torch.tensor([0, 1, 2, 2, 0])
    offsets = torch.tensor([0, 3])

    def f(w: torch.Tensor, i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(i, w, o, mode="max")

    we, wc = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    f(we, idx, offsets).sum().backward()
    _compile(f)(wc, idx, offsets).sum().backward()
    assert torch.equal(wc.grad, we.grad), (wc.grad, we.grad)


def test_one_hot_and_its_class_checks() -> None:
    f = _compile(lambda i: F.one_hot(i, 6))
    i = torch.tensor([[0, 5, 3], [2, 2, 1]])
    assert torch.equal(f(i), F.one_hot(i, 6))
    for bad, why in ((torch.tensor([[0, 6, 1], [0, 0, 0]]), "smaller than num_classes"),
                     (torch.tensor([[0, -1, 1], [0, 0, 0]]), "non-negative")):
        with pytest.raises(RuntimeError):
            F.one_hot(bad, 6)
        with pytest.raises(DeviceAssertionError) as info:
            f(bad)
        assert re.search(why, str(info.value)), str(info.value)


def test_embedding_bag_gradient_forms_without_a_kernel_are_refused_by_name() -> None:
    from neuron_compile.errors import UnsupportedOpError

    w = torch.randn(10, 4, requires_grad=True)
    f = _compile(lambda w, i, o: F.embedding_bag(i, w, o, mode="sum", scale_grad_by_freq=True))
    with pytest.raises(Exception) as info:
        f(w, torch.tensor([1, 2, 2]), torch.tensor([0, 1]))
    seen: BaseException | None = info.value
    while seen is not None and not isinstance(seen, UnsupportedOpError):
        seen = seen.__cause__ or seen.__context__
    assert seen is not None and "EmbeddingBag backward with scale_grad_by_freq=True is not supported" in str(seen)
