"""Compile metrics for users and tools: one JSON-able dict per compiled graph.

The pipeline records each graph in :mod:`neuron_compile.compile_record` (the core); this module is the
reporting face of those records (``neuron_compile.get_compile_metrics()``, the ``check`` command's
report, the benchmarks).
"""

from __future__ import annotations

import logging
from typing import Any

from neuron_compile.compile_record import GraphRecord, estimate_stats_us, records, reset

log = logging.getLogger(__name__)

__all__ = ["GraphRecord", "estimate_stats_us", "get_compile_metrics", "records", "reset"]


def get_compile_metrics() -> list[dict[str, Any]]:
    """One dict per compiled graph, in compile order (see :meth:`GraphRecord.to_json`)."""
    return [r.to_json() for r in records()]
