"""Fixtures for the cache tests: an isolated cache root per test, WARNING capture."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from neuron_compile.cache import store as store_mod


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache root selected through NEURON_COMPILE_CACHE_DIR, with per-process state reset."""
    root = tmp_path / "cache"
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(root))
    monkeypatch.delenv("NEURON_COMPILE_CACHE", raising=False)
    monkeypatch.delenv("NEURON_COMPILE_CACHE_ALLOW_SHARED", raising=False)
    store_mod.reset_process_state()
    yield root
    store_mod.reset_process_state()


@pytest.fixture
def warnings_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="neuron_compile.cache")
    return caplog
