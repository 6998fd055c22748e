"""Name coexistence: on a host where another backend owns ``backend="neuron"`` (TorchNeuron on Trainium),
neuron-compile stays reachable as ``backend="neuron_compile"`` and a warning says which one "neuron" is.
Each case runs in a fresh process, since registration happens at import (see NOTES.md)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from fresh_process import Started

log = logging.getLogger(__name__)

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


BOTH_OURS = """
import torch, neuron_compile
from torch._dynamo.backends.registry import lookup_backend
from neuron_compile.backend import neuron_backend
assert lookup_backend("neuron") is neuron_backend and lookup_backend("neuron_compile") is neuron_backend
assert neuron_compile.neuron_resolves_to() is None
print("ok")
"""


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Started]]:
    """The three cases, started together (each is mostly torch's import)."""
    root = tmp_path_factory.mktemp("names")
    site = root / "site"
    (site / "torch_neuronx").mkdir(parents=True)
    (site / "torch_neuronx" / "__init__.py").write_text(TORCH_NEURONX)
    with_site = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    cases = {
        "fake_first": (FAKE_FIRST, {}),
        "torch_neuronx": (IMPORTED_FIRST, {"PYTHONPATH": with_site}),
        "both_ours": (BOTH_OURS, {}),
    }
    runs = {name: Started(code, {"NEURON_COMPILE_CACHE_DIR": str(root / f"cache_{name}"), **env}, root / name)
            for name, (code, env) in cases.items()}
    yield runs
    for run in runs.values():
        run.stop()


def test_other_neuron_backend_keeps_the_name_and_ours_answers_to_neuron_compile(started) -> None:
    res = started["fake_first"].result()
    assert res.returncode == 0, res.stderr[-3000:]
    first, last = res.stdout.strip().splitlines()[0], res.stdout.strip().splitlines()[-1]
    assert first.startswith("torch.compile(backend='neuron') resolves to __main__.fake_neuron, another backend")
    assert "Use backend='neuron_compile' for neuron-compile" in first and last == "ok"


def test_torch_neuronx_installed_gets_the_name_even_when_imported_later(started) -> None:
    res = started["torch_neuronx"].result()
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == ("torch-neuronx is installed, so backend='neuron' is left to TorchNeuron's backend; use "
                        "backend='neuron_compile' for neuron-compile.")
    assert lines[-1] == "ok"


def test_both_names_are_ours_without_another_backend(started) -> None:
    res = started["both_ours"].result()
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
