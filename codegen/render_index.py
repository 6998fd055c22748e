"""Kernel bodies for the index families: row gathers and one-hot index_put accumulation.

Inputs are :class:`~neuron_compile.lowering.ir.GatherKernel` and :class:`IndexAddKernel`; outputs are the
NKI body text that ``gather.nki.j2`` / ``index_put.nki.j2`` place inside the shared kernel frame (scans are
a family template, ``scan.nki.j2``). Kernel arguments are flat 1-D HBM buffers, so
every access is a raw ``.ap`` pattern; tile sizes respect the 128-partition, matmul-K/M <= 128 and
PSUM-bank N <= 512 limits (``simulator_limits``).
"""

from __future__ import annotations

import logging

from neuron_compile.codegen.render import Lines, _offset
from neuron_compile.lowering.ir import GatherKernel, IndexAddKernel

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

GATHER_FREE_TILE = 2048  # elements of one gathered row chunk per partition (8 KiB fp32 of 192 KiB SBUF)
MATMUL_N = 512  # one PSUM bank of fp32 per partition (matmul moving free size limit)


def _outer_loops(out: Lines, sizes: list[int]) -> list[str]:
    names = []
    for i, size in enumerate(sizes):
        out.add(f"for o{i} in range({size}):")
        out.depth += 1
        names.append(f"o{i}")
    return names


def gather_body(k: GatherKernel, table_dtype: str) -> str:
    """Indices on partitions (128 per tile), one indirect DMA per row chunk, rows stored densely.

    Full 128-row tiles go in groups: one DMA brings the indices of the whole group (``[128, T]``: row
    ``t * 128 + p`` on partition p), the index arithmetic runs once over the group, each tile's rows arrive
    by their own indirect DMA into a ``[128, T, F]`` staging tile that leaves in one store. A ragged last
    tile (fewer than 128 rows) is handled alone.
    """
    out = Lines()
    names = _outer_loops(out, [s for s, _, _ in k.outer])
    t_terms = [(v, ts) for v, (_, ts, _) in zip(names, k.outer, strict=True)]
    o_terms = [(v, os) for v, (_, _, os) in zip(names, k.outer, strict=True)]
    ft = min(GATHER_FREE_TILE, k.row_size)
    full, rem = divmod(k.rows, PMAX)
    group = max(1, min(full, GATHER_GROUP_BYTES // (ft * _itemsize(table_dtype)), GATHER_GROUP_TILES))
    if full:
        out.add(f"for g0 in range(0, {full}, {group}):")
        out.depth += 1
        out.add(f"T = min({group}, {full} - g0)")
        _gather_tiles(out, k, table_dtype, t_terms, o_terms, ft, group, "g0 * 128", "T")
        out.depth -= 1
    if rem:
        _gather_tiles(out, k, table_dtype, t_terms, o_terms, ft, 1, str(full * PMAX), None, rows=rem)
    return out.text()


GATHER_GROUP_TILES = 32  # index tiles per group (one index DMA, one store per row chunk)
GATHER_GROUP_BYTES = 64 * 1024  # per-partition SBUF of a group's staged rows


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "bool": 1, "uint8": 1, "int8": 1}.get(dtype, 4)


def _gather_tiles(out: Lines, k: GatherKernel, table_dtype: str, t_terms: list[tuple[str, int]],
                  o_terms: list[tuple[str, int]], ft: int, group: int, p0: str, tiles: str | None,
                  rows: int = PMAX) -> None:
    """Rows ``p0 .. p0 + tiles * 128`` (or one ragged tile of ``rows``): indices, index math, gathers, stores."""
    si = k.index.strides[0]
    P = PMAX if tiles else rows
    T = tiles or "1"
    out.add(f"""\
p0 = {p0}
idx = nl.ndarray(({P}, {group}), dtype=nl.int32, buffer=nl.sbuf)
nisa.dma_copy(dst=idx[:, 0:{T}], src=in1.ap(pattern=[[{si}, {P}], [{si * PMAX}, {T}]], offset={_offset(k.index.offset, [("p0", si)])}))""")
    idx = "idx"
    if k.wrap_negative:
        # x[idx] wraps negative indices: idx + rows * (idx < 0), exact in fp32 for any realistic row count.
        out.add(f"""\
idx_f = nl.ndarray(({P}, {group}), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_copy(dst=idx_f[:, 0:{T}], src=idx[:, 0:{T}])
neg = nl.ndarray(({P}, {group}), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_scalar(dst=neg[:, 0:{T}], data=idx_f[:, 0:{T}], op0=nl.less, operand0=0.0, op1=nl.multiply, operand1={float(k.num_rows_table)})
nisa.tensor_tensor(dst=idx_f[:, 0:{T}], data1=idx_f[:, 0:{T}], data2=neg[:, 0:{T}], op=nl.add)
idx_w = nl.ndarray(({P}, {group}), dtype=nl.int32, buffer=nl.sbuf)
nisa.tensor_copy(dst=idx_w[:, 0:{T}], src=idx_f[:, 0:{T}])""")
        idx = "idx_w"
    if k.row_stride != 1:
        # The HBM arguments are flat 1-D buffers, so one indirect "row" is one element: scale the
        # indices by the row stride in exact int32 arithmetic (GpSimd) rather than in fp32.
        out.add(f"""\
row_stride = nl.ndarray(({P}, {group}), dtype=nl.int32, buffer=nl.sbuf)
nisa.memset(dst=row_stride[:, 0:{T}], value={k.row_stride})
idx_scaled = nl.ndarray(({P}, {group}), dtype=nl.int32, buffer=nl.sbuf)
nisa.tensor_tensor(dst=idx_scaled[:, 0:{T}], data1={idx}[:, 0:{T}], data2=row_stride[:, 0:{T}], op=nl.multiply)""")
        idx = "idx_scaled"
    # Out-of-range rows are skipped, not faulted: the graph's bounds check (lowering.graph_checks) raises
    # IndexOutOfRangeError after the kernels, before any output is returned.
    t_off = _offset(k.table_offset, t_terms + [("f0", k.elem_stride)])
    o_off = _offset(0, o_terms + [("p0", k.row_size), ("f0", 1)])
    out.add(f"""\
for f0 in range(0, {k.row_size}, {ft}):
    F = min({ft}, {k.row_size} - f0)
    rows = nl.ndarray(({P}, {group}, F), dtype=nl.{table_dtype}, buffer=nl.sbuf)
    for t in range({T}):
        nisa.dma_copy(dst=rows[:, t, :], src=in0.ap(pattern=[[1, {P}], [{k.elem_stride}, F]], offset={t_off}, vector_offset={idx}[:, t:t + 1], indirect_dim=0), oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=out0.ap(pattern=[[{k.row_size}, {P}], [{k.row_size * PMAX}, {T}], [1, F]], offset={o_off}), src=rows[:, 0:{T}, :])""")


def index_add_body(k: IndexAddKernel) -> str:
    """PSUM accumulation of one-hot(indices)^T @ values over token tiles, plus the base rows.

    Negative indices wrap (``idx + rows`` where ``idx < 0``) as index_put does eagerly.
    """
    out = Lines()
    names = _outer_loops(out, [s for s, *_ in k.outer])
    b_terms = [(v, o[1]) for v, o in zip(names, k.outer, strict=True)]
    v_terms = [(v, o[2]) for v, o in zip(names, k.outer, strict=True)]
    d_terms = [(v, o[3]) for v, o in zip(names, k.outer, strict=True)]
    si = k.index.strides[0]
    vn, vd = k.values.strides
    bn, bd = k.base.strides
    dn, dd = k.out.strides
    ft = min(MATMUL_N, k.row_size)
    cdt = k.compute_dtype
    out.add(f"""\
for m0 in range(0, {k.rows}, {PMAX}):
    M = min({PMAX}, {k.rows} - m0)
    for f0 in range(0, {k.row_size}, {ft}):
        F = min({ft}, {k.row_size} - f0)
        acc = nl.ndarray((M, F), dtype=nl.float32, buffer=nl.psum)
        for k0 in range(0, {k.tokens}, {PMAX}):
            K = min({PMAX}, {k.tokens} - k0)
            idx = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=idx, src=in{k.index.arg}.ap(pattern=[[{si}, K], [1, 1]], offset={_offset(k.index.offset, [("k0", si)])}))
            neg = nl.ndarray((K, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg, data=idx, op0=nl.less, operand0=0.0, op1=nl.multiply, operand1={float(k.rows)})
            nisa.tensor_tensor(dst=idx, data1=idx, data2=neg, op=nl.add)
            ids = nl.ndarray((K, M), dtype=nl.float32, buffer=nl.sbuf)
            nisa.iota(dst=ids, pattern=[[1, M]], offset=m0)
            onehot = nl.ndarray((K, M), dtype=nl.{cdt}, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=onehot, data=ids, op0=nl.equal, operand0=idx)
            vals = nl.ndarray((K, F), dtype=nl.{cdt}, buffer=nl.sbuf)
            nisa.dma_copy(dst=vals, src=in{k.values.arg}.ap(pattern=[[{vn}, K], [{vd}, F]], offset={_offset(k.values.offset, v_terms + [("k0", vn), ("f0", vd)])}))
            nisa.nc_matmul(dst=acc, stationary=onehot, moving=vals, accumulate=(k0 > 0))
        base = nl.ndarray((M, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=base, src=in{k.base.arg}.ap(pattern=[[{bn}, M], [{bd}, F]], offset={_offset(k.base.offset, b_terms + [("m0", bn), ("f0", bd)])}))
        res = nl.ndarray((M, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res, data1=acc, data2=base, op=nl.add)
        nisa.dma_copy(dst=out0.ap(pattern=[[{dn}, M], [{dd}, F]], offset={_offset(k.out.offset, d_terms + [("m0", dn), ("f0", dd)])}), src=res)""")
    return out.text()
