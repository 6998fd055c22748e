"""Strided views of runtime buffers, and the dtype mapping between torch and NKI storage.

A :class:`View` is where a graph value lives: a buffer plus (offset, shape, strides) in elements.
View ops (reshape, permute, expand, slice, ...) only compute a new View; kernels address their
arguments through these strides, so views never move data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# torch dtype -> NKI storage dtype. NeuronCores have no 64-bit types: int64 lives as int32 (values
# are checked at the boundary), float64 runs as float32 (with a warning from the backend).
STORAGE_DTYPE: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float32",
    torch.int64: "int32",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "uint8",
}


def storage_dtype(dtype: torch.dtype) -> str | None:
    return STORAGE_DTYPE.get(dtype)


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


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    acc = 1
    for size in reversed(shape):
        out.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(out))


def reshape_strides(shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]) -> tuple[int, ...] | None:
    """Strides for viewing (shape, strides) as ``new_shape`` without a copy, or None (torch's computeStride)."""
    numel = math.prod(shape)
    if numel == 0 or not shape:  # empty, or a 0-d source: any strides address the element(s)
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1] if strides else 1
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)
