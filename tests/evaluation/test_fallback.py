"""Eager fallback: unsupported ops in the middle of a graph run eagerly, are recorded, and the default stays strict."""

from __future__ import annotations

import logging

import pytest
import torch

import neuron_compile
from neuron_compile.errors import ConfigError, UnsupportedOpError

# Why an eigendecomposition whose vectors are read is refused (the start of the reason the lowering gives).
ITERATIVE = "its eigenvectors are read by the forward (returned or computed with), and they are unique only up to sign"


def middle_eig(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An eigendecomposition whose vectors are read (refused: their signs are LAPACK's) between two compiled
    parts (``abs``: a sign flip from rounding differences upstream changes nothing)."""
    h = torch.exp(x @ w * 0.1)
    s = torch.linalg.eigh(h @ h.mT).eigenvectors[..., -1].abs()
    return torch.tanh(s * 0.01) * 2 + 1, h.sum(-1)


def test_unsupported_op_in_the_middle_gives_eager_numbers_and_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(5, 24), torch.randn(24, 40)
    f = torch.compile(middle_eig, backend="neuron", dynamic=False, options={"fallback": "eager"})
    with caplog.at_level(logging.INFO, logger="neuron_compile.fallback"):
        got_s, got_i = f(x, w)
    want_s, want_i = middle_eig(x, w)
    torch.testing.assert_close(got_s, want_s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_i, want_i, atol=1e-4, rtol=1e-5)
    ops = neuron_compile.get_fallback_ops()
    assert [o["op"] for o in ops] == ["aten._linalg_eigh.default"]
    assert ops[0]["count"] == 1 and ops[0]["calls"] == 1
    assert ops[0]["signatures"][0].startswith("float32[5, 5]")
    assert len(ops[0]["reasons"]) == 1 and ops[0]["reasons"][0].startswith(ITERATIVE)
    assert len(ops[0]["locations"]) == 1 and ops[0]["locations"][0].endswith("s = torch.linalg.eigh(h @ h.mT).eigenvectors[..., -1].abs()")
    assert "test_fallback.py" in ops[0]["locations"][0]
    lines = [r.getMessage() for r in caplog.records if "fell back to eager" in r.getMessage()]
    assert lines == ["neuron: inference graph: 1 op(s) fell back to eager (aten._linalg_eigh.default); 2 compiled "
                     "segment(s)"]
    m = neuron_compile.get_compile_metrics()
    assert len(m) == 1 and m[0]["fallback_ops"] == 1 and m[0]["segments"] == 3 and m[0]["kernels"] >= 2
    # Kernels really ran on both sides of the eager op.
    f(x, w)
    assert neuron_compile.get_fallback_ops()[0]["calls"] == 2
    neuron_compile.clear_fallback_ops()
    assert neuron_compile.get_fallback_ops() == []


def test_default_stays_strict() -> None:
    f = torch.compile(middle_eig, backend="neuron", dynamic=False)
    with pytest.raises(Exception) as info:
        f(torch.randn(3, 8), torch.randn(8, 16))
    err = info.value
    while err is not None and not isinstance(err, UnsupportedOpError):
        err = err.__cause__ or err.__context__
    assert isinstance(err, UnsupportedOpError)
    assert f"aten._linalg_eigh.default(float32[3, 3]): {ITERATIVE}" in str(err)
    assert neuron_compile.get_fallback_ops() == []


def test_env_knob_enables_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "eager")
    x = torch.randn(4, 6)
    f = torch.compile(lambda t: torch.linalg.eigh(t @ t.mT).eigenvectors.abs() + 1, backend="neuron", dynamic=False)
    torch.testing.assert_close(f(x), torch.linalg.eigh(x @ x.mT).eigenvectors.abs() + 1, atol=1e-4, rtol=1e-4)
    assert neuron_compile.get_fallback_ops()[0]["op"] == "aten._linalg_eigh.default"


def test_bad_fallback_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "cpu")
    from neuron_compile.config import config

    with pytest.raises(ConfigError, match="NEURON_COMPILE_FALLBACK=cpu: expected one of strict, eager"):
        _ = config.fallback


def test_training_with_fallback_forward_and_backward() -> None:
    """The joint-graph check honours the option: an eigendecomposition in a training graph runs eagerly both ways."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(12, 12)

    def loss_fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(lin(x))
        s = torch.linalg.eigh(h @ h.mT).eigenvectors[..., -1].abs()
        return (s * torch.arange(3.0)).sum()

    x = torch.randn(3, 12)
    f = torch.compile(loss_fn, backend="neuron", dynamic=False, options={"fallback": "eager"})
    loss = f(x)
    loss.backward()
    got = lin.weight.grad.clone()
    lin.weight.grad = None
    want_loss = loss_fn(x)
    want_loss.backward()
    torch.testing.assert_close(loss, want_loss, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(got, lin.weight.grad, atol=1e-4, rtol=1e-4)
    kinds = [m["kind"] for m in neuron_compile.get_compile_metrics()]
    assert kinds == ["forward", "backward"]
    assert any(o["op"] == "aten._linalg_eigh.default" for o in neuron_compile.get_fallback_ops())
