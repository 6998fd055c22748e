"""Plans of the DMA-driven kernels: copies, row gathers and index_put / index_add scatter-adds.

Inputs are :class:`~neuron_compile.lowering.ir.CopyKernel`, :class:`GatherKernel` and :class:`IndexAddKernel`;
outputs are the plain-data plans ``copy.nki.j2`` / ``gather.nki.j2`` / ``index_put.nki.j2`` render as the kernel
body (scans are a family template, ``scan.nki.j2``). Kernel arguments are flat 1-D HBM buffers, so every access is
a raw ``.ap`` pattern: the plans hold its strides, sizes and offset expressions. Tile sizes respect the
128-partition, matmul-K/M <= 128 and PSUM-bank N <= 512 limits (``simulator_limits``).
"""

from __future__ import annotations

import logging
from typing import Any

from neuron_compile.codegen.render import _offset, render_block
from neuron_compile.lowering.ir import Access, CopyKernel, GatherKernel, IndexAddKernel

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

GATHER_FREE_TILE = 2048  # elements of one gathered row chunk per partition (8 KiB fp32 of 192 KiB SBUF)
GATHER_GROUP_TILES = 32  # index tiles per group (one index DMA, one store per row chunk)
GATHER_GROUP_BYTES = 64 * 1024  # per-partition SBUF of a group's staged rows
MATMUL_N = 512  # one PSUM bank of fp32 per partition (matmul moving free size limit)


def index_body(k: CopyKernel | GatherKernel | IndexAddKernel, grid: int = 1) -> tuple[str, int]:
    """(body, launch grid) of a copy, gather or index_put kernel. Only gathers split over ``grid`` programs (their
    row groups are independent); a copy is one DMA per view, and index_put programs could add to the same row."""
    if isinstance(k, CopyKernel):
        return render_block("copy.nki.j2", "copies", p=copy_plan(k)), 1
    if isinstance(k, GatherKernel):
        plan = gather_plan(k, grid)
        return render_block("gather.nki.j2", "gather", k=k, p=plan, pmax=PMAX), plan["grid"]
    return render_block("index_put.nki.j2", "index_add", k=k, p=index_add_plan(k), pmax=PMAX), 1


def _loops(sizes: list[int]) -> list[dict[str, Any]]:
    """Index loops ``o0, o1, ...`` over ``sizes`` (plan data for ``_loop_macros.loops``)."""
    return [{"var": f"o{i}", "start": 0, "stop": n, "step": None, "split": False} for i, n in enumerate(sizes)]


def _copy_access(acc: Access, space: tuple[int, ...], loops: list[int], tail: list[int]) -> dict[str, Any]:
    return {"pairs": [(acc.strides[d], space[d]) for d in tail],
            "offset": _offset(acc.offset, [(f"o{i}", acc.strides[i]) for i in loops])}


def copy_plan(k: CopyKernel) -> dict[str, Any]:
    """One DMA per (source view, destination view) pair: every dim but the last two loops, those two form the
    DMA pattern."""
    copies = []
    for src_arg, src, dst_out, dst, space in k.copies:
        n = len(space)
        loops = list(range(max(n - 2, 0)))
        tail = list(range(max(n - 2, 0), n))
        copies.append({"loops": _loops([space[i] for i in loops]), "src_arg": src_arg, "dst_out": dst_out,
                       "src": _copy_access(src, space, loops, tail), "dst": _copy_access(dst, space, loops, tail)})
    return {"copies": copies, "src_dtype": k.src_dtype}


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "bool": 1, "uint8": 1, "int8": 1}.get(dtype, 4)


def gather_plan(k: GatherKernel, grid: int = 1) -> dict[str, Any]:
    """Indices on partitions (128 per tile), one indirect DMA per row chunk, rows stored densely.

    Full 128-row tiles go in groups: one DMA brings the indices of the whole group (``[128, T]``: row
    ``t * 128 + p`` on partition p), the index arithmetic runs once over the group, each tile's rows arrive
    by their own indirect DMA into a ``[128, T, F]`` staging tile that leaves in one store. A ragged last
    tile (fewer than 128 rows) is handled alone. The group loop ``g0`` splits over ``grid`` programs when it is
    the top loop (no outer dims) and has at least ``grid`` iterations.
    """
    table_dtype = k.inputs[0].dtype
    outer = _loops([s for s, _, _ in k.outer])
    t_terms = [(o["var"], ts) for o, (_, ts, _) in zip(outer, k.outer, strict=True)]
    o_terms = [(o["var"], os) for o, (_, _, os) in zip(outer, k.outer, strict=True)]
    ft = min(GATHER_FREE_TILE, k.row_size)
    full, rem = divmod(k.rows, PMAX)
    group = max(1, min(full, GATHER_GROUP_BYTES // (ft * _itemsize(table_dtype)), GATHER_GROUP_TILES))
    split = grid > 1 and not outer and full > 0 and len(range(0, full, group)) >= grid
    si = k.index.strides[0]
    return {
        "outer": outer, "full": full, "rem": rem, "group": group, "ft": ft, "table_dtype": table_dtype,
        "groups": {"var": "g0", "start": 0, "stop": full, "step": group, "split": split},
        "grid": grid if split else 1, "si": si, "index_offset": _offset(k.index.offset, [("p0", si)]),
        "table_rows": float(k.num_rows_table),
        # Out-of-range rows are skipped, not faulted: the graph's bounds check (lowering.graph_checks) raises
        # IndexOutOfRangeError after the kernels, before any output is returned.
        "table_offset": _offset(k.table_offset, t_terms + [("f0", k.elem_stride)]),
        "out_offset": _offset(0, o_terms + [("p0", k.row_size), ("f0", 1)]),
        "ragged_p0": full * PMAX,
    }


def index_add_plan(k: IndexAddKernel) -> dict[str, Any]:
    """The DMA scatter-add's strides and offset expressions: the base-to-out copy per outer position, the index tile
    (``k0``), the values rows (``k0``, ``f0``) and the scattered row chunk of ``out`` (``f0``; the row itself comes
    from the tile's addresses, ``vector_offset``)."""
    outer = _loops([s for s, *_ in k.outer])
    names = [o["var"] for o in outer]
    b_terms = [(v, o[1]) for v, o in zip(names, k.outer, strict=True)]
    v_terms = [(v, o[2]) for v, o in zip(names, k.outer, strict=True)]
    d_terms = [(v, o[3]) for v, o in zip(names, k.outer, strict=True)]
    si = k.index.strides[0]
    vn, vd = k.values.strides
    bn, bd = k.base.strides
    dn, dd = k.out.strides
    return {
        "outer": outer, "ft": min(MATMUL_N, k.row_size),
        "si": si, "vn": vn, "vd": vd, "bn": bn, "bd": bd, "dn": dn, "dd": dd,
        "index_offset": _offset(k.index.offset, [("k0", si)]),
        "values_offset": _offset(k.values.offset, v_terms + [("k0", vn), ("f0", vd)]),
        "base_offset": _offset(k.base.offset, b_terms),
        "out_rows_offset": _offset(k.out.offset, d_terms),
        "out_offset": _offset(k.out.offset, d_terms + [("f0", dd)]),
    }
