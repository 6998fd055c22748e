"""The examples run as real programs (fresh processes, a private artifact cache) and match eager.

The example processes start together (module fixture) so their simulator time overlaps; quickstart and
default_backend share one cache (two processes writing it at once), which the cache CLI test then inspects.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = ("train.py", "per_region.py", "default_backend.py", "quickstart.py")


@pytest.fixture(scope="module")
def cache_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    dirs = {name: tmp_path_factory.mktemp(f"cache_{name[:-3]}") for name in EXAMPLES if name != "quickstart.py"}
    dirs["quickstart.py"] = dirs["default_backend.py"]
    return dirs


@pytest.fixture(scope="module")
def runs(cache_dirs: dict[str, Path]) -> dict[str, subprocess.CompletedProcess]:
    procs = {}
    for name in EXAMPLES:
        env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(cache_dirs[name]))
        procs[name] = subprocess.Popen([sys.executable, str(REPO / "examples" / name)], cwd=REPO, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def _ok(run: subprocess.CompletedProcess) -> list[str]:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    lines = run.stdout.splitlines()
    assert lines[-1] == "MATCH"
    return lines


def test_train_losses_match_eager_and_fall(runs):
    lines = _ok(runs["train.py"])
    assert lines[0].startswith("model: GPT 2 layers, d_model=64, heads=2, vocab=128")
    assert any(re.fullmatch(r"forward graph: \d+ NKI kernels", ln) for ln in lines)
    assert any(re.fullmatch(r"backward graph: \d+ NKI kernels", ln) for ln in lines)
    rows = [ln.split() for ln in lines if re.match(r"\s*\d+\s+\d+\.\d+\s+\d+\.\d+\s", ln)]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    eager = [float(r[1]) for r in rows]
    neuron = [float(r[2]) for r in rows]
    for e, n in zip(eager, neuron, strict=True):  # re-checked here, not only trusted from the exit status
        assert abs(n - e) <= 1e-4 * abs(e)
    assert eager[-1] < 0.6 * eager[0]  # the optimizer really stepped (memorizing one batch)


def test_per_region_each_way_matches_eager(runs):
    lines = _ok(runs["per_region.py"])
    out = "\n".join(lines)
    assert "model.block = torch.compile(model.block) forward: 1 compiled graph(s)" in out
    assert "model.block = torch.compile(model.block) backward: 1 compiled graph(s)" in out
    assert "model.block.compile(backend='neuron'): 1 compiled graph(s)" in out
    assert "@torch.compile function with a graph break: 2 compiled graph(s)" in out
    results = [ln for ln in lines if "max abs" in ln]
    assert len(results) == 4 and all(ln.endswith(": ok") for ln in results)
    # The graph break's print ran eagerly, between the two compiled graphs, before the result line.
    assert out.index("(graph break:") < out.index("@torch.compile function with a graph break")


def test_default_backend_compiles_with_neuron(runs):
    lines = _ok(runs["default_backend.py"])
    assert lines[0] == "torch.compiler.set_default_backend('neuron')"
    assert "batch 4: max abs error vs eager" in lines[1] and lines[1].endswith(": ok")
    assert "batch 7: max abs error vs eager" in lines[2] and lines[2].endswith(": ok")
    assert "graphs compiled by backend 'neuron': 2 (inference, inference)" in lines


def test_quickstart_matches_eager(runs):
    lines = _ok(runs["quickstart.py"])
    assert lines[0].startswith("model: GPT 2 layers, d_model=128, heads=4, vocab=512")
    assert re.fullmatch(r"graph 0 \(inference\): \d+ NKI kernels: k0_\w+.*", lines[1])
    error = float(lines[2].removeprefix("max abs error vs eager: "))
    assert error < 1e-4


def test_cache_cli_on_a_cache_made_by_the_examples(runs, cache_dirs):
    """The cache CLI on the cache quickstart and default_backend filled at the same time."""
    _ok(runs["quickstart.py"])
    _ok(runs["default_backend.py"])
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(cache_dirs["quickstart.py"]))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "neuron_compile", "cache", *args], capture_output=True,
                              text=True, timeout=120, cwd=REPO, env=env)

    listed = json.loads(cli("list", "--json").stdout)
    entries = listed["entries"] if isinstance(listed, dict) else listed
    kernels = [e for e in entries if e["kernels"]]  # ATen graphs (whole-graph warm-start entries have none)
    assert len(kernels) == 3  # quickstart's graph and default_backend's two batch sizes
    assert cli("verify").returncode == 0
    shown = cli("show", kernels[0]["key"][:12], "--source")
    assert shown.returncode == 0 and "@nki.jit" in shown.stdout
    stats = json.loads(cli("stats", "--json").stdout)
    assert stats["misses"] >= 3


def test_train_exits_1_on_mismatch(runs, cache_dirs):
    """A tolerance no result can meet: the example must report MISMATCH and exit 1 (one step; cache reused)."""
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(cache_dirs["train.py"]))
    run = subprocess.run([sys.executable, str(REPO / "examples" / "train.py"), "--steps", "1", "--rtol", "-1"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "MISMATCH (rtol=-1.0)"


def test_distributed_fsdp2_example_under_torchrun(tmp_path):
    """examples/distributed.py as the README runs it: torchrun --nproc_per_node=2 (gloo), FSDP2 + compile."""
    sys.path.insert(0, str(REPO / "tests" / "distributed"))
    from launcher import torchrun

    job = torchrun(REPO / "examples" / "distributed.py", [], tmp_path, timeout=240.0, out_arg=False,
                   env={"NEURON_COMPILE_CACHE_DIR": str(tmp_path / "cache")})
    assert job.returncode == 0, job.tail()
    lines = [ln for ln in job.stdout.splitlines() if not ln.startswith("[")]
    assert lines[-1] == "MATCH", job.tail()
    rows = [ln.split() for ln in lines if re.fullmatch(r"\s*\d+\s+\d+\.\d+\s+\d+\.\d+", ln)]
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    for _, e, n in rows:
        assert abs(float(n) - float(e)) <= 2e-3 * abs(float(e))  # bf16 parameters: rounding, not drift
    assert float(rows[-1][1]) < float(rows[0][1])
    assert any(re.match(r"graphs compiled on rank 0: 1 forward, 1 backward \(forward at models\.py:\d+\)", ln)
               for ln in lines), lines
