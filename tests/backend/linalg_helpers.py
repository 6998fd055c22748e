"""What the linear-algebra tests share (test_linalg.py, real matrices; test_complex_linalg.py, complex ones):
compiling, comparing every output with eager's, gradients against eager's, and reading a refusal's reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from cnn_helpers import unsupported


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def check_outputs(got: Any, want: Any) -> None:
    """Every output's dtype and shape are eager's, its values within 2e-5; integer ones (pivots, info, ranks)
    exactly eager's."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if w.dtype.is_floating_point or w.dtype.is_complex:
            torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)
        else:
            assert torch.equal(g, w)


def _inexact(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


def check_gradients(fn: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> None:
    """The gradients of a real loss of every float / complex output (``sin`` of each part) with respect to every
    float / complex argument match eager autograd's (autograd's formulas read the forward's factors back, so
    wrong conventions give wrong gradients)."""
    def loss(*xs: torch.Tensor) -> torch.Tensor:
        out = fn(*xs)
        total = torch.zeros(())
        for o in out if isinstance(out, tuple) else (out,):
            if o.is_complex():
                total = total + (o.real.sin() + o.imag.cos()).sum()
            elif o.dtype.is_floating_point:
                total = total + o.sin().sum()
        return total

    wrt = [i for i, a in enumerate(args) if _inexact(a)]
    eager_leaves = [a.detach().clone().requires_grad_(i in wrt) for i, a in enumerate(args)]
    want = torch.autograd.grad(loss(*eager_leaves), [eager_leaves[i] for i in wrt])
    leaves = [a.detach().clone().requires_grad_(i in wrt) for i, a in enumerate(args)]
    got = torch.autograd.grad(compiled(loss)(*leaves), [leaves[i] for i in wrt])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def refusal(fn: Callable[..., Any], *args: torch.Tensor) -> str:
    """The message of the UnsupportedOpError compiling ``fn`` raises (Dynamo wraps it: it is in the chain)."""
    with pytest.raises(Exception) as info:  # noqa: PT011
        compiled(fn)(*args)
    return str(unsupported(info.value))
