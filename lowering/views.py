"""Strided views of runtime buffers.

A :class:`View` is where a graph value lives: a buffer plus (offset, shape, strides) in elements.
View ops (reshape, permute, expand, slice, ...) only compute a new View; kernels address their
arguments through these strides, so views never move data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class View:
    buffer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    torch_dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape) or self.numel <= 1


def dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Non-overlapping and dense: a permutation of a contiguous layout (each dim's stride the size of the dims
    inside it; a size-1 dim's stride is free)."""
    expected = 1
    for st, sz in sorted((st, sz) for sz, st in zip(shape, strides, strict=True) if sz != 1):
        if st != expected:
            return False
        expected *= sz
    return True


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    acc = 1
    for size in reversed(shape):
        out.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(out))
