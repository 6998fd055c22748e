"""The ``torch.compile`` entry point: the compile pipeline with the evaluation tools wired in.

This is the composition root. The core (capture → lowering → codegen → cache → runtime, driven by
:mod:`neuron_compile.backend`) never imports the tools that sit above it; importing them here registers
their hooks with it: :mod:`neuron_compile.fallback` compiles graphs with unsupported ops under
``fallback="eager"``, :mod:`neuron_compile.debug` writes debug dumps and :mod:`neuron_compile.check` wraps
runners for the numeric check mode (finish hooks of :mod:`neuron_compile.compile_record`). Dynamo finds
the backend here, through the package's registration or its ``torch_dynamo_backends`` entry points.
"""

from __future__ import annotations

import logging

from neuron_compile import check, debug, fallback  # noqa: F401  (each registers its hook with the core)
from neuron_compile.backend import neuron_backend

log = logging.getLogger(__name__)

__all__ = ["neuron_backend"]
