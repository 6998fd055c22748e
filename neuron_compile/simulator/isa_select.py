"""Masking and selection (REFERENCE 3.3): ``affine_select`` (GpSimd), ``select_reduce``,
``tensor_copy_predicated``, ``range_select`` (VectorE; the reducing ones use the Vector accumulators).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import enums as _en
from neuron_compile.simulator import ops as O
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.enums import reduce_cmd
from neuron_compile.simulator.isa_elementwise import _read_out, _row_reduce, update_registers
from neuron_compile.simulator.isa_movement import _pattern_values
from neuron_compile.simulator.tensor import PSUM, NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
FP32_MIN = -3.4028235e38
_PRED_DTYPES = frozenset((_dt.int8, _dt.uint8, _dt.int16, _dt.uint16, _dt.int32, _dt.uint32, _dt.bool_))


def _cmp(api: str, param: str, op: Any) -> str:
    n = O.opname(op)
    if n not in ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal"):
        raise SimulatorConstraintError(api, param, n or op, "a comparison op (nl.equal, nl.greater_equal, ...)")
    return n  # type: ignore[return-value]


def affine_select(dst: NkiTensor, pattern: Any, channel_multiplier: int, on_true_tile: NkiTensor,
                  on_false_value: Any, cmp_op: Any = None, offset: int = 0, name: str | None = None,
                  **removed: Any) -> None:
    """dst = on_true_tile where cmp_op(offset + p*channel_multiplier + sum(idx*step), 0), else on_false_value."""
    api = "nisa.affine_select"
    if removed:
        C.removed_kwargs(api, removed)
    n = "equal" if cmp_op is None else _cmp(api, "cmp_op", cmp_op)
    p, f = C.onchip(api, "dst", dst, gpsimd=True)
    C.same_pf(api, "on_true_tile", C.onchip(api, "on_true_tile", on_true_tile, gpsimd=True), "dst", (p, f))
    C.sbuf_only(api, "dst", dst)
    v = _pattern_values(api, pattern, dst.shape, p, f, offset, channel_multiplier).reshape(p, f)
    keep = O.ARITH[n](v, np.zeros_like(v)).astype(bool)
    vals = C.read32(on_true_tile).reshape(p, f)
    C.write(dst, np.where(keep, vals, F32(on_false_value)))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "affine_select", (dst, on_true_tile))


def _pred(api: str, predicate: NkiTensor, p: int, f: int, reverse: bool) -> np.ndarray:
    C.same_pf(api, "predicate", C.onchip(api, "predicate", predicate), "dst", (p, f))
    if predicate.dtype not in _PRED_DTYPES:
        raise SimulatorConstraintError(api, "predicate", predicate.dtype, "an integer predicate dtype (uint8/16/32)")
    m = np.asarray(predicate.arr).reshape(p, f) != 0
    return ~m if reverse else m


def tensor_copy_predicated(dst: NkiTensor, src: Any, predicate: NkiTensor, reverse_pred: bool = False,
                           name: str | None = None, **removed: Any) -> None:
    """Where predicate != 0 copy src (tile or scalar) into dst; elsewhere dst keeps its value."""
    api = "nisa.tensor_copy_predicated"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "dst", dst)
    mask = _pred(api, predicate, p, f, reverse_pred)
    cur = np.array(dst.arr).reshape(p, f)
    if isinstance(src, NkiTensor):
        C.same_pf(api, "src", C.onchip(api, "src", src), "dst", (p, f))
        if src.dtype != dst.dtype:
            raise SimulatorConstraintError(api, "src", src.dtype, f"dtype == dst dtype ({dst.dtype})")
        if src.storage.buffer is PSUM and predicate.storage.buffer is PSUM:
            raise SimulatorConstraintError(api, "predicate", "nl.psum", "src and predicate cannot both be in PSUM")
        vals = np.asarray(src.arr).reshape(p, f)
        C.write_raw(dst, np.where(mask, vals, cur))
    else:
        conv = _dt.cast_for_store(np.asarray(src, dtype=np.float64 if dst.info.is_int else F32), dst.info)
        scalar = np.asarray(src if conv is None else conv).astype(cur.dtype)
        C.write_raw(dst, np.where(mask, scalar, cur))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "tensor_copy_predicated", [dst] + ([src] if isinstance(src, NkiTensor) else [])
                      + [predicate])


def select_reduce(dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false: Any,
                  reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_op: Any = None,
                  reverse_pred: bool = False, name: str | None = None, **removed: Any) -> None:
    """dst = where(predicate, on_true, on_false) with an optional row reduction (max) into reduce_res."""
    api = "nisa.select_reduce"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "on_true", C.onchip(api, "on_true", on_true), "dst", (p, f))
    if predicate.dtype not in (_dt.int8, _dt.uint8, _dt.int16, _dt.uint16):
        raise SimulatorConstraintError(api, "predicate", predicate.dtype, "int8/uint8/int16/uint16")
    if on_true.dtype in (_dt.tfloat32, _dt.int32, _dt.uint32):
        raise SimulatorConstraintError(api, "on_true", on_true.dtype, "not tfloat32/int32/uint32")
    mask = _pred(api, predicate, p, f, reverse_pred)
    fv = C.scalar_or_vector(api, "on_false", on_false, p, 2)
    y = np.where(mask, C.read32(on_true).reshape(p, f), fv).astype(F32)
    red = O.reduce_name(reduce_op) if reduce_op is not None else "maximum"
    if red != "maximum":
        raise SimulatorConstraintError(api, "reduce_op", red, "nl.maximum, the only reduction select_reduce supports "
                                       "(nki.isa.select_reduce API reference)")
    if reduce_res is not None or reduce_cmd is not _en.reduce_cmd.idle:
        regs = _state.current().dve_acc
        start = dst.pinfo()[0]
        update_registers(api, regs, start, p, reduce_cmd, red, _row_reduce(y, p, red))
        _read_out(api, reduce_res, regs, start, p)
    C.write(dst, y)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "select_reduce", (dst, predicate, on_true))


def range_select(dst: NkiTensor, on_true_tile: NkiTensor, comp_op0: Any, comp_op1: Any, bound0: Any, bound1: Any,
                 reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, reduce_res: NkiTensor | None = None,
                 reduce_op: Any = None, range_start: int = 0, on_false_value: float = FP32_MIN,
                 name: str | None = None, **removed: Any) -> None:
    """Keep elements whose free index (+range_start) satisfies both comparisons against per-row bounds."""
    api = "nisa.range_select"
    if removed:
        C.removed_kwargs(api, removed)
    C.need_version(api, 3)
    n0 = _cmp(api, "comp_op0", comp_op0)
    n1 = _cmp(api, "comp_op1", comp_op1)
    if float(on_false_value) != FP32_MIN:
        raise SimulatorConstraintError(api, "on_false_value", on_false_value, "-3.4028235e38 (FP32_MIN)")
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "on_true_tile", C.onchip(api, "on_true_tile", on_true_tile), "dst", (p, f))
    b0 = np.asarray(C.scalar_or_vector(api, "bound0", bound0, p, 2), dtype=F32)
    b1 = np.asarray(C.scalar_or_vector(api, "bound1", bound1, p, 2), dtype=F32)
    idx = (np.arange(f, dtype=F32) + F32(range_start))[None, :]
    keep = O.ARITH[n0](idx, b0).astype(bool) & O.ARITH[n1](idx, b1).astype(bool)
    y = np.where(keep, C.read32(on_true_tile).reshape(p, f), F32(FP32_MIN)).astype(F32)
    red = O.reduce_name(reduce_op) if reduce_op is not None else "maximum"
    regs = _state.current().dve_acc
    start = dst.pinfo()[0]
    update_registers(api, regs, start, p, reduce_cmd, red, _row_reduce(y, p, red))
    _read_out(api, reduce_res, regs, start, p)
    C.write(dst, y)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "range_select", (dst, on_true_tile))
