"""Compile metrics, debug dumps (NEURON_COMPILE_DEBUG_DIR) and the progress bar's on/off rules."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import torch

import neuron_compile
from neuron_compile.config import config
from neuron_compile.progress import Progress


def small(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ w, dim=-1) @ w.t()  # two kernels: matmul + softmax epilogue, then a matmul


def test_metrics_per_graph_with_cache_miss_then_hit() -> None:
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    torch.compile(small, backend="neuron", dynamic=False, options={"fallback": "eager"})(x, w)
    torch._dynamo.reset()
    torch.compile(small, backend="neuron", dynamic=False, options={"fallback": "eager"})(x, w)
    cold, warm = neuron_compile.get_compile_metrics()
    assert cold["name"] == "g0_inference" and warm["name"] == "g1_inference"
    assert cold["cache"] == "miss" and warm["cache"] == "hit"
    assert cold["nodes"] >= 5 and cold["kernels"] >= 2 and warm["kernels"] == cold["kernels"]
    assert cold["fallback_ops"] == 0 and cold["input_shapes"] == [[4, 16], [16, 8]]
    assert set(cold["times_ms"]) == {"trace_aot", "lowering", "codegen", "cache_lookup", "load"}
    assert cold["times_ms"]["lowering"] > 0 and cold["times_ms"]["codegen"] > 0
    assert warm["times_ms"]["lowering"] == 0 and warm["times_ms"]["codegen"] == 0  # nothing lowered on a hit
    assert cold["times_ms"]["trace_aot"] > 0 and cold["times_ms"]["load"] > 0
    assert cold["total_ms"] >= sum(cold["times_ms"].values()) * 0.99
    assert cold["location"].endswith("test_metrics_debug.py:19")
    assert cold["est_device_us"] > 0 and warm["est_device_us"] == pytest.approx(cold["est_device_us"])


def test_metrics_of_a_whole_graph_cache_hit() -> None:
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    # The AOTAutograd warm path: with warm frames the second compile would load the Dynamo package
    # instead and never call the backend.
    with torch.no_grad(), config.patch(warm_frames=False):
        torch.compile(small, backend="neuron", dynamic=False)(x, w)
        torch._dynamo.reset()
        out = torch.compile(small, backend="neuron", dynamic=False)(x, w)
    torch.testing.assert_close(out, small(x, w), atol=1e-5, rtol=1e-4)
    cold, warm = neuron_compile.get_compile_metrics()
    assert not cold["whole_graph"] and cold["cache"] == "miss"
    assert warm["whole_graph"] and warm["cache"] == "hit" and warm["kernels"] == cold["kernels"]
    assert warm["times_ms"]["load"] > 0 and warm["times_ms"]["lowering"] == 0


def test_debug_dump_contents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_DEBUG_DIR", str(tmp_path / "dump"))
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    out = torch.compile(small, backend="neuron", dynamic=False)(x, w)
    torch.testing.assert_close(out, small(x, w), atol=1e-5, rtol=1e-4)
    [rec] = neuron_compile.get_compile_metrics()
    folder = tmp_path / "dump" / f"rank0_pid{os.getpid()}" / "g0_inference"
    assert Path(rec["debug_dir"]) == folder
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    kernels = sorted(n for n in names if n.startswith("kernels/"))
    assert {"dynamo_graph.py", "aten_graph.py", "kernel_ir.txt", "kernel_ir.json", "runner_plan.json",
            "metrics.json"} <= names
    assert len(kernels) == rec["kernels"] >= 2
    assert "torch.softmax" in (folder / "dynamo_graph.py").read_text() or "softmax" in \
        (folder / "dynamo_graph.py").read_text()
    aten = (folder / "aten_graph.py").read_text()
    assert "torch.ops.aten.mm.default" in aten
    ir = (folder / "kernel_ir.txt").read_text()
    for k in kernels:
        name = Path(k).stem
        assert f"kernel {name} " in ir
        assert f"def {name}(" in (folder / k).read_text()
    ir_json = json.loads((folder / "kernel_ir.json").read_text())
    assert [k["name"] for k in ir_json["kernels"]] == [Path(k).stem for k in kernels] or \
        sorted(k["name"] for k in ir_json["kernels"]) == [Path(k).stem for k in kernels]
    runner = json.loads((folder / "runner_plan.json").read_text())
    assert sorted(runner["kernel_names"]) == [Path(k).stem for k in kernels]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["name"] == "g0_inference" and metrics["kernels"] == rec["kernels"]


def test_debug_dump_of_a_fallback_graph_has_segments(tmp_path: Path) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        e = x.exp()
        return torch.linalg.eigh(e @ e.mT).eigenvectors.tanh()

    with config.patch(debug_dir=str(tmp_path)):
        torch.compile(f, backend="neuron", dynamic=False, options={"fallback": "eager"})(torch.randn(2, 5))
    folder = Path(neuron_compile.get_compile_metrics()[0]["debug_dir"])
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["segment0", "segment1"]
    assert (folder / "segment0" / "aten_graph.py").read_text().count("aten.exp.default") == 1
    assert json.loads((folder / "metrics.json").read_text())["fallback"][0]["op"] == "aten._linalg_eigh.default"


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    assert Progress.wanted(100) and not Progress.wanted(3)  # few kernels: quiet
    bar = Progress(100, "neuron-compile: rendering kernels")
    for i in range(100):
        bar.tick(f"k{i}")
    bar.close()
    assert "100/100" in tty.getvalue() and "#" * 30 in tty.getvalue()
    monkeypatch.setenv("CI", "true")
    assert not Progress.wanted(100)
    monkeypatch.delenv("CI")
    with config.patch(progress="never"):
        assert not Progress.wanted(100)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    assert not Progress.wanted(100)
    with config.patch(progress="always"):
        assert Progress.wanted(1)
