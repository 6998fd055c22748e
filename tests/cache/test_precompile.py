"""``neuron-compile precompile``: capture a real training script's graphs, compile them in parallel, then
a real run that is all cache hits (no AOTAutograd tracing); under torchrun two ranks split the work."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cache_helpers import REPO

SCRIPT = r'''
import json, sys, torch
import neuron_compile.backend as B
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
ref = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
ref.load_state_dict(model.state_dict())
x, y = torch.randn(8, 12), torch.randn(8, 4)
compiled = torch.compile(model, backend="neuron", dynamic=False)
opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
losses = []
for step in range(5):
    for opt in opts:
        opt.zero_grad()
    loss = torch.nn.functional.mse_loss(compiled(x), y)
    loss.backward()
    expect = torch.nn.functional.mse_loss(ref(x), y)
    expect.backward()
    for opt in opts:
        opt.step()
    losses.append([float(loss), float(expect)])
    with torch.no_grad():  # an evaluation per step: a third (inference) graph
        losses.append([float(compiled(x).sum()), float(ref(x).sum())])
    print(f"step {step} done", flush=True)
print(json.dumps({"losses": losses, "aot_calls": counters["aot_autograd"]["total"],
                  "graphs": [[g["kind"], g["cache_hit"], bool(g.get("whole_graph"))] for g in B.compiled_graphs()]}))
'''


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}
    env["NEURON_COMPILE_CACHE_DIR"] = str(root)
    return env


def _precompile(script: Path, root: Path, *extra: str) -> tuple[dict[str, object], str]:
    proc = subprocess.run([sys.executable, "-m", "neuron_compile", "precompile", *extra, str(script), "--json"],
                          env=_env(root), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def test_precompile_then_a_real_run_is_all_hits(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    root = tmp_path / "cache"
    report, err = _precompile(script, root, "--workers", "2", "--steps", "2")
    assert (report["graphs_found"], report["unique"], report["already_cached"]) == (3, 3, 0)  # fw, bw, no_grad
    assert (report["compiled"], report["waited"], report["fetched"], report["failed"]) == (3, 0, 0, [])
    assert report["script_ok"] and report["workers"] == 2
    # Bounded: the script ran two steps, then capture stopped it (no kernel ran: losses were zeros).
    assert "step 0 done" in err and "step 1 done" in err and "step 2 done" not in err
    assert "neuron-compile precompile: captured 2 step(s); stopping the script" in err
    proc = subprocess.run([sys.executable, str(script)], env=_env(root), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["aot_calls"] == 0  # warm start: the capture phase published the AOTAutograd state too
    assert run["graphs"] == [["forward", True, True], ["backward", True, True], ["inference", True, True]]
    for got, expect in run["losses"]:
        assert got == pytest.approx(expect, rel=1e-4)
    again, _ = _precompile(script, root, "--workers", "1")
    assert (again["unique"], again["already_cached"], again["compiled"]) == (3, 3, 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_ranks_split_the_work(tmp_path: Path) -> None:
    """Two ranks, one shared cache: every graph is compiled exactly once across the ranks."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    root = tmp_path / "cache"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           "-m", "neuron_compile", "precompile", "--workers", "1", "--output", str(tmp_path / "report-{rank}.json"),
           str(script)]
    proc = subprocess.run(cmd, env=_env(root), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["unique"]) for r in reports] == [(0, 2, 3), (1, 2, 3)]
    assert sum(r["compiled"] for r in reports) == 3  # each graph once
    # (How the 3 split between the ranks depends on timing: each starts at its own offset of the sorted
    # list, and a rank that is ahead takes over graphs nobody has claimed yet.)
    assert sum(r["compiled"] + r["waited"] + r["fetched"] for r in reports) == 6
    assert not any(r["failed"] for r in reports)


def test_precompile_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_compile.cli import main

    def err_of(argv: list[str]) -> str:
        assert main(argv) == 2
        return capsys.readouterr().err

    assert err_of(["precompile", str(tmp_path / "missing.py")]) == \
        f"neuron-compile precompile: {tmp_path / 'missing.py'}: no such file\n"
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit(3)\n")
    assert err_of(["precompile", "--workers", "0", str(script)]) == "neuron-compile precompile: --workers 0: expected 1..1024\n"
    assert err_of(["precompile", "--steps", "-1", str(script)]) == \
        "neuron-compile precompile: --steps -1: expected an integer >= 1\n"
    monkeypatch.setenv("RANK", "one")
    assert err_of(["precompile", str(script)]) == \
        "neuron-compile precompile: RANK=one: expected a non-negative integer (torchrun sets it)\n"
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert err_of(["precompile", str(script)]) == \
        "neuron-compile precompile: RANK=2, WORLD_SIZE=2: expected 0 <= RANK < WORLD_SIZE (torchrun sets them)\n"
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    proc = subprocess.run([sys.executable, "-m", "neuron_compile", "precompile", str(script)], env=_env(tmp_path / "c"),
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 1
    assert "graphs found:   0 (0 unique, 0 already cached)" in proc.stdout
    assert "the script exited with status 3 during capture" in proc.stdout
