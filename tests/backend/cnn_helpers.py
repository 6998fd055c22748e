"""Shared helpers of the CNN op tests (test_conv.py, test_pool.py, test_cnn_models.py): compile forward and
backward against eager, tolerance per dtype, the NKI API checker and the refusal in an exception chain."""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from neuron_compile import backend as B
from neuron_compile.errors import UnsupportedOpError

log = logging.getLogger(__name__)

TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2)}


def api_checker() -> types.ModuleType:
    if "nki_api_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("nki_api_check",
                                                      Path(__file__).resolve().parents[1] / "nki_api_check.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["nki_api_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["nki_api_check"]


def close(got: torch.Tensor, want: torch.Tensor, what: str, dtype: torch.dtype = torch.float32) -> None:
    assert got.shape == want.shape, what
    assert got.dtype == want.dtype, what
    rtol, atol = TOL[dtype]
    scale = max(1.0, want.float().abs().max().item())
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol * scale, msg=lambda m: f"{what}: {m}")


def check_grads(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor, dtype: torch.dtype = torch.float32,
                autocast: bool = False) -> list[Any]:
    """Compiled forward and backward of ``fn`` vs eager; returns the kernels of the compiled graphs."""
    got_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    want_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        got = compiled(*got_in)
        want = fn(*want_in)
    close(got, want, "forward", dtype)
    grad = torch.randn_like(want)
    got.backward(grad)
    want.backward(grad)
    for i, (a, b) in enumerate(zip(got_in, want_in, strict=True)):
        if b.grad is not None:
            close(a.grad, b.grad, f"grad of input {i}", dtype)
    return [k for g in B.compiled_graphs() for k in g["plan"].kernels]


def unsupported(exc: BaseException | None) -> UnsupportedOpError:
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None, "no UnsupportedOpError in the exception chain"
    return exc


def families(kernels: list[Any]) -> list[str]:
    return [k.family for k in kernels]
