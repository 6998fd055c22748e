"""Search, gather and segment instructions: ``topk``, ``local_gather``, ``sequence_bounds``,
``nonzero_with_count`` (GpSimd) and ``nc_match_replace8`` (VectorE), written from their nki.isa API
reference pages (semantics, dtypes, buffers and size limits as documented there).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.tensor import NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32


def topk(val_dst: NkiTensor, idx_dst: NkiTensor, src: NkiTensor, n: int, name: str | None = None,
         **removed: Any) -> None:
    """Top-K of each 16-partition group's ``n`` bf16 elements, read as a snake (element ``e`` at partition
    ``e % 16``, column ``e // 16``): every partition of the group gets the K largest values in ascending
    order (bf16) and their 0-based element indices (uint32); K = val_dst's free size. GpSimd, SBUF."""
    api = "nisa.topk"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "src", src, gpsimd=True)
    pv, k = C.onchip(api, "val_dst", val_dst, gpsimd=True)
    pi, ki = C.onchip(api, "idx_dst", idx_dst, gpsimd=True)
    for nm, t in (("src", src), ("val_dst", val_dst), ("idx_dst", idx_dst)):
        C.sbuf_only(api, nm, t)
    if src.dtype != _dt.bfloat16 or val_dst.dtype != _dt.bfloat16:
        raise SimulatorConstraintError(api, "src", (src.dtype, val_dst.dtype), "bfloat16 src and val_dst")
    if idx_dst.dtype != _dt.uint32:
        raise SimulatorConstraintError(api, "idx_dst", idx_dst.dtype, "uint32")
    if p % 16 or pv != p or pi != p or ki != k:
        raise SimulatorConstraintError(api, "val_dst", (val_dst.shape, idx_dst.shape),
                                       f"src, val_dst and idx_dst on the same partitions (a multiple of 16, got {p}) "
                                       "and val_dst/idx_dst of the same [P, K] shape")
    n = int(n)
    if not 8 <= n < 65536:
        raise SimulatorConstraintError(api, "n", n, "8 <= n < 65536")
    if not 1 <= k < 32768 or k > n:
        raise SimulatorConstraintError(api, "val_dst", k, f"1 <= K < 32768 and K <= n ({n})")
    if f * 16 < n:
        raise SimulatorConstraintError(api, "src", src.shape, f"a free size >= ceil(n / 16) = {-(-n // 16)}")
    x = C.read32(src).reshape(p, f)
    vals = np.empty((p, k), dtype=F32)
    idx = np.empty((p, k), dtype=np.int64)
    for g in range(0, p, 16):
        snake = x[g:g + 16].T.reshape(-1)[:n]
        order = np.argsort(-snake, kind="stable")[:k][::-1]  # the K largest, ascending
        vals[g:g + 16] = snake[order]
        idx[g:g + 16] = order
    C.write(val_dst, vals.reshape(val_dst.shape))
    C.write(idx_dst, idx.reshape(idx_dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "topk", (val_dst, idx_dst, src), main=src)


def local_gather(dst: NkiTensor, src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                 num_valid_indices: int | None = None, name: str | None = None, **removed: Any) -> None:
    """Per 16-partition group (one GpSimd core): its uint16 indices, read partition-first, are element
    offsets into each partition's (flattened) free data; each partition gathers ``num_elem_per_idx``
    contiguous elements per valid index: ``dst[p, i, :] = src[p, idx[i] : idx[i] + num_elem_per_idx]``.
    No dtype casting. GpSimd, SBUF."""
    api = "nisa.local_gather"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "src_buffer", src_buffer, gpsimd=True)
    pi, fi = C.onchip(api, "index", index, gpsimd=True)
    pd, fd = C.onchip(api, "dst", dst, gpsimd=True)
    for nm, t in (("src_buffer", src_buffer), ("index", index), ("dst", dst)):
        C.sbuf_only(api, nm, t)
    if pi != p or p % 16:
        raise SimulatorConstraintError(api, "index", index.shape, f"the partitions of src_buffer ({p}), a multiple "
                                       "of 16")
    if index.dtype != _dt.uint16:
        raise SimulatorConstraintError(api, "index", index.dtype, "uint16 indices")
    if dst.dtype != src_buffer.dtype:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == src_buffer dtype ({src_buffer.dtype}): no "
                                       "casting")
    m = int(num_elem_per_idx)
    if m not in (1, 2, 4, 8, 16, 32):
        raise SimulatorConstraintError(api, "num_elem_per_idx", m, "one of 1, 2, 4, 8, 16, 32")
    per_core = 16 * fi
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= per_core or valid > 4096:
        raise SimulatorConstraintError(api, "num_valid_indices", valid, f"1..{min(per_core, 4096)} per core")
    if pd != p or fd != valid * m:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{p} partitions x {valid * m} elements "
                                       "(num_valid_indices x num_elem_per_idx)")
    data = np.asarray(src_buffer.arr).reshape(p, f)
    ind = np.asarray(index.arr).reshape(p, fi).astype(np.int64)
    out = np.empty((p, valid, m), dtype=data.dtype)
    span = np.arange(m, dtype=np.int64)
    for g in range(0, p, 16):
        idx = ind[g:g + 16].T.reshape(-1)[:valid]
        cols = idx[:, None] + span[None, :]
        if (cols < 0).any() or (cols >= f).any():
            raise SimulatorError(f"{api}: an index reads past the {f} elements of a partition of "
                                 f"'{src_buffer.name}' (out-of-bounds indices are undefined on hardware)")
        out[g:g + 16] = data[g:g + 16][:, cols]
    C.write_raw(dst, out.reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "local_gather", (dst, src_buffer, index), main=dst)


def sequence_bounds(dst: NkiTensor, segment_ids: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """For a (1, n) tile of segment ids, dst (1, 2, n) holds each element's segment [start, end) (end
    exclusive); padding (id 0) gets start n and end -1. float32 or int32. GpSimd."""
    api = "nisa.sequence_bounds"
    if removed:
        C.removed_kwargs(api, removed)
    p, n = C.onchip(api, "segment_ids", segment_ids, gpsimd=True)
    pd, fd = C.onchip(api, "dst", dst, gpsimd=True)
    for nm, t in (("segment_ids", segment_ids), ("dst", dst)):
        if t.dtype not in (_dt.float32, _dt.int32):
            raise SimulatorConstraintError(api, nm, t.dtype, "float32 or int32")
    if p != 1 or pd != 1:
        raise SimulatorConstraintError(api, "segment_ids", segment_ids.shape, "a partition dim of 1")
    if fd != 2 * n:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"(1, 2, {n}): a start and an end per element")
    ids = C.read32(segment_ids).reshape(-1)
    if (ids < 0).any():
        raise SimulatorError(f"{api}: segment ids must be non-negative")
    start = np.empty(n, dtype=np.int64)
    end = np.empty(n, dtype=np.int64)
    for i in range(n):
        start[i] = n if ids[i] == 0 else (start[i - 1] if i and ids[i] == ids[i - 1] else i)
    for i in range(n - 1, -1, -1):
        end[i] = -1 if ids[i] == 0 else (end[i + 1] if i < n - 1 and ids[i] == ids[i + 1] else i + 1)
    C.write(dst, np.stack([start, end]).astype(F32 if dst.info.is_float else np.int64).reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "sequence_bounds", (dst, segment_ids), main=segment_ids)


def nonzero_with_count(dst: NkiTensor, src: NkiTensor, index_offset: int = 0, padding_val: int = -1,
                       name: str | None = None, **removed: Any) -> None:
    """On partitions 0, 16, ..., 112 only: dst = indices of src's non-zero elements (+ index_offset),
    then padding_val, then the count in the extra last slot. Other partitions stay untouched. GpSimd, NC-v3+."""
    api = "nisa.nonzero_with_count"
    if removed:
        C.removed_kwargs(api, removed)
    C.need_version(api, 3)
    p, f = C.onchip(api, "src", src, gpsimd=True)
    pd, fd = C.onchip(api, "dst", dst, gpsimd=True)
    C.sbuf_only(api, "src", src)
    C.sbuf_only(api, "dst", dst)
    if src.dtype not in (_dt.float32, _dt.int32):
        raise SimulatorConstraintError(api, "src", src.dtype, "float32 or int32")
    if dst.dtype != _dt.int32:
        raise SimulatorConstraintError(api, "dst", dst.dtype, "int32")
    if pd != p or fd != f + 1:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{p} partitions x {f + 1} elements (one more than src)")
    x = C.read32(src).reshape(p, f)
    out = np.array(dst.arr).reshape(p, fd).astype(np.int64)
    for q in range(0, p, 16):
        nz = np.flatnonzero(x[q] != 0)
        row = np.full(fd, int(padding_val), dtype=np.int64)
        row[:nz.size] = nz + int(index_offset)
        row[-1] = nz.size
        out[q] = row
    C.write(dst, out.reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "nonzero_with_count", (dst, src), main=src)


def nc_match_replace8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx: NkiTensor | None = None,
                      name: str | None = None, **removed: Any) -> None:
    """dst = data with the first occurrence of each of the 8 ``vals`` per partition replaced by ``imm``;
    ``dst_idx`` (optional) gets the matched positions. Duplicate vals are processed from the last
    (i = 7 .. 0), so they take successive matches and the first match lands in the highest slot. VectorE."""
    api = "nisa.nc_match_replace8"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "data", data)
    C.same_pf(api, "dst", C.onchip(api, "dst", dst), "data", (p, f))
    pv, fv = C.onchip(api, "vals", vals)
    if pv != p or fv != 8:
        raise SimulatorConstraintError(api, "vals", vals.shape, f"({p}, 8): 8 values per partition")
    x = C.read32(data).reshape(p, f).copy()
    v = C.read32(vals).reshape(p, 8)
    found = np.full((p, 8), 0xFFFFFFFF, dtype=np.int64)
    used = np.zeros((p, f), dtype=bool)
    for row in range(p):
        for i in range(7, -1, -1):
            hits = np.flatnonzero((x[row] == v[row, i]) & ~used[row])
            if hits.size:
                used[row, hits[0]] = True
                found[row, i] = hits[0]
    x[used] = F32(imm)
    C.write(dst, x.reshape(dst.shape))
    if dst_idx is not None:
        pi, fi = C.onchip(api, "dst_idx", dst_idx)
        if pi != p or fi != 8 or dst_idx.info.kind not in ("u", "i"):
            raise SimulatorConstraintError(api, "dst_idx", (dst_idx.shape, dst_idx.dtype), f"a ({p}, 8) integer tile")
        C.write(dst_idx, found.reshape(dst_idx.shape))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "nc_match_replace8", (dst, data, vals), main=data)
