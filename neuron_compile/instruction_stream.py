"""Analytic instruction streams: what a kernel would execute, without running it.

``kernel_stream(kernel)`` renders the kernel (the real codegen) and executes the rendered NKI source
against *shape-only* ``nki`` / ``nl`` / ``nisa`` namespaces: tensors carry a shape, strides, dtype
and buffer but no data, and every ISA call appends the same
:class:`~neuron_compile.simulator.trace.InstructionRecord` the simulator's trace would (engine
defaults, operand order, partitions/free size, bytes). Loops run as plain Python, so a 4096^3 GEMM
costs tens of thousands of cheap calls and no NumPy work. The result is a ``Counter`` of records
(identical tiles collapse), the input of :func:`neuron_compile.costmodel.estimate`.

Instructions the rendered code uses but this module does not know raise ``NotImplementedError``
naming them, so a template change can't silently drop instructions from the cost.

Runtime control flow (``nl.while_loop`` / ``nl.fori_loop`` on ``nisa`` registers): register values
set from compile-time ints (``register_alloc(x)``, ``register_move``) are known and followed, but
shape-only tensors have no data, so ``register_load`` yields a register whose value is **0** by
default (``loaded_flag=`` chooses another). The stream therefore follows the path where every flag
loaded from a tensor is 0: a ``while_loop`` on such a flag runs no iteration (e.g. a rarely taken
fix-up branch is costed as not taken, plus the ``register_load`` itself), and a ``fori_loop`` bound
loaded from a tensor is 0; ``loaded_flag=1`` costs the branch taken once.
Register instructions are recorded with engine ``"sequencer"``, as the simulator traces them.
"""

from __future__ import annotations

import builtins
import logging
import math
import types
from collections import Counter
from collections.abc import Sequence
from typing import Any

from neuron_compile.simulator.trace import InstructionRecord

log = logging.getLogger(__name__)

ON_CHIP = ("sbuf", "psum")
_INT32ISH = ("int32", "uint32")


class ShapeTensor:
    """A tensor view without data: shape, strides (elements), dtype name, buffer name."""

    __slots__ = ("shape", "strides", "dtype", "buffer")

    def __init__(self, shape: Sequence[int], strides: Sequence[int], dtype: str, buffer: str) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.dtype = dtype
        self.buffer = buffer

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def ap(self, pattern: Sequence[Sequence[int]], offset: Any = 0, scalar_offset: Any = None,
           vector_offset: Any = None, indirect_dim: int = 0, dtype: Any = None) -> ShapeTensor:
        return ShapeTensor([p[1] for p in pattern], [p[0] for p in pattern], dtype or self.dtype, self.buffer)

    def broadcast(self, dim: int, size: int) -> ShapeTensor:
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = size, 0
        return ShapeTensor(shape, strides, self.dtype, self.buffer)

    def expand_dim(self, dim: int) -> ShapeTensor:
        return ShapeTensor(self.shape[:dim] + (1,) + self.shape[dim:], self.strides[:dim] + (0,) + self.strides[dim:],
                           self.dtype, self.buffer)

    def view(self, dtype: Any) -> ShapeTensor:
        """Bit reinterpretation (same-size dtypes keep the shape; the last dim scales by the size ratio)."""
        old, new = _itemsize(self.dtype), _itemsize(_dtype_name(dtype))
        last = self.shape[-1] * old // new if self.shape else 1
        return ShapeTensor(self.shape[:-1] + (last,), self.strides, _dtype_name(dtype), self.buffer)

    def __getitem__(self, key: Any) -> ShapeTensor:
        key = key if isinstance(key, tuple) else (key,)
        shape, strides = [], []
        for d, (n, s) in enumerate(zip(self.shape, self.strides, strict=True)):
            k = key[d] if d < len(key) else slice(None)
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                shape.append(max(0, (stop - start + step - 1) // step))
                strides.append(s * step)
            # an integer index drops the dim
        return ShapeTensor(shape, strides, self.dtype, self.buffer)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2, "int16": 2, "uint16": 2}.get(dtype, 1) \
        if dtype not in ("float64", "int64") else 8


def _dtype_name(dtype: Any) -> str:
    return str(getattr(dtype, "name", dtype))


class _Recorder:
    """Counts records; ``segments`` splits them at every ``register_load`` (a runtime branch drains the engines, so
    the work before and after it doesn't overlap)."""

    def __init__(self) -> None:
        self.counts: Counter[InstructionRecord] = Counter()
        self.segments: list[Counter[InstructionRecord]] = [Counter()]

    def add(self, engine: str, instruction: str, operands: Sequence[Any], main: Any = None,
            flags: tuple[str, ...] = ()) -> None:
        from neuron_compile.costmodel import itemsize

        tensors = [o for o in operands if isinstance(o, ShapeTensor)]
        ref = main if main is not None else (tensors[0] if tensors else None)
        if ref is not None and ref.shape:
            parts = ref.shape[0]
            free = ref.size // parts if parts else 0
        else:
            parts, free = 1, 1
        rec = InstructionRecord(
            engine=engine, instruction=instruction, partitions=parts, free_size=free,
            dtypes=tuple(o.dtype for o in tensors), bytes=sum(o.size * itemsize(o.dtype) for o in tensors),
            buffers=tuple(o.buffer for o in tensors), shapes=tuple(o.shape for o in tensors),
            strides=tuple(o.strides for o in tensors), flags=flags)
        self.counts[rec] += 1
        self.segments[-1][rec] += 1
        if instruction == "register_load":
            self.segments.append(Counter())


class ShapeRegister:
    """A sequencer register of the shape-only namespace: compile-time values are kept, loads give 0."""

    __slots__ = ("value",)

    def __init__(self, value: int | float = 0) -> None:
        self.value = value


def _reg_int(v: Any) -> int:
    return int(v.value) if isinstance(v, ShapeRegister) else int(v)


def _engine_name(engine: Any, default: str) -> str:
    name = getattr(engine, "name", None)
    return default if engine is None or name in (None, "unknown") else str(name)


def _namespaces(rec: _Recorder, loaded_flag: int = 0
                ) -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    nl = types.ModuleType("nki.language")
    for b in ("sbuf", "psum", "shared_hbm", "private_hbm", "hbm"):
        setattr(nl, b, b)

    def ndarray(shape: Sequence[int], dtype: Any, buffer: Any = "sbuf", name: str | None = None) -> ShapeTensor:
        shape = tuple(int(s) for s in shape)
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        return ShapeTensor(shape, strides, _dtype_name(dtype), str(buffer))

    nl.ndarray = ndarray  # type: ignore[attr-defined]

    def fori_loop(lower: Any, upper: Any, body_fun: Any, step: int = 1) -> None:
        for i in range(_reg_int(lower), _reg_int(upper), step):
            body_fun(i)

    def while_loop(init: ShapeRegister, body_fun: Any) -> None:
        r = init
        while r.value != 0:
            r = body_fun(ShapeRegister(r.value))

    nl.fori_loop = fori_loop  # type: ignore[attr-defined]
    nl.while_loop = while_loop  # type: ignore[attr-defined]

    def nl_getattr(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return attr  # dtypes, ALU ops, activation functions: their names are all the cost model needs

    nl.__getattr__ = nl_getattr  # type: ignore[attr-defined]

    isa = types.ModuleType("nki.isa")

    def engine_kw(kw: dict[str, Any], default: str) -> str:
        return _engine_name(kw.get("engine"), default)

    def dma_copy(dst: ShapeTensor, src: ShapeTensor, **kw: Any) -> None:
        rec.add("dma", "dma_copy", (dst, src), main=dst if dst.on_chip or not src.on_chip else src)

    def tensor_copy(dst: ShapeTensor, src: ShapeTensor, **kw: Any) -> None:
        rec.add(engine_kw(kw, "vector"), "tensor_copy", (dst, src))

    def tensor_tensor(dst: ShapeTensor, data1: ShapeTensor, data2: ShapeTensor, op: Any, **kw: Any) -> None:
        ints = data1.dtype in _INT32ISH and data2.dtype in _INT32ISH
        anypsum = "psum" in (data1.buffer, data2.buffer, dst.buffer)
        default = "gpsimd" if (str(op) == "power" or ints) and not anypsum else "vector"
        rec.add(engine_kw(kw, default), "tensor_tensor", (dst, data1, data2))

    def tensor_scalar(dst: ShapeTensor, data: ShapeTensor, op0: Any = None, operand0: Any = None,
                      operand1: Any = None, **kw: Any) -> None:
        rec.add(engine_kw(kw, "vector"), "tensor_scalar", [dst, data] + [o for o in (operand0, operand1)
                                                                        if isinstance(o, ShapeTensor)])

    def memset(dst: ShapeTensor, value: Any = 0, **kw: Any) -> None:
        rec.add(engine_kw(kw, "vector"), "memset", (dst,))

    def iota(dst: ShapeTensor, *args: Any, **kw: Any) -> None:
        rec.add("gpsimd", "iota", (dst,))

    def activation(dst: ShapeTensor, op: Any, data: ShapeTensor, bias: Any = None, scale: Any = 1.0,
                   reduce_op: Any = None, reduce_res: Any = None, **kw: Any) -> None:
        instr = "activation_reduce" if reduce_res is not None else "activation"
        rec.add("scalar", instr, [dst, data] + [t for t in (bias, scale, reduce_res) if isinstance(t, ShapeTensor)])

    def reciprocal(dst: ShapeTensor, data: ShapeTensor, **kw: Any) -> None:
        rec.add("vector", "reciprocal", (dst, data))

    def tensor_reduce(dst: ShapeTensor, op: Any, data: ShapeTensor, axis: Any = None, **kw: Any) -> None:
        rec.add("vector", "tensor_reduce", (dst, data), main=data)

    def tensor_scalar_reduce(dst: ShapeTensor, data: ShapeTensor, op0: Any = None, operand0: Any = None,
                             reduce_op: Any = None, reduce_res: Any = None, **kw: Any) -> None:
        rec.add("vector", "tensor_scalar_reduce", (dst, data))

    def tensor_partition_reduce(dst: ShapeTensor, op: Any, data: ShapeTensor, **kw: Any) -> None:
        rec.add("gpsimd", "tensor_partition_reduce", (dst, data), main=data)

    def nc_matmul(dst: ShapeTensor, stationary: ShapeTensor, moving: ShapeTensor, is_transpose: bool = False,
                  perf_mode: Any = None, **kw: Any) -> None:
        double = perf_mode is not None and getattr(perf_mode, "name", str(perf_mode)) not in ("none", "None")
        flags = (("is_transpose",) if is_transpose else ()) + (("double_row",) if double else ())
        rec.add("tensor", "nc_matmul", (dst, stationary, moving), flags=flags)

    def nc_transpose(dst: ShapeTensor, data: ShapeTensor, **kw: Any) -> None:
        default = "tensor" if dst.buffer == "psum" and data.buffer == "sbuf" else "vector"
        rec.add(engine_kw(kw, default), "nc_transpose", (dst, data))

    def tensor_copy_predicated(dst: ShapeTensor, src: Any, predicate: ShapeTensor, **kw: Any) -> None:
        rec.add("vector", "tensor_copy_predicated", [dst] + ([src] if isinstance(src, ShapeTensor) else [])
                + [predicate])

    def tensor_tensor_scan(dst: ShapeTensor, data0: ShapeTensor, data1: ShapeTensor, initial: Any = None,
                           **kw: Any) -> None:
        rec.add("vector", "tensor_tensor_scan", (dst, data0, data1))

    def scalar_tensor_tensor(dst: ShapeTensor, data: ShapeTensor, op0: Any = None, operand0: Any = None,
                             op1: Any = None, operand1: Any = None, **kw: Any) -> None:
        rec.add("vector", "scalar_tensor_tensor", (dst, data, operand1))

    def affine_select(dst: ShapeTensor, pattern: Any = None, channel_multiplier: int = 0, on_true_tile: Any = None,
                      **kw: Any) -> None:
        rec.add("gpsimd", "affine_select", (dst, on_true_tile))

    def nc_n_gather(dst: ShapeTensor, data: ShapeTensor, indices: ShapeTensor, **kw: Any) -> None:
        rec.add("gpsimd", "nc_n_gather", (dst, data, indices), main=dst)  # per-partition gather: one pass over dst

    def register_alloc(x: int | None = None) -> ShapeRegister:
        rec.add("sequencer", "register_alloc", ())
        return ShapeRegister(0 if x is None else int(x))

    def register_move(dst: ShapeRegister, src: Any) -> None:
        dst.value = src.value if isinstance(src, ShapeRegister) else int(src)
        rec.add("sequencer", "register_move", ())

    def register_load(dst: ShapeRegister, src: ShapeTensor) -> None:
        dst.value = loaded_flag  # no data: every loaded flag is 0 unless asked otherwise (module docstring)
        rec.add("sequencer", "register_load", (src,))

    def register_store(dst: ShapeTensor, src: ShapeRegister) -> None:
        rec.add("sequencer", "register_store", (dst,))

    for fn in (dma_copy, tensor_copy, tensor_tensor, tensor_scalar, memset, iota, activation, reciprocal,
               tensor_reduce, tensor_scalar_reduce, tensor_partition_reduce, nc_matmul, nc_transpose,
               tensor_copy_predicated, tensor_tensor_scan, scalar_tensor_tensor, affine_select, nc_n_gather, register_alloc, register_move, register_load, register_store):
        setattr(isa, fn.__name__, fn)
    isa.VirtualRegister = ShapeRegister  # type: ignore[attr-defined]

    def isa_getattr(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr in ("engine", "dge_mode", "oob_mode", "matmul_perf_mode", "reduce_cmd", "nc_version"):
            return types.SimpleNamespace(__getattr__=None, **{n: types.SimpleNamespace(name=n) for n in (
                "unknown", "tensor", "vector", "scalar", "gpsimd", "sync", "none", "double_row", "hwdge",
                "swdge", "error", "skip", "idle", "reset", "reduce", "reset_reduce", "load_reduce")})
        raise NotImplementedError(f"instruction_stream: nisa.{attr} is not modelled; add it to "
                                  "neuron_compile/instruction_stream.py (and the cost model)")

    isa.__getattr__ = isa_getattr  # type: ignore[attr-defined]

    nki = types.ModuleType("nki")
    nki.language = nl  # type: ignore[attr-defined]
    nki.isa = isa  # type: ignore[attr-defined]
    nki.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)  # type: ignore[attr-defined]
    return nki, nl, isa


def source_stream(source: str, name: str, args: Sequence[tuple[int, str]], loaded_flag: int = 0
                  ) -> Counter[InstructionRecord]:
    """Records of one rendered kernel ``name`` called with flat HBM args ``(numel, dtype)``; every register loaded
    from a tensor holds ``loaded_flag``."""
    return _run_source(source, name, args, loaded_flag).counts


def _run_source(source: str, name: str, args: Sequence[tuple[int, str]], loaded_flag: int) -> _Recorder:
    rec = _Recorder()
    nki, nl, isa = _namespaces(rec, loaded_flag)
    subs = {"nki": nki, "nki.language": nl, "nki.isa": isa}
    real_import = builtins.__import__

    def imp(modname: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and modname in subs:
            return subs[modname] if fromlist else nki
        return real_import(modname, globals, locals, fromlist, level)

    bdict = dict(builtins.__dict__)
    bdict["__import__"] = imp
    env: dict[str, Any] = {"__name__": __name__, "__builtins__": bdict}
    exec(compile(source, f"<stream:{name}>", "exec"), env)
    env[name](*[ShapeTensor((n,), (1,), dt, "private_hbm") for n, dt in args])
    return rec


def kernel_stream(kernel: Any, loaded_flag: int = 0) -> Counter[InstructionRecord]:
    """The instruction stream of one IR kernel (any family), rendered by the real codegen (``loaded_flag``: the value
    of every register loaded from a tensor, e.g. 1 to cost an attention kernel whose guard trips)."""
    from neuron_compile.codegen.render import render_kernel

    return source_stream(render_kernel(kernel), kernel.name, [(a.numel, a.dtype) for a in kernel.inputs],
                         loaded_flag)


def kernel_segments(kernel: Any, loaded_flag: int = 0) -> list[Counter[InstructionRecord]]:
    """:func:`kernel_stream` split at every ``register_load``: the parts run one after the other (cost each with
    :func:`~neuron_compile.costmodel.estimate` and add them with :func:`~neuron_compile.costmodel.total`)."""
    from neuron_compile.codegen.render import render_kernel

    rec = _run_source(render_kernel(kernel), kernel.name, [(a.numel, a.dtype) for a in kernel.inputs], loaded_flag)
    return [seg for seg in rec.segments if seg]


def count_instructions(counts: Counter[InstructionRecord]) -> Counter[tuple[str, str]]:
    """(engine, instruction) -> number executed."""
    out: Counter[tuple[str, str]] = Counter()
    for r, c in counts.items():
        out[(r.engine, r.instruction)] += c
    return out
