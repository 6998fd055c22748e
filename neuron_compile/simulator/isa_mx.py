"""MX (microscaling) instructions of NeuronCore-v4: ``quantize_mx`` (VectorE) and ``nc_matmul_mx``
(TensorE), written from their nki.isa API reference pages and the OCP Microscaling format.

Packed dtypes: a ``float8_e5m2_x4`` / ``float8_e4m3fn_x4`` element is a 32-bit word holding four
fp8 values, value ``q`` in byte ``q`` (least significant first); a ``float4_e2m1fn_x4`` element is
16 bits holding four fp4 codes, value ``q`` in nibble ``q`` (the low nibble of a byte first, as AWS's
MX tutorial packs two fp4 values per byte). Element ``j`` of a packed row stands for the four
consecutive unpacked values ``4j .. 4j+3`` of that partition.

Scales: one per group of 8 partitions x 4 unpacked values (one packed column). The scale of group
``(b, j)`` (partitions ``8b .. 8b+7``, packed column ``j``) lives in the scale tile at partition
``32 * (b // 4) + b % 4``, column ``j``: the first four partitions of each 32-partition quadrant
(the page says the scale tile's partitions depend on the quadrants the data spans; this is the
layout this simulator uses for both instructions, so they agree with each other). A
``float8_e8m0fnu`` scale is ``2**e``; a ``uint8`` scale ``u`` is ``2**(u - 127)``. A scale operand may be
a view starting at partition 0, 4, 8 or 12 (the MX deep dive's scale packing: up to four tensors' scales share
one tile, each at its own offset inside every quadrant); its rows are counted from that start.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.isa_matmul import _accumulate
from neuron_compile.simulator.tensor import PSUM, NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
_FP8 = {_dt.float8_e5m2_x4: _dt.float8_e5m2, _dt.float8_e4m3fn_x4: _dt.float8_e4m3fn}  # packed -> element dtype
_EMAX = {_dt.float8_e5m2_x4: 15, _dt.float8_e4m3fn_x4: 8}
_PACKED = (_dt.float8_e5m2_x4, _dt.float8_e4m3fn_x4, _dt.float4_e2m1fn_x4)
_SCALE_DTYPES = (_dt.float8_e8m0fnu, _dt.uint8)
SCALE_STARTS = (0, 4, 8, 12)  # scale offsets inside each 32-partition quadrant


def scale_rows(p: int) -> np.ndarray:
    """The scale-tile partition of each 8-partition group of a ``p``-partition data tile."""
    b = np.arange(p // 8)
    return 32 * (b // 4) + b % 4


def unpack(t: NkiTensor) -> np.ndarray:
    """A packed (P, F) x4 tile as fp32 values of shape (P, 4F)."""
    words = np.ascontiguousarray(np.asarray(t.arr)).astype(t.info.np_dtype).reshape(t.shape[0], -1)
    raw = words.view(np.uint8).reshape(words.shape[0], -1)  # little-endian: byte q = value q
    if t.dtype == _dt.float4_e2m1fn_x4:
        import ml_dtypes

        nibbles = np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(raw.shape[0], -1)  # low nibble first
        return nibbles.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)
    return raw.view(_dt.low_precision_types()[_FP8[t.dtype]]).astype(F32)


def _scales(api: str, name: str, t: NkiTensor, p: int, f: int) -> np.ndarray:
    """Per group (P/8, F) scale factors from a scale tile."""
    pf = C.onchip(api, name, t, starts=SCALE_STARTS)
    C.sbuf_only(api, name, t)
    if t.dtype not in _SCALE_DTYPES:
        raise SimulatorConstraintError(api, name, t.dtype, "float8_e8m0fnu (or uint8)")
    rows = scale_rows(p)
    if pf[1] != f or pf[0] <= int(rows.max()):
        raise SimulatorConstraintError(api, name, t.shape, f"{f} columns and at least {int(rows.max()) + 1} partitions "
                                       "(scales sit on the first 4 partitions of each 32-partition quadrant)")
    vals = np.asarray(t.arr).reshape(pf[0], f)[rows]
    if t.dtype == _dt.uint8:
        return np.exp2(vals.astype(F32) - F32(127))
    return vals.astype(F32)


def _data(api: str, name: str, t: NkiTensor) -> tuple[int, int]:
    pf = C.onchip(api, name, t)
    C.sbuf_only(api, name, t)
    if t.dtype not in _PACKED:
        raise SimulatorConstraintError(api, name, t.dtype, "float8_e5m2_x4, float8_e4m3fn_x4 or float4_e2m1fn_x4")
    if pf[0] % 32 or pf[0] > 128:
        raise SimulatorConstraintError(api, name, t.shape, "a partition count that is a multiple of 32, <= 128")
    return pf


def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name: str | None = None,
                **removed: Any) -> None:
    """src (P, F) bf16/fp16 -> dst (P, F/4) packed fp8 + one scale per 8 x 4 group: the scale is
    ``2**(floor(log2(amax)) - (Emax - 1))`` (Emax 8 for e4m3fn, 15 for e5m2; 2**-127 for an all-zero
    group) and each value is ``src / scale`` rounded to fp8. VectorE, NC-v4, SBUF only."""
    api = "nisa.quantize_mx"
    if removed:
        C.removed_kwargs(api, removed)
    C.need_version(api, 4)
    p, f = C.onchip(api, "src", src)
    C.sbuf_only(api, "src", src)
    if src.dtype not in (_dt.bfloat16, _dt.float16):
        raise SimulatorConstraintError(api, "src", src.dtype, "bfloat16 or float16")
    if p % 32 or f % 4:
        raise SimulatorConstraintError(api, "src", src.shape, "partitions a multiple of 32 and a free size that is a "
                                       "multiple of 4")
    pd, fd = _data(api, "dst", dst)
    if dst.dtype not in _FP8:
        raise SimulatorConstraintError(api, "dst", dst.dtype, "float8_e5m2_x4 or float8_e4m3fn_x4")
    if (pd, fd) != (p, f // 4):
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{p} partitions x {f // 4} packed elements (src free / 4)")
    ps, fs = C.onchip(api, "dst_scale", dst_scale, starts=SCALE_STARTS)
    C.sbuf_only(api, "dst_scale", dst_scale)
    if dst_scale.dtype not in _SCALE_DTYPES:
        raise SimulatorConstraintError(api, "dst_scale", dst_scale.dtype, "float8_e8m0fnu (or uint8)")
    rows = scale_rows(p)
    if fs != fd or ps <= int(rows.max()):
        raise SimulatorConstraintError(api, "dst_scale", dst_scale.shape, f"{fd} columns and at least "
                                       f"{int(rows.max()) + 1} partitions")
    x = C.read32(src).reshape(p // 8, 8, fd, 4)
    amax = np.abs(x).max(axis=(1, 3))  # (P/8, F/4)
    with np.errstate(divide="ignore"):
        exp = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - (_EMAX[dst.dtype] - 1), -127)
    exp = np.clip(exp, -127, 127)
    scale = np.exp2(exp).astype(F32)
    q = (x / scale[:, None, :, None]).reshape(p, fd, 4).astype(_dt.low_precision_types()[_FP8[dst.dtype]])
    C.write_raw(dst, np.ascontiguousarray(q).view(np.uint8).reshape(p, fd * 4).view(np.uint32).reshape(dst.shape))
    cur = np.array(dst_scale.arr).reshape(ps, fs)
    if dst_scale.dtype == _dt.uint8:
        cur[rows] = (exp + 127).astype(np.uint8)
    else:
        cur[rows] = scale.astype(cur.dtype)
    C.write_raw(dst_scale, cur.reshape(dst_scale.shape))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "quantize_mx", (dst, src, dst_scale), main=src)


def nc_matmul_mx(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, stationary_scale: NkiTensor,
                 moving_scale: NkiTensor, tile_position: Any = None, tile_size: Any = None,
                 accumulate: bool | None = None, name: str | None = None, **removed: Any) -> None:
    """dst[M, N] (+)= sum over K partitions x 4 packed values of dequantized stationary[K, M] x moving[K, N]
    (fp32 accumulation in PSUM; dst fp32 or bf16). TensorE, NC-v4; row tiling only."""
    api = "nisa.nc_matmul_mx"
    if removed:
        C.removed_kwargs(api, removed)
    C.need_version(api, 4)
    k, m = _data(api, "stationary", stationary)
    k2, n = _data(api, "moving", moving)
    if k2 != k:
        raise SimulatorConstraintError(api, "moving", f"K={k2}", f"contraction (partition) size == stationary's K={k}")
    if m % 2 or m > 128:
        raise SimulatorConstraintError(api, "stationary", m, "an even free size <= 128")
    pd, fd = C.onchip(api, "dst", dst)
    if dst.storage.buffer is not PSUM:
        raise SimulatorConstraintError(api, "dst", f"nl.{dst.storage.buffer.value}", "dst in PSUM")
    if dst.dtype not in (_dt.float32, _dt.bfloat16):
        raise SimulatorConstraintError(api, "dst", dst.dtype, "float32 or bfloat16")
    nmax = 8192 if dst.dtype == _dt.bfloat16 else 4096
    if n > nmax:
        raise SimulatorConstraintError(api, "moving", n, f"a free size <= {nmax} for a {dst.dtype} dst")
    if (pd, fd) != (m, n):
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{m} partitions x {n} elements")
    if tile_position is not None or tile_size is not None:
        pos, size = tuple(tile_position or ()), tuple(tile_size or ())
        if len(pos) != 2 or len(size) != 2 or size[1] != 128 or pos[1] != 0 or size[0] not in (128, 64, 32) \
                or pos[0] % size[0] or pos[0] + size[0] > 128 or k > size[0]:
            raise SimulatorConstraintError(api, "tile_size", (pos, size), "row tiling only: tile_size (rows in "
                                           "128/64/32, 128) and tile_position (a multiple of rows, 0), covering K")
    if accumulate is not None and not isinstance(accumulate, (bool, np.bool_)):
        raise C.SimulatorError(f"{api}: accumulate must be None, True or False, got {accumulate!r}")
    s = unpack(stationary).reshape(k // 8, 8, m, 4) * _scales(api, "stationary_scale", stationary_scale, k, m)[
        :, None, :, None]
    mv = unpack(moving).reshape(k // 8, 8, n, 4) * _scales(api, "moving_scale", moving_scale, k, n)[:, None, :, None]
    prod = np.einsum("gpmq,gpnq->mn", s, mv, dtype=F32)
    _accumulate(api, dst, prod, accumulate, 4)
    if _trace.ACTIVE is not None:
        _trace.record("tensor", "nc_matmul_mx", (dst, stationary, moving))


__all__ = ["nc_matmul_mx", "quantize_mx", "scale_rows", "unpack"]
