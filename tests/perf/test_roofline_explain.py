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


def test_cli_explain_trace_is_chrome_trace_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``explain --trace out.json``: Chrome trace-event JSON, one process per kernel call, one track per engine and
    DMA queue (per core of an LNC=2 launch), every instruction named with its kernel source line."""
    script = tmp_path / "s.py"
    script.write_text("import torch\n"
                      "f = torch.compile(lambda a, b: torch.softmax(a @ b, -1).cumsum(-1), backend='neuron', "
                      "dynamic=False)\n"
                      "f(torch.randn(256, 128), torch.randn(128, 640))\n")
    out = tmp_path / "trace.json"
    assert cli.main(["explain", str(script), "--trace", str(out)]) == 0
    assert "wrote the scheduled timeline" in capsys.readouterr().err
    data = json.loads(out.read_text())
    events = data["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    assert len(procs) == 2 and all("graph 0" in n for n in procs.values()), procs  # matmul+softmax, cumsum
    names = set(tracks.values())
    assert {"core0 tensor", "core1 tensor", "core0 dma_q0", "core1 dma_q0"} <= names, names  # both cores (LNC=2)
    assert any(n.endswith(("vector", "scalar")) for n in names)
    for e in spans:
        assert (e["pid"], e["tid"]) in tracks and e["dur"] >= 0 and e["ts"] >= 0
        instr, line = e["name"].rsplit(" L", 1)
        assert int(line) == e["args"]["line"] > 0 and instr.replace("_", "").isalpha()
        assert e["args"]["source"].startswith("nisa.")  # the kernel's own line
    matmuls = [e for e in spans if e["name"].startswith("nc_matmul")]
    assert matmuls and all(tracks[(e["pid"], e["tid"])].endswith("tensor") for e in matmuls)
    # the second kernel starts after the first (calls run one after the other)
    first = {e["ts"] for e in spans if e["pid"] == min(procs)}
    second = {e["ts"] for e in spans if e["pid"] == max(procs)}
    assert min(second) >= min(first)


def test_roofline_sums_each_kernel_at_its_own_dtype() -> None:
    """A tiny fp32 matmul before a bf16 GEMM must not price the GEMM's FLOPs at the fp32 peak."""
    from neuron_compile.roofline import Roofline

    small = Roofline(2 * 64 ** 3, "float32", 0, "float32", 0, "trn2", (("float32", 2 * 64 ** 3),))
    big = Roofline(2 * 4096 ** 3, "bfloat16", 0, "float32", 0, "trn2", (("bfloat16", 2 * 4096 ** 3),))
    both = small + big
    assert both.component_ns()["pe"] == pytest.approx(small.component_ns()["pe"] + big.component_ns()["pe"])
    assert both.time_ns < 1.01 * big.time_ns and both.pe_dtype == "mixed"
    hw3 = hardware("trn3")
    assert hw3.pe_flops_per_s("mxfp8") == pytest.approx(4 * hw3.pe_flops_per_s("bfloat16"))
    assert hw3.pe_roofline_per_s("mxfp8") / 1e12 == pytest.approx(2517 / 8, rel=1e-3)
    assert hardware("trn2").pe_roofline_per_s("bfloat16") >= 667e12 / 8 * (1 - 1e-9)
