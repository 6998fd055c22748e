"""On-device randomness: ``rng``, ``dropout``, ``set_rng_seed``, ``rand_set_state``,
``rand_get_state`` and ``rand2`` (the nki.isa API reference pages of each).

Each engine (Vector, GpSimd) keeps a per-lane XORWOW generator, per simulation, as the API pages
describe: a lane's state is 6 uint32 words on GpSimd (x, y, z, w, v, d) and 24 on Vector (four
generators per lane, element ``j`` of a partition drawing from generator ``j % 4``). A fresh
simulation seeds every lane from its lane number; ``set_rng_seed`` (Vector) and ``rand_set_state``
reseed, ``rand_get_state`` reads the state back, so a saved state replays the same numbers. The
hardware's exact bit stream is not documented: results match the documented distribution and
determinism, not the device's values.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.simulator import checks as C
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import targets as _targets
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.enums import engine
from neuron_compile.simulator.tensor import PSUM, NkiTensor

log = logging.getLogger(__name__)

F32 = np.float32
_U32 = np.uint32
_WORDS = {"gpsimd": 6, "vector": 24}
_INT_DTYPES = (_dt.int8, _dt.int16, _dt.int32, _dt.uint8, _dt.uint16, _dt.uint32)


def _default_state(eng: str) -> np.ndarray:
    """Per-lane words seeded from the lane number (never all zero: XORWOW needs a non-zero x..v)."""
    gens = _WORDS[eng] // 6
    lanes = np.arange(128, dtype=np.uint64)[:, None] * gens + np.arange(gens, dtype=np.uint64)[None, :]
    seeds = (lanes * 0x9E3779B1 + 0x85EBCA6B).astype(np.uint64)
    out = np.zeros((128, gens, 6), dtype=_U32)
    for k, mult in enumerate((0x2545F491, 0x6C8E9CF5, 0x1B873593, 0xCC9E2D51, 0xE6546B64)):
        out[:, :, k] = ((seeds * mult + k + 1) & 0xFFFFFFFF).astype(_U32) | _U32(1)
    out[:, :, 5] = 6615241
    return out.reshape(128, _WORDS[eng])


def _state_of(eng: str) -> np.ndarray:
    st = _state.current()
    words = st.rng_state.get(eng)
    if words is None:
        words = _default_state(eng)
        st.rng_state[eng] = words
    return words  # type: ignore[return-value]


def _draw(eng: str, start: int, p: int, f: int) -> np.ndarray:
    """``f`` 32-bit draws for lanes [start, start+p): XORWOW, advancing the lanes' state."""
    words = _state_of(eng)
    gens = _WORDS[eng] // 6
    s = words[start:start + p].reshape(p, gens, 6).astype(np.uint64)
    out = np.empty((p, f), dtype=np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    for j in range(f):
        g = j % gens
        x, y, z, w, v, d = (s[:, g, k] for k in range(6))
        t = (x ^ (x >> np.uint64(2))) & mask
        nv = ((v ^ ((v << np.uint64(4)) & mask)) ^ (t ^ ((t << np.uint64(1)) & mask))) & mask
        nd = (d + np.uint64(362437)) & mask
        s[:, g, 0], s[:, g, 1], s[:, g, 2], s[:, g, 3], s[:, g, 4], s[:, g, 5] = y, z, w, v, nv, nd
        out[:, j] = (nv + nd) & mask
    words[start:start + p] = s.reshape(p, _WORDS[eng]).astype(_U32)
    return out.astype(_U32)


def _uniform(eng: str, start: int, p: int, f: int) -> np.ndarray:
    """U[0, 1) fp32 values from 24 random bits per draw."""
    return (_draw(eng, start, p, f) >> _U32(8)).astype(F32) * F32(1.0 / (1 << 24))


def rng(dst: NkiTensor, engine: engine = engine.vector, name: str | None = None, **removed: Any) -> None:
    """32 random bits per element, truncated to dst's integer dtype (its least significant bits)."""
    api = "nisa.rng"
    if removed:
        C.removed_kwargs(api, removed)
    eng = C.resolve_engine(api, engine, ("vector", "gpsimd"), "vector")
    if eng == "gpsimd":
        C.need_version(api + " (engine=gpsimd)", 3)
    p, f = C.onchip(api, "dst", dst, gpsimd=eng == "gpsimd")
    if dst.dtype not in _INT_DTYPES:
        raise SimulatorConstraintError(api, "dst", dst.dtype, "an integer dtype (int8/16/32, uint8/16/32)")
    bits = _draw(eng, dst.pinfo()[0], p, f)
    C.write_raw(dst, bits.astype(dst.info.np_dtype).reshape(dst.shape))  # C-style wrap keeps the low bits
    if _trace.ACTIVE is not None:
        _trace.record(eng, "rng", (dst,))


def dropout(dst: NkiTensor, data: NkiTensor, prob: Any, name: str | None = None, **removed: Any) -> None:
    """Each element of ``data`` becomes 0 with probability ``prob`` (a scalar or a (P, 1) tile), else is
    kept unchanged (no rescaling); ``dst.dtype == data.dtype``. VectorE."""
    api = "nisa.dropout"
    if removed:
        C.removed_kwargs(api, removed)
    p, f = C.onchip(api, "dst", dst)
    C.same_pf(api, "data", C.onchip(api, "data", data), "dst", (p, f))
    if dst.dtype != data.dtype:
        raise SimulatorConstraintError(api, "dst", dst.dtype, f"dtype == data dtype ({data.dtype})")
    if isinstance(prob, NkiTensor):
        if not prob.info.is_float:
            raise SimulatorConstraintError(api, "prob", prob.dtype, "a float dtype")
        if data.info.is_int and prob.dtype != _dt.float32:
            raise SimulatorConstraintError(api, "prob", prob.dtype, "float32 when data is an integer tile")
    pr = np.asarray(C.scalar_or_vector(api, "prob", prob, p, 2, fp32_only=False), dtype=F32)
    keep = _uniform("vector", dst.pinfo()[0], p, f) >= pr
    vals = np.asarray(data.arr).reshape(p, f)
    C.write_raw(dst, np.where(keep, vals, np.zeros((), dtype=vals.dtype)).reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "dropout", [dst, data] + ([prob] if isinstance(prob, NkiTensor) else []))


def set_rng_seed(src_seeds: NkiTensor, name: str | None = None, **removed: Any) -> None:
    """Seed the Vector engine's generators from a [1, 1] 32-bit tensor in SBUF or PSUM."""
    api = "nisa.set_rng_seed"
    if removed:
        C.removed_kwargs(api, removed)
    C.onchip(api, "src_seeds", src_seeds)
    if src_seeds.size != 1:
        raise SimulatorConstraintError(api, "src_seeds", src_seeds.shape, "a [1, 1] tensor")
    if src_seeds.itemsize != 4:
        raise SimulatorConstraintError(api, "src_seeds", src_seeds.dtype, "a 32-bit dtype")
    seed = int(np.asarray(src_seeds.arr).view(np.uint32).reshape(-1)[0])
    words = _default_state("vector").astype(np.uint64)
    words[:, np.arange(24) % 6 != 5] ^= np.uint64(seed * 0x9E3779B1 & 0xFFFFFFFF)
    words[words == 0] = 1
    _state.current().rng_state["vector"] = words.astype(_U32)
    if _trace.ACTIVE is not None:
        _trace.record("vector", "set_rng_seed", (src_seeds,))


def _state_engine(api: str, eng: Any) -> str:
    C.need_version(api, 3)
    name = C.resolve_engine(api, eng, ("gpsimd", "vector"), "gpsimd")
    if name == "vector":
        C.need_version(api + " (engine=vector)", 4)
    return name


def rand_set_state(src_seeds: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None,
                   **removed: Any) -> None:
    """Load each lane's generator state from a uint32 SBUF tile (6 words per lane on GpSimd, 24 on Vector)."""
    api = "nisa.rand_set_state"
    if removed:
        C.removed_kwargs(api, removed)
    eng = _state_engine(api, engine)
    p, f = C.onchip(api, "src_seeds", src_seeds)
    C.sbuf_only(api, "src_seeds", src_seeds)
    if src_seeds.dtype != _dt.uint32:
        raise SimulatorConstraintError(api, "src_seeds", src_seeds.dtype, "uint32")
    if f != _WORDS[eng]:
        raise SimulatorConstraintError(api, "src_seeds", src_seeds.shape, f"{_WORDS[eng]} elements per partition "
                                       f"(the XORWOW state of one {eng} lane)")
    start = src_seeds.pinfo()[0]
    _state_of(eng)[start:start + p] = np.asarray(src_seeds.arr).reshape(p, f)
    if _trace.ACTIVE is not None:
        _trace.record(eng, "rand_set_state", (src_seeds,))


def rand_get_state(dst: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None, **removed: Any) -> None:
    """Store each lane's generator state into a uint32 tile (SBUF; PSUM only from the Vector engine)."""
    api = "nisa.rand_get_state"
    if removed:
        C.removed_kwargs(api, removed)
    eng = _state_engine(api, engine)
    p, f = C.onchip(api, "dst", dst, gpsimd=eng == "gpsimd")
    if dst.storage.buffer is PSUM and _targets.nc_version() < 4:
        raise SimulatorConstraintError(api, "dst", "nl.psum", "SBUF on NeuronCore-v3")
    if dst.dtype != _dt.uint32:
        raise SimulatorConstraintError(api, "dst", dst.dtype, "uint32")
    if f != _WORDS[eng]:
        raise SimulatorConstraintError(api, "dst", dst.shape, f"{_WORDS[eng]} elements per partition")
    start = dst.pinfo()[0]
    C.write_raw(dst, _state_of(eng)[start:start + p].reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record(eng, "rand_get_state", (dst,))


def rand2(dst: NkiTensor, min: Any, max: Any, name: str | None = None, **removed: Any) -> None:  # noqa: A002
    """Uniform fp32 values in [min, max] (scalars or (P, 1) tiles) cast to dst's dtype. VectorE, NC-v4."""
    api = "nisa.rand2"
    if removed:
        C.removed_kwargs(api, removed)
    C.need_version(api, 4)
    p, f = C.onchip(api, "dst", dst)
    if dst.info.kind == "x" or dst.dtype in (_dt.bool_, _dt.float8_e8m0fnu, _dt.float8_e4m3fn):
        raise SimulatorConstraintError(api, "dst", dst.dtype, "a float8_e4m3/e5m2, 16/32-bit float or integer dtype")
    lo = np.asarray(C.scalar_or_vector(api, "min", min, p, 2), dtype=F32)
    hi = np.asarray(C.scalar_or_vector(api, "max", max, p, 2), dtype=F32)
    if np.any(lo >= hi):
        raise SimulatorConstraintError(api, "min", float(np.max(lo)), "min < max")
    u = _uniform("vector", dst.pinfo()[0], p, f)
    C.write(dst, (lo + u * (hi - lo)).reshape(dst.shape))
    if _trace.ACTIVE is not None:
        _trace.record("vector", "rand2", [dst] + [t for t in (min, max) if isinstance(t, NkiTensor)])
