"""Fixtures for the backend op tests: a fresh Dynamo and neuron_compile stats per test."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import pytest
import torch

import neuron_compile.backend
from neuron_compile.config import config

log = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test compiles its own graphs: reset Dynamo's caches and the compiled-graph stats.

    The persistent artifact cache is off (and errors strict) so every test really lowers, renders and
    runs its kernels, whatever an earlier run left on disk.
    """
    torch._dynamo.reset()
    neuron_compile.backend.reset()
    with warnings.catch_warnings(), config.patch(cache=False, fallback="strict"):
        warnings.filterwarnings("ignore", message=".*doesn't take boxed arguments.*")
        yield
    torch._dynamo.reset()
