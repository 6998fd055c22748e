"""Warm frames and the code they stand for (neuron_compile.warm_frames).

A package is keyed on its function's code, not only its name and line: lambdas written on one line share
both. torch's frame packages record the source of every function a frame traced and raise when it can't be
read; such code compiles and runs as without warm frames (the frame is just not packaged), in a cold and in
a warm process: a script piped into ``python -``, a function made by ``exec``, a module edited since import;
so does a frame torch can't name (a property getter with a graph break).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import importlib, sys, tempfile, torch
    from pathlib import Path
    import neuron_compile  # noqa: F401

    exec("def scaled(x):\\n    return x.cos() * 2\\n")  # no source file

    def uses_exec(x):
        return scaled(x) + 1

    mod_dir = Path(tempfile.mkdtemp())
    (mod_dir / "edited_mod.py").write_text("def act(x):\\n    return x.sigmoid() * 3\\n")
    sys.path.insert(0, str(mod_dir))
    import edited_mod
    (mod_dir / "edited_mod.py").write_text("# edited after import\\n\\ndef act(x):\\n    return x.tanh()\\n")

    def uses_edited(x):
        return edited_mod.act(x) - 1

    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    for fn in (uses_exec, uses_edited, lambda t: torch.logspace(0.5, 2, 5) * t.abs().sum()):
        got = torch.compile(fn, backend="neuron", dynamic=False)(x)
        torch.testing.assert_close(got, fn(x))
    print("MATCHES EAGER")
""")


def test_lambdas_on_one_line_get_their_own_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    fns = [lambda t: t + 1, lambda t: t * 3, lambda t: t - 2, lambda t: t + 1]  # same name, line and file
    x = torch.arange(6.0)
    for fn in fns:
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="neuron", dynamic=False)(x), fn(x))


class _Scaled(torch.nn.Module):
    @property
    def scale(self) -> torch.Tensor:  # Dynamo compiles the getter as a frame of its own (after the graph break)
        torch._dynamo.graph_break()
        return torch.full((3,), 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1) * self.scale


def test_graph_break_inside_a_property_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch can't name a property getter's frame for a package (Hugging Face's ``self.loss_function``): that
    frame is not packaged, the model compiles and matches eager."""
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    x = torch.randn(3)
    torch.testing.assert_close(torch.compile(_Scaled(), backend="neuron", dynamic=False)(x), _Scaled()(x))


def _run(args: list[str], cache: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}
    env["NEURON_COMPILE_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, *args], input=stdin, env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_unreadable_source_compiles_cold_and_warm(tmp_path: Path) -> None:
    for run in ("cold", "warm"):
        proc = _run(["-"], tmp_path / "cache", stdin=SCRIPT)  # the script piped in: none of it has a source file
        assert proc.returncode == 0, f"{run}: {proc.stderr[-3000:]}"
        assert "MATCHES EAGER" in proc.stdout, proc.stdout
        assert "could not get source" not in proc.stderr and "Source mismatch" not in proc.stderr
