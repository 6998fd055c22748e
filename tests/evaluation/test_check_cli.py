"""``neuron-compile check SCRIPT.py [args] [--json]`` end to end: readiness report, failures, exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_compile import cli

ROOT = Path(__file__).resolve().parents[2]


def test_check_evaluate_example_json_end_to_end(tmp_path: Path) -> None:
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CI", None)
    proc = subprocess.run([sys.executable, "-m", "neuron_compile", "check", "examples/evaluate.py", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]  # not ready: the eigendecomposition fell back
    report = json.loads(proc.stdout)  # the script's own prints went to stderr
    assert "max |compiled - eager|" in proc.stderr and "OK" in proc.stderr
    assert report["ready"] is False and report["error"] is None
    assert report["verdict"].startswith("not ready: 1 op(s) fell back to eager (aten._linalg_eigh.default")
    assert len(report["graphs"]) == 3  # batch 4 and the buckets 8, 16 (4 reused)
    [eig] = report["ops_fallen_back"]
    assert eig["op"] == "aten._linalg_eigh.default" and eig["count"] == 3
    [location] = eig["locations"]
    assert location.endswith("examples/evaluate.py:37: leading = torch.linalg.eigh(scores @ scores.mT).eigenvectors[..., -1].abs()")
    assert report["ops_lowered"]["aten.mm.default"] == 9 and "aten._linalg_eigh.default" not in report["ops_lowered"]
    assert report["mismatches"] == [] and len(report["checks"]) == 3
    assert all(c["calls"] >= 1 and all(o["ok"] for o in c["outputs"]) for c in report["checks"])
    assert report["compile_ms"]["cold_graphs"] == 3 and report["compile_ms"]["cached_graphs"] == 0
    [rc] = report["recompiles"]
    assert rc["compiles"] == 3 and rc["changes"] == {"input 2 shape": [[4, 64], [8, 64], [16, 64]]}


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


READY = """
    import sys
    import torch
    f = torch.compile(lambda x: torch.tanh(x) * 2, backend="neuron", dynamic=False)
    print("script args", sys.argv[1:])
    f(torch.randn(3, 5))
"""


def test_ready_script_text_report_then_cached(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path, "ready.py", READY)
    assert cli.main(["check", str(script), "--flag", "v"]) == 0
    out, err = capsys.readouterr()
    assert "script args ['--flag', 'v']" in err and "script args" not in out
    assert "verdict: ready: every op lowered, numerics match eager" in out
    assert "ops fallen back to eager: 0 distinct, 0 nodes" in out
    assert "numeric check: 1 graph(s) checked, 0 mismatching" in out
    assert "g0_inference     ok" not in out and "aten.tanh" not in out  # concise: only what needs attention
    assert "compile time: cold" in out and "(1 graph(s)), cached 0 ms (0 graph(s))" in out
    assert "recompiles: none" in out
    assert cli.main(["check", "-v", str(script)]) == 0
    out = capsys.readouterr().out
    assert "g0_inference     ok (0/1 calls differ)" in out and "tanh.default x1" in out
    assert cli.main(["check", "--json", str(script)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compile_ms"]["cached_graphs"] == 1 and report["compile_ms"]["cold_graphs"] == 0
    assert report["ops_lowered"] == {"aten.mul.Tensor": 1, "aten.tanh.default": 1}


def test_script_that_raises_still_gets_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path, "boom.py", """
        import torch
        f = torch.compile(lambda x: x.exp(), backend="neuron", dynamic=False)
        f(torch.randn(2, 2))
        raise RuntimeError("model exploded")
    """)
    assert cli.main(["check", str(script)]) == 1
    out = capsys.readouterr().out
    assert "verdict: the script failed: RuntimeError: model exploded" in out
    assert f"at {script}:5: raise RuntimeError(\"model exploded\")" in out
    assert "graphs: 1" in out and "g0_inference" in out


def test_script_with_no_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path, "eager.py", "import torch\nprint(torch.ones(2).sum())\n")
    assert cli.main(["check", "--json", str(script)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["graphs"] == [] and report["ready"] is False
    assert report["verdict"].startswith("no graph was compiled with backend='neuron'")


def test_missing_script_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", str(tmp_path / "nope.py")]) == 2
    assert "nope.py: no such file" in capsys.readouterr().err


def test_plain_torch_compile_uses_neuron_and_explicit_backends_are_reported(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path, "plain.py", """
        import torch
        f = torch.compile(lambda x: x * 2 + 1)
        f(torch.randn(3, 4)); f(torch.randn(5, 4)); f(torch.randn(7, 4)); f(torch.randn(7, 4).bfloat16())
        g = torch.compile(lambda x: x - 1, backend="eager")
        g(torch.randn(2))
    """)
    assert cli.main(["check", "--json", str(script)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["graphs"]) == 4 and report["ready"] is True
    assert report["other_backends"] == [{"backend": "eager", "location": f"{script}:5"}]
    [rc] = report["recompiles"]
    assert rc["compiles"] == 4
    assert rc["changes"] == {"input 0 shape": [[3, 4], [5, 4], [7, 4], [7, 4]],
                             "input 0 dtype": ["float32", "float32", "float32", "bfloat16"]}
    assert torch_default_backend() == "inductor"  # restored after the run


def torch_default_backend() -> str:
    import torch

    return str(torch.compiler.get_default_backend())


def test_backend_failure_is_reported_as_ours_with_its_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import neuron_compile.lowering.graph as graph

    def broken(self: object) -> None:
        raise KeyError("internal bookkeeping")

    monkeypatch.setattr(graph.GraphLowering, "run", broken)  # a bug inside the backend
    script = _write(tmp_path, "internal.py", """
        import torch



        f = torch.compile(lambda x: x.exp(), backend="neuron", dynamic=False)
        f(torch.randn(2, 2))
    """)
    assert cli.main(["check", str(script)]) == 1
    out = capsys.readouterr().out
    assert "verdict: neuron-compile failed (a backend error, not your code): KeyError" in out
    assert "backend error: KeyError: 'internal bookkeeping'" in out
    assert "neuron_compile/backend.py" in out  # our frames are listed
    assert f"(while running the script at {script}:7: f(torch.randn(2, 2)))" in out
    assert "script error:" not in out
