"""Plans for the kernel families whose template is the whole kernel (sort, ...).

Each family template (``templates/<family>.nki.j2``) extends the shared frame and renders the kernel
from the IR (``k``) and a plan this module computes as plain data: loop extents, the outer-loop offset
terms, network stages, sentinel values. No NKI text is built here; :func:`family_plan` only returns
numbers, tuples and strings naming NKI ops.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from neuron_compile.lowering.ir import (
    Access,
    LineGatherKernel,
    ScanKernel,
    ScatterKernel,
    SearchKernel,
    SortKernel,
)

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

SORT_CHUNK = 4096  # elements per partition when a row spans several partitions (a long sort)
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
NAN_KEY = 0x7FC00000  # every NaN's key: above +inf's (0x7F800000), below the ascending pad key


def literal(value: float | int) -> str:
    """A Python literal for a number a template writes into the kernel (inf and NaN included)."""
    if isinstance(value, float) and value != value:
        return "float('nan')"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "float('inf')" if value > 0 else "-float('inf')"
    return repr(value)


def outer_terms(space: tuple[int, ...], n_outer: int, access: Access | None) -> list[tuple[int, int, int]]:
    """(divisor, size, stride) per outer dim: the dim's index is ``o // divisor % size`` of one flat loop ``o``."""
    if access is None:
        return []
    terms = []
    div = 1
    for d in range(n_outer - 1, -1, -1):
        if access.strides[d] and space[d] > 1:
            terms.append((div, space[d], access.strides[d]))
        div *= space[d]
    return terms[::-1]


def _sort_plan(k: SortKernel) -> dict[str, Any]:
    n = k.space[-1]
    n_pad = 1 << max(n - 1, 0).bit_length()
    chunks = k.chunks
    m = n_pad // chunks  # elements per partition
    stages = []
    size = 2
    while size <= n_pad:
        half = size // 2
        # direction of a block of `size`: within a partition from the free dims (shift -1); for blocks spanning
        # partitions bit log2(size / m) of the partition index; the last merge ascends everywhere
        shift = (size // m).bit_length() - 1 if m <= size < n_pad else -1
        while half >= 1:
            # one compare-exchange step: pairs (i, i + half) inside blocks of `size` (sorted up, then down)
            if half >= m:  # pairs `half // m` partitions apart (kind 1)
                stages.append((size, half, 1, 1, 1, 1, shift, (half // m).bit_length() - 1))
            elif size >= m:  # blocks span partitions: this step stays within each partition
                stages.append((size, half, 1, 1, m // (2 * half), 0, shift, 0))
            else:
                stages.append((size, half, m // (2 * size), 2, size // (2 * half), 0, -1, 0))
            half //= 2
        size *= 2
    lo, hi = k.keep
    if chunks == 1 and not k.select and 4 * hi <= n_pad:
        stages = _topk_stages(n_pad, 1 << max(hi - 1, 1).bit_length())
    return {
        "n": n, "n_pad": n_pad, "rows": k.space[-2], "outer": math.prod(k.space[:k.n_outer]),
        "src_terms": outer_terms(k.space, k.n_outer, k.src),
        "val_terms": outer_terms(k.space, k.n_outer, k.values),
        "idx_terms": outer_terms(k.space, k.n_outer, k.indices),
        "stages": tuple(stages), "lo": lo, "width": hi - lo,
        "key_cmp": "less" if k.descending else "greater",
        "pad_key": INT32_MIN if k.descending else INT32_MAX, "nan_key": NAN_KEY,
        "carry_values": k.key == "float" and (k.values is not None or bool(k.select)),
        "chunks": chunks, "m": m, "row_tile": PMAX // chunks, "full": n // m, "rem": n % m,
        "pad_value": literal(float("-inf") if k.descending else float("nan")) if k.key == "float"
        else (INT32_MIN if k.descending else INT32_MAX),
    }


def _topk_stages(n_pad: int, best: int) -> list[tuple[int, ...]]:
    """A bitonic top-k network: blocks of ``best`` sorted in alternating directions, then rounds of a half-cleaner
    between neighbour blocks (the best ``best`` of each pair move to its first block), a compaction keeping
    those blocks (kind 2: the tile halves) and a bitonic merge of each; ~(1 + log2 best) * n compares instead of
    a full sort's log2(n)^2 * n / 2."""
    stages = []
    size = 2
    while size <= best:
        half = size // 2
        while half >= 1:
            stages.append((size, half, n_pad // (2 * size), 2, size // (2 * half), 0, -1, 0))
            half //= 2
        size *= 2
    width = n_pad
    while width > best:
        stages.append((best, best, width // (2 * best), 1, 1, 0, -1, 0))  # half-cleaner, every pair forward
        stages.append((best, 0, 0, 0, 0, 2, -1, 0))  # keep the first block of each pair
        width //= 2
        half = best // 2
        while half >= 1:
            stages.append((best, half, max(width // (2 * best), 1), min(2, width // best), best // (2 * half), 0, -1, 0))
            half //= 2
    return stages


SEARCH_CHUNK = 2048  # values per partition per chunk: ~10 live [P, F] int32 tiles, 80 KiB


def _search_plan(k: SearchKernel) -> dict[str, Any]:
    m = k.space[-1]
    return {
        "m": m, "rows": k.space[-2], "outer": math.prod(k.space[:k.n_outer]), "chunk": max(1, min(SEARCH_CHUNK, m)),
        "steps": k.n_seq.bit_length(),  # each step at least halves every [lo, hi): n_seq -> 0
        "val_terms": outer_terms(k.space, k.n_outer, k.values), "out_terms": outer_terms(k.space, k.n_outer, k.out),
        "seq_terms": outer_terms(k.space, k.n_outer, k.seq), "sorter_terms": outer_terms(k.space, k.n_outer, k.sorter),
    }


GATHER_INDEX_CHUNK = 2048  # indices per partition per chunk
GATHER_LINE_CHUNK = 16384  # elements of x's line per partition per nc_n_gather (64 KiB fp32)


def _line_gather_plan(k: LineGatherKernel) -> dict[str, Any]:
    j = k.space[-1]
    sc = min(GATHER_LINE_CHUNK, k.size)
    return {
        "j": j, "jc": max(1, min(GATHER_INDEX_CHUNK, j)), "sc": sc, "chunks": -(-k.size // sc),
        "rows": k.space[-2], "outer": math.prod(k.space[:k.n_outer]),
        "idx_terms": outer_terms(k.space, k.n_outer, k.index), "x_terms": outer_terms(k.space, k.n_outer, k.x),
        "out_terms": outer_terms(k.space, k.n_outer, k.out),
    }


SCATTER_INDEX_CHUNK = 512  # indices per partition per step
SCATTER_STEP = 2048  # targets x indices compared per partition per step (the [P, T, F] tiles)
_SCATTER_OPS = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "maximum", "amin": "minimum",
                "assign": "add"}
_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": float("-inf"), "amin": float("inf"), "assign": 0.0}
_INT_IDENTITY = {"sum": 0, "prod": 1, "amax": INT32_MIN, "amin": INT32_MAX, "assign": 0}


def _scatter_plan(k: ScatterKernel) -> dict[str, Any]:
    j = k.space[-1]
    jc = max(1, min(SCATTER_INDEX_CHUNK, j))
    keep_unhit = k.reduce == "assign" or not k.include_self
    identity = _IDENTITY[k.reduce] if k.key == "float" else _INT_IDENTITY[k.reduce]
    fill = float(k.fill) if k.key == "float" else int(k.fill)
    # self copied whole first, in [rows, cols] blocks (cols <= 8192) plus a ragged tail
    precopy = []
    if k.precopy:
        cols = min(k.precopy, 8192)
        rows = k.precopy // cols
        precopy.append((rows, cols, 0))
        if k.precopy - rows * cols:
            precopy.append((1, k.precopy - rows * cols, rows * cols))
    return {
        "j": j, "jc": jc, "tc": max(1, min(k.size, SCATTER_STEP // jc)), "rows": k.space[-2],
        "outer": math.prod(k.space[:k.n_outer]), "op": _SCATTER_OPS[k.reduce],
        "identity": literal(identity), "fill": literal(fill), "count": keep_unhit or k.reduce == "mean", "keep_unhit": keep_unhit,
        "precopy": precopy,
        "idx_terms": outer_terms(k.space, k.n_outer, k.index), "src_terms": outer_terms(k.space, k.n_outer, k.src),
        "base_terms": outer_terms(k.space, k.n_outer, k.base), "out_terms": outer_terms(k.space, k.n_outer, k.out),
    }


CUMULATIVE_CHUNK = 512  # free elements per scan chunk (the int (hi, lo) scan keeps ~8 such tiles)
# fp32 scans r_i = op1(op0(unit, r_(i-1)), x_i) from r = init: sum (1 * r) + x, product (0 + r) * x
_SCAN = {"sum": (0.0, 1.0, "multiply", "add"), "prod": (1.0, 0.0, "add", "multiply"),
         "logsumexp": (0.0, 0.0, "add", "add")}


def _cumulative_plan(k: ScanKernel) -> dict[str, Any]:
    n = k.space[-1]
    init, unit, op0, op1 = _SCAN.get(k.op, (0.0, 0.0, "add", "add"))
    return {
        "n": n, "chunk": max(1, min(CUMULATIVE_CHUNK, n)), "rows": k.space[-2], "outer": math.prod(k.space[:k.n_outer]),
        "init": init, "unit": unit, "op0": op0, "op1": op1,
        "int_op": "maximum" if k.op == "max" else "minimum", "nan_key": NAN_KEY if k.op == "max" else INT32_MIN,
        "src_terms": outer_terms(k.space, k.n_outer, k.src), "val_terms": outer_terms(k.space, k.n_outer, k.values),
        "idx_terms": outer_terms(k.space, k.n_outer, k.indices),
    }


_PLANS = {SortKernel: _sort_plan, SearchKernel: _search_plan, LineGatherKernel: _line_gather_plan,
          ScatterKernel: _scatter_plan, ScanKernel: _cumulative_plan}


def family_plan(kernel: Any) -> dict[str, Any]:
    return _PLANS[type(kernel)](kernel)
