"""``nl`` compute wrappers (REFERENCE 2.2-2.4): each allocates its result tile and runs (and
records) the ``nisa`` instruction(s) it stands for. The functions double as opcodes (``op=nl.add``):
each carries ``_nki_op``. Wrappers that hardware rejects (``divide``, ``fmod``, ``mod``,
``power(tile, scalar)``, ``matmul`` without ``transpose_x``) work but warn (REFERENCE 0.1).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import isa_elementwise as E
from neuron_compile.simulator import isa_matmul as MM
from neuron_compile.simulator import isa_movement as MV
from neuron_compile.simulator import isa_reduce as R
from neuron_compile.simulator import ops as O
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.allocation import allocate
from neuron_compile.simulator.enums import engine, reduce_cmd
from neuron_compile.simulator.tensor import PSUM, SBUF, NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
_ACT_ENGINE_OPS = frozenset(O.ACTIVATIONS) - {"reciprocal", "rsqrt", "sin", "copy"}


def _opcode(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.__name__ = name
    fn.__qualname__ = name
    fn._nki_op = name  # type: ignore[attr-defined]
    return fn


def _new(shape: tuple[int, ...], dtype: Any, api: str, buffer: Any = SBUF) -> NkiTensor:
    return allocate(shape, dtype, buffer, "", api)


def _tile(api: str, x: Any, name: str = "x") -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise SimulatorError(f"{api}: {name} must be a tile, got {type(x).__name__}")
    if not x.on_chip:
        raise SimulatorError(f"{api}: {name} is in nl.{x.buffer.value}; load it into SBUF first (nl.load / "
                             "nisa.dma_copy)")
    return x


def _as_f32_vector(api: str, v: NkiTensor) -> NkiTensor:
    if v.dtype == _dt.float32:
        return v
    t = _new(v.shape, _dt.float32, api)
    MV.tensor_copy(t, v)
    return t


def _binary(name: str, x: Any, y: Any, dtype: Any) -> NkiTensor:
    api = f"nl.{name}"
    if name in O.HW_UNSUPPORTED:
        C.warn(f"{api} is not supported on hardware (NKI Release Notes, known issues); use nl.multiply(x, nl.reciprocal(y)) for divide")
    xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    if not (xt or yt):
        raise SimulatorError(f"{api}: at least one operand must be a tile")
    op = _BY_NAME[name]
    if xt and yt:
        _tile(api, x, "x")
        _tile(api, y, "y")
        if x.shape != y.shape:
            if y.shape == (x.shape[0], 1) or (y.ndim == x.ndim and y.shape[0] == x.shape[0] and
                                               all(n == 1 for n in y.shape[1:])):
                out = _new(x.shape, dtype or x.dtype, api)
                E.tensor_scalar(out, x, op, _as_f32_vector(api, y.reshape((y.shape[0], 1)) if y.ndim != 2 else y))
                return out
            if x.shape[1:] == (1,) * (x.ndim - 1) and x.shape[0] == y.shape[0]:
                out = _new(y.shape, dtype or y.dtype, api)
                E.tensor_scalar(out, y, op, _as_f32_vector(api, x if x.ndim == 2 else x.reshape((x.shape[0], 1))),
                                reverse0=True)
                return out
            x, y = _broadcast_free(api, x, y)
        out = _new(x.shape, dtype or x.dtype, api)
        E.tensor_tensor(out, x, y, op)
        return out
    if name == "power" and xt:
        C.warn("nl.power(tile, scalar) is not supported on hardware (only tile ** tile)")
    t, s, rev = (x, y, False) if xt else (y, x, True)
    _tile(api, t)
    out = _new(t.shape, dtype or t.dtype, api)
    if not isinstance(s, (bool, int, float, np.integer, np.floating)):
        raise SimulatorError(f"{api}: operand must be a tile or a scalar, got {type(s).__name__}")
    E.tensor_scalar(out, t, op, s, reverse0=rev)
    return out


def _broadcast_free(api: str, x: NkiTensor, y: NkiTensor) -> tuple[NkiTensor, NkiTensor]:
    if x.ndim != y.ndim or x.shape[0] != y.shape[0]:
        raise SimulatorError(f"{api}: shapes {x.shape} and {y.shape} do not broadcast (partition dims must match; "
                             "broadcast across partitions explicitly)")
    for d in range(1, x.ndim):
        if x.shape[d] != y.shape[d]:
            if y.shape[d] == 1:
                y = y.broadcast(d, x.shape[d])
            elif x.shape[d] == 1:
                x = x.broadcast(d, y.shape[d])
            else:
                raise SimulatorError(f"{api}: shapes {x.shape} and {y.shape} do not broadcast")
    return x, y


def _unary(name: str, x: Any, dtype: Any) -> NkiTensor:
    api = f"nl.{name}"
    _tile(api, x)
    out = _new(x.shape, dtype or x.dtype, api)
    fn = _BY_NAME[name]
    if name in _ACT_ENGINE_OPS:
        E.activation(out, fn, x)
    elif name == "copy":
        MV.tensor_copy(out, x)
    elif name == "reciprocal":
        E.reciprocal(out, x)
    elif name == "rsqrt":
        E.tensor_scalar(out, x, fn, None, engine=engine.gpsimd)
    elif name == "negative":
        E.activation(out, _BY_NAME["copy"], x, scale=-1.0)
    elif name == "logical_not":
        E.tensor_scalar(out, x, _BY_NAME["logical_xor"], 1.0)
    elif name == "invert":
        E.tensor_scalar(out, x, fn, None)
    else:  # sin (range-reduced), cos, tan, ceil, floor, trunc: no single instruction
        f = np.sin if name == "sin" else O.EXTRA_UNARY[name]
        C.write(out, f(C.read32(x)))
        if _trace.ACTIVE is not None:
            eng = "vector" if name in ("ceil", "floor", "trunc") else "scalar"
            _trace.record(eng, "activation" if eng == "scalar" else "tensor_scalar", (out, x))
    return out


_BY_NAME: dict[str, Callable[..., Any]] = {}
_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "abs_max", "abs_min", "power", "equal",
           "not_equal", "less", "less_equal", "greater", "greater_equal", "bitwise_and", "bitwise_or",
           "bitwise_xor", "left_shift", "right_shift", "logical_and", "logical_or", "logical_xor", "fmod", "mod")
_UNARY = ("abs", "square", "invert", "logical_not", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu",
          "gelu_apprx_sigmoid", "gelu_apprx_tanh", "gelu_dx", "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "softplus",
          "mish", "erf", "erf_dx", "reciprocal", "copy", "sin", "cos", "tan", "arctan", "ceil", "floor", "trunc",
          "negative", "sign")


def _mk_binary(name: str) -> Callable[..., NkiTensor]:
    def fn(x: Any, y: Any, dtype: Any = None) -> NkiTensor:
        return _binary(name, x, y, dtype)
    return _opcode(name, fn)


def _mk_unary(name: str) -> Callable[..., NkiTensor]:
    def fn(x: Any, dtype: Any = None) -> NkiTensor:
        return _unary(name, x, dtype)
    return _opcode(name, fn)


for _n in _BINARY:
    _BY_NAME[_n] = _mk_binary(_n)
for _n in _UNARY:
    _BY_NAME[_n] = _mk_unary(_n)


# ------------------------------------------------------------------------------------ reductions

def _axes(api: str, x: NkiTensor, axis: Any) -> tuple[int, ...]:
    ax = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(sorted(int(a) + x.ndim if int(a) < 0 else int(a) for a in ax))


def _reduced_shape(x: NkiTensor, axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    shp = tuple(n for d, n in enumerate(x.shape) if d not in axes)
    return shp if len(shp) >= 2 else shp + (1,) * (2 - len(shp))


def _reduction(name: str, red: str) -> Callable[..., NkiTensor]:
    def fn(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
        api = f"nl.{name}"
        _tile(api, x)
        axes = _axes(api, x, axis)
        out = _new(_reduced_shape(x, axes, keepdims), dtype or x.dtype, api)
        R.tensor_reduce(out, _BY_NAME[red], x, axes, keepdims=keepdims)
        return out
    return _opcode(name, fn)


_BY_NAME["sum"] = _reduction("sum", "add")
_BY_NAME["max"] = _reduction("max", "maximum")
_BY_NAME["min"] = _reduction("min", "minimum")
_BY_NAME["prod"] = _reduction("prod", "multiply")


def _all(x: Any, axis: Any, dtype: Any = None) -> NkiTensor:
    _tile("nl.all", x)
    axes = _axes("nl.all", x, axis)
    out = _new(_reduced_shape(x, axes, False), dtype or x.dtype, "nl.all")
    R.tensor_reduce(out, _BY_NAME["logical_and"], x, axes)
    return out


def _mean(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    _tile("nl.mean", x)
    axes = _axes("nl.mean", x, axis)
    shp = _reduced_shape(x, axes, keepdims)
    acc = _new(shp, _dt.float32, "nl.mean")  # fp32 internally
    R.tensor_reduce(acc, _BY_NAME["add"], x, axes, keepdims=keepdims)
    out = _new(shp, dtype or x.dtype, "nl.mean")
    E.tensor_scalar(out, acc, _BY_NAME["multiply"], 1.0 / math.prod(x.shape[a] for a in axes))
    return out


def _var(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    _tile("nl.var", x)
    axes = _axes("nl.var", x, axis)
    shp = _reduced_shape(x, axes, True)  # var always keeps dims (REFERENCE 2.4)
    out = _new(shp, dtype or x.dtype, "nl.var")
    v = C.read32(x).astype(np.float64).var(axis=axes, keepdims=True)
    C.write(out, v.astype(F32))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "bn_stats", (x,))
        _trace.record("vector", "bn_aggr", (out,))
    return out


_BY_NAME["all"] = _opcode("all", _all)
_BY_NAME["mean"] = _opcode("mean", _mean)
_BY_NAME["var"] = _opcode("var", _var)


def softmax(x: Any, axis: Any = -1, dtype: Any = None) -> NkiTensor:
    """exp(x - max) / sum(exp(x - max)) along free axes (max, exp+sum, reciprocal, multiply)."""
    api = "nl.softmax"
    _tile(api, x)
    axes = _axes(api, x, axis)
    if 0 in axes:
        raise C.SimulatorConstraintError(api, "axis", axis, "free axes only")
    p = x.shape[0]
    out = _new(x.shape, dtype or x.dtype, api)
    if axes == tuple(range(1, x.ndim)):
        nmax = _new((p, 1), _dt.float32, api)
        R.tensor_reduce(nmax, _BY_NAME["maximum"], x, axes, negate=True)
        e = _new(x.shape, _dt.float32, api)
        s = _new((p, 1), _dt.float32, api)
        E.activation(e, _BY_NAME["exp"], x, bias=nmax, reduce_op=_BY_NAME["add"], reduce_res=s,
                     reduce_cmd=reduce_cmd.reset_reduce)
        r = _new((p, 1), _dt.float32, api)
        E.reciprocal(r, s)
        E.tensor_scalar(out, e, _BY_NAME["multiply"], r)
        return out
    v = C.read32(x)
    ex = np.exp(v - v.max(axis=axes, keepdims=True))
    C.write(out, ex / ex.sum(axis=axes, keepdims=True))
    if _trace.ACTIVE is not None:
        for eng, ins in (("vector", "tensor_reduce"), ("scalar", "activation"), ("vector", "tensor_reduce"),
                         ("vector", "tensor_tensor")):
            _trace.record(eng, ins, (out, x))
    return out


def rms_norm(x: Any, w: Any, axis: Any, n: int, epsilon: float = 1e-06, dtype: Any = None,
             compute_dtype: Any = None) -> NkiTensor:
    """x / sqrt(sum(x^2, axis) / n + epsilon) * w."""
    api = "nl.rms_norm"
    _tile(api, x)
    axes = _axes(api, x, axis)
    v = C.read32(x)
    ss = np.square(v).sum(axis=axes, keepdims=True, dtype=F32)
    r = (F32(1) / np.sqrt(ss / F32(n) + F32(epsilon))).astype(F32)
    wv = C.read32(_tile(api, w, "w")) if isinstance(w, NkiTensor) else F32(w)
    out = _new(x.shape, dtype or x.dtype, api)
    C.write(out, v * r * np.broadcast_to(wv, v.shape) if isinstance(wv, np.ndarray) and wv.size == v.size
            else v * r * wv)
    if _trace.ACTIVE is not None:
        _trace.record("scalar", "activation", (x,))
        _trace.record("scalar", "activation", (out,))
        _trace.record("vector", "tensor_scalar", (out, x))
        _trace.record("vector", "tensor_tensor", (out, x))
    return out


# ---------------------------------------------------------------------------------- movement & PE

def load(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """HBM view -> new SBUF tile (DMA)."""
    if not isinstance(src, NkiTensor):
        raise SimulatorError("nl.load: src must be an NkiTensor")
    if src.ndim < 2:
        raise SimulatorError(f"nl.load: a {src.ndim}-D source cannot become an SBUF tile (>= 2-D, partition first); "
                             "reshape it to (1, N) or (N, 1)")
    out = _new(src.shape, dtype or src.dtype, "nl.load")
    MV.dma_copy(out, src)
    return out


def store(dst: NkiTensor, value: NkiTensor) -> None:
    """SBUF tile -> HBM view (DMA). PSUM values must be copied to SBUF first."""
    MV.dma_copy(dst, value)


def copy(x: Any, dtype: Any = None) -> NkiTensor:
    return _unary("copy", x, dtype)


_opcode("copy", copy)
_BY_NAME["copy"] = copy


def load_transpose2d(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """HBM 2-D view -> SBUF tile with the two dims swapped (DMA transpose)."""
    if not isinstance(src, NkiTensor) or src.ndim != 2:
        raise SimulatorError("nl.load_transpose2d: src must be a 2-D tensor")
    t = _new((src.shape[1], src.shape[0]), src.dtype, "nl.load_transpose2d")
    MV.dma_transpose(t, src)
    if dtype is None or _dt.normalize(dtype) == src.dtype:
        return t
    out = _new(t.shape, dtype, "nl.load_transpose2d")
    MV.tensor_copy(out, t)
    return out


def transpose(x: Any, dtype: Any = None) -> NkiTensor:
    """2-D partition <-> free swap on TensorE; returns a PSUM tile."""
    _tile("nl.transpose", x)
    if x.ndim != 2:
        raise SimulatorError("nl.transpose: x must be 2-D")
    out = _new((x.shape[1], x.shape[0]), x.dtype, "nl.transpose", PSUM)
    MM.nc_transpose(out, x, engine=engine.tensor if x.buffer is SBUF else engine.vector)
    return out


def matmul(x: Any, y: Any, transpose_x: bool = False) -> NkiTensor:
    """x.T @ y with ``transpose_x=True`` (x is [K, M]); returns an fp32 PSUM tile [M, N]."""
    api = "nl.matmul"
    _tile(api, x, "x")
    _tile(api, y, "y")
    if not transpose_x:
        C.warn("nl.matmul(x, y) without transpose_x=True fails on hardware (NKI Release Notes, known issues); pass x as [K, M] with "
               "transpose_x=True")
        tp = _new((x.shape[1], x.shape[0]), x.dtype, api, PSUM)
        MM.nc_transpose(tp, x, engine=engine.tensor)
        xt = _new(tp.shape, x.dtype, api)
        MV.tensor_copy(xt, tp)
        x = xt
    out = _new((x.shape[1], y.shape[1]), _dt.float32, api, PSUM)
    MM.nc_matmul(out, x, y, accumulate=False)
    return out


def broadcast_to(x: Any, shape: Any, dtype: Any = None) -> NkiTensor:
    """Same-rank broadcast of size-1 dims into a new SBUF tile (TensorE for the partition dim)."""
    api = "nl.broadcast_to"
    _tile(api, x)
    shape = tuple(int(s) for s in shape)
    if len(shape) != x.ndim or any(a != b and a != 1 for a, b in zip(x.shape, shape, strict=False)):
        raise SimulatorError(f"{api}: cannot broadcast {x.shape} to {shape} (same rank; each dim equal or 1)")
    out = _new(shape, dtype or x.dtype, api)
    C.write(out, np.broadcast_to(C.read32(x), shape))
    if _trace.ACTIVE is not None:
        if x.shape[0] != shape[0]:
            _trace.record("tensor", "nc_matmul", (x,))
        _trace.record("vector", "tensor_copy", (out, x))
    return out


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    return x.expand_dim(axis)


def gather_flattened(data: Any, indices: Any, axis: int = 0, dtype: Any = None) -> NkiTensor:
    """Per-partition gather along the flattened free dims (GpSimd ``nc_n_gather``)."""
    api = "nl.gather_flattened"
    _tile(api, data, "data")
    _tile(api, indices, "indices")
    out = _new(indices.shape, data.dtype, api)
    MV.nc_n_gather(out, data, indices)
    if dtype is None or _dt.normalize(dtype) == data.dtype:
        return out
    res = _new(indices.shape, dtype, api)
    MV.tensor_copy(res, out)
    return res


def where(condition: Any, x: Any, y: Any, dtype: Any = None) -> NkiTensor:
    """condition (1.0/0.0 tile) ? x : y (a copy then a predicated copy)."""
    api = "nl.where"
    _tile(api, condition, "condition")
    ref = x if isinstance(x, NkiTensor) else (y if isinstance(y, NkiTensor) else condition)
    out = _new(condition.shape, dtype or ref.dtype, api)
    xv = C.read32(x).reshape(condition.shape) if isinstance(x, NkiTensor) else F32(x)
    yv = C.read32(y).reshape(condition.shape) if isinstance(y, NkiTensor) else F32(y)
    C.write(out, np.where(C.read32(condition) != 0, xv, yv))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "tensor_copy", (out,))
        _trace.record("vector", "tensor_copy_predicated", (out, condition))
    return out


def dropout(x: Any, rate: Any, dtype: Any = None) -> NkiTensor:
    """Zero each element with probability ``rate`` (scalar or (P,1) tile); no rescaling."""
    from neuron_compile.simulator import state as _state

    api = "nl.dropout"
    _tile(api, x)
    st = _state.current()
    g = np.random.default_rng(st.seed)
    st.seed += 1
    r = C.scalar_or_vector(api, "rate", rate, x.shape[0], x.ndim, fp32_only=False)
    keep = g.random(x.shape, dtype=np.float32) >= r
    out = _new(x.shape, dtype or x.dtype, api)
    C.write(out, np.where(keep, C.read32(x), F32(0)))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "dropout", (out, x))
    return out


FUNCTIONS: dict[str, Callable[..., Any]] = dict(_BY_NAME)
FUNCTIONS.update(softmax=softmax, rms_norm=rms_norm, load=load, store=store, load_transpose2d=load_transpose2d,
                 transpose=transpose, matmul=matmul, broadcast_to=broadcast_to, expand_dims=expand_dims,
                 gather_flattened=gather_flattened, where=where, dropout=dropout)
