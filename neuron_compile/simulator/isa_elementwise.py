"""Element-wise compute instructions (REFERENCE 3.3): ``tensor_tensor``, ``tensor_scalar``,
``scalar_tensor_tensor`` (VectorE/GpSimd ALU), ``activation``/``activation_reduce`` (ScalarE, with
its per-lane fp32 accumulators), ``reciprocal`` and ``exponential`` (VectorE, NC-v4).

Inputs are read as fp32, computed in fp32 NumPy and rounded to the dst dtype on write; bit-vector
ops work on the raw integers. ``tensor_tensor`` whose data1, data2 *and* dst are all int32/uint32
defaults to GpSimd and uses native integer arithmetic (NKI docs: "when all input/output tiles are
int32 or uint32"): exact for every 32-bit value, wrapping modulo 2**32 like a native 32-bit ALU.
An fp32 (or other) dst, an explicit ``engine=nisa.engine.vector`` or a PSUM operand means Vector and
fp32 math.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import enums as _en
from neuron_compile.simulator import ops as O
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import targets as _targets
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.enums import check_enum, engine, reduce_cmd
from neuron_compile.simulator.tensor import PSUM, NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
_F32D = np.dtype(np.float32)
_UFUNCS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
           "minimum": np.minimum}
_INT32ISH = frozenset((_dt.int32, _dt.uint32))




def _alu(api: str, param: str, op: Any) -> str:
    n = O.opname(op)
    if n in O.ARITH or n in O.BITVEC:
        if n in O.V4_ONLY:
            C.need_version(f"{api} (op={n})", 4)
        if n in O.HW_UNSUPPORTED:
            C.warn(f"{api}: op=nl.{n} has no hardware ALU instruction (NKI Release Notes, known issues); simulated only")
        return n  # type: ignore[return-value]
    raise SimulatorConstraintError(api, param, n or op, "an ALU operator (nl.add, nl.multiply, nl.maximum, ...)")



def _out_fast(dst: NkiTensor, shape: tuple[int, ...]) -> np.ndarray | None:
    """dst's array when results can be computed straight into it (fp32 dst with the same shape)."""
    a = dst.arr
    return a if (a.dtype == _F32D and a.shape == shape and dst.dtype == _dt.float32) else None


def tensor_tensor(dst: NkiTensor, data1: NkiTensor, data2: NkiTensor, op: Any, engine: engine = engine.unknown,
                  name: str | None = None, **removed: Any) -> None:
    """dst = data1 <op> data2 (same partitions and elements per partition; not both in PSUM)."""
    api = "nisa.tensor_tensor"
    if removed:
        C.removed_kwargs(api, removed)
    n = _alu(api, "op", op)
    C.tensor(api, "data1", data1)
    C.tensor(api, "data2", data2)
    C.tensor(api, "dst", dst)
    # Native integer math only when every tile (dst included) is int32/uint32 (REFERENCE 1.7, 3.3).
    ints = data1.dtype in _INT32ISH and data2.dtype in _INT32ISH and dst.dtype in _INT32ISH
    anypsum = PSUM in (data1.storage.buffer, data2.storage.buffer, dst.storage.buffer)
    if n == "power" and anypsum:
        raise SimulatorConstraintError(api, "op", "nl.power", "operands outside PSUM: nl.power runs on GpSimd, which "
                                       "cannot access PSUM", "copy the PSUM operand to SBUF first")
    default = "gpsimd" if (n == "power" or ints) and not anypsum else "vector"
    eng = C.resolve_engine(api, engine, ("vector", "gpsimd"), default)
    g = eng == "gpsimd"
    pf = C.onchip(api, "dst", dst, g)
    C.same_pf(api, "data1", C.onchip(api, "data1", data1, g), "dst", pf)
    C.same_pf(api, "data2", C.onchip(api, "data2", data2, g), "dst", pf)
    if data1.storage.buffer is PSUM and data2.storage.buffer is PSUM:
        raise SimulatorConstraintError(api, "data2", "nl.psum", "data1 and data2 cannot both be in PSUM",
                                       "copy one of them to SBUF first")
    if n in O.BITVEC:
        for nm, t in (("data1", data1), ("data2", data2), ("dst", dst)):
            if not t.info.is_int:
                raise SimulatorConstraintError(api, nm, t.dtype, f"integer dtype for the bit-vector op nl.{n}")
        a = data1.arr
        b = data2.arr if data2.shape == a.shape else data2.arr.reshape(a.shape)
        C.write(dst, O.BITVEC[n](a, b))
    elif g and ints:
        a = data1.arr.astype(np.int64)
        b = data2.arr.astype(np.int64).reshape(a.shape)
        with np.errstate(all="ignore"):
            r = np.asarray(O.ARITH[n](a, b), dtype=np.int64)
        # A native 32-bit integer ALU wraps (two's complement); saturation is the float->int cast rule.
        C.write_raw(dst, r.astype(dst.arr.dtype))
    else:
        a = C.read32(data1)
        b = C.read32(data2)
        if b.shape != a.shape:
            b = b.reshape(a.shape)
        uf = _UFUNCS.get(n)
        out = _out_fast(dst, a.shape) if uf is not None else None
        if out is not None:
            uf(a, b, out=out)  # type: ignore[misc]
            C.mark_written(dst)
        else:
            C.write(dst, O.ARITH[n](a, b))
    if _trace.ACTIVE is not None:
        _trace.record(eng, "tensor_tensor", (dst, data1, data2))


def _stage(api: str, x: np.ndarray, n: str, operand: Any, reverse: bool, param: str) -> np.ndarray:
    if n in O.ALU_UNARY:
        if operand is not None and not (not isinstance(operand, np.ndarray) and operand == 0):
            raise SimulatorConstraintError(api, param, operand, f"0 or None for the unary op nl.{n}")
        return O.ALU_UNARY[n](x)
    if operand is None:
        raise SimulatorError(f"{api}: {param} is required for the binary op nl.{n}")
    f = O.ARITH[n]
    return f(operand, x) if reverse else f(x, operand)


def _opnd(api: str, name: str, v: Any, p: int, ndim: int) -> Any:
    if v is None:
        return None
    return C.scalar_or_vector(api, name, v, p, ndim)


def tensor_scalar(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reverse0: bool = False, op1: Any = None,
                  operand1: Any = None, reverse1: bool = False, engine: engine = engine.unknown,
                  name: str | None = None, **removed: Any) -> None:
    """dst = (data <op0> operand0) <op1> operand1 with scalar or (P,1) fp32 operands."""
    api = "nisa.tensor_scalar"
    if removed:
        C.removed_kwargs(api, removed)
    n0 = O.opname(op0)
    if n0 not in O.ALU_UNARY and n0 not in O.BITVEC_UNARY:
        n0 = _alu(api, "op0", op0)
    n1 = None if op1 is None else O.opname(op1)
    if op1 is not None and n1 not in O.ALU_UNARY and n1 not in O.BITVEC_UNARY:
        n1 = _alu(api, "op1", op1)
    bit0 = n0 in O.BITVEC or n0 in O.BITVEC_UNARY
    bit1 = n1 is not None and (n1 in O.BITVEC or n1 in O.BITVEC_UNARY)
    if n1 is not None and bit0 != bit1:
        raise SimulatorConstraintError(api, "op1", n1, f"same class as op0 nl.{n0} (both arithmetic or both bit-vector)")
    eng = C.resolve_engine(api, engine, ("vector", "scalar", "gpsimd"), "vector")
    if eng == "gpsimd" and n0 != "rsqrt":
        raise SimulatorConstraintError(api, "engine", "nisa.engine.gpsimd", "GpSimd tensor_scalar only for nl.rsqrt")
    if eng == "scalar":
        if bit0:
            raise SimulatorConstraintError(api, "engine", "nisa.engine.scalar", "bit-vector ops run on Vector only")
        if _targets.current_target() == "trn2" and (n0, n1) not in (("multiply", "add"), ("multiply", None),
                                                                     ("add", None)):
            raise SimulatorConstraintError(api, "op0", (n0, n1), "ScalarE on trn2 supports (multiply, add), "
                                           "(multiply, None), (add, None)")
    g = eng == "gpsimd"
    p, f = C.onchip(api, "dst", dst, g)
    C.same_pf(api, "data", C.onchip(api, "data", data, g), "dst", (p, f))
    if bit0:
        for nm, t in (("data", data), ("dst", dst)):
            if not t.info.is_int:
                raise SimulatorConstraintError(api, nm, t.dtype, "integer dtype for bit-vector ops")
        x = data.arr
        for n, opnd, nm in ((n0, operand0, "operand0"), (n1, operand1, "operand1")):
            if n is None:
                continue
            if n in O.BITVEC_UNARY:
                x = np.invert(x)
            else:
                v = C.scalar_or_vector(api, nm, opnd, p, x.ndim, fp32_only=False)
                v = np.asarray(v).astype(x.dtype) if not isinstance(opnd, NkiTensor) else \
                    np.asarray(opnd.arr).reshape(v.shape).astype(x.dtype)
                x = O.BITVEC[n](x, v)
        C.write(dst, x)
    else:
        x = C.read32(data)
        v0 = _opnd(api, "operand0", operand0, p, x.ndim)
        uf = _UFUNCS.get(n0)
        out = _out_fast(dst, x.shape) if (n1 is None and uf is not None and not reverse0) else None
        if out is not None:
            uf(x, v0, out=out)  # type: ignore[misc]
            C.mark_written(dst)
        else:
            y = _stage(api, x, n0, v0, reverse0, "operand0")
            if n1 is not None:
                y = _stage(api, y, n1, _opnd(api, "operand1", operand1, p, x.ndim), reverse1, "operand1")
            C.write(dst, y)
    if _trace.ACTIVE is not None:
        _trace.record(eng, "tensor_scalar", [dst, data] + [o for o in (operand0, operand1) if isinstance(o, NkiTensor)])


def scalar_tensor_tensor(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, op1: Any, operand1: NkiTensor,
                         reverse0: bool = False, reverse1: bool = False, name: str | None = None,
                         **removed: Any) -> None:
    """dst = (data <op0> operand0) <op1> operand1: operand0 scalar/(P,1), operand1 a full tile."""
    api = "nisa.scalar_tensor_tensor"
    if removed:
        C.removed_kwargs(api, removed)
    n0 = _alu(api, "op0", op0)
    n1 = _alu(api, "op1", op1)
    if n0 in O.BITVEC or n1 in O.BITVEC:
        raise SimulatorConstraintError(api, "op0", (n0, n1), "arithmetic ops only")
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "data", C.onchip(api, "data", data), "dst", (p, f))
    C.same_pf(api, "operand1", C.onchip(api, "operand1", operand1), "dst", (p, f))
    if data.storage.buffer is PSUM and operand1.storage.buffer is PSUM:
        raise SimulatorConstraintError(api, "operand1", "nl.psum", "data and operand1 cannot both be in PSUM")
    x = C.read32(data)
    # any dtype: "All input tiles can be any supported NKI data type", cast to fp32 (unlike tensor_scalar's operands)
    y = _stage(api, x, n0, C.scalar_or_vector(api, "operand0", operand0, p, x.ndim, fp32_only=False), reverse0,
               "operand0")
    t = C.read32(operand1)
    if t.shape != y.shape:
        t = t.reshape(y.shape)
    C.write(dst, O.ARITH[n1](t, y) if reverse1 else O.ARITH[n1](y, t))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "scalar_tensor_tensor", (dst, data, operand1))


# ------------------------------------------------------------------------------ accumulator registers

_COMBINE = {"add": np.add, "maximum": np.maximum, "minimum": np.minimum, "multiply": np.multiply,
            "abs_max": O._abs_max, "abs_min": O._abs_min}


def update_registers(api: str, regs: np.ndarray, start: int, p: int, cmd: Any, red: str, partial: np.ndarray | None,
                     init: Any = None) -> None:
    """Apply ``reduce_cmd`` to the lanes [start, start+p) with the per-partition ``partial`` results."""
    cmd = check_enum(cmd, reduce_cmd, api, "reduce_cmd")
    lanes = regs[start:start + p]
    if cmd is reduce_cmd.idle:
        return
    if cmd is reduce_cmd.reset:
        lanes[...] = O.REDUCE_IDENTITY.get(red, 0.0)
        return
    if partial is None:
        return
    if cmd is reduce_cmd.reset_reduce:
        lanes[...] = partial
    elif cmd is reduce_cmd.reduce:
        lanes[...] = _COMBINE[red](lanes, partial)
    else:  # load_reduce
        base = O.REDUCE_IDENTITY.get(red, 0.0) if init is None else init
        if isinstance(base, NkiTensor):
            base = C.read32(base).reshape(-1)
        lanes[...] = _COMBINE[red](np.asarray(base, dtype=F32), partial)


def _read_out(api: str, reduce_res: NkiTensor | None, regs: np.ndarray, start: int, p: int, negate: bool = False) -> None:
    if reduce_res is None:
        return
    rp, rf = C.onchip(api, "reduce_res", reduce_res)
    if rp != p or rf != 1:
        raise SimulatorConstraintError(api, "reduce_res", reduce_res.shape, f"a ({p}, 1) tile")
    vals = regs[start:start + p].reshape(p, 1)
    C.write(reduce_res, -vals if negate else vals)


def _row_reduce(y: np.ndarray, p: int, red: str) -> np.ndarray:
    flat = y.reshape(p, -1)
    if red == "add":
        return flat.sum(axis=1, dtype=F32)
    return O.REDUCERS[red](flat, (1,), False).astype(F32)


def _activation(api: str, instr: str, dst: NkiTensor, op: Any, data: NkiTensor, bias: Any, scale: Any,
                reduce_op: Any, reduce_res: NkiTensor | None, cmd: Any) -> None:
    n = O.opname(op)
    if n not in O.ACTIVATIONS:
        raise SimulatorConstraintError(api, "op", n or op, "a function of the activation table (NKI API reference, 'Supported Activation Functions'): "
                                       + ", ".join(sorted(O.ACTIVATIONS)))
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "data", C.onchip(api, "data", data), "dst", (p, f))
    x = C.read32(data)
    fresh = False
    if not (isinstance(scale, (int, float)) and scale == 1.0):
        s = C.scalar_or_vector(api, "scale", scale, p, x.ndim)
        x = x * s
        fresh = True
    if bias is not None:
        if isinstance(bias, NkiTensor):
            if bias.dtype == _dt.tfloat32:
                raise SimulatorConstraintError(api, "bias", bias.dtype, "any dtype but tfloat32")
            b = C.scalar_or_vector(api, "bias", bias, p, x.ndim, fp32_only=False)
        else:
            if _targets.nc_version() < 3:
                raise SimulatorConstraintError(api, "bias", bias, "a (P, 1) tile on trn1 (scalar bias needs NC-v3+)")
            b = C.scalar_or_vector(api, "bias", bias, p, x.ndim)
        if fresh:
            np.add(x, b, out=x)
        else:
            x = x + b
            fresh = True
    rng = O.ACT_RANGES.get(n)
    if rng is not None and x.size:
        lo, hi = rng
        if n == "reciprocal":
            ax = np.abs(x)
            bad = bool(np.nanmin(ax) < lo or np.nanmax(ax) > hi) if not np.isnan(ax).all() else False
        else:
            bad = bool(np.nanmin(x) < lo or np.nanmax(x) > hi) if not np.isnan(x).all() else False
        if bad:
            C.warn(f"{api}: op=nl.{n} input outside its valid range [{lo:g}, {hi:g}] (tensor '{data.name}'): "
                   "hardware results are undefined there")
    if n == "exp":
        with np.errstate(over="ignore"):
            y = np.exp(x, out=x) if fresh else np.exp(x)
    elif n == "copy":
        y = x
    else:
        y = O.ACTIVATIONS[n](x)
    if reduce_op is not None or reduce_res is not None or cmd is not reduce_cmd.idle:
        red = O.reduce_name(reduce_op) if reduce_op is not None else "add"
        if red != "add":
            raise SimulatorConstraintError(api, "reduce_op", red, "nl.add")
        regs = _state.current().act_acc
        start = dst.pinfo()[0]
        update_registers(api, regs, start, p, cmd, "add", _row_reduce(y, p, "add"))
        _read_out(api, reduce_res, regs, start, p)
    out = _out_fast(dst, y.shape)
    if out is not None:
        out[...] = y
        C.mark_written(dst)
    else:
        C.write(dst, y)
    if _trace.ACTIVE is not None:
        # A reduce_res read-out is an extra accumulator read (REFERENCE 3.3): traced as activation_reduce.
        instr = "activation_reduce" if reduce_res is not None else instr
        _trace.record("scalar", instr, [dst, data] + [t for t in (bias, scale, reduce_res) if isinstance(t, NkiTensor)])


def activation(dst: NkiTensor, op: Any, data: NkiTensor, bias: Any = None, scale: Any = 1.0, reduce_op: Any = None,
               reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
               name: str | None = None, **removed: Any) -> None:
    """dst = op(data * scale + bias) on ScalarE, optionally reducing (add) into its accumulators."""
    if removed:
        C.removed_kwargs("nisa.activation", removed)
    _activation("nisa.activation", "activation", dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd)


def activation_reduce(dst: NkiTensor, op: Any, data: NkiTensor, reduce_op: Any, reduce_res: NkiTensor,
                      bias: Any = None, scale: Any = 1.0, name: str | None = None, **removed: Any) -> None:
    """Legacy form of ``activation(..., reduce_cmd=reset_reduce, reduce_res=...)``."""
    if removed:
        C.removed_kwargs("nisa.activation_reduce", removed)
    _activation("nisa.activation_reduce", "activation_reduce", dst, op, data, bias, scale, reduce_op, reduce_res,
                reduce_cmd.reset_reduce)


def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """dst = 1 / data on VectorE (fp32)."""
    api = "nisa.reciprocal"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "data", C.onchip(api, "data", data), "dst", (p, f))
    with np.errstate(divide="ignore"):
        C.write(dst, np.reciprocal(C.read32(data)))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "reciprocal", (dst, data))


def exponential(dst: NkiTensor, src: NkiTensor, max_value: Any = 0.0, reduce_res: NkiTensor | None = None,
                reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_init: Any = 0.0, name: str | None = None,
                **removed: Any) -> None:
    """dst = exp(src - max_value) on VectorE (NC-v4), optional running sum in the Vector accumulators."""
    api = "nisa.exponential"
    if removed:
        C.removed_kwargs(api, removed)
    C.need_version(api, 4)
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "src", C.onchip(api, "src", src), "dst", (p, f))
    if src.ndim > 4:
        raise SimulatorConstraintError(api, "src", src.shape, "up to 4-D")
    x = C.read32(src)
    m = C.scalar_or_vector(api, "max_value", max_value, p, x.ndim)
    with np.errstate(over="ignore"):
        y = np.exp(x - m)
    if reduce_res is not None or reduce_cmd is not _en.reduce_cmd.idle:
        regs = _state.current().dve_acc
        start = dst.pinfo()[0]
        init = reduce_init if isinstance(reduce_init, NkiTensor) else F32(reduce_init)
        update_registers(api, regs, start, p, reduce_cmd, "add", _row_reduce(y, p, "add"), init)
        _read_out(api, reduce_res, regs, start, p)
    C.write(dst, y)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "exponential", (dst, src))


_ACT2_PAIRS = frozenset((("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
                         ("subtract", "bypass"), ("bypass", "bypass")))
_ACT2_REDUCE = ("add", "maximum", "minimum", "abs_max", "abs_min")


def activate2(dst: NkiTensor, op: Any, data: NkiTensor, imm0: Any, imm1: Any, op0: Any, op1: Any,
              relu_param: Any = 0.0, reverse0: bool = False, reverse1: bool = False, reduce_op: Any = None,
              reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle, name: str | None = None,
              **removed: Any) -> None:
    """dst = op((data <op0> imm0) <op1> imm1) on ScalarE (NC-v4); (op0, op1) is one of the six documented
    pairs (nl.bypass skips a stage); ``relu_param`` is the negative slope of nl.prelu; an optional
    free-dim reduction (add, maximum, minimum, abs_max, abs_min) goes to the ScalarE accumulators."""
    api = "nisa.activate2"
    if removed:
        C.removed_kwargs(api, removed)
    C.need_version(api, 4)
    n = O.opname(op)
    if n not in O.ACTIVATIONS:
        raise SimulatorConstraintError(api, "op", n or op, "a function of the activation table (NKI API reference, "
                                       "'Supported Activation Functions')")
    n0, n1 = O.opname(op0) or "bypass", O.opname(op1) or "bypass"
    if (n0, n1) not in _ACT2_PAIRS:
        raise SimulatorConstraintError(api, "op0", (n0, n1), "one of (multiply, add), (multiply, subtract), "
                                       "(multiply, bypass), (add, bypass), (subtract, bypass), (bypass, bypass)")
    if reverse0 and n0 == "bypass" or reverse1 and n1 == "bypass":
        raise SimulatorError(f"{api}: reverse0/reverse1 need op0/op1 to be set (not nl.bypass)")
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "data", C.onchip(api, "data", data), "dst", (p, f))
    x = C.read32(data).reshape(p, f)
    for stage, imm, reverse, param in ((n0, imm0, reverse0, "imm0"), (n1, imm1, reverse1, "imm1")):
        if stage == "bypass":
            continue
        v = C.scalar_or_vector(api, param, imm, p, 2, fp32_only=False)
        x = O.ARITH[stage](v, x) if reverse else O.ARITH[stage](x, v)
    if n == "prelu":
        slope = C.scalar_or_vector(api, "relu_param", relu_param, p, 2, fp32_only=False)
        y = np.where(x >= 0, x, x * slope).astype(F32)
    elif n == "copy":
        y = x
    else:
        with np.errstate(over="ignore"):
            y = O.ACTIVATIONS[n](x)
    if reduce_op is not None or reduce_res is not None or reduce_cmd is not _en.reduce_cmd.idle:
        red = O.reduce_name(reduce_op) if reduce_op is not None else "add"
        if red not in _ACT2_REDUCE:
            raise SimulatorConstraintError(api, "reduce_op", red, "nl.add, nl.maximum, nl.minimum, nl.abs_max or "
                                           "nl.abs_min")
        regs = _state.current().act_acc
        start = dst.pinfo()[0]
        update_registers(api, regs, start, p, reduce_cmd, red, _row_reduce(y, p, red))
        _read_out(api, reduce_res, regs, start, p)
    C.write(dst, y.reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("scalar", "activate2", [dst, data] + [t for t in (imm0, imm1, reduce_res)
                                                            if isinstance(t, NkiTensor)])
