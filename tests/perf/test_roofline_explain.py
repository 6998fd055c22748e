"""Roofline arithmetic and the explain report / CLI on small graphs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import neuron_compile
from neuron_compile import backend, cli
from neuron_compile.config import config
from neuron_compile.costmodel import hardware
from neuron_compile.instruction_stream import kernel_stream
from neuron_compile.roofline import graph_min_bytes, kernel_roofline

log = logging.getLogger(__name__)


def test_matmul_roofline_is_pe_bound() -> None:
    a, b = torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(512, 1024, dtype=torch.bfloat16)
    rep = neuron_compile.explain(lambda a, b: a @ b, a, b)
    (g,) = rep.graphs
    (k,) = g.kernels
    assert k.roofline.pe_flops == 2 * 256 * 512 * 1024
    assert k.roofline.min_bytes == 2 * (256 * 512 + 512 * 1024 + 256 * 1024)  # bf16 in, bf16 out
    hw = hardware("trn2")
    flops = 2 * 256 * 512 * 1024
    # the roofline takes the higher documented peak (chip 667 TFLOPS / 8 cores), and reports the clock figure too;
    # the kernel's launch grid (LNC=2 on trn2: both cores of the logical core) multiplies both
    cores = k.roofline.cores
    assert cores == 2
    assert k.roofline.component_ns()["pe"] == pytest.approx(flops / hw.pe_roofline_per_s("bfloat16") / cores * 1e9)
    assert hw.pe_roofline_per_s("bfloat16") == pytest.approx(667e12 / 8)
    assert k.roofline.pe_ns_at_clock_peak() == pytest.approx(flops / hw.pe_flops_per_s("bfloat16") / cores * 1e9)
    assert k.efficiency == pytest.approx(k.roofline.time_ns / k.estimate.time_ns)
    assert 0 < k.efficiency <= 1


def test_explain_report_per_graph_and_kernel() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                            torch.nn.LayerNorm(64))
    x = torch.randn(32, 64)
    with config.patch(fuse_matmul_norm=False):  # the LayerNorm keeps its own kernel (and a reason to explain)
        rep = neuron_compile.explain(m, x)
    (g,) = rep.graphs
    assert [k.family for k in g.kernels] == ["matmul", "matmul", "reduction"]
    first, _, ln = g.kernels
    assert "aten.gelu.default" in first.source_ops and first.template == "matmul.nki.j2"
    assert first.reason == "a matmul starts its own kernel"
    assert "reduction" in ln.reason and "matmul" in ln.reason
    assert first.tiles["space"] == [32, 256] and first.tiles["k"] == 64
    assert all(k.traced for k in g.kernels)
    plan = backend.compiled_graphs()[-1]["plan"]
    for k, ir in zip(g.kernels, plan.kernels, strict=True):  # the trace and the analytic stream agree
        from neuron_compile.costmodel import estimate

        assert k.estimate.time_ns == pytest.approx(estimate(kernel_stream(ir)).time_ns)
        assert k.roofline.flops == kernel_roofline(ir).flops
    assert g.roofline.min_bytes == graph_min_bytes(plan)
    assert g.estimate.time_ns == pytest.approx(sum(k.estimate.time_ns for k in g.kernels))
    text = str(rep)
    assert "k0_mm_add_gelu" in text and "new kernel because: a matmul starts its own kernel" in text
    data = rep.to_json()
    kj = data["graphs"][0]["kernels"][0]
    assert {"ops", "template", "tiles", "flops", "hbm_bytes", "min_hbm_bytes", "estimated_ns", "roofline_ns",
            "efficiency", "reason"} <= set(kj)
    assert kj["hbm_bytes"] >= kj["min_hbm_bytes"] > 0


def test_graph_min_bytes_counts_graph_io_only() -> None:
    x = torch.randn(128, 256)
    rep = neuron_compile.explain(lambda x: torch.softmax(x * 2, -1).exp(), x)
    assert rep.graphs[0].roofline.min_bytes == 2 * 128 * 256 * 4


def test_cli_explain_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys, torch\n"
                      "f = torch.compile(lambda x: x.relu() + 1, backend='neuron', dynamic=False)\n"
                      "print('the script prints too')\n"
                      "f(torch.randn(8, int(sys.argv[1])))\n"
                      "sys.exit(0)\n")
    assert cli.main(["explain", str(script), "40", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # the script's own print went to stderr
    assert "the script prints too" in captured.err
    (g,) = data["graphs"]
    assert g["kernels"][0]["tiles"]["space"] in ([8, 40], [1, 320])  # the lowering may flatten a dense space
    assert g["kernels"][0]["ops"] == ["aten.relu.default", "aten.add.Tensor"]


def test_explain_is_callable_after_submodule_import() -> None:
    import neuron_compile.explain as mod

    assert callable(neuron_compile.explain) and isinstance(mod.explain(lambda x: x + 1, torch.randn(4, 4)),
                                                               mod.Report)


def test_cli_explain_without_graphs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "none.py"
    script.write_text("print('hi')\n")
    assert cli.main(["explain", str(script)]) == 1
    assert "compiled no graph with backend='neuron'" in capsys.readouterr().err
