"""Kernel bodies for the index families: row gathers, one-hot index_put accumulation, and scans.

Inputs are :class:`~neuron_compile.lowering.ir.GatherKernel`, :class:`IndexAddKernel` and
:class:`ScanKernel`; outputs are the NKI body text that ``gather.nki.j2`` / ``index_put.nki.j2`` /
``scan.nki.j2`` place inside the shared kernel frame. Kernel arguments are flat 1-D HBM buffers, so
every access is a raw ``.ap`` pattern; tile sizes respect the 128-partition, matmul-K/M <= 128 and
PSUM-bank N <= 512 limits (``simulator_limits``).
"""

from __future__ import annotations

import logging
from typing import Any

from neuron_compile.codegen.render import Lines, _offset
from neuron_compile.lowering.ir import GatherKernel, IndexAddKernel, ScanKernel

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


def scan_body(k: ScanKernel) -> str:
    """Per 128-row tile: chunked ``tensor_tensor_scan`` (r = 1 * r + x) carrying a (P, 1) running value."""
    if k.outputs[0].dtype == "int32" and k.op == "add":
        return _int_scan_body(k)
    out = Lines()
    np_, nf, s_terms, d_terms, ssp, ssf, dsp, dsf, ft = _scan_frame(out, k)
    init = {"add": 0.0, "multiply": 1.0}[k.op]
    op0 = {"add": "multiply", "multiply": "add"}[k.op]  # r_i = (1 * r) + x  or  (0 + r) * x
    unit = {"add": 1.0, "multiply": 0.0}[k.op]
    out.add(f"""\
for p0 in range(0, {np_}, {PMAX}):
    P = min({PMAX}, {np_} - p0)
    carry = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=carry, value={init})
    for f0 in range(0, {nf}, {ft}):
        F = min({ft}, {nf} - f0)
        x = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=in{k.src.arg}.ap(pattern=[[{ssp}, P], [{ssf}, F]], offset={_offset(k.src.offset, s_terms + [("p0", ssp), ("f0", ssf)])}))
        unit = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=unit, value={unit})
        acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=acc, data0=unit, data1=x, initial=carry, op0=nl.{op0}, op1=nl.{k.op})
        nisa.tensor_copy(dst=carry, src=acc[:, F - 1:F])
        nisa.dma_copy(dst=out0.ap(pattern=[[{dsp}, P], [{dsf}, F]], offset={_offset(k.dst.offset, d_terms + [("p0", dsp), ("f0", dsf)])}), src=acc)""")
    return out.text()


def _scan_frame(out: Lines, k: ScanKernel) -> tuple[Any, ...]:
    """Open a scan kernel's outer loops; its sizes, outer offset terms and (part, free) strides."""
    n_outer = k.n_outer
    names = _outer_loops(out, list(k.space[:n_outer]))
    np_, nf = k.space[n_outer], k.space[n_outer + 1]
    s_terms = [(v, k.src.strides[i]) for i, v in enumerate(names)]
    d_terms = [(v, k.dst.strides[i]) for i, v in enumerate(names)]
    ssp, ssf = k.src.strides[n_outer], k.src.strides[n_outer + 1]
    dsp, dsf = k.dst.strides[n_outer], k.dst.strides[n_outer + 1]
    return np_, nf, s_terms, d_terms, ssp, ssf, dsp, dsf, min(k.free_tile, nf)


def _int_scan_body(k: ScanKernel) -> str:
    """Exact int32 cumsum: a Hillis-Steele scan per chunk (``a[i] += a[i - s]`` for s = 1, 2, 4, ...) with
    GpSimd int32 ``tensor_tensor`` adds on shifted slices (ping-pong tiles), then the int32 carry added."""
    out = Lines()
    np_, nf, s_terms, d_terms, ssp, ssf, dsp, dsf, ft = _scan_frame(out, k)
    out.add(f"""\
for p0 in range(0, {np_}, {PMAX}):
    P = min({PMAX}, {np_} - p0)
    carry = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=carry, value=0)
    for f0 in range(0, {nf}, {ft}):
        F = min({ft}, {nf} - f0)
        acc = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=acc, src=in{k.src.arg}.ap(pattern=[[{ssp}, P], [{ssf}, F]], offset={_offset(k.src.offset, s_terms + [("p0", ssp), ("f0", ssf)])}))
        s = 1
        while s < F:
            nxt = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=nxt[:, 0:s], src=acc[:, 0:s])
            nisa.tensor_tensor(dst=nxt[:, s:F], data1=acc[:, s:F], data2=acc[:, 0:F - s], op=nl.add)
            acc = nxt
            s = s * 2
        res = nl.ndarray((P, F), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res, data1=acc, data2=carry.broadcast(1, F), op=nl.add)
        nisa.tensor_copy(dst=carry, src=res[:, F - 1:F])
        nisa.dma_copy(dst=out0.ap(pattern=[[{dsp}, P], [{dsf}, F]], offset={_offset(k.dst.offset, d_terms + [("p0", dsp), ("f0", dsf)])}), src=res)""")
    return out.text()
