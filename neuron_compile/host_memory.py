"""NumPy views of torch CPU tensors that leave the tensors' storage resizable.

``Tensor.numpy()`` marks the tensor's storage non-resizable for the rest of its life (NumPy keeps a
raw pointer into it, so torch forbids freeing it underneath). That is invisible to most code but
breaks FSDP2, which frees and re-materialises unsharded parameters with
``untyped_storage().resize_(0)`` / ``resize_(n)`` after every forward and backward: once a compiled
graph had read a parameter through ``.numpy()``, the next reshard failed with "Trying to resize
storage that is not resizable". The same held for graph outputs built with ``torch.from_numpy``
(their storage belongs to NumPy and cannot be resized either).

:func:`numpy_view` reads a tensor's memory through NumPy's array interface instead: the array holds
a reference to the tensor (so the memory stays alive while the array does) and the storage flag is
untouched. Callers must not keep the array past the point where the tensor's owner may resize it;
the runtime only uses such views for the duration of one upload/download copy.
:func:`torch_copy` makes a graph output: a fresh torch-owned (resizable) tensor holding a copy of
the NumPy result.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from neuron_compile.lowering.dtypes import BY_NAME, DTYPES, numpy_type, uses_ml_dtypes

log = logging.getLogger(__name__)


class _TensorMemory:
    """An ``__array_interface__`` exporter over a CPU tensor's memory (keeps the tensor alive)."""

    def __init__(self, t: torch.Tensor, np_dtype: Any) -> None:
        self.tensor = t
        dt = np.dtype(np_dtype)
        self.__array_interface__ = {
            "version": 3, "shape": tuple(t.shape), "typestr": dt.str, "data": (t.data_ptr(), False),
            "strides": tuple(s * t.element_size() for s in t.stride()),
        }


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A NumPy array sharing ``t``'s memory (bf16/fp8 as ``ml_dtypes`` types, bool as uint8), without
    marking ``t``'s storage non-resizable as ``Tensor.numpy()`` does."""
    if t.device.type != "cpu":
        raise ValueError(f"numpy_view needs a CPU tensor, got one on {t.device}")
    facts = DTYPES.get(t.dtype)
    if facts is None:
        raise TypeError(f"numpy_view: dtype {t.dtype} has no NumPy equivalent here")
    raw, shown = numpy_type(facts.host_bytes), numpy_type(facts.host)  # ml_dtypes is imported for bf16/fp8 only
    if t.numel() == 0:
        return np.empty(tuple(t.shape), dtype=shown)
    arr = np.asarray(_TensorMemory(t.detach(), raw))
    return arr.view(shown) if shown != raw else arr


def torch_copy(a: np.ndarray) -> torch.Tensor:
    """A torch-owned CPU tensor (resizable storage) holding a copy of ``a`` (bf16/fp8 from ``ml_dtypes``)."""
    if uses_ml_dtypes(a.dtype.name):
        dtype = BY_NAME[a.dtype.name]
    elif a.dtype == np.bool_:
        dtype = torch.bool
    else:
        dtype = torch.from_numpy(np.empty(0, dtype=a.dtype)).dtype
    out = torch.empty(a.shape, dtype=dtype)
    if out.numel():
        np.copyto(numpy_view(out), a.view(np.uint8) if a.dtype == np.bool_ else a)
    return out


def host_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a contiguous CPU tensor (for hashing) without touching its storage's flags."""
    return numpy_view(t.contiguous()).tobytes() if t.numel() else b""
