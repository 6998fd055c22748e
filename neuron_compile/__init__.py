"""neuron-compile: a ``torch.compile`` backend for AWS Trainium.

``torch.compile(model, backend="neuron")`` lowers the captured graph to NKI kernels and runs them on
Trainium through the real ``nki`` package, or anywhere else on the bundled CPU simulator
(:mod:`neuron_compile.simulator`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from neuron_compile.config import config, patch  # noqa: E402
from neuron_compile.errors import (  # noqa: E402
    DistributedCompileError,
    NeuronCompileError,
    SimulatorConstraintError,
    UnsupportedOpError,
)

BACKEND_NAME = "neuron"
ALT_BACKEND_NAME = "neuron_compile"  # always ours, also where another package owns "neuron"
_ENTRY_POINT = "neuron_compile.entry:neuron_backend"


def _describe(fn_or_ep: object) -> str | None:
    """Who a registry slot names: None when it is neuron-compile, else a printable origin."""
    value = getattr(fn_or_ep, "value", None)  # an importlib EntryPoint
    if isinstance(value, str):
        # ours under any module of this package (an install made before the entry moved still names ours)
        return None if value.split(":")[0].split(".")[0] == "neuron_compile" else f"the entry point {value}"
    module = getattr(fn_or_ep, "__module__", "") or ""
    if module.split(".")[0] == "neuron_compile":
        return None
    return f"{module}.{getattr(fn_or_ep, '__qualname__', type(fn_or_ep).__name__)}"


def neuron_resolves_to() -> str | None:
    """None when ``backend="neuron"`` is neuron-compile's; else what it resolves to (e.g. TorchNeuron's
    backend on a Trainium host), in which case use ``backend="neuron_compile"`` for this package."""
    import sys

    if "torch" not in sys.modules:
        return None
    from torch._dynamo.backends import registry

    fn = registry._COMPILER_FNS.get(BACKEND_NAME)
    if fn is not None:
        return _describe(fn)
    ep = registry._BACKENDS.get(BACKEND_NAME)
    return _describe(ep) if ep is not None else None


def _register_backend() -> None:
    """Register ``backend="neuron"`` and ``backend="neuron_compile"`` with Dynamo (see NOTES.md).

    Names Dynamo already knows are left alone (the ``torch_dynamo_backends`` entry points register
    them on first use; registering twice makes Dynamo fail with "duplicate name"). When another
    backend already holds "neuron" (TorchNeuron's, on a Trainium host), it keeps it: neuron-compile
    stays reachable as "neuron_compile" and a warning says so. Skipped when torch is not imported
    yet (the CLI never needs Dynamo, and importing it costs seconds).
    """
    import sys
    import warnings

    if "torch" not in sys.modules:
        return
    from torch._dynamo.backends import registry

    from neuron_compile.entry import neuron_backend  # the pipeline with the tools wired in

    if ALT_BACKEND_NAME not in registry._COMPILER_FNS and registry._BACKENDS.get(ALT_BACKEND_NAME) is None:
        registry.register_backend(compiler_fn=neuron_backend, name=ALT_BACKEND_NAME)
    other = neuron_resolves_to()
    if other is not None:
        warnings.warn(f"torch.compile(backend='neuron') resolves to {other}, another backend registered under that "
                      "name (TorchNeuron's on a Trainium host), not to neuron-compile. Use "
                      "backend='neuron_compile' for neuron-compile; backend='neuron' keeps the other one.",
                      UserWarning, stacklevel=3)
        return
    if BACKEND_NAME in registry._COMPILER_FNS or registry._BACKENDS.get(BACKEND_NAME) is not None:
        return  # already ours, or our torch_dynamo_backends entry point is about to register it
    import importlib.util

    if importlib.util.find_spec("torch_neuronx") is not None:
        # TorchNeuron registers "neuron" when it is imported: taking the name first would make its
        # registration fail ("duplicate name"), so leave it free.
        warnings.warn("torch-neuronx is installed, so backend='neuron' is left to TorchNeuron's backend; use "
                      "backend='neuron_compile' for neuron-compile.", UserWarning, stacklevel=3)
        return
    registry.register_backend(compiler_fn=neuron_backend, name=BACKEND_NAME)


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
    "ALT_BACKEND_NAME",
    "BACKEND_NAME",
    "DistributedCompileError",
    "NeuronCompileError",
    "SimulatorConstraintError",
    "UnsupportedOpError",
    "__version__",
    "clear_fallback_ops",
    "config",
    "explain",
    "get_compile_metrics",
    "get_fallback_ops",
    "neuron_resolves_to",
    "patch",
]
