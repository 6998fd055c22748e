"""Fixtures for the performance tests: fresh Dynamo caches and compiled-graph stats, cache off."""

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
    torch._dynamo.reset()
    neuron_compile.backend.reset()
    with warnings.catch_warnings(), config.patch(cache=False):
        warnings.filterwarnings("ignore", message=".*doesn't take boxed arguments.*")
        yield
    torch._dynamo.reset()
