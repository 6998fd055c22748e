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


def _register_backend() -> None:
    """Register ``backend="neuron"`` with Dynamo unless the entry point already does (see NOTES.md).

    Skipped when torch is not imported yet (the CLI never needs Dynamo, and importing it costs
    seconds): the installed ``torch_dynamo_backends`` entry point registers the name on first use.
    """
    import sys

    if "torch" not in sys.modules:
        return
    from torch._dynamo.backends import registry

    if "neuron" in registry._COMPILER_FNS or registry._BACKENDS.get("neuron") is not None:
        return  # already registered, or the torch_dynamo_backends entry point is about to register it
    from neuron_compile.backend import neuron_backend

    registry.register_backend(compiler_fn=neuron_backend, name="neuron")


_register_backend()


def get_fallback_ops() -> list[dict[str, object]]:
    """Ops that ran eagerly under ``options={"fallback": "eager"}`` (see :mod:`neuron_compile.fallback`)."""
    from neuron_compile.fallback import get_fallback_ops as _get

    return _get()


def clear_fallback_ops() -> None:
    from neuron_compile.fallback import clear_fallback_ops as _clear

    _clear()


def get_compile_metrics() -> list[dict[str, object]]:
    """Per compiled graph: nodes, kernels, fallbacks, time split, cache hit/miss (see :mod:`neuron_compile.metrics`)."""
    from neuron_compile.metrics import get_compile_metrics as _get

    return _get()


def explain(model_or_fn: object, *example_inputs: object, **kwargs: object) -> object:
    """Per graph and kernel: fused ops, tiles, FLOPs, HBM bytes, estimated vs roofline time (see :mod:`neuron_compile.explain`)."""
    from neuron_compile.explain import explain as _explain

    return _explain(model_or_fn, *example_inputs, **kwargs)


__all__ = [
    "NeuronCompileError",
    "SimulatorConstraintError",
    "UnsupportedOpError",
    "__version__",
    "clear_fallback_ops",
    "config",
    "explain",
    "get_compile_metrics",
    "get_fallback_ops",
    "patch",
]
