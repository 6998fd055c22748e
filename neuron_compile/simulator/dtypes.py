"""NKI dtype constants and the numerics of the simulator.

Owns the mapping between NKI dtype names (``nl.float32`` ... are plain strings, as ``DType = str``
in the real API) and NumPy / ml_dtypes storage types, plus the casts every instruction uses to
write results: round-to-nearest-even for floats (ml_dtypes for bf16/fp8, bit arithmetic for
tf32), round-half-even plus saturation for integers. ``NKI_PRECISE_FP=0`` stores bf16/fp8 tensors
as fp32 (as the real simulator does) to separate algorithm bugs from rounding.

``ml_dtypes`` is imported on the first bf16/fp8 use, not at import: its extension registers its NumPy
loops one by one (quadratic in NumPy's loop list), several seconds of every process start here, which
an fp32 model (and a warm start) never needs.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from neuron_compile.errors import SimulatorError

log = logging.getLogger(__name__)

F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class DTypeInfo:
    """Precomputed facts about one NKI dtype (looked up once per tensor, never per element)."""

    name: str
    np_dtype: np.dtype  # dtype of the storage array
    itemsize: int  # bytes per element on the device (not of the storage when imprecise)
    kind: str  # "f" float, "i" signed int, "u" unsigned int, "b" bool, "x" packed MX container
    lo: float = 0.0  # saturation bounds for ints
    hi: float = 0.0

    @property
    def is_int(self) -> bool:
        return self.kind in ("i", "u", "b")

    @property
    def is_float(self) -> bool:
        return self.kind == "f"


bool_ = "bool_"
int8 = "int8"
int16 = "int16"
int32 = "int32"
uint8 = "uint8"
uint16 = "uint16"
uint32 = "uint32"
float16 = "float16"
float32 = "float32"
bfloat16 = "bfloat16"
tfloat32 = "tfloat32"
float8_e4m3 = "float8_e4m3"
float8_e4m3fn = "float8_e4m3fn"
float8_e5m2 = "float8_e5m2"
float8_e8m0fnu = "float8_e8m0fnu"
float8_e5m2_x4 = "float8_e5m2_x4"
float8_e4m3fn_x4 = "float8_e4m3fn_x4"
float4_e2m1fn_x4 = "float4_e2m1fn_x4"

ALL_DTYPES = (bool_, int8, int16, int32, uint8, uint16, uint32, float16, float32, bfloat16, tfloat32,
              float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float8_e5m2_x4, float8_e4m3fn_x4,
              float4_e2m1fn_x4)

LOW_PRECISION_NAMES = (bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu)


@functools.cache
def low_precision_types() -> dict[str, type]:
    """NKI name -> ml_dtypes scalar type of the bf16/fp8 dtypes (imports ml_dtypes on first use)."""
    import ml_dtypes

    return {name: getattr(ml_dtypes, name) for name in LOW_PRECISION_NAMES}


def low_precision_type(name: str) -> type | None:
    """The ml_dtypes type storing NKI dtype ``name``, or None for a dtype NumPy stores itself."""
    return low_precision_types()[name] if name in LOW_PRECISION_NAMES else None


def __getattr__(name: str) -> object:
    if name == "_LOW_PRECISION":  # the table, for callers that index it by a bf16/fp8 name
        return low_precision_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def precise_fp() -> bool:
    """``NKI_PRECISE_FP`` (default 1): store bf16/fp8 with their real precision."""
    return os.environ.get("NKI_PRECISE_FP", "1").strip().lower() not in ("0", "false", "no", "off")


def _int_info(name: str, np_t: type) -> DTypeInfo:
    ii = np.iinfo(np_t)
    return DTypeInfo(name, np.dtype(np_t), np.dtype(np_t).itemsize, "u" if ii.min == 0 else "i", float(ii.min),
                     float(ii.max))


def _build(precise: bool) -> dict[str, DTypeInfo]:
    """Every dtype but bf16/fp8 (added by :func:`_table` on the first lookup of one of them)."""
    table = {
        bool_: DTypeInfo(bool_, np.dtype(np.uint8), 1, "b", 0.0, 1.0),
        int8: _int_info(int8, np.int8),
        int16: _int_info(int16, np.int16),
        int32: _int_info(int32, np.int32),
        uint8: _int_info(uint8, np.uint8),
        uint16: _int_info(uint16, np.uint16),
        uint32: _int_info(uint32, np.uint32),
        float16: DTypeInfo(float16, np.dtype(np.float16), 2, "f"),
        float32: DTypeInfo(float32, F32, 4, "f"),
        tfloat32: DTypeInfo(tfloat32, F32, 4, "f"),
    }
    for name in (float8_e5m2_x4, float8_e4m3fn_x4):  # four 8-bit codes: a 32-bit word
        table[name] = DTypeInfo(name, np.dtype(np.uint32), 4, "x")
    table[float4_e2m1fn_x4] = DTypeInfo(float4_e2m1fn_x4, np.dtype(np.uint16), 2, "x")  # four 4-bit codes: 16 bits
    return table


_TABLES = {True: _build(True), False: _build(False)}
_NAMES = frozenset(ALL_DTYPES)


def _table(precise: bool, name: str) -> dict[str, DTypeInfo]:
    table = _TABLES[precise]
    if name in LOW_PRECISION_NAMES and name not in table:
        for low, t in low_precision_types().items():
            table[low] = DTypeInfo(low, np.dtype(t) if precise else F32, np.dtype(t).itemsize, "f")
    return table


def info(dtype: object) -> DTypeInfo:
    """The :class:`DTypeInfo` of an NKI dtype name (also accepts NumPy/ml_dtypes/torch dtypes)."""
    precise = precise_fp()
    got = _TABLES[precise].get(dtype) if isinstance(dtype, str) else None
    if got is not None:
        return got
    name = normalize(dtype)
    return _table(precise, name)[name]


def normalize(dtype: object) -> str:
    """Turn any accepted dtype spelling into the NKI dtype name."""
    if isinstance(dtype, str):
        if dtype in _NAMES:
            return dtype
        if dtype in ("bool", "float64", "int64", "uint64"):
            return {"bool": bool_, "float64": float32, "int64": int32, "uint64": uint32}[dtype]
        raise SimulatorError(f"unknown NKI dtype {dtype!r}; use one of nl.{', nl.'.join(ALL_DTYPES)}")
    mod = type(dtype).__module__
    if mod.startswith("torch"):
        name = str(dtype).removeprefix("torch.")
        torch_map = {"bool": bool_, "float8_e4m3fn": float8_e4m3fn, "float8_e5m2": float8_e5m2}
        return normalize(torch_map.get(name, name))
    try:
        npd = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        raise SimulatorError(f"unknown dtype {dtype!r}: expected an NKI dtype such as nl.float32") from None
    return normalize(npd.name)


def from_numpy_dtype(npd: np.dtype) -> str:
    """NKI dtype of a NumPy array's dtype (float64/int64 map to their 32-bit forms)."""
    return normalize(npd.name if npd.kind != "b" else "bool")


# --------------------------------------------------------------------------------------------- casts

def _round_tf32(x: np.ndarray) -> np.ndarray:
    """Round fp32 to tf32 (10 explicit mantissa bits), nearest-even, keeping fp32 storage."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (bits >> np.uint32(13)) & np.uint32(1)
    rounded = (bits + np.uint32(0x0FFF) + lsb) & np.uint32(0xFFFFE000)
    finite = np.isfinite(x)
    return np.where(finite, rounded.view(np.float32), x)


def to_int(x: np.ndarray, dt: DTypeInfo) -> np.ndarray:
    """fp32 -> int: round half to even, saturate to the dtype range, NaN -> 0."""
    r = np.rint(np.asarray(x, dtype=np.float64))
    np.clip(r, dt.lo, dt.hi, out=r)
    r = np.nan_to_num(r, nan=0.0, copy=False)
    if dt.kind == "b":
        return (r != 0).astype(np.uint8)
    return r.astype(dt.np_dtype)


def cast_for_store(values: np.ndarray, dt: DTypeInfo) -> np.ndarray | None:
    """The array to assign into a ``dt`` tensor, or None when plain NumPy assignment already rounds right.

    NumPy assignment of fp32 into float16 / ml_dtypes arrays is round-to-nearest-even; ints need
    explicit rounding and saturation; tf32 needs mantissa rounding.
    """
    if dt.is_int:
        if values.dtype.kind in "iub":
            if dt.kind == "b":
                return (values != 0).astype(np.uint8)
            return np.clip(values, dt.lo, dt.hi).astype(dt.np_dtype) if values.dtype != dt.np_dtype else None
        return to_int(values, dt)
    if dt.name == tfloat32:
        return _round_tf32(np.asarray(values, dtype=np.float32))
    if dt.kind == "x":
        return np.asarray(values).astype(dt.np_dtype)
    return None


def make_caster(dt: DTypeInfo) -> Callable[[np.ndarray, np.ndarray], None]:
    """A function ``store(dst_view, fp32_values)`` writing with the rounding rules of ``dt``."""
    if dt.is_int or dt.name == tfloat32 or dt.kind == "x":
        def store(dst: np.ndarray, values: np.ndarray) -> None:
            conv = cast_for_store(np.asarray(values), dt)
            dst[...] = values if conv is None else conv
        return store

    def store_float(dst: np.ndarray, values: np.ndarray) -> None:
        dst[...] = values
    return store_float


def sentinel(dt: DTypeInfo) -> float:
    """Fill value of fresh allocations: NaN for floats, 4 for ints (REFERENCE 6.1)."""
    return 4 if dt.kind in ("i", "u", "b", "x") else float("nan")


FLOAT8 = (float8_e4m3, float8_e4m3fn, float8_e5m2)
MATMUL_INPUT_DTYPES = frozenset((float8_e4m3, float8_e4m3fn, float8_e5m2, bfloat16, float16, tfloat32, float32))
