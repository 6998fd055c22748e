"""Fixtures for the distributed tests that run in this process (the torchrun ones start their own)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@pytest.fixture
def single_rank_group(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group (collectives run, but nothing is distributed: no rank agreement)."""
    if dist.is_initialized():  # pragma: no cover - another test left a group behind
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    torch._dynamo.reset()
    try:
        yield
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
