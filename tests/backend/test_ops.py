"""Op-table tests of the ``neuron`` backend against eager PyTorch, plus fusion and rejection tests.

Every :class:`~tests.backend.op_table.OpCase` runs ``torch.compile(fn, backend="neuron",
dynamic=False)`` forward (an inference graph) and, for differentiable float cases, forward and
backward (training graphs), comparing outputs and input ``.grad`` with eager in float32 and
bfloat16.
"""

from __future__ import annotations

import logging
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import neuron_compile.backend
from neuron_compile.errors import UnsupportedOpError

sys.path.insert(0, str(Path(__file__).parent))
from op_table import CASES, OpCase, make_input  # noqa: E402

log = logging.getLogger(__name__)

FWD_PARAMS = [pytest.param(case, dtype, id=f"{case.name}-{str(dtype).replace('torch.', '')}")
              for case in CASES for dtype in case.dtypes]
BWD_PARAMS = [p for p in FWD_PARAMS if p.values[0].grad]


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    raise TypeError(f"unexpected output {type(out)}")


def _inputs(case: OpCase, dtype: torch.dtype, requires_grad: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    xs = [make_input(a, dtype, gen) for a in case.args]
    if requires_grad:
        xs = [x.detach().requires_grad_(x.is_floating_point()) for x in xs]  # non-contiguous leaves stay strided
    return xs


def _assert_close(got: torch.Tensor, want: torch.Tensor, case: OpCase, dtype: torch.dtype, what: str) -> None:
    assert got.shape == want.shape, f"{case.name} {what}: shape {tuple(got.shape)} != eager {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{case.name} {what}: dtype {got.dtype} != eager {want.dtype}"
    if not want.is_floating_point():
        assert torch.equal(got, want), f"{case.name} {what}: {got} != {want}"
        return
    atol, rtol = case.tol[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{case.name} {what} ({dtype}): {m}")


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


@pytest.mark.parametrize(("case", "dtype"), FWD_PARAMS)
def test_forward(case: OpCase, dtype: torch.dtype) -> None:
    xs = _inputs(case, dtype, requires_grad=False)
    want = _flat(case.fn(*xs))
    got = _flat(_compile(case.fn)(*xs))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _assert_close(g, w, case, dtype, f"output {i}")
    assert neuron_compile.backend.compiled_graphs(), "the neuron backend compiled nothing"


@pytest.mark.parametrize(("case", "dtype"), BWD_PARAMS)
def test_backward(case: OpCase, dtype: torch.dtype) -> None:
    xs = _inputs(case, dtype, requires_grad=True)
    xs_eager = [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]
    want = _flat(case.fn(*xs_eager))
    got = _flat(_compile(case.fn)(*xs))
    gen = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(w.shape, generator=gen).to(w.dtype) for w in want]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _assert_close(g.detach(), w.detach(), case, dtype, f"output {i}")
    pairs = [(g, w, c) for g, w, c in zip(got, want, cotangents, strict=True) if w.requires_grad]
    assert pairs, f"{case.name}: no differentiable output"
    torch.autograd.backward([w for _, w, _ in pairs], [c for _, _, c in pairs])
    torch.autograd.backward([g for g, _, _ in pairs], [c for _, _, c in pairs])
    kinds = [g["kind"] for g in neuron_compile.backend.compiled_graphs()]
    assert "backward" in kinds, f"{case.name}: no backward graph was compiled by the neuron backend ({kinds})"
    for i, (x, xe) in enumerate(zip(xs, xs_eager, strict=True)):
        if not x.requires_grad:
            continue
        assert (x.grad is None) == (xe.grad is None), f"{case.name}: grad of input {i} missing on one side"
        if xe.grad is not None:
            _assert_close(x.grad, xe.grad, case, dtype, f"grad of input {i}")
