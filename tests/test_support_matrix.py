"""`neuron-compile ops`: the support matrix generated from the lowering registry (CLI, JSON, Markdown)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from neuron_compile.lowering.registry import rules

from neuron_compile import support_matrix as sm
from neuron_compile.cli import main
from neuron_compile.errors import UnsupportedOpError

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ops.md"
ALL = [sm.dtype_name(d) for d in sm.DTYPES]


@pytest.fixture(scope="module")
def data() -> dict:
    return sm.to_json(sm.matrix())


def _by_op(data: dict) -> dict[str, dict]:
    return {row["op"]: row for row in data["ops"]}


def test_json_schema_covers_exactly_the_registry(data, capsys):
    assert main(["ops", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == data
    assert set(data) == {"schema", "dtypes", "families", "ops"}
    assert data["schema"] == 1 and data["dtypes"] == ALL
    registry = {r.name: r for r in rules().values() if r.op.namespace in ("aten", "prims")}  # user-facing ops
    assert [row["op"] for row in data["ops"]] == sorted(registry, key=lambda n: (registry[n].family, n))
    assert data["families"] == sorted({r.family for r in registry.values()})
    for row in data["ops"]:
        assert set(row) == {"op", "family", "kind", "dtypes", "doc"}
        rule = registry[row["op"]]
        assert (row["family"], row["kind"], row["doc"]) == (rule.family, rule.kind, rule.doc)
        # Every rule must probe as supported for some dtype: a new rule without a usable sample fails here.
        assert row["dtypes"], f"{row['op']}: no dtype probed as supported (add a sample to support_matrix._OVERRIDES)"
        assert row["dtypes"] == [d for d in ALL if d in row["dtypes"]]


def test_dtype_limits_come_from_the_rules_checks(data):
    ops = _by_op(data)
    # matmul check: TensorE takes fp32/bf16/fp16 (float64 runs as float32, as everywhere).
    # integer matmuls come from decomp_intmm (fp32 matmuls of 8-bit limbs), which the probe follows
    mm_dtypes = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8"]
    assert ops["aten.mm.default"]["dtypes"] == mm_dtypes
    assert ops["aten.bmm.default"]["dtypes"] == mm_dtypes
    # bitwise ops lower on integers and bools, not floats; activations only on floats; views on everything.
    assert ops["aten.bitwise_and.Tensor"]["dtypes"] == [d for d in ALL if not d.startswith(("float", "bfloat"))]
    assert ops["aten.gelu.default"]["dtypes"] == ["float32", "bfloat16", "float16", "float64"]
    assert ops["aten.permute.default"]["dtypes"] == ALL
    # torch itself rejects neg on bool: not listed, although the rule has no check.
    assert "bool" not in ops["aten.neg.default"]["dtypes"] and "int64" in ops["aten.neg.default"]["dtypes"]


def test_probe_agrees_with_the_compiler():
    assert sm.probe(torch.ops.aten.mm.default, torch.int64) is True  # limb matmuls in fp32 (decomp_intmm)
    assert sm.probe(torch.ops.aten.mm.default, torch.float32) is True
    assert sm.probe(torch.ops.aten.frac.default, torch.int64) is None  # eager's CPU kernel is float-only
    assert sm.probe(torch.ops.aten.prod.default, torch.int64) is True  # a tree of int multiplications (decomp_intprod)
    assert sm.probe(torch.ops.aten.index_put.default, torch.int64) is True  # a scatter-add (decomp_index)
    assert sm.probe(torch.ops.aten.view.dtype, torch.int64) is False
    f = torch.compile(lambda a: a.view(torch.int32) + 1, backend="neuron", dynamic=False)
    with pytest.raises(Exception) as info:
        f(torch.ones(4, 8, dtype=torch.int64))
    exc: BaseException | None = info.value
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None and "aten.view.dtype(int64[4, 8]" in str(exc) and "torch.int64" in str(exc)
    g = torch.compile(lambda a, b: a @ b, backend="neuron", dynamic=False)
    a, b = torch.arange(32).reshape(4, 8), torch.arange(40).reshape(8, 5)
    assert torch.equal(g(a, b), a @ b)


def test_text_output_grouped_by_family(capsys):
    assert main(["ops", "--family", "matmul", "--family", "scan"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "matmul (2)"
    mm_dtypes = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8"]
    assert out[1].split() == ["aten.bmm.default", *mm_dtypes]
    assert out[2].split() == ["aten.mm.default", *mm_dtypes]
    assert out[3] == "scan (5)" and [ln.split()[0] for ln in out[4:9]] == [
        "aten.cummax.default", "aten.cummin.default", "aten.cumprod.default", "aten.cumsum.default",
        "aten.logcumsumexp.default"]
    assert out[-1].startswith("7 ATen overloads")


def test_committed_markdown_is_the_generated_one():
    text = sm.render_markdown(sm.matrix())
    assert DOC.read_text(encoding="utf-8") == text, "docs/ops.md is stale: run `neuron-compile ops --markdown docs/ops.md`"
    assert "do not edit by hand" in text and "| `aten.mm.default` | matmul | ✓ | ✓ | ✓ | ✓ | ✓ |" in text
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "## Supported ops" in readme and "(docs/ops.md)" in readme


def test_markdown_write_and_check_exit_codes(tmp_path, capsys):
    path = tmp_path / "sub" / "ops.md"
    assert main(["ops", "--markdown", str(path), "--check"]) == 1  # missing: stale
    assert "out of date" in capsys.readouterr().err
    assert main(["ops", "--markdown", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == DOC.read_text(encoding="utf-8")
    assert main(["ops", "--markdown", str(path), "--check"]) == 0
    path.write_text(path.read_text(encoding="utf-8").replace("✓", "x", 1), encoding="utf-8")
    assert main(["ops", "--markdown", str(path), "--check"]) == 1


def test_usage_errors_exit_2(capsys):
    assert main(["ops", "--check"]) == 2
    assert "--check needs --markdown" in capsys.readouterr().err
    assert main(["ops", "--family", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown family nosuch" in err and "matmul" in err
    assert main(["ops", "--json", "--markdown", "x.md"]) == 2  # mutually exclusive
    assert main(["ops", "--no-such-flag"]) == 2


def test_console_command_in_a_fresh_process():
    proc = subprocess.run([sys.executable, "-m", "neuron_compile", "ops", "--json"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "aten.add.Tensor" in _by_op(json.loads(proc.stdout))
