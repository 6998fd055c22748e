"""PyTorch's ModuleInfo database (every ``torch.nn`` module it describes) through ``torch.compile(backend="neuron")``.

Each module is built from its first sample's constructor arguments, compiled whole and run on the sample's forward
inputs, in training mode and, where the modes differ (dropout, batch and instance norm), in eval mode; outputs and
updated buffers (running statistics) must match eager. ``python tests/modules/sweep.py [--grad]`` runs every sample
of every module, gradients included, in parallel workers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sweep import run_module  # noqa: E402

pytestmark = pytest.mark.slow


def _modules() -> list[str]:
    from torch.testing._internal.common_modules import module_db

    return sorted(m.name for m in module_db)


MODULES = _modules()


@pytest.mark.parametrize("name", MODULES)
def test_module_matches_eager(name: str) -> None:
    result = run_module(name, samples=1, dtype_name="float32")
    if result["status"] == "n/a":
        pytest.skip(f"{name}: ModuleInfo gives no sample eager accepts ({result['detail']})")
    assert result["status"] == "pass", f"{name}: {result['status']}: {result['detail']} ({result.get('sample')})"
    assert result["samples"] >= 1
