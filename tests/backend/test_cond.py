"""``torch.cond`` compiles by computing both branches and selecting each result (``lowering/decomp_cond.py``).

Compared with eager: both predicate values, nested conds, a module's parameters in the branches, several results,
gradients (a branch not taken may hold NaN/inf gradients, which must not leak), and the checks of a branch (an
out-of-range index, an integer division by zero), which raise only when their branch is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.exc import BackendCompilerFailed

from neuron_compile.errors import DeviceAssertionError, IndexOutOfRangeError, UnsupportedOpError


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


def _leaves(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]


def _same(fn: Callable[..., Any], *xs: torch.Tensor, grad: bool = False) -> None:
    ea, ca = _leaves(*xs), _leaves(*xs)
    want, got = fn(*ea), _compile(fn)(*ca)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    if grad:
        want.float().sum().backward()
        got.float().sum().backward()
        for e, c in zip(ea, ca, strict=True):
            if e.requires_grad:
                assert torch.isfinite(c.grad).all()
                torch.testing.assert_close(c.grad, e.grad, rtol=1e-5, atol=1e-5)


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_matches_eager_for_either_predicate(sign: float) -> None:
    _same(lambda x: torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos() * 2, (x,)), sign * X.abs())


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradients_of_the_branch_not_taken_do_not_leak(sign: float) -> None:
    # the true branch's sqrt has NaN values and gradients for a negative x: they must not reach either result
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x, w: (x * w).sqrt(), lambda x, w: x.cos() + w, (x, w))

    _same(fn, (sign * X.abs()).requires_grad_(), torch.rand(4, 8).requires_grad_(), grad=True)


@pytest.mark.parametrize(("a", "b"), [(1.0, 1.0), (1.0, -1.0), (-1.0, 1.0), (-1.0, -1.0)])
def test_nested_cond(a: float, b: float) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        inner = lambda x: torch.cond(x[0, 1] > 0, lambda y: y + 1, lambda y: y.exp(), (x,))  # noqa: E731
        return torch.cond(x[0, 0] > 0, inner, lambda x: x * 2, (x,))

    x = X.clone()
    x[0, 0], x[0, 1] = a, b
    _same(fn, x)


class _TwoPaths(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cond(x.mean() > 0, lambda x: (F.gelu(self.a(x)), x.amax(1)),
                          lambda x: (self.b(x).relu(), x.amin(1)), (x,))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_module_parameters_and_several_results_train_like_eager(sign: float) -> None:
    torch.manual_seed(0)
    ref = _TwoPaths()
    mod = _TwoPaths()
    mod.load_state_dict(ref.state_dict())
    x = sign * X.abs()
    want = ref(x)
    got = _compile(mod)(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    (want[0].sum() + want[1].sum()).backward()
    (got[0].sum() + got[1].sum()).backward()
    for (name, p), q in zip(mod.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)


def _gather_if_small(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.cond(i.max() < 4, lambda x, i: x[i], lambda x, i: x[:2] * 0, (x, i))


def test_an_index_out_of_range_in_the_branch_not_taken_does_not_raise() -> None:
    _same(_gather_if_small, X, torch.tensor([1, 9]))
    _same(_gather_if_small, X, torch.tensor([1, 3]))


def test_an_index_out_of_range_in_the_branch_taken_raises_like_eager() -> None:
    i = torch.tensor([-9, 1])
    with pytest.raises(IndexError):
        _gather_if_small(X, i)
    with pytest.raises(IndexOutOfRangeError, match=r"index out of range in aten\.index: an index is outside "
                       r"\[-4, 4\) for a dimension of size 4 \(at .*test_cond\.py"):
        _compile(_gather_if_small)(X, i)


def _divide_if_positive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cond(a.sum() > 0, lambda a, b: a // b, lambda a, b: a * 0, (a, b))


def test_an_integer_division_by_zero_raises_only_in_the_branch_taken() -> None:
    b = torch.tensor([2, 0])
    _same(_divide_if_positive, torch.tensor([-4, -6]), b)
    compiled = _compile(_divide_if_positive)
    with pytest.raises(DeviceAssertionError, match="ZeroDivisionError: integer division by zero in aten.div"):
        compiled(torch.tensor([4, 6]), b)
    assert torch.equal(compiled(torch.tensor([4, 6]), torch.tensor([2, 4])), torch.tensor([2, 1]))


def test_while_loop_is_refused_by_name() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.while_loop(lambda i, x: i < x.sum().abs().long(), lambda i, x: (i + 1, x * 0.5),
                                (torch.tensor(0), x))[1]

    with pytest.raises(BackendCompilerFailed) as info:
        _compile(fn)(X)
    assert isinstance(info.value.inner_exception, UnsupportedOpError)
    assert "torch.ops.higher_order.while_loop" in str(info.value)
    assert "its trip count depends on tensor values" in str(info.value)
