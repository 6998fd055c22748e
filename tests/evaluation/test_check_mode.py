"""Numeric check mode: outputs compared with eager; a deliberately broken lowering is caught and its kernel named."""

from __future__ import annotations

import logging

import pytest
import torch

import neuron_compile
from neuron_compile.check import compare, get_check_results


def model(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.relu(x) * 3  # a kernel of its own that stays right
    h = (x @ w).sum(-1, keepdim=True) * 0.1  # matmul + reduction, before the broken op
    y = torch.exp(a - h) + 1
    return a, y


def test_check_mode_passes_a_correct_graph() -> None:
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    f = torch.compile(model, backend="neuron", dynamic=False, options={"check": True})
    f(x, w)
    f(x, w)
    [res] = get_check_results()
    assert res["calls"] == 2 and res["mismatched_calls"] == 0 and res["first_divergence"] is None
    assert [o["ok"] for o in res["outputs"]] == [True, True]
    assert all(o["max_rel"] < 1e-4 for o in res["outputs"])
    assert neuron_compile.get_compile_metrics()[0]["check"]["calls"] == 2


def test_check_mode_catches_the_injected_broken_lowering(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NEURON_COMPILE_TEST_BREAK_OP", "aten.exp.default")
    # seeded and moderate, so that exp stays below ~100 and its own fp32 error far below the injected 1.0
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 16, generator=gen) * 0.5, torch.randn(16, 8, generator=gen) * 0.5
    f = torch.compile(model, backend="neuron", dynamic=False, options={"check": True})
    with caplog.at_level(logging.WARNING, logger="neuron_compile.check"):
        a, y = f(x, w)
    want_a, want_y = model(x, w)
    # The broken rule adds 1.0 to exp(): the compiled output is wrong, and the check says so.
    torch.testing.assert_close(y, want_y + 1.0, atol=1e-4, rtol=1e-4)
    [res] = get_check_results()
    assert res["mismatched_calls"] == 1
    ok = {o["index"]: o["ok"] for o in res["outputs"]}
    assert ok == {0: True, 1: False}
    assert res["outputs"][1]["max_abs"] == pytest.approx(1.0, abs=1e-3)
    div = res["first_divergence"]
    assert "aten.exp.default" in div["ops"]
    assert "exp" in div["kernel"] and div["kernel"].startswith("k")
    plan = neuron_compile.backend.compiled_graphs()[-1]["plan"]
    kernel_names = [k["name"] for k in plan.summary["kernels"]] if plan.kernels else []
    assert div["kernel"] in kernel_names
    # The kernels before it (relu*3, the matmul/reduction) were compared and agreed.
    assert kernel_names.index(div["kernel"]) > 0
    assert any("y = torch.exp(a - h) + 1" in line for line in div["source_lines"])
    assert div["max_abs"] == pytest.approx(1.0, abs=1e-3)
    warning = [r.getMessage() for r in caplog.records if "differs from eager" in r.getMessage()]
    assert len(warning) == 1 and div["kernel"] in warning[0] and "output 1: max abs 1" in warning[0]


def test_check_mode_through_a_fallback_graph_names_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_TEST_BREAK_OP", "aten.exp.default")

    def f(x: torch.Tensor) -> torch.Tensor:
        s = torch.linalg.eigh(x @ x.mT * 0.02).eigenvectors[..., -1]  # eigenvectors: refused, eager
        return torch.exp(s)

    x = torch.randn(3, 10)
    g = torch.compile(f, backend="neuron", dynamic=False, options={"check": True, "fallback": "eager"})
    g(x)
    [res] = get_check_results()
    assert res["mismatched_calls"] == 1
    assert res["first_divergence"]["ops"] == ["aten.exp.default"]


def test_check_is_off_by_default() -> None:
    f = torch.compile(model, backend="neuron", dynamic=False)
    f(torch.randn(4, 16), torch.randn(16, 8))
    assert get_check_results() == []
    assert neuron_compile.get_compile_metrics()[0]["check"] is None


def test_compare_is_dtype_aware() -> None:
    want = torch.tensor([1.0, 2.0, float("nan"), float("inf")])
    assert compare(want + 5e-5, want)["ok"]
    assert not compare(want + 5e-3, want)["ok"]
    bf = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    assert compare(bf * 1.01, bf)["ok"] and not compare(bf * 1.1, bf)["ok"]
    ints = torch.tensor([1, 2, 3])
    assert not compare(ints + torch.tensor([0, 0, 1]), ints)["ok"]
    res = compare(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0]))
    assert res["max_abs"] == pytest.approx(1.0) and res["max_rel"] == pytest.approx(0.5)
    assert not compare(torch.zeros(2, 3), torch.zeros(3, 2))["ok"]
