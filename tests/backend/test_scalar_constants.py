"""Ops of Python scalars only folded into graph constants (lowering/graph_passes.fold_scalar_ops), and pdist.

``tril_indices`` / ``triu_indices`` and the window functions depend on compile-time sizes alone: computed once at
compile time, they are graph constants (in inference, forward and backward graphs alike). Random ops are not
folded: they are drawn at every call. ``pdist`` gathers its row pairs with such a constant and follows eager's
per-p formulas in its backward (zero distances, ties of the inf-norm, p < 1).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from cnn_helpers import check_grads


def _same(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> None:
    got = torch.compile(fn, backend="neuron", dynamic=False)(*args)
    want = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows,cols,offset", [(6, 6, 0), (6, 6, -1), (5, 7, 2), (7, 4, -3), (3, 3, 5)])
def test_tril_and_triu_indices_equal_eager(rows: int, cols: int, offset: int) -> None:
    x = torch.randn(rows, cols)
    _same(lambda x: x[tuple(torch.tril_indices(rows, cols, offset))], x)
    _same(lambda x: torch.triu_indices(rows, cols, offset) + x.sum().long() * 0, x)
    _same(lambda: torch.tril_indices(rows, cols, offset))  # a graph of the constant alone


def test_triu_indices_in_a_training_graph() -> None:
    """DLRM's pairwise interactions: the upper triangle of a Gram matrix, differentiated."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        gram = x @ x.transpose(1, 2)
        i, j = torch.triu_indices(5, 5, 1)
        return gram[:, i, j]

    check_grads(fn, torch.randn(3, 5, 4))


@pytest.mark.parametrize("window", [torch.hann_window, torch.hamming_window, torch.blackman_window,
                                    torch.kaiser_window, torch.bartlett_window])
def test_window_functions(window: Callable[..., torch.Tensor]) -> None:
    _same(lambda x: x * window(16), torch.randn(3, 16))


def test_random_ops_are_not_folded() -> None:
    """``randperm(8)`` takes Python scalars only, but it is drawn at every call (eager's draws), not folded."""
    x = torch.randn(8)
    compiled = torch.compile(lambda x: x[torch.randperm(8)], backend="neuron")
    torch.manual_seed(0)
    first = compiled(x)
    torch.manual_seed(0)
    assert torch.equal(first, x[torch.randperm(8)])
    draws = {tuple(compiled(x).tolist()) for _ in range(4)}
    assert len(draws) > 1


def _rows() -> torch.Tensor:
    a = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    a[3] = a[1]  # a zero distance
    a[5, 2] = a[4, 2]  # an equal coordinate (p < 1, inf-norm ties)
    a[6] = a[2] + 0.5  # every coordinate tied for the inf-norm
    return a


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_pdist_forward_and_backward_match_eager(p: float) -> None:
    check_grads(lambda x: F.pdist(x, p), _rows())


def test_pdist_of_one_row_is_empty() -> None:
    _same(lambda x: F.pdist(x), torch.randn(1, 4))


@pytest.mark.parametrize("start,end,step", [(0.0, -8.000001, -4.0), (0.5, 2.0, 0.1), (-1.0, 1.0, 0.3)])
def test_fractional_arange_is_eager_values(start: float, end: float, step: float) -> None:
    """The device's iota takes integer starts and steps; a fractional arange is eager's own values, folded (exact:
    eager computes ``start + i * step`` in double before rounding, which an fp32 iota would not repeat)."""
    got = torch.compile(lambda x: x + torch.arange(start, end, step), backend="neuron", dynamic=False)
    n = torch.arange(start, end, step).numel()
    x = torch.randn(n)
    assert torch.equal(got(x), x + torch.arange(start, end, step))


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, float("inf")])
def test_cdist_of_points_with_no_coordinates_is_zero(p: float) -> None:
    """Eager's distance between points of zero coordinates is 0 for every p (a vector norm of nothing would
    refuse p = inf)."""
    _same(lambda a, b: torch.cdist(a, b, p=p), torch.randn(2, 3, 0), torch.randn(2, 4, 0))


@pytest.mark.parametrize("fn", [torch.sgn, lambda x: torch.sgn(x) * x.exp()])
def test_gradient_of_sgn_is_a_zero_tensor_memset(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Autograd writes sgn's gradient as an ``_efficientzerotensor`` (no storage): it becomes a memset of zeros
    (AOTAutograd's copy of a backward graph holding it as a constant crashed before)."""
    check_grads(fn, torch.randn(5, 5))


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist_forward_and_backward_match_eager(p: float) -> None:
    """cdist's direct path (_cdist_forward / _cdist_backward) with eager's per-p gradient formulas, shared with
    pdist: zero distances, tied inf-norm coordinates and zero coordinates for p < 1 included."""
    a = _rows()
    b = torch.cat([a[:3], a[3:] + 0.25])  # equal rows (zero distance), shifted rows (all inf-norm coordinates tie)
    check_grads(lambda x, y: torch.cdist(x, y, p, compute_mode="donot_use_mm_for_euclid_dist"), a, b)


@pytest.mark.parametrize("shapes", [((0, 5), (4, 5)), ((2, 4, 5), (2, 0, 5)), ((0, 4, 5), (3, 5))])
def test_cdist_of_no_pairs_is_empty(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, y, float("inf"))

    ours = [torch.randn(s, requires_grad=True) for s in shapes]
    eager = [t.detach().clone().requires_grad_() for t in ours]
    got, want = torch.compile(fn, backend="neuron", dynamic=False)(*ours), fn(*eager)
    assert got.shape == want.shape and got.numel() == 0
    got.sum().backward()
    want.sum().backward()
    for a, b in zip(ours, eager, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


CONSTANT_UNARY = {
    "trunc": torch.trunc, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "frac": torch.frac,
    "reciprocal": torch.reciprocal, "rsqrt": torch.rsqrt, "sign": torch.sign, "softplus": F.softplus,
    "mish": F.mish, "softshrink": F.softshrink, "to_bf16": lambda t: t.bfloat16().float(),
    "to_half": lambda t: t.half().float(), "to_uint8": lambda t: t.byte().float(), "to_int": lambda t: t.int().float(),
}


@pytest.mark.parametrize("name,value", [(n, v) for n in sorted(CONSTANT_UNARY) for v in (3.5, -1.75, 0.37)
                                        if not (n == "to_uint8" and v < 0)])  # float -> uint8 of -1.75: UB in C++
def test_unary_ops_of_a_constant_operand(name: str, value: float) -> None:
    """An op whose only tensor operand is a graph constant (here a ``full``, folded to a scalar) computes what the
    op computes on a tensor: trunc(3.5) was 3.5, a bf16 cast kept every bit, reciprocal/sign/softplus crashed."""
    op = CONSTANT_UNARY[name]
    x = torch.tensor([0.0, 1.0, 2.0])
    fn = lambda x: op(torch.full_like(x, value)) + x  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend="neuron", dynamic=False)(x), fn(x), rtol=1e-6, atol=1e-6,
                               equal_nan=True)


def test_constant_folds_round_like_the_fp32_alu() -> None:
    """Two constants folded into one: the result is rounded to fp32 as the kernel's ALU would round it (a float64
    fold made rint's (x + 2**23) - 2**23 the identity)."""
    _same(lambda x: torch.round(torch.full_like(x, 2.5) + torch.full_like(x, 0.25)) + x, torch.zeros(3))
    _same(lambda x: torch.special.chebyshev_polynomial_u(x, 3.5), torch.tensor([0.0, 2.0, 1.0, 3.0]))
