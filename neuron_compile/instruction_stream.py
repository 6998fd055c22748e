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
loaded from a tensor is 0; ``loaded_flag=1`` costs the branch taken once. A tuple gives each
``register_load`` of a program its own value, in program order (the last one repeats): ``(0, 1)`` costs an
attention kernel whose first-unit check passes and whose final check fails.
Register instructions are recorded with engine ``"sequencer"``, as the simulator traces them.
"""

from __future__ import annotations

import ast
import builtins
import functools
import logging
import math
import re
import sys
import types
from collections import Counter
from collections.abc import Sequence
from typing import Any

from neuron_compile.loop_skipping import LoopDriver
from neuron_compile.simulator.trace import InstructionRecord

log = logging.getLogger(__name__)

ON_CHIP = ("sbuf", "psum")
_INT32ISH = ("int32", "uint32")


class ShapeTensor:
    """A tensor view without data: shape, strides (elements), dtype name, buffer name, and where it lies: its
    allocation (:class:`~neuron_compile.scheduler.Alloc`) and element offset into it (``None``: unknown, a runtime
    offset)."""

    __slots__ = ("shape", "strides", "dtype", "buffer", "base", "offset")

    def __init__(self, shape: Sequence[int], strides: Sequence[int], dtype: str, buffer: str, base: Any = None,
                 offset: int | None = 0) -> None:
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        self.dtype = dtype
        self.buffer = buffer
        self.base = base
        self.offset = offset

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def ap(self, pattern: Sequence[Sequence[int]], offset: Any = 0, scalar_offset: Any = None,
           vector_offset: Any = None, indirect_dim: int = 0, dtype: Any = None) -> ShapeTensor:
        known = scalar_offset is None and vector_offset is None and isinstance(offset, int)
        return ShapeTensor([p[1] for p in pattern], [p[0] for p in pattern], dtype or self.dtype, self.buffer,
                           self.base, offset if known else None)

    def broadcast(self, dim: int, size: int) -> ShapeTensor:
        shape, strides = list(self.shape), list(self.strides)
        shape[dim], strides[dim] = size, 0
        return ShapeTensor(shape, strides, self.dtype, self.buffer, self.base, self.offset)

    def expand_dim(self, dim: int) -> ShapeTensor:
        return ShapeTensor(self.shape[:dim] + (1,) + self.shape[dim:], self.strides[:dim] + (0,) + self.strides[dim:],
                           self.dtype, self.buffer, self.base, self.offset)

    def reshape_dim(self, dim: int, shape: Sequence[int]) -> ShapeTensor:
        """Split free dim ``dim`` into ``shape`` (one ``-1`` allowed): strides follow from the dim's own."""
        d = dim % len(self.shape)
        parts = list(shape)
        if -1 in parts:
            known = math.prod(n for n in parts if n != -1)
            parts[parts.index(-1)] = self.shape[d] // known if known else 0
        strides, step = [], self.strides[d]
        for n in reversed(parts):
            strides.append(step)
            step *= n
        return ShapeTensor(self.shape[:d] + tuple(parts) + self.shape[d + 1:],
                           self.strides[:d] + tuple(reversed(strides)) + self.strides[d + 1:], self.dtype, self.buffer,
                           self.base, self.offset)

    def view(self, dtype: Any) -> ShapeTensor:
        """Bit reinterpretation (same-size dtypes keep the shape; the last dim scales by the size ratio)."""
        old, new = _itemsize(self.dtype), _itemsize(_dtype_name(dtype))
        last = self.shape[-1] * old // new if self.shape else 1
        # offsets count elements of the allocation's dtype: a same-size view keeps its place, another size is
        # placed anywhere in the allocation (the scheduler then orders it after every access to it: never early)
        return ShapeTensor(self.shape[:-1] + (last,), self.strides, _dtype_name(dtype), self.buffer, self.base,
                           self.offset if old == new else None)

    def __getitem__(self, key: Any) -> ShapeTensor:
        if key.__class__ is not tuple:
            key = (key,)
        shape: list[int] = []
        strides: list[int] = []
        off = self.offset
        nk = len(key)
        d = 0
        for n, s in zip(self.shape, self.strides, strict=True):
            k = key[d] if d < nk else None
            d += 1
            if k is None:
                shape.append(n)
                strides.append(s)
            elif k.__class__ is slice:
                a, b, step = k.start, k.stop, k.step
                if step is None and (a is None or 0 <= a <= n) and (b is None or 0 <= b):
                    a = a or 0
                    b = n if b is None or b > n else b
                    shape.append(b - a if b > a else 0)
                    strides.append(s)
                else:
                    r = range(*k.indices(n))
                    a = r.start
                    shape.append(len(r))
                    strides.append(s * r.step)
                if off is not None:
                    off += a * s
            elif off is not None:  # an integer index drops the dim
                off += int(k) * s
        return ShapeTensor(shape, strides, self.dtype, self.buffer, self.base, off)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2, "int16": 2, "uint16": 2}.get(dtype, 1) \
        if dtype not in ("float64", "int64") else 8


def _dtype_name(dtype: Any) -> str:
    return str(getattr(dtype, "name", dtype))


MIN_TRIP = 4  # loops shorter than this are always scheduled iteration by iteration
MAX_SAMPLES = 8  # identical iterations scheduled before moving on by the longest period seen
TAIL = 1  # the last iterations of a skipped loop always run (a ragged last tile)
UNIFORM = 0.01  # queues advancing within 1% of each other per iteration are in steady state
_TAGS = ("tensor", "vector", "scalar", "gpsimd", "dma_q_first", "dma_q_last", "dma_lanes", "hbm")  # Scheduler.frontier()
MAX_PERIOD = 4  # skipped loops may repeat a block of up to this many iterations (e.g. alternating engines)


def _by_tag(adv: Sequence[float]) -> dict[str, float]:
    """Advance per queue (frontier entry), for :meth:`Scheduler.shift`."""
    return {tag: d for d, tag in zip(adv, _TAGS, strict=True) if d > 1e-9}


class _Recorder:
    """Counts records and feeds them, in program order, to a :class:`~neuron_compile.scheduler.Scheduler`.

    ``segments`` splits the counts at every ``register_load`` (a runtime branch drains the engines, so the work
    before and after it doesn't overlap). ``loop`` wraps every ``range`` loop of the kernel: it schedules the
    first iterations, and once two consecutive ones issue identical instructions (the same records, in the same
    order) and advance every queue by the same period, the following identical iterations run (so the counts stay
    exact) but are not scheduled: the scheduler moves forward by the period for each. An iteration that differs
    is scheduled from its buffered instructions, and sampling starts again."""

    def __init__(self, sched: Any = None, fast: bool = True) -> None:
        self.ids: dict[tuple[Any, ...], int] = {}  # interned records (counters count ids, not records)
        self.records: list[InstructionRecord] = []
        self.counts: Counter[int] = Counter()
        self.segments: list[Counter[int]] = [Counter()]
        self.sched = sched
        self.fast = fast and sched is not None
        self.line = 0
        self.queue: str | None = None  # a DMA's issue queue when the kernel names its engine
        self.sig: list[int] = []  # running signature of each open loop iteration
        self.buffer: list[tuple[Any, ...]] | None = None  # instructions of an iteration being fast-forwarded
        self.iter_counts: list[Counter[int]] = []  # counts of each open loop iteration

    def add(self, engine: str, instruction: str, operands: Sequence[Any], main: Any = None,
            flags: tuple[str, ...] = (), writes: Sequence[Any] | None = None, rmw: bool = False,
            extra: Sequence[Any] = ()) -> None:
        tensors = [o for o in operands if o.__class__ is ShapeTensor]
        mi = next((i for i, t in enumerate(tensors) if t is main), -1) if main is not None else 0
        key = (engine, instruction, flags, mi, *[(t.shape, t.strides, t.dtype, t.buffer) for t in tensors])
        rid = self.ids.get(key)
        if rid is None:
            rid = self.ids[key] = len(self.records)
            self.records.append(self._record(engine, instruction, tensors, main, flags))
        self.counts[rid] += 1
        self.segments[-1][rid] += 1
        if self.iter_counts:
            self.iter_counts[-1][rid] += 1
        if instruction == "register_load":
            self.segments.append(Counter())
        if self.sig:
            if engine == "dma":  # which DMA engines serve it (8 partitions each) changes its timing, not its record
                chip = next((t for t in tensors if t.buffer in ON_CHIP and t.offset is not None and t.base), None)
                lane = chip.offset // max(chip.base.pstride, 1) // 8 if chip is not None else 0
                self.sig[-1] = hash((self.sig[-1], rid, lane))
            else:
                self.sig[-1] = hash((self.sig[-1], rid))
        rec = self.records[rid]
        if self.sched is None:
            return
        if writes is None:
            w, r = tensors[:1], (tensors if rmw else tensors[1:])
        else:  # reads: every operand position but the first one of each written tensor (in place ops read dst)
            w = list(writes)
            pos = {next((i for i, t in enumerate(tensors) if t is x), -1) for x in w}
            r = [t for i, t in enumerate(tensors) if rmw or i not in pos]
        if extra:
            r = r + list(extra)
        if self.buffer is not None:  # resolved now: buffers and PSUM banks assigned as if it were scheduled
            self.buffer.append((rec, (), (), self.line, self.queue, self.sched.boxes(r, w)))
        else:
            self.sched.issue(rec, r, w, self.line, self.queue)

    @staticmethod
    def _record(engine: str, instruction: str, tensors: list[ShapeTensor], main: Any,
                flags: tuple[str, ...]) -> InstructionRecord:
        from neuron_compile.costmodel import itemsize

        ref = main if main is not None else (tensors[0] if tensors else None)
        if ref is not None and ref.shape:
            parts = ref.shape[0]
            free = ref.size // parts if parts else 0
        else:
            parts, free = 1, 1
        return InstructionRecord(
            engine=engine, instruction=instruction, partitions=parts, free_size=free,
            dtypes=tuple(o.dtype for o in tensors), bytes=sum(o.size * itemsize(o.dtype) for o in tensors),
            buffers=tuple(o.buffer for o in tensors), shapes=tuple(o.shape for o in tensors),
            strides=tuple(o.strides for o in tensors), flags=flags)

    def record_counts(self, counts: Counter[int]) -> Counter[InstructionRecord]:
        """Interned record ids -> records."""
        out: Counter[InstructionRecord] = Counter()
        for rid, c in counts.items():
            out[self.records[rid]] += c
        return out

    def loop(self, it: Any, safe: bool = False) -> Any:
        """``for v in range(...)`` of the kernel source (rewritten by ``loop_skipping.LoopDriver``; ``safe``: the
        body may be skipped, see :mod:`neuron_compile.loop_skipping`)."""
        if self.sched is None or not isinstance(it, range):
            return it
        if not self.fast or self.buffer is not None or len(it) < MIN_TRIP:
            return self._plain(it)
        return self._loop(it, safe)

    def _plain(self, vals: range) -> Any:
        """Every iteration run and scheduled; the same loop signature as :meth:`_loop`."""
        rle: list[list[int]] = []
        try:
            for v in vals:
                self.sig.append(0)
                try:
                    yield v
                finally:
                    sig = self.sig.pop()
                if rle and rle[-1][0] == sig:
                    rle[-1][1] += 1
                else:
                    rle.append([sig, 1])
        finally:
            if self.sig:
                self.sig[-1] = hash((self.sig[-1], tuple(map(tuple, rle))))

    def _fold(self, sig: int, counts: Counter[int], times: int = 1) -> None:
        """Close a loop iteration: fold its counts into the enclosing iteration (signatures: see ``_loop``)."""
        if self.iter_counts:
            parent = self.iter_counts[-1]
            for r, c in counts.items():
                parent[r] += c * times

    def _skip(self, counts: Counter[int], times: int) -> None:
        """Count ``times`` more iterations identical to one with ``counts`` (not executed)."""
        seg = self.segments[-1]
        for r, c in counts.items():
            self.counts[r] += c * times
            seg[r] += c * times

    @staticmethod
    def _steady(hist: list[tuple[Any, ...]], max_period: int) -> tuple[int, dict[str, float], float,
                                                                          dict[str, float]] | None:
        """A repeating block of the last iterations: (iterations per block, busy time per iteration, the time
        before which nothing moves, each queue's advance per block). Steady: the last two blocks issued the same
        instructions and every queue they moved advanced by the same period in both (within UNIFORM);
        failing that, the shortest block seen repeating MAX_SAMPLES iterations long, each queue at its longest
        advance over those blocks (conservative)."""
        fallback = None
        for per in range(1, max_period + 1):
            if len(hist) < 2 * per or any(hist[-k][0] != hist[-k - per][0] for k in range(1, per + 1)):
                continue
            f_a, f_b, f_c = hist[-2 * per][1], hist[-per][1], hist[-1][2]  # block starts and the end
            adv = [c - b for b, c in zip(f_b, f_c, strict=True)]
            period = max(adv)
            if period <= 1e-9:
                return None
            # every queue the block moved advanced by the period, as in the block before (a coupled pipeline in
            # steady state: queues that move at different rates are still filling or draining)
            same = all(abs((c - b) - (b - a)) <= UNIFORM * period for a, b, c in zip(f_a, f_b, f_c, strict=True))
            b_a, b_c = hist[-per][3], hist[-1][4]
            busy = {e: (b_c[e] - b_a[e]) / per for e in b_c}
            after = min(b for b, d in zip(f_b, adv, strict=True) if d > 1e-9)
            if same:
                return per, busy, after, _by_tag(adv)
            reps = sum(1 for k in range(per, len(hist) + 1 - per, per)
                       if all(hist[-j][0] == hist[-j - k][0] for j in range(1, per + 1)))
            if fallback is None and (reps + 1) * per >= MAX_SAMPLES:
                # each queue's mean advance per block over the repeated blocks after the first (the first fills the
                # pipeline), but never less than its last block's
                blocks = min(reps, (len(hist) - per) // per)
                start = hist[-(blocks + 1) * per + per][1] if blocks else f_b
                mean = [(c - a) / max(blocks, 1) for a, c in zip(start, f_c, strict=True)]
                fallback = (per, busy, after, _by_tag([max(a, m) for a, m in zip(adv, mean, strict=True)]))
        return fallback

    def _loop(self, vals: range, safe: bool) -> Any:
        sched = self.sched
        n = len(vals)
        hist: list[tuple[Any, ...]] = []  # sampled iterations: signature, frontier before/after, busy, counts
        steady: tuple[int, dict[str, float], float, dict[str, float]] | None = None  # per, busy, after, advance
        steady_sig = 0
        skipped = 0
        rle: list[list[int]] = []  # the loop's signature: its iterations' signatures, run-length encoded

        def done(sig: int, times: int = 1) -> None:
            if rle and rle[-1][0] == sig:
                rle[-1][1] += times
            else:
                rle.append([sig, times])

        i = 0
        try:
            while i < n:
                v = vals[i]
                i += 1
                if steady is not None:  # fast-forward: run the body, schedule nothing unless it differs
                    self.buffer = []
                    self.sig.append(0)
                    self.iter_counts.append(Counter())
                    try:
                        yield v
                    finally:
                        sig, cnt, buf = self.sig.pop(), self.iter_counts.pop(), self.buffer
                        self.buffer = None
                    self._fold(sig, cnt)
                    done(sig)
                    if sig == steady_sig and i < n - TAIL:
                        skipped += 1
                        continue
                    # An iteration that differs, or the last one before the tail, is scheduled: the tail starts
                    # from the queues, buffers and region times a scheduled iteration leaves.
                    if skipped:
                        sched.shift(skipped, steady[2], steady[1], skipped, steady[3])
                    skipped, steady = 0, None
                    hist.clear()
                    for ev in buf:
                        sched.issue(*ev)
                    continue
                f0, b0 = sched.frontier(), sched.busy_snapshot()
                self.sig.append(0)
                self.iter_counts.append(Counter())
                try:
                    yield v
                finally:
                    sig, cnt = self.sig.pop(), self.iter_counts.pop()
                self._fold(sig, cnt)
                done(sig)
                hist.append((sig, f0, sched.frontier(), b0, sched.busy_snapshot(), cnt))
                if len(hist) > 2 * MAX_PERIOD:
                    del hist[0]
                if i >= n:
                    continue
                found = self._steady(hist, MAX_PERIOD if safe else 1)
                if found is None:
                    continue
                per, busy, after, moved = found
                m = (n - TAIL - i) // per * per
                if safe and m > 0:  # skip the body itself up to the last TAIL iterations
                    sched.shift(m // per, after, busy, m, moved)
                    block: Counter[int] = Counter()
                    for h in hist[-per:]:
                        block.update(h[5])
                    self._skip(block, m // per)
                    self._fold(sig, block, m // per)
                    if per == 1:
                        done(sig, m)
                    else:
                        rle.append([hash(tuple(h[0] for h in hist[-per:])), m // per])
                    i += m
                    hist.clear()
                elif per == 1 and not safe:
                    steady, steady_sig = (1, busy, after, moved), sig
        finally:
            if steady is not None and skipped:
                sched.shift(skipped, steady[2], steady[1], skipped, steady[3])
            if self.sig:  # the enclosing iteration sees this loop as one item, however it was scheduled
                self.sig[-1] = hash((self.sig[-1], tuple(map(tuple, rle))))


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


def _namespaces(rec: _Recorder, loaded_flag: int | tuple[int, ...] = 0, program: tuple[int, int] = (0, 1)
                ) -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    from neuron_compile.costmodel import itemsize
    from neuron_compile.scheduler import Alloc

    nl = types.ModuleType("nki.language")
    for b in ("sbuf", "psum", "shared_hbm", "private_hbm", "hbm"):
        setattr(nl, b, b)

    def ndarray(shape: Sequence[int], dtype: Any, buffer: Any = "sbuf", name: str | None = None) -> ShapeTensor:
        shape = tuple(int(s) for s in shape)
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        dt, buf = _dtype_name(dtype), str(buffer)
        size = itemsize(dt)
        pstride = strides[0] * shape[0] // max(shape[0], 1) if buf in ON_CHIP and shape else 0
        base = Alloc(buf, pstride, size, (sys._getframe(1).f_lineno, pstride * size), pstride * size)
        return ShapeTensor(shape, strides, dt, buf, base, 0)

    nl.ndarray = ndarray  # type: ignore[attr-defined]
    nl.program_id = lambda axis=0: program[0] if axis == 0 else 0  # type: ignore[attr-defined]
    nl.num_programs = lambda axes=0: program[1] if axes in (0, None) else 1  # type: ignore[attr-defined]
    nl.program_ndim = lambda: 1  # type: ignore[attr-defined]

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
        rec.queue = {"sync": "dma_q0", "scalar": "dma_q1"}.get(_engine_name(kw.get("engine"), ""))
        rec.add("dma", "dma_copy", (dst, src), main=dst if dst.on_chip or not src.on_chip else src)
        rec.queue = None

    def dma_transpose(dst: ShapeTensor, src: ShapeTensor, axes: Any = None, **kw: Any) -> None:
        rec.add("dma", "dma_transpose", (dst, src), main=dst)

    def dma_compute(dst: ShapeTensor, srcs: Sequence[ShapeTensor], reduce_op: Any = None, **kw: Any) -> None:
        # a scatter-RMW names its HBM destination among the sources too: it is read, then written
        srcs = list(srcs)
        rec.add("dma", "dma_compute", (dst, *srcs), main=next((t for t in srcs if t.on_chip), dst), rmw=True)

    def tensor_copy(dst: ShapeTensor, src: ShapeTensor, **kw: Any) -> None:
        rec.add(engine_kw(kw, "vector"), "tensor_copy", (dst, src))

    def tensor_tensor(dst: ShapeTensor, data1: ShapeTensor, data2: ShapeTensor, op: Any, **kw: Any) -> None:
        ints = data1.dtype in _INT32ISH and data2.dtype in _INT32ISH and dst.dtype in _INT32ISH  # as the simulator
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
        rec.add("scalar", instr, [dst, data] + [t for t in (bias, scale, reduce_res) if isinstance(t, ShapeTensor)],
                writes=[t for t in (dst, reduce_res) if isinstance(t, ShapeTensor)])

    def reciprocal(dst: ShapeTensor, data: ShapeTensor, **kw: Any) -> None:
        rec.add("vector", "reciprocal", (dst, data))

    def tensor_reduce(dst: ShapeTensor, op: Any, data: ShapeTensor, axis: Any = None, **kw: Any) -> None:
        rec.add("vector", "tensor_reduce", (dst, data), main=data)

    def tensor_scalar_reduce(dst: ShapeTensor, data: ShapeTensor, op0: Any = None, operand0: Any = None,
                             reduce_op: Any = None, reduce_res: Any = None, **kw: Any) -> None:
        rec.add("vector", "tensor_scalar_reduce", (dst, data),
                writes=[t for t in (dst, reduce_res) if isinstance(t, ShapeTensor)],
                extra=[t for t in (operand0,) if isinstance(t, ShapeTensor)])

    def bn_stats(dst: ShapeTensor, data: ShapeTensor, **kw: Any) -> None:
        rec.add("vector", "bn_stats", (dst, data), main=data)  # one pass over <= 512 elements per partition

    def bn_aggr(dst: ShapeTensor, data: ShapeTensor, **kw: Any) -> None:
        rec.add("vector", "bn_aggr", (dst, data))

    def tensor_partition_reduce(dst: ShapeTensor, op: Any, data: ShapeTensor, **kw: Any) -> None:
        rec.add("gpsimd", "tensor_partition_reduce", (dst, data), main=data)

    def nc_matmul(dst: ShapeTensor, stationary: ShapeTensor, moving: ShapeTensor, is_transpose: bool = False,
                  perf_mode: Any = None, **kw: Any) -> None:
        double = perf_mode is not None and getattr(perf_mode, "name", str(perf_mode)) not in ("none", "None")
        flags = (("is_transpose",) if is_transpose else ()) + (("double_row",) if double else ())
        rec.add("tensor", "nc_matmul", (dst, stationary, moving), flags=flags, rmw=bool(kw.get("accumulate")))

    def nc_transpose(dst: ShapeTensor, data: ShapeTensor, **kw: Any) -> None:
        default = "tensor" if dst.buffer == "psum" and data.buffer == "sbuf" else "vector"
        rec.add(engine_kw(kw, default), "nc_transpose", (dst, data))

    def tensor_copy_predicated(dst: ShapeTensor, src: Any, predicate: ShapeTensor, **kw: Any) -> None:
        rec.add("vector", "tensor_copy_predicated", [dst] + ([src] if isinstance(src, ShapeTensor) else [])
                + [predicate], rmw=True)

    def tensor_tensor_scan(dst: ShapeTensor, data0: ShapeTensor, data1: ShapeTensor, initial: Any = None,
                           **kw: Any) -> None:
        rec.add("vector", "tensor_tensor_scan", (dst, data0, data1))

    def scalar_tensor_tensor(dst: ShapeTensor, data: ShapeTensor, op0: Any = None, operand0: Any = None,
                             op1: Any = None, operand1: Any = None, **kw: Any) -> None:
        rec.add("vector", "scalar_tensor_tensor", (dst, data, operand1),
                extra=[t for t in (operand0,) if isinstance(t, ShapeTensor)])

    def affine_select(dst: ShapeTensor, pattern: Any = None, channel_multiplier: int = 0, on_true_tile: Any = None,
                      **kw: Any) -> None:
        rec.add("gpsimd", "affine_select", (dst, on_true_tile))

    def nc_n_gather(dst: ShapeTensor, data: ShapeTensor, indices: ShapeTensor, **kw: Any) -> None:
        rec.add("gpsimd", "nc_n_gather", (dst, data, indices), main=dst)  # per-partition gather: one pass over dst

    def sendrecv(src: ShapeTensor, dst: ShapeTensor, send_to_rank: int, recv_from_rank: int, pipe_id: int,
                 **kw: Any) -> None:
        rec.add("dma", "sendrecv", (dst, src))  # the tile moves to the peer core by DMA (costmodel.SYNC_INSTRUCTIONS)

    def core_barrier(data: ShapeTensor, cores: Any, engine: Any = None, **kw: Any) -> None:
        rec.add(_engine_name(engine, "gpsimd"), "core_barrier", (data,), writes=())

    def register_alloc(x: int | None = None) -> ShapeRegister:
        rec.add("sequencer", "register_alloc", ())
        return ShapeRegister(0 if x is None else int(x))

    def register_move(dst: ShapeRegister, src: Any) -> None:
        dst.value = src.value if isinstance(src, ShapeRegister) else int(src)
        rec.add("sequencer", "register_move", ())

    flags = tuple(loaded_flag) if isinstance(loaded_flag, (tuple, list)) else (loaded_flag,)
    loads = [0]

    def register_load(dst: ShapeRegister, src: ShapeTensor) -> None:
        # no data: every loaded flag is 0 unless asked otherwise (module docstring)
        dst.value = flags[min(loads[0], len(flags) - 1)]
        loads[0] += 1
        rec.add("sequencer", "register_load", (src,), writes=())

    def register_store(dst: ShapeTensor, src: ShapeRegister) -> None:
        rec.add("sequencer", "register_store", (dst,))

    def at_line(fn: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            rec.line = sys._getframe(1).f_lineno
            return fn(*args, **kw)

        call.__name__ = fn.__name__
        return call

    for fn in (dma_copy, dma_transpose, dma_compute, tensor_copy, tensor_tensor, tensor_scalar, memset, iota,
               activation, reciprocal, tensor_reduce, tensor_scalar_reduce, bn_stats, bn_aggr, tensor_partition_reduce,
               nc_matmul, nc_transpose, tensor_copy_predicated, tensor_tensor_scan, scalar_tensor_tensor,
               affine_select, nc_n_gather, sendrecv, core_barrier, register_alloc, register_move, register_load,
               register_store):
        setattr(isa, fn.__name__, at_line(fn))
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


class Stream(Counter[InstructionRecord]):
    """A kernel's instruction counts (``{record: count}``, every program of its launch grid) and, per program, its
    :class:`~neuron_compile.scheduler.Schedule` on ``target`` (what :func:`~neuron_compile.costmodel.estimate`
    reports)."""

    def __init__(self, target: str | None = None) -> None:
        super().__init__()
        self.target = target
        self.schedules: list[Any] = []
        self.segments: list[Counter[InstructionRecord]] = []


@functools.lru_cache(maxsize=64)
def code_tree(source: str) -> list[ast.stmt]:
    return ast.parse(source).body


_GRID_LINE = re.compile(r"^LAUNCH_GRID = (\d+)\b", re.M)


def _declared_grid(source: str) -> int:
    """The launch grid a kernel declares at module level (``LAUNCH_GRID = n``, see codegen's frame), else 1."""
    if "LAUNCH_GRID" not in source:
        return 1
    match = _GRID_LINE.search(source)
    if match:  # the codegen's form: no need to parse the kernel again
        return int(match.group(1))
    probe: dict[str, Any] = {"__builtins__": builtins.__dict__}
    try:  # any other module-level assignment
        exec(compile(ast.Module([n for n in code_tree(source) if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "LAUNCH_GRID" for t in n.targets)], []), "<grid>", "exec"), probe)
    except Exception:  # noqa: BLE001 - a grid we can't read is the one we were given
        pass
    return int(probe.get("LAUNCH_GRID", 1))


@functools.lru_cache(maxsize=64)
def _compiled(source: str, name: str) -> Any:
    tree = ast.fix_missing_locations(LoopDriver().visit(ast.parse(source)))
    return compile(tree, f"<stream:{name}>", "exec")


def _run_source(source: str, name: str, args: Sequence[tuple[int, str]], loaded_flag: int | tuple[int, ...],
                target: str | None = None, grid: int = 1, schedule: bool = True, timeline: bool = False, fast: bool = True,
                first_program: bool = False, budget_ns: float = math.inf) -> Stream:
    """Run the kernel once per program of its launch grid on the shape-only namespaces, scheduling each program
    (``first_program``: program 0 only, see :func:`kernel_time_ns`; ``budget_ns``: the scheduler raises
    :class:`~neuron_compile.scheduler.OverBudget` once a program's makespan passes it)."""
    from neuron_compile.config import config
    from neuron_compile.scheduler import Alloc, Scheduler

    target = target or config.target
    code = _compiled(source, name)
    real_import = builtins.__import__
    out = Stream(target)
    grid = max(grid, _declared_grid(source))
    for pid in range(1 if first_program else grid):
        sched = Scheduler(target, timeline=timeline) if schedule else None
        if sched is not None:
            sched.budget_ns = budget_ns
        rec = _Recorder(sched, fast=fast and not timeline)
        nki, nl, isa = _namespaces(rec, loaded_flag, (pid, grid))
        subs = {"nki": nki, "nki.language": nl, "nki.isa": isa}

        def imp(modname: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0,
                subs: dict[str, Any] = subs, nki: Any = nki) -> Any:
            if level == 0 and modname in subs:
                return subs[modname] if fromlist else nki
            return real_import(modname, globals, locals, fromlist, level)

        bdict = dict(builtins.__dict__)
        bdict["__import__"] = imp
        env: dict[str, Any] = {"__name__": __name__, "__builtins__": bdict, "__nc_loop__": rec.loop}
        exec(code, env)
        from neuron_compile.costmodel import itemsize

        # kernel arguments are device tensors in shared HBM, as the runner passes them (neuron_compile.device)
        env[name](*[ShapeTensor((n,), (1,), dt, "shared_hbm", Alloc("shared_hbm", 0, itemsize(dt), None, 0), 0)
                    for n, dt in args])
        out.update(rec.record_counts(rec.counts))
        for i, seg in enumerate(rec.segments):
            if i < len(out.segments):
                out.segments[i].update(rec.record_counts(seg))
            else:
                out.segments.append(rec.record_counts(seg))
        if sched is not None:
            out.schedules.append(sched.result())
    if not first_program:
        from neuron_compile.scheduler import couple_programs

        couple_programs(out.schedules)
    return out


def source_stream(source: str, name: str, args: Sequence[tuple[int, str]],
                  loaded_flag: int | tuple[int, ...] = 0,
                  target: str | None = None, grid: int = 1, timeline: bool = False, exact: bool = False) -> Stream:
    """Records of one rendered kernel ``name`` called with flat HBM args ``(numel, dtype)`` on a launch grid of
    ``grid`` programs, scheduled on ``target`` (default ``config.target``); every register loaded from a tensor
    holds ``loaded_flag``; ``timeline`` keeps every scheduled instruction; ``timeline`` or ``exact`` schedule every
    loop iteration (slower; loops are otherwise skipped or fast-forwarded once in steady state)."""
    return _run_source(source, name, args, loaded_flag, target, grid, timeline=timeline, fast=not exact)




def kernel_stream(kernel: Any, loaded_flag: int | tuple[int, ...] = 0, target: str | None = None,
                  timeline: bool = False, exact: bool = False) -> Stream:
    """The instruction stream of one IR kernel (any family), rendered by the real codegen (``loaded_flag``: the value
    of every register loaded from a tensor, e.g. 1 to cost an attention kernel whose guard trips)."""
    from neuron_compile.codegen.render import render_kernel

    return source_stream(render_kernel(kernel), kernel.name, [(a.numel, a.dtype) for a in kernel.inputs],
                         loaded_flag, target, 1, timeline, exact)


def kernel_time_ns(kernel: Any, target: str | None = None, budget_ns: float = math.inf) -> float:
    """The scheduled time of ``kernel`` (as ``estimate(kernel_stream(kernel)).time_ns``) for tuners ranking
    candidates: only program 0 of a launch grid is scheduled. The codegen splits a loop cyclically (the attention,
    loop, index and matmul plans: program ``i`` runs iterations ``i, i + grid, ...``), so program 0 runs the most
    iterations (``ceil(n / grid)``, and program 1 the ragged last one when ``n`` is even) on an identical core: it is
    the slowest program, whose makespan is the kernel's.

    ``budget_ns``: a candidate whose makespan passes it stops being scheduled there and gets ``math.inf`` (its time
    would be larger still: the makespan only grows, and the estimate adds the launch to it)."""
    from neuron_compile.codegen.render import render_kernel
    from neuron_compile.costmodel import estimate
    from neuron_compile.scheduler import OverBudget

    try:
        stream = _run_source(render_kernel(kernel), kernel.name, [(a.numel, a.dtype) for a in kernel.inputs], 0,
                             target, first_program=True, budget_ns=budget_ns)
    except OverBudget:
        return math.inf
    return estimate(stream, stream.target).time_ns


def kernel_streams(kernels: Sequence[Any], loaded_flag: int | tuple[int, ...] = 0, target: str | None = None,
                   timeline: bool = False) -> list[Stream]:
    """:func:`kernel_stream` of each kernel; kernels that render the same source but for their name (one per
    transformer layer) are enumerated and scheduled once and share one (read-only) :class:`Stream`."""
    from neuron_compile.codegen.render import render_kernel

    seen: dict[Any, Stream] = {}
    out = []
    for k in kernels:
        src = render_kernel(k)
        args = tuple((a.numel, a.dtype) for a in k.inputs)
        key = (src.replace(k.name, "\0"), args)
        stream = seen.get(key)
        if stream is None:
            stream = seen[key] = source_stream(src, k.name, args, loaded_flag, target, 1, timeline)
        out.append(stream)
    return out


def kernel_segments(kernel: Any, loaded_flag: int = 0) -> list[Counter[InstructionRecord]]:
    """:func:`kernel_stream` split at every ``register_load``: the parts run one after the other (first-order
    costs of each add with :func:`~neuron_compile.costmodel.total`)."""
    return [seg for seg in kernel_stream(kernel, loaded_flag).segments if seg]


def count_instructions(counts: Counter[InstructionRecord]) -> Counter[tuple[str, str]]:
    """(engine, instruction) -> number executed."""
    out: Counter[tuple[str, str]] = Counter()
    for r, c in counts.items():
        out[(r.engine, r.instruction)] += c
    return out
