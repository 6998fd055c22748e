"""Name coexistence: on a host where another backend owns ``backend="neuron"`` (TorchNeuron on Trainium),
neuron-compile stays reachable as ``backend="neuron_compile"`` and a warning says which one "neuron" is.
Each case runs in a fresh process, since registration happens at import (see NOTES.md)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]

FAKE_FIRST = """
import warnings
import torch
from torch._dynamo.backends.registry import register_backend

calls = []

def fake_neuron(gm, example_inputs):
    calls.append(len(example_inputs))
    return gm.forward

register_backend(compiler_fn=fake_neuron, name="neuron")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import neuron_compile
    import neuron_compile.backend as B
msgs = [str(w.message) for w in caught if "resolves to" in str(w.message)]
assert len(msgs) == 1, msgs
print(msgs[0])
assert neuron_compile.neuron_resolves_to() == "__main__.fake_neuron"
x = torch.randn(4, 6)
f = torch.compile(lambda x: x * 3, backend="neuron", dynamic=False)
assert torch.allclose(f(x), x * 3) and calls == [1] and B.compiled_graphs() == []
g = torch.compile(lambda x: torch.relu(x) * 5, backend="neuron_compile", dynamic=False)
assert torch.allclose(g(x), torch.relu(x) * 5) and calls == [1] and len(B.compiled_graphs()) == 1
print("ok")
"""

TORCH_NEURONX = """
import torch
from torch._dynamo.backends.registry import register_backend

def neuron(gm, example_inputs):
    return gm.forward

register_backend(compiler_fn=neuron, name="neuron")  # as TorchNeuron does when imported
"""

IMPORTED_FIRST = """
import warnings
import torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import neuron_compile
import torch_neuronx  # registers "neuron" after us: must not hit "duplicate name"
print([str(w.message) for w in caught if "torch-neuronx" in str(w.message)][0])
assert neuron_compile.neuron_resolves_to() == "torch_neuronx.neuron"
x = torch.randn(3, 5)
g = torch.compile(lambda x: x.exp(), backend="neuron_compile", dynamic=False)
assert torch.allclose(g(x), x.exp(), atol=1e-6)
import neuron_compile.backend as B
assert len(B.compiled_graphs()) == 1
print("ok")
"""


def _run(code: str, tmp_path: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, NEURON_COMPILE_CACHE_DIR=str(tmp_path / "cache"))
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra_path), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)


def test_other_neuron_backend_keeps_the_name_and_ours_answers_to_neuron_compile(tmp_path: Path) -> None:
    res = _run(FAKE_FIRST, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    first, last = res.stdout.strip().splitlines()[0], res.stdout.strip().splitlines()[-1]
    assert first.startswith("torch.compile(backend='neuron') resolves to __main__.fake_neuron, another backend")
    assert "Use backend='neuron_compile' for neuron-compile" in first and last == "ok"


def test_torch_neuronx_installed_gets_the_name_even_when_imported_later(tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "torch_neuronx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(TORCH_NEURONX)
    res = _run(IMPORTED_FIRST, tmp_path, tmp_path / "site")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == ("torch-neuronx is installed, so backend='neuron' is left to TorchNeuron's backend; use "
                        "backend='neuron_compile' for neuron-compile.")
    assert lines[-1] == "ok"


def test_both_names_are_ours_without_another_backend(tmp_path: Path) -> None:
    res = _run("""
        import torch, neuron_compile
        from torch._dynamo.backends.registry import lookup_backend
        from neuron_compile.backend import neuron_backend
        assert lookup_backend("neuron") is neuron_backend and lookup_backend("neuron_compile") is neuron_backend
        assert neuron_compile.neuron_resolves_to() is None
        print("ok")
    """, tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
