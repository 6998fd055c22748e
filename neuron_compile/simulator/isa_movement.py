"""Data-movement instructions: DMA (``dma_copy``, ``dma_transpose``, ``dma_compute``), engine copies
(``tensor_copy``, ``memset``, ``iota``), and the gather/shuffle family (``nc_stream_shuffle``,
``nc_n_gather``). REFERENCE 3.1.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import enums as _en
from neuron_compile.simulator import targets as _targets
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.enums import check_enum, dge_mode, engine, oob_mode
from neuron_compile.simulator.tensor import PSUM, NkiTensor
from neuron_compile.simulator.tensor import SBUF as _SBUF

log = logging.getLogger(__name__)

F32 = np.float32


def _no_psum(api: str, name: str, t: NkiTensor) -> None:
    if t.storage.buffer is PSUM:
        raise SimulatorConstraintError(api, name, "nl.psum", "DMA cannot access PSUM",
                                       f"tensor '{t.name}'; evict PSUM to SBUF with nisa.tensor_copy first")


def _indirect_rows(api: str, t: NkiTensor, oob: oob_mode) -> tuple[np.ndarray, np.ndarray]:
    """Flat storage addresses (rows x elements) of an indirect view, and the in-bounds row mask."""
    idx_t, row_stride, rows = t._indirect  # type: ignore[misc]
    if idx_t.info.kind not in ("i", "u"):
        raise SimulatorConstraintError(api, "vector_offset", idx_t.dtype, "index tile must have an integer dtype")
    a = np.asarray(idx_t.arr)
    # [P, N] index tiles are read column by column: index j is at [j % P, j // P].
    flat = a.reshape(a.shape[0], -1).T.reshape(-1) if a.ndim >= 2 and a.size > a.shape[0] else a.reshape(-1)
    idx = flat[:t.shape[0]].astype(np.int64)
    inner = C.offsets(t.shape[1:], t.strides[1:]).reshape(1, -1)
    addr = t.offset + idx[:, None] * row_stride + inner
    # the DGE checks addresses: a row must lie inside the tensor (an index in range plus the access's offset
    # can still run past its end)
    valid = (idx >= 0) & (idx < rows) & ((addr >= 0) & (addr < t.storage.data.size)).all(axis=1)
    if not valid.all() and oob is oob_mode.error:
        bad = idx[~valid][0]
        raise SimulatorError(f"{api}: vector_offset index {bad} out of bounds for {rows} rows of tensor "
                             f"'{t.storage.name}' (pass oob_mode=nisa.oob_mode.skip to skip such rows)")
    return np.where(valid[:, None], addr, 0), valid


def _values_for(api: str, src: NkiTensor, oob: oob_mode, want_fp32: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows x elements values of ``src`` (gathered when indirect) and the valid-row mask."""
    if src._indirect is not None:
        addr, valid = _indirect_rows(api, src, oob)
        vals = src.storage.data[addr]
        return (vals.astype(F32) if want_fp32 else vals), valid
    a = C.read32(src) if want_fp32 else src.arr
    n = src.shape[0] if src.shape else 1
    return a.reshape(n, -1), None


def dma_copy(dst: NkiTensor, src: NkiTensor, priority: int | None = None, oob_mode: oob_mode = oob_mode.error,
             dge_mode: dge_mode = dge_mode.unknown, engine: engine = engine.unknown, name: str | None = None,
             **removed: Any) -> None:
    """dst = src through a DMA queue (HBM/SBUF only; casts via fp32 when dtypes differ)."""
    api = "nisa.dma_copy"
    if removed:
        C.removed_kwargs(api, removed)
    C.tensor(api, "dst", dst)
    C.tensor(api, "src", src)
    _no_psum(api, "dst", dst)
    _no_psum(api, "src", src)
    if dst.size != src.size:
        raise SimulatorConstraintError(api, "src", f"{src.shape} ({src.size} elements)",
                                       f"element count == dst element count ({dst.size}, dst shape {dst.shape})")
    if engine is not _en.engine.unknown:
        # engine= picks the sequencer that drives the hardware DGE: "Only valid when dge_mode=nisa.dge_mode.hwdge"
        # (nki.isa.dma_copy), and only sync or scalar (the "NKI DGE" deep dive)
        eng = check_enum(engine, _en.engine, api, "engine")
        if eng.name not in ("sync", "scalar"):
            raise SimulatorConstraintError(api, "engine", f"nisa.engine.{eng.name}", "nisa.engine.sync or "
                                           "nisa.engine.scalar (the sequencers that drive the hardware DGE)")
        if dge_mode is _en.dge_mode.unknown or check_enum(dge_mode, _en.dge_mode, api, "dge_mode").name != "hwdge":
            raise SimulatorConstraintError(api, "engine", f"nisa.engine.{eng.name}", "engine= only with "
                                           "dge_mode=nisa.dge_mode.hwdge", "or leave the queue to the compiler")
    if dge_mode is not _en.dge_mode.unknown:
        check_enum(dge_mode, _en.dge_mode, api, "dge_mode")
        if dge_mode.name == "hwdge":
            C.need_version(api + " (dge_mode=hwdge)", 3)
            if src.dtype != dst.dtype:
                raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == src dtype ({src.dtype}) with "
                                               "dge_mode=hwdge", "use .view() or dge_mode=nisa.dge_mode.swdge")
            if src._indirect is not None or dst._indirect is not None:
                raise SimulatorConstraintError(api, "dge_mode", "hwdge", "indirect (vector_offset) DMA needs swdge")
    if priority is not None:
        C.need_version(api + " (priority=)", 4)
        if priority not in (0, 1, 2, 3):
            raise SimulatorConstraintError(api, "priority", priority, "0..3")
    if dst.oob is not None or src.oob is not None:
        inside = _inside_rows(api, dst, src, check_enum(oob_mode, _en.oob_mode, api, "oob_mode"))
        if inside is None:  # every row skipped: the DMA is still issued
            if _trace.ACTIVE is not None:
                _trace.record("dma", "dma_copy", (dst, src), main=dst if dst.on_chip or not src.on_chip else src)
            return
        dst, src = inside
    same = src.dtype == dst.dtype and src.info.np_dtype == dst.info.np_dtype
    if src._indirect is None and dst._indirect is None:
        if same:
            C.write_raw(dst, src.arr)
        else:
            C.write(dst, C.read32(src))
    else:
        _dma_indirect(api, dst, src, check_enum(oob_mode, _en.oob_mode, api, "oob_mode"), same)
    if _trace.ACTIVE is not None:
        _trace.record("dma", "dma_copy", (dst, src), main=dst if dst.on_chip or not src.on_chip else src)


def _inside_rows(api: str, dst: NkiTensor, src: NkiTensor, oob: oob_mode) -> tuple[NkiTensor, NkiTensor] | None:
    """A DMA whose runtime (scalar_offset) access pattern leaves its tensor: with ``oob_mode.skip`` only the rows
    inside move (both sides cut to them, which needs the same row count on both); None when no row is inside."""
    t = dst if dst.oob is not None else src
    other = src if t is dst else dst
    why, r0, r1, runtime = t.oob  # type: ignore[misc]
    if oob is not oob_mode.skip or not runtime or other.oob is not None:
        raise SimulatorError(f"{api}: {why}")
    if r0 == r1:
        return None
    if other.shape[:1] != t.shape[:1]:
        raise SimulatorError(f"{api}: {why}; rows {r0}..{r1 - 1} of {t.shape[0]} are inside, and skipping the others "
                             f"needs the other side to have the same rows (its shape is {other.shape})")
    inside = NkiTensor(t.storage, t.offset + r0 * t.strides[0], (r1 - r0,) + t.shape[1:], t.strides, t.info, t.name)
    part = other._view(other.offset + r0 * other.strides[0], (r1 - r0,) + other.shape[1:], other.strides)
    return (inside, part) if t is dst else (part, inside)


def _dma_indirect(api: str, dst: NkiTensor, src: NkiTensor, oob: oob_mode, same: bool) -> None:
    if dst._indirect is not None and src._indirect is not None:
        raise SimulatorError(f"{api}: only one of src/dst may use vector_offset")
    if src._indirect is not None:  # gather
        vals, valid = _values_for(api, src, oob, not same)
        cur = np.array(dst.arr).reshape(vals.shape)
        if valid is not None and not valid.all():
            vals = np.where(valid[:, None], vals, cur if same else cur.astype(F32))
        (C.write_raw if same else C.write)(dst, vals.reshape(dst.shape))
        return
    addr, valid = _indirect_rows(api, dst, oob)  # scatter
    vals = src.arr.reshape(addr.shape)
    if not same:
        conv = _dt.cast_for_store(C.read32(src).reshape(addr.shape), dst.info)
        vals = C.read32(src).reshape(addr.shape).astype(dst.arr.dtype) if conv is None else conv
    dst.storage.data[addr[valid]] = vals[valid]
    dst.storage.written = True


def dma_transpose(dst: NkiTensor, src: NkiTensor, axes: tuple[int, ...] | None = None, priority: int | None = None,
                  dge_mode: dge_mode = dge_mode.unknown, oob_mode: oob_mode = oob_mode.error, name: str | None = None,
                  **removed: Any) -> None:
    """dst = src permuted by ``axes`` through the DMA engine (2-D (1,0), 3-D (2,1,0), 4-D (3,1,2,0)).

    An indirect source (``src_hbm.ap(..., vector_offset=idx)``) is a gather-transpose on the
    software DGE: rows ``idx`` (read column by column from a ``[P, N]`` uint32 SBUF tile) are
    gathered, then transposed; with ``oob_mode.skip`` an out-of-range row leaves its dst column as it
    was, with ``oob_mode.error`` it raises."""
    api = "nisa.dma_transpose"
    if removed:
        C.removed_kwargs(api, removed)
    C.tensor(api, "dst", dst)
    C.tensor(api, "src", src)
    C.sbuf_only(api, "dst", dst)
    _no_psum(api, "src", src)
    if src.dtype != dst.dtype:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == src dtype ({src.dtype})")
    default = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
    if src.ndim not in default:
        raise SimulatorConstraintError(api, "src", src.shape, "2-D, 3-D or 4-D source")
    ax = tuple(int(a) for a in axes) if axes is not None else default[src.ndim]
    if ax != default[src.ndim]:
        raise SimulatorConstraintError(api, "axes", ax, f"the {src.ndim}-D permutation {default[src.ndim]}")
    expect = tuple(src.shape[a] for a in ax)
    if dst.shape != expect:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"shape == permuted src shape {expect}")
    mode = check_enum(dge_mode, _en.dge_mode, api, "dge_mode")
    oob = check_enum(oob_mode, _en.oob_mode, api, "oob_mode")
    if src._indirect is not None:
        _check_gather_transpose(api, src, mode)
        vals, valid = _values_for(api, src, oob, False)
        out = np.transpose(vals.reshape(src.shape), ax)
        if valid is not None and not valid.all():  # source row r lands in dst[..., r]
            out = np.where(valid, out, np.asarray(dst.arr))
        C.write_raw(dst, out)
        if _trace.ACTIVE is not None:
            _trace.record("dma", "dma_transpose", (dst, src))
        return
    if mode.name == "swdge":
        raise SimulatorConstraintError(api, "dge_mode", "swdge", "nisa.dge_mode.unknown or hwdge for a direct "
                                       "transpose (swdge is the indirect gather-transpose: src.ap(vector_offset=...))")
    if mode.name == "hwdge":
        if src.itemsize != 2:
            raise SimulatorConstraintError(api, "src", src.dtype, "2-byte dtype on the HW-DGE path")
        if src.shape[-1] > 128:
            raise SimulatorConstraintError(api, "src", src.shape, "src.shape[-1] <= 128 on the HW-DGE path")
        if src.shape[0] not in (1, 2, 4, 8, 16):
            raise SimulatorConstraintError(api, "src", src.shape, "src.shape[0] in {1, 2, 4, 8, 16} on the HW-DGE path")
        if src.ndim > 2 and (src.shape[0] * src.shape[-2]) % 16:
            raise SimulatorConstraintError(api, "src", src.shape, "src.shape[0] * src.shape[-2] a multiple of 16 on "
                                           "the HW-DGE path")
    C.write_raw(dst, np.transpose(src.arr, ax))
    if _trace.ACTIVE is not None:
        _trace.record("dma", "dma_transpose", (dst, src))


def _check_gather_transpose(api: str, src: NkiTensor, mode: Any) -> None:
    """The documented limits of the indirect (software DGE) transpose."""
    idx = src._indirect[0]  # type: ignore[index]
    if mode.name not in ("unknown", "swdge"):
        raise SimulatorConstraintError(api, "dge_mode", mode.name, "nisa.dge_mode.unknown or swdge for an indirect "
                                       "(vector_offset) source")
    C.need_version(api + " (indirect source)", 3)
    if src.itemsize != 2:
        raise SimulatorConstraintError(api, "src", src.dtype, "a 2-byte dtype for the indirect transpose")
    if src.shape[-1] > 128:
        raise SimulatorConstraintError(api, "src", src.shape, "src.shape[-1] <= 128 for the indirect transpose")
    if src.shape[0] % 16:
        raise SimulatorConstraintError(api, "src", src.shape, "src.shape[0] divisible by 16 (indirect transpose)")
    if src.ndim == 4 and src.shape[1] != 1 and src.shape[2] != 1:
        raise SimulatorConstraintError(api, "src", src.shape, "a 4-D indirect source with shape[1] or shape[2] == 1")
    if idx.ndim != 2:
        raise SimulatorConstraintError(api, "vector_offset", idx.shape, "2-D indices [P, N]")
    if idx.dtype != _dt.uint32:
        raise SimulatorConstraintError(api, "vector_offset", idx.dtype, "uint32 indices")
    if idx.buffer is not _SBUF:
        raise SimulatorConstraintError(api, "vector_offset", f"nl.{idx.buffer.value}", "indices in SBUF")
    p, n = idx.shape
    if not (16 <= p <= 128 and p % 16 == 0):
        raise SimulatorConstraintError(api, "vector_offset", idx.shape, "indices.shape[0] in [16, 128] and a "
                                       "multiple of 16")
    if n > 1 and p != 128:
        raise SimulatorConstraintError(api, "vector_offset", idx.shape, "indices.shape[0] == 128 when "
                                       "indices.shape[1] > 1")
    if p * n < src.shape[0]:
        raise SimulatorConstraintError(api, "vector_offset", idx.shape, f"at least src.shape[0] = {src.shape[0]} "
                                       "indices")


def _check_rmw(api: str, dst: NkiTensor, srcs: list[NkiTensor], indirect: list[NkiTensor]) -> None:
    """The documented read-modify-write forms: exactly two sources, one of them ``dst`` itself (the indirect HBM
    rows of a scatter-RMW, the SBUF tile of a gather-RMW), the other the data (in SBUF for a scatter)."""
    if len(srcs) != 2:
        raise SimulatorConstraintError(api, "srcs", len(srcs), "exactly 2 sources with a vector_offset (read-modify-"
                                       "write: dst and the data)")
    if dst._indirect is not None:
        own = [s for s in indirect if s.storage is dst.storage and s.offset == dst.offset and s.shape == dst.shape
               and s._indirect[0] is dst._indirect[0]]  # type: ignore[index]
        data = [s for s in srcs if s._indirect is None]
        if len(indirect) != 1 or not own or len(data) != 1:
            raise SimulatorConstraintError(api, "srcs", "sources", "a scatter-RMW's sources: dst itself (same "
                                           "vector_offset) and one direct data tile")
        if data[0].buffer is not _SBUF:
            raise SimulatorConstraintError(api, "srcs", f"nl.{data[0].buffer.value}", "a scatter-RMW's data in SBUF")
    else:
        if len(indirect) != 1 or dst.buffer is not _SBUF or not any(s.storage is dst.storage for s in srcs):
            raise SimulatorConstraintError(api, "srcs", "sources", "a gather-RMW's sources: the SBUF dst itself and "
                                           "one indirect HBM source")


def dma_compute(dst: NkiTensor, srcs: Any, reduce_op: Any, scales: Any = None, unique_indices: bool = True,
                oob_mode: oob_mode = oob_mode.error, name: str | None = None, **removed: Any) -> None:
    """dst = reduce_op(srcs...) in the DMA engine (add only); with vector_offset: scatter/gather-RMW."""
    from neuron_compile.simulator.ops import opname

    api = "nisa.dma_compute"
    if removed:
        C.removed_kwargs(api, removed)
    C.tensor(api, "dst", dst)
    srcs = list(srcs)
    if not 1 <= len(srcs) <= 16:
        raise SimulatorConstraintError(api, "srcs", len(srcs), "1..16 sources")
    if opname(reduce_op) != "add":
        raise SimulatorConstraintError(api, "reduce_op", opname(reduce_op) or reduce_op, "nl.add only")
    if scales is not None and any(float(s) != 1.0 for s in scales):
        raise SimulatorConstraintError(api, "scales", tuple(scales), "all scales 1.0")
    _no_psum(api, "dst", dst)
    for i, s in enumerate(srcs):
        C.tensor(api, f"srcs[{i}]", s)
        _no_psum(api, f"srcs[{i}]", s)
        if s.size != dst.size:
            raise SimulatorConstraintError(api, f"srcs[{i}]", s.shape, f"element count == dst's ({dst.size})")
    indirect = [s for s in srcs if s._indirect is not None]
    if dst._indirect is not None or indirect:
        _check_rmw(api, dst, srcs, indirect)
    if dst._indirect is not None:  # scatter-RMW: dst_hbm[idx] += sum(direct srcs)
        addr, valid = _indirect_rows(api, dst, oob_mode)
        delta = np.zeros(addr.shape, dtype=F32)
        for s in srcs:
            if s._indirect is None:
                delta += C.read32(s).reshape(addr.shape)
        data = dst.storage.data
        a = addr[valid].reshape(-1)
        d = delta[valid].reshape(-1)
        if unique_indices:
            if np.unique(a).size != a.size:
                raise SimulatorConstraintError(api, "unique_indices", True, "distinct row addresses (duplicates race "
                                               "in the read-modify-write; pass unique_indices=False or combine them "
                                               "first)")
            new = data[a].astype(F32) + d
        else:
            uniq, inv = np.unique(a, return_inverse=True)
            acc = data[uniq].astype(F32)
            np.add.at(acc, inv.reshape(-1), d)
            a, new = uniq, acc
        conv = _dt.cast_for_store(new, dst.info)
        data[a] = new if conv is None else conv
        dst.storage.written = True
    else:
        total = np.zeros((dst.shape[0] if dst.shape else 1, dst.size // max(1, dst.shape[0] if dst.shape else 1)),
                         dtype=F32)
        for s in srcs:
            vals, valid = _values_for(api, s, oob_mode, True)
            vals = vals.reshape(total.shape)
            if valid is not None and not valid.all():
                vals = np.where(valid[:, None], vals, 0)
            total += vals
        C.write(dst, total.reshape(dst.shape))
    if len(indirect) > 1:
        log.debug("%s: %d indirect sources", api, len(indirect))
    if _trace.ACTIVE is not None:
        _trace.record("dma", "dma_compute", [dst] + srcs)




def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: str | None = None,
                **removed: Any) -> None:
    """dst = src on Vector/Scalar/GpSimd (bit-exact when dtypes match, else via fp32)."""
    api = "nisa.tensor_copy"
    if removed:
        C.removed_kwargs(api, removed)
    eng = C.resolve_engine(api, engine, ("vector", "scalar", "gpsimd"), "vector")
    g = eng == "gpsimd"
    pf = C.onchip(api, "dst", dst, g)
    C.same_pf(api, "src", C.onchip(api, "src", src, g), "dst", pf)
    if eng == "scalar" and _targets.nc_version() < 3:
        raise SimulatorConstraintError(api, "engine", "nisa.engine.scalar", "Scalar tensor_copy needs NC-v3+",
                                       "use nisa.activation(op=nl.copy) on trn1")
    if src.dtype == dst.dtype and src.info.np_dtype == dst.info.np_dtype:
        C.write_raw(dst, src.arr if src.shape == dst.shape else src.arr.reshape(dst.shape))
    else:
        C.write(dst, C.read32(src))
    if _trace.ACTIVE is not None:
        _trace.record(eng, "tensor_copy", (dst, src))


def memset(dst: NkiTensor, value: Any, engine: engine = engine.unknown, name: str | None = None,
           **removed: Any) -> None:
    """Fill dst with a compile-time constant: an integral one for an integer dtype (an int, or a float such as 0.0,
    which AWS's nki-library passes for uint32 tiles), 0 for a packed x4 dtype."""
    api = "nisa.memset"
    if removed:
        C.removed_kwargs(api, removed)
    eng = C.resolve_engine(api, engine, ("vector", "gpsimd"), "vector")
    C.onchip(api, "dst", dst, eng == "gpsimd")
    info = dst.info
    if isinstance(value, NkiTensor) or not isinstance(value, (bool, int, float, np.integer, np.floating)):
        raise SimulatorError(f"{api}: value must be a compile-time int or float, got {type(value).__name__}")
    if info.is_int and not isinstance(value, (bool, int, np.integer)) and not float(value).is_integer():
        raise SimulatorConstraintError(api, "value", value, f"an int literal (or an integral float) for the integer "
                                       f"dtype {dst.dtype}")
    if info.kind == "x" and value != 0:
        raise SimulatorConstraintError(api, "value", value, f"0 for the packed dtype {dst.dtype}")
    if info.is_int:
        v = np.asarray(min(max(int(value), int(info.lo)), int(info.hi)))
        if info.kind == "b":
            v = np.asarray(int(value != 0))
        C.write_raw(dst, np.broadcast_to(v.astype(info.np_dtype), dst.shape))
    else:
        C.write(dst, np.broadcast_to(F32(value), dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record(eng, "memset", (dst,))


def _pattern_values(api: str, pattern: Any, shape: tuple[int, ...], p: int, f: int, offset: Any,
                    channel_multiplier: int) -> np.ndarray:
    pat = [(int(s), int(n)) for s, n in pattern]
    if not 1 <= len(pat) <= 4:
        raise SimulatorConstraintError(api, "pattern", pat, "1..4 [step, num] pairs")
    if math.prod(n for _, n in pat) != f:
        raise SimulatorConstraintError(api, "pattern", pat, f"product of counts == dst elements per partition ({f})")
    v = np.zeros([n for _, n in pat], dtype=np.int64)
    for d, (s, n) in enumerate(pat):
        sh = [1] * len(pat)
        sh[d] = n
        v = v + (np.arange(n, dtype=np.int64) * s).reshape(sh)
    off = offset if not isinstance(offset, NkiTensor) else int(np.asarray(offset.arr).reshape(-1)[0])
    base = np.arange(p, dtype=np.int64) * int(channel_multiplier) + int(off)
    return base.reshape((p,) + (1,) * len(pat)) + v[None]


def iota(dst: NkiTensor, pattern: Any, offset: Any = 0, channel_multiplier: int = 0, name: str | None = None,
         **removed: Any) -> None:
    """dst[p, ...] = offset + p*channel_multiplier + sum(idx*step) (int32 math, cast to dst dtype)."""
    api = "nisa.iota"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "dst", dst, gpsimd=True)
    C.sbuf_only(api, "dst", dst)
    v = _pattern_values(api, pattern, dst.shape, p, f, offset, channel_multiplier)
    v32 = v.astype(np.int32)  # int32 arithmetic wraps
    if dst.info.is_int:
        C.write(dst, v32.reshape(dst.shape))
    else:
        C.write(dst, v32.astype(F32).reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "iota", (dst,))


def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask: Any, name: str | None = None,
                      **removed: Any) -> None:
    """Within each 32-partition quadrant, dst partition i = src partition mask[i] (255 keeps dst)."""
    api = "nisa.nc_stream_shuffle"
    if removed:
        C.removed_kwargs(api, removed)
    pd, fd = C.onchip(api, "dst", dst)
    ps, fs = C.onchip(api, "src", src)
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32:
        raise SimulatorConstraintError(api, "shuffle_mask", len(mask), "exactly 32 entries")
    if src.dtype != dst.dtype:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == src dtype ({src.dtype})")
    if fs != fd:
        raise SimulatorConstraintError(api, "src", fs, f"elements per partition == dst's ({fd})")
    s = np.asarray(src.arr).reshape(ps, fs)
    out = np.array(dst.arr).reshape(pd, fd)
    for i in range(pd):
        m = mask[i % 32]
        if m == 255:
            continue
        j = (i // 32) * 32 + m
        if m > 31 or j >= ps:
            raise SimulatorConstraintError(api, "shuffle_mask", m, f"a source partition < {ps} (or 255)")
        out[i] = s[j]
    C.write_raw(dst, out.reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "nc_stream_shuffle", (dst, src))


def nc_n_gather(dst: NkiTensor, data: NkiTensor, indices: NkiTensor, name: str | None = None,
                **removed: Any) -> None:
    """dst[p, j] = data[p, indices[p, j]] over the flattened free dims (GpSimd, all SBUF)."""
    api = "nisa.nc_n_gather"
    if removed:
        C.removed_kwargs(api, removed)
    pd, fd = C.onchip(api, "dst", dst, True)
    p, f = C.onchip(api, "data", data, True)
    pi, fi = C.onchip(api, "indices", indices, True)
    for nm, t in (("dst", dst), ("data", data), ("indices", indices)):
        C.sbuf_only(api, nm, t)
    if dst.dtype != data.dtype:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == data dtype ({data.dtype})")
    if indices.info.kind not in ("u", "i"):
        raise SimulatorConstraintError(api, "indices", indices.dtype, "uint32 indices")
    if pd != p or pi != p or fi != fd:
        raise SimulatorConstraintError(api, "indices", indices.shape, f"({p}, {fd}) to match data and dst")
    idx = np.asarray(indices.arr).reshape(p, fi).astype(np.int64)
    if (idx < 0).any() or (idx >= f).any():
        raise SimulatorError(f"{api}: index out of range [0, {f})")
    vals = np.take_along_axis(np.asarray(data.arr).reshape(p, f), idx, axis=1)
    C.write_raw(dst, vals.reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("gpsimd", "nc_n_gather", (dst, data, indices))

