"""Helpers for the simulator unit tests: build tiles from arrays and read them back."""

from __future__ import annotations

import numpy as np

from neuron_compile.simulator import nisa, nl
from neuron_compile.simulator.tensor import NkiTensor, to_numpy


def tile(arr: np.ndarray, dtype: str | None = None, buffer: object = None) -> NkiTensor:
    """An on-chip tile holding ``arr`` (written with a DMA from a shared constant)."""
    arr = np.asarray(arr)
    t = nl.ndarray(arr.shape, dtype=dtype or str(nl_dtype(arr)), buffer=buffer or nl.sbuf)
    src = nl.shared_constant(arr)
    if t.buffer is nl.psum:
        tmp = nl.ndarray(arr.shape, dtype=t.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tmp, src=src)
        nisa.tensor_copy(dst=t, src=tmp)
    else:
        nisa.dma_copy(dst=t, src=src)
    return t


def nl_dtype(arr: np.ndarray) -> str:
    return {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "int32": "int32", "uint8": "uint8",
            "int8": "int8", "uint32": "uint32", "int16": "int16", "uint16": "uint16"}[arr.dtype.name]


def val(t: NkiTensor) -> np.ndarray:
    return to_numpy(t)


