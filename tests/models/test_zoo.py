"""The model zoo compiled strict, forward and backward, compared with eager (fp32 and bf16 autocast).

Each model is small and randomly initialised (no downloads). Inference compares the main output;
training takes one backward pass of a weighted sum of that output (dropout off; training with dropout, which
draws eager's masks, is tests/backend/test_random.py's) and compares every parameter gradient, relative to its
largest magnitude.
A model that still can't be lowered is an explicit xfail listing its ops (``Entry.xfail``).
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import neuron_compile.backend
from neuron_compile.config import config

sys.path.insert(0, str(Path(__file__).parent))
from zoo import ZOO, Entry, first_tensor, loss_of  # noqa: E402

pytestmark = pytest.mark.slow

# (fp32, bf16): max |error| of the output relative to its largest magnitude, and of each gradient
TOL = {"float32": 2e-5, "bfloat16": 5e-2}


def _params(entry: Entry, mode: str, dtype: str) -> object:
    missing = [p for p in entry.needs if importlib.util.find_spec(p) is None]
    marks = []
    if missing:
        marks.append(pytest.mark.skip(reason=f"needs {', '.join(missing)} (pip install '.[test]')"))
    reason = entry.xfail.get(mode) or entry.xfail.get(f"{mode}-{dtype}")
    if reason:
        marks.append(pytest.mark.xfail(reason=reason, strict=True))
    return pytest.param(entry, mode, dtype, id=f"{entry.name}-{mode}-{dtype}", marks=marks)


CASES = [_params(e, mode, dt) for e in ZOO for mode in ("inference", "training") for dt in ("float32", "bfloat16")]


def _no_dropout(model: torch.nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-6))


def _seeded(fn: Any) -> Any:
    """``fn`` called right after ``torch.manual_seed``: models that draw noise (``randn_like``) see the same
    numbers in eager and compiled runs (the backend draws with torch's own generator)."""
    torch.manual_seed(1234)
    return fn


@pytest.fixture(autouse=True)
def _python_path_reference() -> Any:
    """Eager references take the Python path of nn.MultiheadAttention / TransformerEncoderLayer, the one Dynamo
    traces: the fused native fast path is eager-only and differs from it (under autocast it even returns bf16
    where the Python path, and every torch.compile backend, returns fp32)."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


@pytest.mark.parametrize("entry, mode, dtype", CASES)
def test_zoo_model_matches_eager(entry: Entry, mode: str, dtype: str) -> None:
    torch._dynamo.reset()
    neuron_compile.backend.reset()
    model, inputs = entry.build()
    _no_dropout(model)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    tol = TOL[dtype]
    with warnings.catch_warnings(), config.patch(cache=False, fallback="strict"):
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="neuron", dynamic=False)
        if mode == "inference":
            with torch.no_grad(), autocast:
                ref = first_tensor(_seeded(model)(**inputs))
                out = first_tensor(_seeded(compiled)(**inputs))
            assert out.shape == ref.shape and out.dtype == ref.dtype
            assert _rel(out, ref) < tol, f"{entry.name}: output differs from eager by {_rel(out, ref):.3g}"
            return
        model.train()
        _no_dropout(model)
        with autocast:
            loss_of(_seeded(model)(**inputs)).backward()
        ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        with autocast:
            loss_of(_seeded(compiled)(**inputs)).backward()
    assert ref_grads, "the model has no trainable parameter that received a gradient"
    # Each gradient is compared relative to the largest gradient of the model: a parameter whose gradient
    # is a sum that nearly cancels (a bias behind a weighted sum) has no meaningful relative error.
    scale = max(float(g.abs().max()) for g in ref_grads.values()) + 1e-12
    grads = dict(model.named_parameters())
    errs = {n: float((grads[n].grad.float() - g.float()).abs().max()) / scale for n, g in ref_grads.items()}
    worst = max(errs, key=errs.__getitem__)
    assert errs[worst] < tol, f"{entry.name}: gradient of {worst} differs from eager by {errs[worst]:.3g} (of the largest)"
    assert neuron_compile.backend.compiled_graphs(), "nothing was compiled by the neuron backend"
