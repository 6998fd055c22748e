"""Constraint checks shared by the ISA instructions, and the fp32 read / rounded write helpers.

Checks raise :class:`SimulatorConstraintError` (instruction, operand, value, limit) for hardware
rules (REFERENCE 1.3, 3, 7.3) and :class:`SimulatorError` for API misuse. They are written for the
hot path: a handful of attribute reads per operand, cached per view.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np

from neuron_compile.errors import RemovedAPIError, SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import targets as _targets
from neuron_compile.simulator.tensor import ON_CHIP, PSUM, SBUF, NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
_F32D = np.dtype(np.float32)

REMOVED_KWARGS = {
    "mask": "min()-bounded slices (the mask= parameter was removed in NKI 0.2.0)",
    "psumAccumulateFlag": "accumulate= (psumAccumulateFlag= was removed in NKI 0.2.0)",
    "is_moving_zero": "is_moving_onezero= (renamed in NKI 0.2.0)",
    "dst_rmw_op": "nisa.dma_compute(dst, srcs, reduce_op) (dst_rmw_op= was removed from dma_copy in NKI 0.3.0)",
    "unique_indices": "nisa.dma_compute(..., unique_indices=) (removed from dma_copy in NKI 0.3.0)",
    "use_gpsimd_dma": "dma_engine=nisa.dma_engine.gpsimd_dma|dma (replaced in NKI 0.3.0)",
    "imm": "src= (renamed in NKI 0.3.0)",
    "dtype": "dst= allocated with the dtype you want (ISA calls stopped taking dtype= and returning their result in "
             "NKI 0.2: nisa.op(dst=nl.ndarray(shape, dtype=...), ...))",
}


class SimulatorWarning(UserWarning):
    """Behaviour that is undefined or different on hardware (the simulator still computes a value)."""


def warn(msg: str) -> None:
    warnings.warn(msg, SimulatorWarning, stacklevel=3)


def removed_kwargs(api: str, kwargs: dict[str, Any]) -> None:
    for k in kwargs:
        if k in REMOVED_KWARGS:
            raise RemovedAPIError(f"{api}: parameter {k}= is gone; use {REMOVED_KWARGS[k]}")
    raise SimulatorError(f"{api}: unexpected keyword argument(s) {', '.join(sorted(kwargs))}")


def tensor(api: str, name: str, t: Any) -> NkiTensor:
    if not isinstance(t, NkiTensor):
        raise SimulatorError(f"{api}: operand '{name}' must be an NkiTensor, got {type(t).__name__}")
    return t


PSUM_ACCESS_ELEMENTS = 4096  # Trainium architecture guide, "Accessing SBUF/PSUM tensors": free size limit in PSUM


def _distinct_free(t: NkiTensor) -> int:
    """Distinct elements per partition a view touches: a stride-0 (broadcast) dim re-reads the same elements, so it
    does not count against the PSUM access limit (nki-library's layernorm_tkg subtracts a one-bank PSUM mean broadcast
    24x over an SBUF tile in one tensor_tensor, in a configuration AWS's own fast tests run)."""
    n = 1
    for size, stride in zip(t.shape[1:], t.strides[1:], strict=True):
        if stride:
            n *= size
    return n


def onchip(api: str, name: str, t: Any, gpsimd: bool = False, starts: tuple[int, ...] | None = None) -> tuple[int, int]:
    """Validate an on-chip compute operand; returns (partitions, elements per partition). ``starts``: the partition
    starts the operand may have instead of the usual quadrant alignment (MX scale tiles: 0, 4, 8 or 12)."""
    if not isinstance(t, NkiTensor):
        raise SimulatorError(f"{api}: operand '{name}' must be an NkiTensor, got {type(t).__name__}")
    buf = t.storage.buffer
    if buf not in ON_CHIP:
        raise SimulatorConstraintError(api, name, f"nl.{buf.value}", "operand must be in SBUF or PSUM",
                                       f"tensor '{t.name}'; move HBM data with nisa.dma_copy first")
    if gpsimd and buf is PSUM:
        raise SimulatorConstraintError(api, name, "nl.psum", "GpSimd cannot access PSUM", f"tensor '{t.name}'")
    start, p, f = t.pinfo()
    if buf is PSUM and f > PSUM_ACCESS_ELEMENTS and (touched := _distinct_free(t)) > PSUM_ACCESS_ELEMENTS:
        raise SimulatorConstraintError(api, name, touched, f"<= {PSUM_ACCESS_ELEMENTS} elements per partition in one PSUM "
                                       "access (a Vector/Scalar instruction reads or writes up to 4K PSUM elements)",
                                       f"tensor '{t.name}'; split the instruction")
    if p > 1 and t.strides[0] != t.part_elems():
        raise SimulatorConstraintError(api, name, t.strides[0],
                                       f"partition stride == {t.part_elems()} (no partition striding)",
                                       f"tensor '{t.name}'")
    if starts is not None:
        if start not in starts:
            raise SimulatorConstraintError(api, name, start, f"a partition start in {starts}", f"tensor '{t.name}'")
    elif start and ((p > 64) or (p > 32 and start != 64) or (start % 32)):
        raise SimulatorConstraintError(api, name, (start, p),
                                       "partition start/count alignment: count in (64,128] -> start 0; (32,64] -> "
                                       "start 0 or 64; (0,32] -> start 0/32/64/96", f"tensor '{t.name}'")
    return p, f


def sbuf_only(api: str, name: str, t: NkiTensor) -> None:
    if t.storage.buffer is not SBUF:
        raise SimulatorConstraintError(api, name, f"nl.{t.storage.buffer.value}", "operand must be in SBUF",
                                       f"tensor '{t.name}'")


def same_pf(api: str, name: str, pf: tuple[int, int], ref_name: str, ref: tuple[int, int]) -> None:
    if pf != ref:
        raise SimulatorConstraintError(api, name, f"{pf[0]} partitions x {pf[1]} elements",
                                       f"same partitions and elements per partition as '{ref_name}' "
                                       f"({ref[0]} x {ref[1]})")


def need_version(api: str, version: int) -> None:
    lim = _targets.limits()
    if lim.nc_version < version:
        names = {2: "trn1", 3: "trn2", 4: "trn3"}
        raise SimulatorConstraintError(api, "target", lim.name, f"needs NeuronCore-v{version} ({names[version]}) "
                                       "or newer", f"set NEURON_PLATFORM_TARGET_OVERRIDE={names[version]}")


def read32(t: NkiTensor) -> np.ndarray:
    """The view's values as fp32 (no copy for fp32 storage: do not write into the result)."""
    a = t.arr
    if a.dtype is _F32D or a.dtype == _F32D:
        return a
    return a.astype(F32)


def raw(t: NkiTensor) -> np.ndarray:
    return t.arr


def write(t: NkiTensor, values: Any) -> None:
    """Store fp32 (or integer) ``values`` into ``t`` rounding RNE / saturating to its dtype."""
    a = t.arr
    info = t.info
    if isinstance(values, np.ndarray):
        if values.shape != a.shape:
            values = values.reshape(a.shape) if values.size == a.size else np.broadcast_to(values, a.shape)
        if info.kind == "f" and info.name != _dt.tfloat32:
            a[...] = values
        else:
            conv = _dt.cast_for_store(values, info)
            a[...] = values if conv is None else conv
    else:
        conv = _dt.cast_for_store(np.asarray(values, dtype=np.float64 if info.is_int else F32), info)
        a[...] = values if conv is None else conv
    mark_written(t)


def mark_written(t: NkiTensor) -> None:
    """The storage was written; in PSUM, the region is now "written by a non-matmul" (flag 2)."""
    st = t.storage
    st.written = True
    if st.mm is not None:
        m = t.mm_view()
        if m is None:
            st.mm[...] = 2
        else:
            m[...] = 2


def write_raw(t: NkiTensor, values: np.ndarray) -> None:
    """Bit-exact store of values already in the storage dtype."""
    a = t.arr
    a[...] = values if values.shape == a.shape else values.reshape(a.shape)
    mark_written(t)


def scalar_or_vector(api: str, name: str, v: Any, p: int, ndim: int, fp32_only: bool = True) -> Any:
    """A Python float, or a ``(P,1)`` tile returned as an fp32 array shaped to broadcast over ``ndim`` dims."""
    if isinstance(v, NkiTensor):
        vp, vf = onchip(api, name, v)
        if vp != p or vf != 1:
            raise SimulatorConstraintError(api, name, v.shape, f"a scalar or a ({p}, 1) vector")
        if fp32_only and v.dtype != _dt.float32:
            raise SimulatorConstraintError(api, name, v.dtype, "vector operand dtype must be float32")
        return read32(v).reshape((p,) + (1,) * (ndim - 1))
    if isinstance(v, (bool, int, float, np.integer, np.floating)):
        return F32(v)
    raise SimulatorError(f"{api}: operand '{name}' must be a scalar or a (P, 1) tile, got {type(v).__name__}")


def offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """Element offsets of a strided view (relative to its start), shaped like the view."""
    out = np.zeros(shape, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides, strict=False)):
        idx = [1] * len(shape)
        idx[d] = n
        out += (np.arange(n, dtype=np.int64) * s).reshape(idx)
    return out


def engine_name(e: Any) -> str:
    return e.name


def resolve_engine(api: str, eng: Any, allowed: tuple[str, ...], default: str) -> str:
    """The engine an instruction runs on: ``default`` for ``engine.unknown``, else one of ``allowed``."""
    from neuron_compile.simulator.enums import check_enum, engine

    if eng is engine.unknown:
        return default
    check_enum(eng, engine, api, "engine")
    if eng.name not in allowed:
        raise SimulatorConstraintError(api, "engine", f"nisa.engine.{eng.name}",
                                       f"one of {', '.join('nisa.engine.' + a for a in allowed)}")
    return eng.name
