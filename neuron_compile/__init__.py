"""neuron-compile: a ``torch.compile`` backend for AWS Trainium.

``torch.compile(model, backend="neuron")`` lowers the captured graph to NKI kernels and runs them on
Trainium through the real ``nki`` package, or anywhere else on the bundled CPU simulator
(:mod:`neuron_compile.simulator`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from neuron_compile.config import config, patch  # noqa: E402
from neuron_compile.errors import (  # noqa: E402
    NeuronCompileError,
    SimulatorConstraintError,
    UnsupportedOpError,
)

__all__ = [
    "NeuronCompileError",
    "SimulatorConstraintError",
    "UnsupportedOpError",
    "__version__",
    "config",
    "patch",
]
