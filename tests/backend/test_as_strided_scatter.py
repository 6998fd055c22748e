"""as_strided_scatter (lowering/ops/movement.py) against eager PyTorch: the input copied, then ``src`` written over
the strided window of its storage, as one copy kernel; the training graphs of ``as_strided`` views (of a transposed
tensor, as Longformer's chunks are) that produce it; and the refusals of windows eager gives no single answer for
and of inputs that are not a whole contiguous buffer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from cnn_helpers import check_grads, unsupported

X = torch.arange(24.0).reshape(4, 6) * 0.5 - 3
S = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))

CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "window": (lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (6, 2), 1), (X, S)),
    "whole_input_permuted": (lambda x, s: torch.as_strided_scatter(x.reshape(-1), s, (4, 6), (1, 4)),
                             (X, torch.randn(4, 6))),
    "transposed_src": (lambda x, s: torch.as_strided_scatter(x, s.t(), (3, 2), (1, 6), 2), (X, S)),
    "int32": (lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (6, 2), 1), (X.int(), (S * 10).int())),
    "bfloat16": (lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (6, 2), 1), (X.bfloat16(), S.bfloat16())),
    "empty_src": (lambda x, s: torch.as_strided_scatter(x, s, (0, 3), (6, 2), 1), (X, S[:0])),
    "zero_dim_src": (lambda x, s: torch.as_strided_scatter(x, s, (), (), 3), (X, torch.tensor(5.0))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_as_strided_scatter_equals_eager(name: str) -> None:
    fn, args = CASES[name]
    got = torch.compile(fn, backend="neuron", dynamic=False)(*args)
    want = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


def _grad_check(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> list[str]:
    """Compiled forward and input gradient vs eager; returns the ops of the compiled graphs."""
    from neuron_compile import backend as B

    check_grads(fn, x)
    return [op for g in B.compiled_graphs() for op in g["plan"].summary["ops"]]


def test_gradient_of_as_strided_over_a_transposed_tensor_matches_eager() -> None:
    """``as_strided`` of a non-contiguous tensor (Longformer's chunks of a transposed projection): its backward
    writes the gradient back through the input's own layout, an as_strided_scatter."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).transpose(1, 2).as_strided((2, 3, 8), (8, 16, 1)) * 3

    assert "prims.as_strided_scatter.default" in _grad_check(fn, torch.randn(2, 8, 3))


def test_gradient_of_overlapping_strided_chunks_matches_eager() -> None:
    """Longformer's sliding-window chunks: ``as_strided`` windows overlapping by half; their backward adds the
    overlaps."""

    def chunks(x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        w = x.as_strided((b, n // 4 - 1, 8, d), (n * d, 4 * d, d, 1))
        return (w * w.flip(2)).sum(2)

    _grad_check(chunks, torch.randn(2, 16, 5))


def test_a_window_writing_an_element_twice_is_refused_by_name() -> None:
    with pytest.raises(Exception) as info:
        torch.compile(lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (1, 1), 0), backend="neuron")(X, S)
    cause = unsupported(info.value)
    assert "as_strided_scatter" in str(cause)
    assert "writes some elements more than once (which write lands is unspecified)" in str(cause)


def test_a_non_contiguous_input_is_refused_by_name() -> None:
    with pytest.raises(Exception) as info:
        torch.compile(lambda x, s: torch.as_strided_scatter(x.t(), s, (2, 3), (6, 2), 1), backend="neuron")(X, S)
    assert "as_strided_scatter into a non-contiguous input (shape (6, 4), strides (1, 6), offset 0)" in \
        str(unsupported(info.value))
