"""TensorE instructions: ``nc_matmul`` (with the PSUM accumulation semantics of REFERENCE 7.5) and
``nc_transpose`` (TensorE or VectorE). REFERENCE 3.2.

PSUM accumulation: every PSUM storage keeps per-element flags (0 never written, 1 written by a
matmul, 2 written by another instruction). ``accumulate=False`` overwrites; ``True`` adds (warning
when the region was never written, or, on NC-v2/v3, last written by a non-matmul instruction);
``None`` overwrites elements not yet written by a matmul and adds onto the others.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import enums as _en
from neuron_compile.simulator import targets as _targets
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.enums import check_enum, engine, matmul_perf_mode
from neuron_compile.simulator.tensor import PSUM, SBUF, NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
_FP32_LIKE = frozenset((_dt.float32, _dt.tfloat32))


def _operand(api: str, name: str, t: Any) -> tuple[int, int]:
    pf = C.onchip(api, name, t)
    if t.storage.buffer is not SBUF:
        raise SimulatorConstraintError(api, name, f"nl.{t.storage.buffer.value}", "matmul operands must be in SBUF",
                                       f"tensor '{t.name}'")
    if t.dtype not in _dt.MATMUL_INPUT_DTYPES:
        raise SimulatorConstraintError(api, name, t.dtype, "one of float8_e4m3, float8_e4m3fn, float8_e5m2, "
                                       "bfloat16, float16, tfloat32, float32")
    return pf


def nc_matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate: bool | None = None,
              tile_position: Any = (), tile_size: Any = (), perf_mode: matmul_perf_mode = matmul_perf_mode.none,
              name: str | None = None, **removed: Any) -> None:
    """dst[M, N] (+)= stationary[K, M].T @ moving[K, N] on TensorE, fp32 accumulation in PSUM."""
    api = "nisa.nc_matmul"
    if removed:
        C.removed_kwargs(api, removed)
    lim = _targets.limits()
    k, m = _operand(api, "stationary", stationary)
    k2, n = _operand(api, "moving", moving)
    pd, fd = C.onchip(api, "dst", dst)
    if dst.storage.buffer is not PSUM:
        raise SimulatorConstraintError(api, "dst", f"nl.{dst.storage.buffer.value}", "matmul dst must be in PSUM",
                                       f"tensor '{dst.name}'")
    double = perf_mode is not matmul_perf_mode.none
    if double:
        check_enum(perf_mode, matmul_perf_mode, api, "perf_mode")
        C.need_version(api + " (perf_mode=double_row)", 3)
        for nm, t in (("stationary", stationary), ("moving", moving)):
            if t.dtype not in _dt.FLOAT8:
                raise SimulatorConstraintError(api, nm, t.dtype, "FP8 operands with perf_mode=double_row")
            if t.ndim != 3 or t.shape[1] != 2:
                raise SimulatorConstraintError(api, nm, t.shape, "shape [K, 2, F] with perf_mode=double_row")
        if is_transpose:
            raise SimulatorConstraintError(api, "is_transpose", True, "not combinable with double_row")
        m //= 2
        n //= 2
    if k != k2:
        raise SimulatorConstraintError(api, "moving", f"K={k2}", f"contraction (partition) size == stationary's K={k}")
    if k > lim.pmax:
        raise SimulatorConstraintError(api, "stationary", k, f"contraction K <= {lim.pmax}")
    if m > lim.gemm_stationary_fmax:
        raise SimulatorConstraintError(api, "stationary", m,
                                       f"free size <= {lim.gemm_stationary_fmax} (gemm_stationary_fmax on {lim.name})")
    nmax = lim.gemm_moving_fmax_bf16 if dst.dtype == _dt.bfloat16 else lim.gemm_moving_fmax_fp32
    if n > nmax:
        raise SimulatorConstraintError(api, "moving", n, f"free size <= {nmax} (gemm_moving_fmax on {lim.name})")
    if pd != m or fd != n:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{m} partitions x {n} elements (stationary free x "
                                       "moving free)")
    sd, md = stationary.dtype, moving.dtype
    if (sd in _FP32_LIKE) != (md in _FP32_LIKE):
        raise SimulatorConstraintError(api, "moving", md, f"fp32/tf32 operands pair only with fp32/tf32 (stationary "
                                       f"is {sd})")
    if _dt.float8_e4m3fn in (sd, md):
        C.need_version(api + " (float8_e4m3fn)", 4)
        if _dt.float8_e4m3 in (sd, md):
            raise SimulatorConstraintError(api, "moving", md, "float8_e4m3fn never mixed with float8_e4m3")
    if is_transpose:
        C.need_version(api + " (is_transpose=True)", 3)
        ok = (dst.dtype == sd) or (dst.dtype == _dt.float32) or (sd in _dt.FLOAT8 and dst.itemsize == 2)
        if not ok:
            raise SimulatorConstraintError(api, "dst", dst.dtype, f"transpose output dtype == input dtype ({sd}) "
                                           "or float32")
    elif lim.nc_version < 4 and dst.dtype != _dt.float32:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"float32 PSUM output on {lim.name}")
    elif dst.dtype not in (_dt.float32, _dt.bfloat16):
        raise SimulatorConstraintError(api, "dst", dst.dtype, "float32 or bfloat16 PSUM output")
    start_byte = (dst.offset % dst.storage.part_elems) * dst.itemsize
    nbytes = fd * dst.itemsize
    bank = lim.psum_bank_bytes
    if lim.nc_version < 4 and (nbytes > bank or start_byte // bank != (start_byte + nbytes - 1) // bank):
        raise SimulatorConstraintError(api, "dst", f"{nbytes} B at byte {start_byte}",
                                       f"fits one {bank} B PSUM bank per partition on {lim.name}")
    if tile_position or tile_size:
        _check_tiling(api, tile_position, tile_size, k, m, lim.nc_version)
    if accumulate is not None and not isinstance(accumulate, (bool, np.bool_)):
        raise C.SimulatorError(f"{api}: accumulate must be None, True or False, got {accumulate!r}")

    s = C.read32(stationary)
    mv = C.read32(moving)
    if double:
        s = s.reshape(k * 2, m)
        mv = mv.reshape(k * 2, n)
    elif s.ndim != 2 or mv.ndim != 2:
        s = s.reshape(k, m)
        mv = mv.reshape(k, n)
    if is_transpose and k == n and np.array_equal(mv, np.eye(k, dtype=F32)):
        prod = np.ascontiguousarray(s.T)  # bit-exact transpose mode (no 0*inf NaNs)
    else:
        prod = np.matmul(s.T, mv)
    if is_transpose and accumulate is None:
        accumulate = False  # transpose mode writes its output (a transposed tile never accumulates)
    _accumulate(api, dst, prod, accumulate, lim.nc_version)
    if _trace.ACTIVE is not None:
        flags = (("is_transpose",) if is_transpose else ()) + (("double_row",) if double else ())
        _trace.record("tensor", "nc_matmul", (dst, stationary, moving), flags=flags)


def _check_tiling(api: str, pos: Any, size: Any, k: int, m: int, ver: int) -> None:
    if len(pos) != 2 or len(size) != 2:
        raise SimulatorConstraintError(api, "tile_position", (tuple(pos), tuple(size)),
                                       "tile_position and tile_size both given as (row, col)")
    allowed = (128, 64, 32) if ver >= 3 else (128, 64)
    for nm, v in (("tile_size", size[0]), ("tile_size", size[1])):
        if v not in allowed:
            raise SimulatorConstraintError(api, nm, tuple(size), f"row/col sizes in {allowed}")
    if pos[0] % size[0] or pos[1] % size[1] or pos[0] + size[0] > 128 or pos[1] + size[1] > 128:
        raise SimulatorConstraintError(api, "tile_position", tuple(pos), "multiples of tile_size inside 128x128")
    if k > size[0] or m > size[1]:
        raise SimulatorConstraintError(api, "tile_size", tuple(size), f"covers K={k} rows and M={m} columns")


def _accumulate(api: str, dst: NkiTensor, prod: np.ndarray, accumulate: bool | None, ver: int) -> None:
    a = dst.arr
    flags = dst.mm_view()
    if prod.shape != a.shape:
        prod = prod.reshape(a.shape)
    store = a.dtype == np.float32
    if flags is None:  # reinterpreted PSUM view: no flags to consult
        if accumulate:
            prod = prod + C.read32(dst)
    elif accumulate is False:
        pass
    elif accumulate is True:
        if not (flags == 1).all():
            if (flags == 0).any():
                C.warn(f"{api}: accumulate=True onto PSUM never written by a matmul (tensor '{dst.name}'): "
                       "undefined on hardware; the first matmul of a group must use accumulate=False")
            elif ver < 4:
                C.warn(f"{api}: accumulate=True onto PSUM last written by a non-matmul instruction (tensor "
                       f"'{dst.name}'): undefined on NC-v{ver}")
        prod = prod + C.read32(dst)
    else:
        f1 = flags == 1
        if f1.all():
            if store:  # hot path of K-accumulation: add in place
                a += prod
                dst.storage.written = True
                return
            prod = prod + C.read32(dst)
        elif f1.any():
            prod = np.where(f1, prod + C.read32(dst), prod)
    if store:
        a[...] = prod
    else:
        a[...] = prod.astype(a.dtype) if a.dtype != prod.dtype else prod
    if flags is not None:
        flags[...] = 1
    dst.storage.written = True


def nc_transpose(dst: NkiTensor, data: NkiTensor, engine: engine = engine.unknown, name: str | None = None,
                 **removed: Any) -> None:
    """dst[F, P] = data[P, F]: TensorE (<=128x128, SBUF -> PSUM) or VectorE (<=32x32)."""
    api = "nisa.nc_transpose"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "data", data)
    pd, fd = C.onchip(api, "dst", dst)
    if engine is _en.engine.unknown:
        eng = "tensor" if dst.storage.buffer is PSUM and data.storage.buffer is SBUF else "vector"
    else:
        check_enum(engine, _en.engine, api, "engine")
        eng = engine.name
        if eng not in ("tensor", "vector"):
            raise SimulatorConstraintError(api, "engine", f"nisa.engine.{eng}", "nisa.engine.tensor or .vector")
    if dst.dtype != data.dtype:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == data dtype ({data.dtype})")
    lim = 128 if eng == "tensor" else 32
    if p > lim or f > lim:
        raise SimulatorConstraintError(api, "data", (p, f), f"<= {lim}x{lim} on the {eng} engine")
    if eng == "tensor":
        if data.storage.buffer is not SBUF:
            raise SimulatorConstraintError(api, "data", f"nl.{data.storage.buffer.value}", "SBUF input on TensorE")
        if dst.storage.buffer is not PSUM:
            raise SimulatorConstraintError(api, "dst", f"nl.{dst.storage.buffer.value}", "PSUM output on TensorE")
    if (pd, fd) != (f, p):
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{f} partitions x {p} elements (transposed data)")
    vals = np.asarray(data.arr).reshape(p, f).T
    C.write_raw(dst, np.ascontiguousarray(vals).reshape(dst.shape))
    if eng == "tensor" and dst.mm_view() is not None:
        dst.mm_view()[...] = 1  # type: ignore[index]
    if _trace.ACTIVE is not None:
        _trace.record(eng, "nc_transpose", (dst, data))
