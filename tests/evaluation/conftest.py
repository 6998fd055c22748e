"""Fixtures for the migration-evaluation tests: fresh Dynamo, a private cache, cleared records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import neuron_compile
from neuron_compile import backend, check, metrics


@pytest.fixture(autouse=True)
def fresh_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees only its own graphs, fallbacks and checks, and compiles into its own cache."""
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("NEURON_COMPILE_FALLBACK", "NEURON_COMPILE_CHECK", "NEURON_COMPILE_DEBUG_DIR",
                "NEURON_COMPILE_TEST_BREAK_OP", "CI"):
        monkeypatch.delenv(var, raising=False)
    torch._dynamo.reset()
    backend.reset()
    metrics.reset()
    neuron_compile.clear_fallback_ops()
    check.clear_check_results()
    yield
    torch._dynamo.reset()
