"""Reductions, scans and statistics (REFERENCE 3.4): ``tensor_reduce``, ``tensor_partition_reduce``,
``tensor_scalar_reduce``, ``tensor_scalar_cumulative``, ``tensor_tensor_scan``, ``bn_stats``/``bn_aggr``,
``max8``, ``nc_find_index8``. Vector-accumulator users share the registers of :mod:`state`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import enums as _en
from neuron_compile.simulator import ops as O
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.enums import check_enum, reduce_cmd
from neuron_compile.simulator.isa_elementwise import _read_out, _row_reduce, _stage, update_registers
from neuron_compile.simulator.tensor import NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
_INT32ISH = ("int32", "uint32")


def _reduce_op(api: str, param: str, op: Any, allowed: Any = None) -> str:
    n = O.reduce_name(op)
    ok = O.REDUCERS if allowed is None else allowed
    if n not in ok:
        raise SimulatorConstraintError(api, param, O.opname(op) or op, "a reduction op: " + ", ".join(sorted(ok)))
    return n  # type: ignore[return-value]


def tensor_reduce(dst: NkiTensor, op: Any, data: NkiTensor, axis: Any, negate: bool = False, keepdims: bool = False,
                  name: str | None = None, **removed: Any) -> None:
    """dst = reduce(op) of data over trailing free axes (optionally negated)."""
    api = "nisa.tensor_reduce"
    if removed:
        C.removed_kwargs(api, removed)
    n = _reduce_op(api, "op", op)
    p, f = C.onchip(api, "data", data)
    pd, fd = C.onchip(api, "dst", dst)
    nd = data.ndim
    axes = tuple(sorted({(int(a) + nd if int(a) < 0 else int(a)) for a in ((axis,) if isinstance(axis, (int, np.integer))
                                                                            else axis)}))
    if not axes or axes[0] <= 0:
        raise SimulatorConstraintError(api, "axis", axis, "free axes only (the partition axis 0 cannot be reduced)")
    if axes != tuple(range(axes[0], nd)):
        raise SimulatorConstraintError(api, "axis", axis, f"the trailing contiguous free axes (e.g. {tuple(range(nd - 1, nd))} "
                                       f"or {tuple(range(1, nd))}) of a {nd}-D tensor")
    keep = math.prod(data.shape[1:axes[0]])
    if pd != p or fd != keep:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{p} partitions x {keep} elements (the reduced shape)")
    if n in O.BITVEC_REDUCE:
        if not (data.info.is_int and dst.info.is_int):
            raise SimulatorConstraintError(api, "data", data.dtype, f"integer dtype for nl.{n}")
        r = O.REDUCERS[n](data.arr, axes, keepdims)
    else:
        r = O.REDUCERS[n](C.read32(data), axes, keepdims)
        if negate:
            r = np.negative(r)
    C.write(dst, r)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "tensor_reduce", (dst, data), main=data)


def tensor_partition_reduce(dst: NkiTensor, op: Any, data: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """dst[1, F] = reduce(op) of data over the partition axis (GpSimd)."""
    api = "nisa.tensor_partition_reduce"
    if removed:
        C.removed_kwargs(api, removed)
    name_ = O.opname(op)
    allowed = ("add", "average", "maximum", "max", "bitwise_or", "bitwise_and")
    if name_ not in allowed:
        raise SimulatorConstraintError(api, "op", name_ or op, "one of nl.add, nl.average, nl.maximum, "
                                       "nl.bitwise_or, nl.bitwise_and")
    p, f = C.onchip(api, "data", data, gpsimd=True)
    pd, fd = C.onchip(api, "dst", dst, gpsimd=True)
    if pd != 1 or fd != f:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"1 partition x {f} elements")
    if name_ in ("bitwise_or", "bitwise_and"):
        x = np.asarray(data.arr).reshape(p, f)
        r = (np.bitwise_or if name_ == "bitwise_or" else np.bitwise_and).reduce(x, axis=0)
    else:
        x = C.read32(data).reshape(p, f)
        r = x.sum(axis=0, dtype=F32) if name_ == "add" else (x.mean(axis=0, dtype=F32) if name_ == "average"
                                                             else x.max(axis=0))
    C.write(dst, r.reshape(1, f))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "tensor_partition_reduce", (dst, data), main=data)


def tensor_scalar_reduce(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reduce_op: Any,
                         reduce_res: NkiTensor | None = None, reverse0: bool = False,
                         reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, reduce_init: Any = None,
                         reduce_res_negate: bool = False, name: str | None = None, **removed: Any) -> None:
    """dst = data <op0> operand0, plus a free-dim reduction into the Vector accumulators."""
    api = "nisa.tensor_scalar_reduce"
    if removed:
        C.removed_kwargs(api, removed)
    if reverse0:
        raise SimulatorConstraintError(api, "reverse0", True, "False (reverse0 is not supported yet)")
    n0 = O.opname(op0)
    if n0 not in O.ARITH and n0 not in O.ALU_UNARY:
        raise SimulatorConstraintError(api, "op0", n0 or op0, "an arithmetic ALU op")
    red = _reduce_op(api, "reduce_op", reduce_op, ("add", "multiply", "maximum", "minimum"))
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "data", C.onchip(api, "data", data), "dst", (p, f))
    x = C.read32(data)
    y = _stage(api, x, n0, C.scalar_or_vector(api, "operand0", operand0, p, x.ndim), False, "operand0")
    regs = _state.current().dve_acc
    start = dst.pinfo()[0]
    update_registers(api, regs, start, p, reduce_cmd, red, _row_reduce(y, p, red), reduce_init)
    _read_out(api, reduce_res, regs, start, p, negate=reduce_res_negate)
    C.write(dst, y)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "tensor_scalar_reduce", (dst, data))


_SCANS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


def tensor_scalar_cumulative(dst: NkiTensor, src: NkiTensor, op0: Any, op1: Any, imm0: Any, imm1: Any = None,
                             reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, name: str | None = None,
                             **removed: Any) -> None:
    """Running scan along the free dim: reg = op1(op0(x_i, imm0), reg); dst_i = reg."""
    api = "nisa.tensor_scalar_cumulative"
    if removed:
        C.removed_kwargs(api, removed)
    n0 = O.opname(op0)
    if n0 not in O.ARITH:
        raise SimulatorConstraintError(api, "op0", n0 or op0, "an arithmetic ALU op")
    n1 = _reduce_op(api, "op1", op1, ("add", "subtract", "multiply", "maximum", "minimum"))
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "src", C.onchip(api, "src", src), "dst", (p, f))
    for nm, t in (("src", src), ("dst", dst)):
        if t.dtype in _INT32ISH:
            raise SimulatorConstraintError(api, nm, t.dtype, "no int32/uint32 input or output")
    x = C.read32(src).reshape(p, f)
    v = _stage(api, x, n0, C.scalar_or_vector(api, "imm0", imm0, p, 2), False, "imm0")
    regs = _state.current().dve_acc
    start = dst.pinfo()[0]
    cmd = check_enum(reduce_cmd, _en.reduce_cmd, api, "reduce_cmd")
    if cmd is _en.reduce_cmd.reduce:
        init = regs[start:start + p].copy()
    elif cmd is _en.reduce_cmd.load_reduce:
        init = np.broadcast_to(np.asarray(C.scalar_or_vector(api, "imm1", 0.0 if imm1 is None else imm1, p, 1),
                                          dtype=F32).reshape(-1), (p,)).copy()
    else:
        init = np.full(p, O.REDUCE_IDENTITY[n1], dtype=F32)
    if n1 in _SCANS:
        uf = _SCANS[n1]
        out = uf.accumulate(np.concatenate([init[:, None], v], axis=1), axis=1)[:, 1:].astype(F32)
    else:
        out = np.empty_like(v)
        reg = init
        for i in range(f):
            reg = v[:, i] - reg
            out[:, i] = reg
    if f:
        regs[start:start + p] = out[:, -1]
    C.write(dst, out)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "tensor_scalar_cumulative", (dst, src))


def tensor_tensor_scan(dst: NkiTensor, data0: NkiTensor, data1: NkiTensor, initial: Any, op0: Any, op1: Any,
                       reverse0: bool = False, reverse1: bool = False, name: str | None = None,
                       **removed: Any) -> None:
    """r_i = op1(op0(data0_i, r_{i-1}), data1_i) per partition, r_{-1} = initial."""
    api = "nisa.tensor_tensor_scan"
    if removed:
        C.removed_kwargs(api, removed)
    n0 = O.opname(op0)
    n1 = O.opname(op1)
    for nm, n, op in (("op0", n0, op0), ("op1", n1, op1)):
        if n not in O.ARITH:
            raise SimulatorConstraintError(api, nm, n or op, "an arithmetic ALU op")
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "data0", C.onchip(api, "data0", data0), "dst", (p, f))
    C.same_pf(api, "data1", C.onchip(api, "data1", data1), "dst", (p, f))
    a = C.read32(data0).reshape(p, f)
    b = C.read32(data1).reshape(p, f)
    init = C.scalar_or_vector(api, "initial", initial, p, 1, fp32_only=False)
    reg = np.broadcast_to(np.asarray(init, dtype=F32).reshape(-1), (p,)).copy()
    f0, f1 = O.ARITH[n0], O.ARITH[n1]  # type: ignore[index]
    out = np.empty((p, f), dtype=F32)
    for i in range(f):
        t = f0(reg, a[:, i]) if reverse0 else f0(a[:, i], reg)
        reg = f1(b[:, i], t) if reverse1 else f1(t, b[:, i])
        out[:, i] = reg
    C.write(dst, out)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "tensor_tensor_scan", (dst, data0, data1))


def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """Per partition: (count, mean, var*count) of the even elements, then the same of the odd ones."""
    api = "nisa.bn_stats"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "data", data)
    pd, fd = C.onchip(api, "dst", dst)
    if f > 512:
        raise SimulatorConstraintError(api, "data", f, "free size <= 512 (bn_stats_fmax); one bn_stats per 512-chunk")
    if pd != p or fd != 6:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{p} partitions x 6 elements")
    x = C.read32(data).reshape(p, f)
    rec = np.zeros((p, 6), dtype=F32)
    for j, part in enumerate((x[:, 0::2], x[:, 1::2])):
        cnt = part.shape[1]
        rec[:, 3 * j] = cnt
        if cnt:
            mean = part.mean(axis=1, dtype=np.float64).astype(F32)  # a running mean: no overflow of a sum
            rec[:, 3 * j + 1] = mean
            rec[:, 3 * j + 2] = np.square(part - mean[:, None]).sum(axis=1, dtype=F32)
    C.write(dst, rec)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "bn_stats", (dst, data), main=data)


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """Combine (count, mean, var*count) triples into (mean, population variance) per partition."""
    api = "nisa.bn_aggr"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "data", data)
    pd, fd = C.onchip(api, "dst", dst)
    if f % 3:
        raise SimulatorConstraintError(api, "data", f, "elements per partition a multiple of 3 (bn_stats records)")
    if pd != p or fd != 2:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{p} partitions x 2 elements (mean, var)")
    t = C.read32(data).reshape(p, f // 3, 3).astype(np.float64)
    cnt, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    n = cnt.sum(axis=1)
    with np.errstate(all="ignore"):
        mu = (cnt * mean).sum(axis=1) / n
        var = (m2 + cnt * np.square(mean - mu[:, None])).sum(axis=1) / n
    C.write(dst, np.stack([mu, var], axis=1).astype(F32))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "bn_aggr", (dst, data))


def max8(dst: NkiTensor, src: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """The 8 largest values per partition, descending."""
    api = "nisa.max8"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "src", src)
    pd, fd = C.onchip(api, "dst", dst)
    if not 8 <= f <= 16384:
        raise SimulatorConstraintError(api, "src", f, "8..16384 elements per partition")
    if pd != p or fd != 8:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{p} partitions x 8 elements")
    x = C.read32(src).reshape(p, f)
    top = -np.sort(-x, axis=1)[:, :8]
    C.write(dst, top)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "max8", (dst, src), main=src)


def nc_find_index8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """dst[p, k] = first index of vals[p, k] in data[p] (uint32; 0xFFFFFFFF when absent)."""
    api = "nisa.nc_find_index8"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "data", data)
    pv, fv = C.onchip(api, "vals", vals)
    pd, fd = C.onchip(api, "dst", dst)
    if fv != 8 or pv != p or pd != p or fd != 8:
        raise SimulatorConstraintError(api, "vals", vals.shape, f"({p}, 8) values and a ({p}, 8) dst")
    if dst.info.kind not in ("u", "i"):
        raise SimulatorConstraintError(api, "dst", dst.dtype, "an integer (uint32) dtype")
    x = C.read32(data).reshape(p, f)
    v = C.read32(vals).reshape(p, 8)
    eq = x[:, None, :] == v[:, :, None]
    idx = np.where(eq.any(axis=2), eq.argmax(axis=2), 0xFFFFFFFF).astype(np.int64)
    C.write(dst, idx)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "nc_find_index8", (dst, data, vals), main=data)
