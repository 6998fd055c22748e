"""Scheduling decisions of a loop kernel's body: SBUF buffers, engines, fused reductions.

Input: the sequence of tile ops one kernel emits per loop body (what :class:`codegen.plan_loop.LoopRenderer`
renders, in order). Output, all used by the renderer only (the IR stays unchanged):

- :func:`assign_buffers`: each full tile op writes in place into an operand tile that dies at that op
  (same dtype), so a chain of N elementwise ops needs one SBUF tile instead of N. Returns the
  buffer each emission writes and the peak number of live full tiles (the SBUF budget check).
- :func:`assign_engines`: Vector, Scalar and GpSimd all execute elementwise work; ops go to the engine
  that keeps the busiest engine least loaded (longest op first), with per-op costs from
  :mod:`neuron_compile.costmodel` (REFERENCE 3.3 for which engine may run what, 4.3 for costs).
- :func:`fuse_act_reduce`: an add-reduction of an ``activation`` output in the same body becomes the
  activation's own accumulator read-out (``reduce_res``, REFERENCE 3.3 / 5.3), so VectorE does not
  read the tile a second time.
- :func:`use_moments`: a row's sum and its sum of squared deviations from the mean (LayerNorm, var)
  become one VectorE statistics pass (``bn_stats`` per 512 elements + ``bn_aggr``) instead of a reduce,
  a centring pass and a square-and-sum pass over the resident row. The template takes the statistics of
  the row shifted by its first element (ScalarE, a chunk ahead), so the variance keeps its precision
  where the mean dwarfs the spread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from neuron_compile.lowering.ir import TileOp

from neuron_compile import costmodel
from neuron_compile.simulator.targets import LIMITS

log = logging.getLogger(__name__)

# Opcodes whose output may overwrite an operand (element-wise streaming: every output element depends only
# on the same element of the operands). Value: operand positions that may be overwritten.
_INPLACE = {"tensor_tensor": (0, 1), "tensor_scalar": (0,), "activation": (0,), "reciprocal": (0,),
            "round": (0,), "select": (2,)}
# ScalarE tensor_scalar on trn2 supports only these (op0, op1) pairs (REFERENCE 3.3).
_SCALAR_TS = {("multiply", "add"), ("multiply", None), ("add", None)}
# Tile dtypes of float compute ops (fp32 compute inside; bf16/fp16 tiles hold storage-dtype values).
_FLOAT_TILES = ("float32", "bfloat16", "float16")


@dataclass
class Buffers:
    writes: list[str]  # per emission: the buffer it writes (its own name when it allocates)
    inplace: list[bool]  # per emission: writes into a dying operand's tile (no allocation)
    peak: int  # most full tiles live at once (pinned tiles excluded)
    peak_bytes: int = 0  # bytes per free element of the live full tiles at that point (dtype-aware)
    alloc_bytes: int = 0  # bytes per free element of every full tile the body allocates (one scope)


def _full_args(op: TileOp, kinds: dict[str, str]) -> list[str]:
    return [a for a in op.args if isinstance(a, str) and kinds.get(a) == "full"]


def assign_buffers(flat: Sequence[TileOp], kinds: dict[str, str], dtypes: dict[str, str],
                   pinned: set[str]) -> Buffers:
    """Buffers for a straight-line emission order ``flat`` (loads, full ops, reduces, stores)."""
    n = len(flat)
    dying: list[set[str]] = [set() for _ in range(n)]
    live: set[str] = set()
    live_before: list[set[str]] = [set() for _ in range(n)]
    # a bitcast is a view of its source's bytes: reading it reads the source, kept live (unwritten) until then
    views = {op.out: op.args[0] for op in flat if op.opcode == "bitcast"}
    for i in range(n - 1, -1, -1):
        op = flat[i]
        args = set(_full_args(op, kinds))
        args |= {views[a] for a in args if a in views}
        dying[i] = {a for a in args if a not in live}
        live.discard(op.out)
        live |= args
        live_before[i] = set(live)
    buf_of: dict[str, str] = {}
    writes: list[str] = []
    inplace: list[bool] = []
    peak = peak_bytes = 0
    buf_dtype: dict[str, str] = {}
    for i, op in enumerate(flat):
        target = None
        if op.kind == "full" and op.opcode in _INPLACE:
            for pos in _INPLACE[op.opcode]:
                a = op.args[pos] if pos < len(op.args) else None
                if isinstance(a, str) and a in dying[i] and a not in pinned and a not in views and kinds.get(a) == "full" \
                        and dtypes.get(a) == op.dtype and a in buf_of:
                    target = buf_of[a]
                    break
        if op.opcode in ("store", "reduce"):
            writes.append(op.out)
            inplace.append(False)
        else:
            buf_of[op.out] = target or op.out
            buf_dtype.setdefault(buf_of[op.out], dtypes.get(op.out, op.dtype))
            writes.append(buf_of[op.out])
            inplace.append(target is not None)
        held = {buf_of[x] for x in live_before[i] if x in buf_of and x not in pinned}
        if op.kind == "full" and op.opcode not in ("store", "reduce"):
            held.add(buf_of[op.out])
        peak = max(peak, len(held))
        peak_bytes = max(peak_bytes, sum(costmodel.itemsize(buf_dtype.get(b, "float32")) for b in held))
    alloc_bytes = sum(costmodel.itemsize(buf_dtype.get(b, "float32")) for b in set(writes)
                      if b in buf_dtype and kinds.get(b) == "full" and b not in pinned)
    return Buffers(writes, inplace, peak, peak_bytes, alloc_bytes)


def engine_options(op: TileOp, target: str) -> tuple[str, ...]:
    """Engines that may execute ``op`` (fp32 compute ops only; everything else keeps the default)."""
    attrs = dict(op.attrs)
    if op.dtype not in _FLOAT_TILES or op.kind != "full":
        return ()
    if op.opcode == "tensor_tensor":
        return ("vector", "gpsimd")
    if op.opcode == "tensor_scalar":
        pair = (attrs.get("op0"), attrs.get("op1"))
        ok = pair in _SCALAR_TS and not attrs.get("reverse0") and not attrs.get("reverse1") \
            and costmodel.hardware(target).nc_version >= 3
        return ("vector", "scalar") if ok else ("vector",)
    if op.opcode == "fill":
        return ("vector", "gpsimd")
    return ()


def _fixed_engine(op: TileOp) -> str | None:
    return {"activation": "scalar", "reduce": "vector", "reciprocal": "vector", "select": "vector",
            "iota": "gpsimd", "broadcast": "vector", "cast": "vector", "predicate": "vector",
            "round": "vector"}.get(op.opcode)


def op_ns(op: TileOp, engine: str, free: int, target: str, kinds: dict[str, str],
          dtypes: dict[str, str] | None = None) -> float:
    """Cost-model time of one instance of ``op`` on ``engine`` over a [128, free] tile.

    With ``dtypes`` (tile dtype per value), VectorE perf modes count as in the cost model: every tile
    of the instruction bf16/fp16 -> tensor_scalar / tensor_copy 4x, tensor_tensor 2x (REFERENCE 4.3).
    """
    hw = costmodel.hardware(target)
    ghz = {"vector": hw.vector_ghz, "scalar": hw.scalar_ghz, "gpsimd": hw.gpsimd_ghz}[engine]
    inputs = 2 if op.opcode in ("tensor_tensor", "select") else 1
    work = float(free * inputs)
    if op.opcode == "reciprocal":
        work = free * costmodel.VECTOR_RECIPROCAL_CYCLES
    elif engine == "vector" and hw.nc_version >= 3:
        tiles = [op.dtype] + [(dtypes or {}).get(a, "float32") for a in op.args if isinstance(a, str) and a in kinds]
        speedup = costmodel.VECTOR_WIDE_V3  # NC-v3+ VectorE: 2 elements per partition per cycle
        if dtypes is not None and all(d in costmodel.LOW_PRECISION for d in tiles):
            speedup = max(speedup, {"tensor_scalar": costmodel.VECTOR_PERF_MODE_MAX,
                                    "cast": costmodel.VECTOR_PERF_MODE_MAX}.get(op.opcode, speedup))
        work /= speedup
    return (costmodel.INSTRUCTION_OVERHEAD + work) / ghz


def assign_engines(body: Sequence[TileOp], free: int, target: str, kinds: dict[str, str],
                   load: dict[str, float] | None = None, dtypes: dict[str, str] | None = None) -> dict[str, str]:
    """``{op.out: engine}`` for ops with a choice; ``load`` (per-engine ns) carries over between bodies."""
    load = load if load is not None else {"vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
    fused = set(fuse_act_reduce(body))
    for op in body:
        fixed = _fixed_engine(op)
        if op.opcode == "reduce" and op.out in fused:
            load["scalar"] += costmodel.ACT_READ_ACCUMULATOR / costmodel.hardware(target).scalar_ghz
        elif fixed is not None and (op.kind == "full" or op.opcode == "reduce"):
            load[fixed] += op_ns(op, fixed, free, target, kinds, dtypes)
    flexible = [op for op in body if engine_options(op, target)]
    cost = {op.out: {e: op_ns(op, e, free, target, kinds, dtypes) for e in engine_options(op, target)}
            for op in flexible}
    choice: dict[str, str] = {}
    for op in sorted(flexible, key=lambda o: -min(cost[o.out].values())):
        best = min(cost[op.out], key=lambda e: (load[e] + cost[op.out][e], e != "vector"))
        load[best] += cost[op.out][best]
        choice[op.out] = best
    return choice


def assign_engines_rows(body: Sequence[TileOp], free: int, target: str, kinds: dict[str, str], rows: int,
                        dtypes: dict[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Row groups: ``{op.out: (engine of row 0, ..., engine of row rows-1)}`` for ops with a choice.

    Each of the ``rows`` instances of an op (one per row of the group, same instruction) is placed on
    its own, longest first, on the engine that finishes it earliest: with R rows an op's work splits
    across engines in steps of 1/R, so two GpSimd/VectorE tensor_tensors no longer leave one engine idle.
    """
    load = {"vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
    fused = set(fuse_act_reduce(body))
    for op in body:
        fixed = _fixed_engine(op)
        if op.opcode == "reduce" and op.out in fused:
            load["scalar"] += rows * costmodel.ACT_READ_ACCUMULATOR / costmodel.hardware(target).scalar_ghz
        elif fixed is not None and (op.kind == "full" or op.opcode == "reduce"):
            load[fixed] += rows * op_ns(op, fixed, free, target, kinds, dtypes)
    flexible = [op for op in body if engine_options(op, target)]
    cost = {op.out: {e: op_ns(op, e, free, target, kinds, dtypes) for e in engine_options(op, target)}
            for op in flexible}
    choice: dict[str, list[str]] = {op.out: [] for op in flexible}
    for op in sorted(flexible, key=lambda o: -min(cost[o.out].values())):
        for _ in range(rows):
            best = min(cost[op.out], key=lambda e: (load[e] + cost[op.out][e], e != "vector"))
            load[best] += cost[op.out][best]
            choice[op.out].append(best)
    return {name: tuple(sorted(engines, key=lambda e: e != "vector")) for name, engines in choice.items()}


def fuse_act_reduce(body: Sequence[TileOp]) -> dict[str, str]:
    """``{reduce.out: activation.out}`` for fp32 add-reductions of an activation emitted earlier in ``body``."""
    acts = {}
    fused: dict[str, str] = {}
    for op in body:
        if op.opcode == "activation" and op.dtype == "float32" and op.kind == "full":
            acts[op.out] = op
        elif op.opcode == "reduce" and op.dtype == "float32":
            a = dict(op.attrs)
            src = op.args[0]
            if a.get("op") == "add" and not a.get("negate") and src in acts and src not in fused.values():
                fused[op.out] = src
    return fused


def use_moments(ops: Sequence[TileOp], count: int) -> list[TileOp] | None:
    """The ops with a mean/variance pair computed by VectorE's statistics instructions, or None.

    Matches (fp32 rows, one row of ``count`` elements resident per partition, reduced over the free dim only):
    ``s = sum(x)``, ``nm = s * a [* b]`` with ``a * b == -1 / count`` (the negated mean), ``c = x + nm``,
    ``q = sum(square(c))`` (or ``sum(square(x + nm))``, the centring folded into the square's bias) where the
    square is read only by that sum. Result: ``s`` becomes one
    ``reduce(x, op='moments', var=q, count=count)`` that writes both ``s`` (``count * mean``) and ``q``
    (``count * variance``: ``bn_aggr``'s population variance) in its phase; ``q`` stays as a ``moments_var`` row op
    that renders nothing (its value is ready after ``s``'s phase); the square is gone; and ``c``, when its only other
    reader is a one-stage ``tensor_scalar(c, v, op)`` (the normalisation), folds into it as
    ``tensor_scalar(x, nm, v, add, op)`` (each stage rounds to fp32 as the separate ops did).
    """
    by_out = {op.out: op for op in ops}
    users: dict[str, list[TileOp]] = {}
    for op in ops:
        for a in op.args:
            if isinstance(a, str):
                users.setdefault(a, []).append(op)

    def add_reduce(op: TileOp | None) -> bool:
        return op is not None and op.opcode == "reduce" and op.kind == "row" and op.dtype == "float32" \
            and op.attr("op") == "add" and not op.attr("negate") and isinstance(op.args[0], str)

    for q in ops:
        if not add_reduce(q):
            continue
        sq = by_out.get(q.args[0])
        if sq is None or sq.opcode != "activation" or sq.attr("func") != "square" or sq.kind != "full" \
                or len(sq.args) != 3 or sq.args[1] != 1.0 or len(users.get(sq.out, [])) != 1:
            continue
        c = None
        if sq.args[2] == 0.0:  # square(c), c = x + nm a tile of its own
            c = by_out.get(sq.args[0])
            if c is None or c.opcode != "tensor_scalar" or c.kind != "full" or c.dtype != "float32" \
                    or c.attr("op0") != "add" or c.attr("op1") or c.attr("reverse0") or len(c.args) != 2:
                continue
            x, nm_name = c.args
        else:  # the centring already folded into the square's bias: square(x + nm)
            x, nm_name = sq.args[0], sq.args[2]
        nm = by_out.get(nm_name) if isinstance(nm_name, str) else None
        if not isinstance(x, str) or nm is None or nm.opcode != "tensor_scalar" or nm.kind != "row" \
                or nm.attr("op0") != "multiply" or nm.attr("reverse0") or nm.attr("reverse1"):
            continue
        factors = list(nm.args[1:])
        if (nm.attr("op1") or "multiply") != "multiply" or not all(isinstance(f, float) for f in factors):
            continue
        scale = 1.0
        for f in factors:
            scale *= f
        s = by_out.get(nm.args[0]) if isinstance(nm.args[0], str) else None
        if not add_reduce(s) or s is None or s.args[0] != x or s.phase > q.phase \
                or abs(scale * count + 1.0) > 1e-6:
            continue
        return _read_moments(_with_moments(ops, s, q, sq, c, users, count), s.out, q.out, nm.out, count)
    return None


def reduction_tiles(reduces: Sequence[TileOp], views: bool = False) -> list[dict[str, str]]:
    """The ``[P, 1]`` tiles a body's reductions write (a moments op: its two results; with ``views``, where the
    template binds a moments op's mean and variance as views of its bn_aggr tile, none for those, see
    :func:`_read_moments`)."""
    out = []
    for op in reduces:
        moments = op.attr("op") == "moments"
        if not (views and moments and op.attr("as_mean")):
            out.append({"out": op.out, "dtype": op.dtype})
        if moments and not (views and op.attr("as_var")):
            out.append({"out": op.attr("var"), "dtype": "float32"})
    return out


def _read_moments(ops: list[TileOp], s: str, q: str, nm: str, count: int) -> list[TileOp]:
    """Read ``bn_aggr``'s mean and variance as they are where the kernel only rescales them back: ``s`` (count x mean)
    read by nothing but the negated mean ``nm = s * (-1 / count)``, which only centres rows (``x + nm`` as the first
    stage of a tensor_scalar), becomes the mean itself and the centring ``x - mean`` (no ``s`` or ``nm``
    instruction); ``q`` (count x variance) read only by activations that scale it (the rstd's
    ``sqrt(q / count + eps)``, or ``sqrt(q / (count * 2^20) + eps / 2^20)`` where the lowering keeps sqrt's input in
    range) becomes the variance, read at the scale times count. Each skipped instruction was a dependent
    VectorE hop (a write-back wait) in every row's statistics chain; the values are bn_aggr's without the
    multiply-and-divide round trip (one fp32 rounding fewer each). Attrs ``as_mean`` / ``as_var`` of the moments
    op: it writes the mean / variance itself, as a view of its ``bn_aggr`` tile where the kernel allocates the
    result for it (:func:`reduction_tiles`), else by a copy into the tile it is given (a row group's column).

    Attr ``shift``: take the statistics of ``x0 - x`` (x0 the row's first element). bn_stats keeps fp32 means, so
    where |mean| >> spread the raw row's variance loses digits to ulps of the mean (1e4 + randn over 8 elements:
    7e-4 relative; eager: 6e-8); shifted, it keeps the spread's precision, for one ScalarE pass over the row. A
    normalisation (the mean only centres rows, the variance only feeds a (r)sqrt) skips it: its result's error is
    already set by the fp32 rounding of the mean, as in eager's kernels, and the statistics' error is of that
    order; GPT-2's LayerNorms cannot spare ScalarE the pass."""
    def readers(name: str) -> list[TileOp]:
        return [op for op in ops if name in op.args and op.opcode != "moments_var"]

    centring = readers(nm)
    mean_view = [op.out for op in readers(s)] == [nm] and bool(centring) and all(  # s becomes the mean, nm goes
        u.opcode == "tensor_scalar" and u.kind == "full" and len(u.args) >= 2 and u.args[0] != nm
        and u.args[1] == nm and nm not in u.args[2:] and u.attr("op0") == "add" and not u.attr("reverse0")
        for u in centring)
    scaled = readers(q)
    var_view = bool(scaled) and all(u.opcode == "activation" and u.kind == "row" and len(u.args) == 3
                                    and u.args[0] == q and q not in u.args[1:] and isinstance(u.args[1], float)
                                    for u in scaled)
    normalises = mean_view and bool(scaled) and all(u.opcode == "activation" and u.kind == "row"
                                                    and u.attr("func") in ("sqrt", "rsqrt") for u in scaled)
    out: list[TileOp] = []
    for op in ops:
        if op.out == s and op.attr("op") == "moments":
            op = replace(op, attrs=op.attrs + (("as_mean", mean_view), ("as_var", var_view),
                                               ("shift", not normalises)))
        elif mean_view and op.out == nm:
            continue
        elif mean_view and nm in op.args:
            attrs = tuple((k, "subtract" if k == "op0" else v) for k, v in op.attrs)
            op = replace(op, args=(op.args[0], s, *op.args[2:]), attrs=attrs)
        elif var_view and q in op.args and op.opcode == "activation":
            op = replace(op, args=(op.args[0], op.args[1] * count, op.args[2]))
        out.append(op)
    return out


def _with_moments(ops: Sequence[TileOp], s: TileOp, q: TileOp, sq: TileOp, c: TileOp | None,
                  users: dict[str, list[TileOp]], count: int) -> list[TileOp]:
    others = [u for u in users.get(c.out, []) if u is not sq] if c is not None else []
    fold = None
    if c is not None and len(others) == 1:
        u = others[0]
        a: dict[str, Any] = dict(u.attrs)
        if u.opcode == "tensor_scalar" and u.kind == "full" and len(u.args) == 2 and u.args[0] == c.out \
                and u.args[1] != c.out and not a.get("op1") and not a.get("reverse0") and a.get("op0") in _STAGES:
            fold = u
    out: list[TileOp] = []
    for op in ops:
        if op is sq or (fold is not None and op is c):
            continue
        if op is s:
            op = replace(op, attrs=(("op", "moments"), ("var", q.out), ("count", count)))
        elif op is q:
            op = replace(op, opcode="moments_var", args=(s.out,), attrs=())
        elif fold is not None and c is not None and op is fold:
            op = replace(op, args=(*c.args, op.args[1]), attrs=(("op0", "add"), ("reverse0", False),
                                                                ("op1", op.attr("op0")), ("reverse1", False)))
        out.append(op)
    return out


_STAGES = {"add", "subtract", "multiply", "maximum", "minimum"}


def hw_queue(src_dtype: str, dst_dtype: str, target: str) -> bool:
    """Whether a ``dma_copy`` may name its issue queue (``engine=nisa.engine.sync`` / ``scalar``): only on the hardware
    DGE (``dge_mode=nisa.dge_mode.hwdge``, NeuronCore-v3 and later), which moves bytes as they are, so only between
    equal dtypes. A converting DMA (bf16 or FP8 in HBM into fp32 or bf16 tiles) leaves the queue to the compiler."""
    return LIMITS[target].nc_version >= 3 and src_dtype == dst_dtype
