"""The torch dtypes this backend takes, and every fact the pipeline needs about each, in one table.

A dtype is added or changed here and nowhere else: its device storage (NeuronCores have no 64-bit types:
int64 lives as int32, its values checked at the boundary; float64 runs as float32, with a warning; bool as
uint8 0/1), its host bytes as NumPy sees them (bf16/fp8 through ``ml_dtypes``, imported on first use: its
import costs seconds), whether its bits are torch's (what a bitcast may move between), whether it is a
narrow float (bf16/fp16/fp8: an in-kernel intermediate is rounded to it as eager rounds; see
``ops.elementwise``) and which matmul operand tile it loads into exactly. Which *target* holds a dtype
(float8_e4m3fn is NeuronCore-v4 only) is the pipeline's check, with its advice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class DtypeFacts:
    dtype: torch.dtype
    storage: str  # the NKI dtype of its device buffers
    host: str  # NumPy dtype callers see on the host (bfloat16 / float8_*: ml_dtypes' types)
    host_bytes: str  # NumPy dtype of the same bytes that needs no ml_dtypes (what a tensor's memory is read as)
    bits_kept: bool = True  # stored as itself, so a bitcast to another such dtype of its size keeps torch's bits
    narrow: bool = False  # bf16/fp16/fp8: values rounded to it in-kernel as eager rounds them
    operand_tile: str | None = None  # the 16-bit matmul operand tile it loads into exactly (narrow floats)

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


DTYPES: dict[torch.dtype, DtypeFacts] = {f.dtype: f for f in (
    DtypeFacts(torch.float32, "float32", "float32", "float32"),
    DtypeFacts(torch.bfloat16, "bfloat16", "bfloat16", "int16", narrow=True, operand_tile="bfloat16"),
    DtypeFacts(torch.float16, "float16", "float16", "float16", narrow=True, operand_tile="float16"),
    DtypeFacts(torch.float64, "float32", "float64", "float64", bits_kept=False),
    DtypeFacts(torch.int64, "int32", "int64", "int64", bits_kept=False),
    DtypeFacts(torch.int32, "int32", "int32", "int32"),
    DtypeFacts(torch.int16, "int16", "int16", "int16"),
    DtypeFacts(torch.int8, "int8", "int8", "int8"),
    DtypeFacts(torch.uint8, "uint8", "uint8", "uint8"),
    DtypeFacts(torch.bool, "uint8", "uint8", "uint8", bits_kept=False),
    # FP8 operands load as bfloat16 tiles (a converting DMA; every FP8 value is a bfloat16)
    DtypeFacts(torch.float8_e5m2, "float8_e5m2", "float8_e5m2", "uint8", narrow=True, operand_tile="bfloat16"),
    # NC-v4 (trn3) only: refused for older targets by the pipeline
    DtypeFacts(torch.float8_e4m3fn, "float8_e4m3fn", "float8_e4m3fn", "uint8", narrow=True,
               operand_tile="bfloat16"),
)}

BY_NAME: dict[str, torch.dtype] = {f.name: d for d, f in DTYPES.items()}  # "int64" -> torch.int64
NARROW_FLOATS: tuple[torch.dtype, ...] = tuple(d for d, f in DTYPES.items() if f.narrow)
STORAGE_DTYPE: dict[torch.dtype, str] = {d: f.storage for d, f in DTYPES.items()}
# storage dtype -> the matmul operand tile it loads into exactly
OPERAND_TILE: dict[str, str] = {f.storage: f.operand_tile for f in DTYPES.values() if f.operand_tile}
# dtypes a bitcast may move between (same size, each stored as itself), with their sizes in bytes
BITCAST_SIZES: dict[torch.dtype, int] = {d: d.itemsize for d, f in DTYPES.items() if f.bits_kept}
_ML_DTYPES = frozenset(f.host for f in DTYPES.values() if f.host != f.host_bytes)


def storage_dtype(dtype: torch.dtype) -> str | None:
    """The NKI storage dtype of a torch dtype, or None when this backend takes no such tensor."""
    f = DTYPES.get(dtype)
    return f.storage if f else None


def narrow_float(dtype: torch.dtype | None) -> str | None:
    """The storage name of a bf16/fp16/fp8 dtype (what an in-kernel value of it is rounded to), else None."""
    f = DTYPES.get(dtype)  # type: ignore[arg-type]
    return f.storage if f and f.narrow else None


@functools.cache
def numpy_type(name: str) -> Any:
    """The NumPy type of a dtype name (a storage name or a torch dtype's name), ml_dtypes' for bf16/fp8."""
    if name in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def uses_ml_dtypes(name: str) -> bool:
    """Whether NumPy sees this dtype name through ml_dtypes (compares names: imports nothing)."""
    return name in _ML_DTYPES
