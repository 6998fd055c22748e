"""Opcode tables: the ALU operators and activation functions of REFERENCE 2.6, in fp32 NumPy.

The ``nl`` wrapper functions double as opcodes: each carries ``_nki_op`` (its opcode name), so the
ISA instructions look implementations up by name here without importing ``nl``. ``Opcode`` objects
are the pure opcode constants (``nl.bypass``, ``nl.prelu``, ``nl.average``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

F32 = np.float32


class Opcode:
    """A pure opcode constant (not callable)."""

    def __init__(self, name: str) -> None:
        self._nki_op = name
        self.__name__ = name

    def __repr__(self) -> str:
        return f"nl.{self._nki_op}"


def opname(op: object) -> str | None:
    """The opcode name of ``op`` (an ``nl`` function or :class:`Opcode`), or None."""
    return getattr(op, "_nki_op", None)


def _bool(f: Callable[..., np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def g(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        r = f(a, b)
        return r.astype(a.dtype if a.dtype.kind in "iu" else F32)
    return g


def _logical(f: Callable[..., np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def g(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        r = f(np.not_equal(a, 0), np.not_equal(b, 0))
        return r.astype(a.dtype if a.dtype.kind in "iu" else F32)
    return g


def _abs_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) > np.abs(b), a, b)


def _abs_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) < np.abs(b), a, b)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.power(a, b)


def _div(f: Callable[..., np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def g(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return f(a, b)
    return g


# Binary arithmetic ALU ops (computed in fp32, or exactly on int64 for GpSimd integer math).
ARITH: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "equal": _bool(np.equal), "not_equal": _bool(np.not_equal), "greater": _bool(np.greater),
    "greater_equal": _bool(np.greater_equal), "less": _bool(np.less), "less_equal": _bool(np.less_equal),
    "logical_and": _logical(np.logical_and), "logical_or": _logical(np.logical_or),
    "logical_xor": _logical(np.logical_xor), "power": _power, "abs_max": _abs_max, "abs_min": _abs_min,
    "divide": _div(np.divide), "mod": _div(np.mod), "fmod": _div(np.fmod),
}
# Not real ALU ops on hardware (REFERENCE 0.1): the simulator computes them but warns.
HW_UNSUPPORTED = frozenset(("divide", "mod", "fmod"))
V4_ONLY = frozenset(("abs_max", "abs_min"))


def _rshift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # logical right shift: shift the unsigned bit pattern
    if a.dtype.kind == "i":
        u = a.view(a.dtype.str.replace("i", "u"))
        return (u >> np.asarray(b).astype(u.dtype)).view(a.dtype)
    return a >> np.asarray(b).astype(a.dtype)


def _lshift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.left_shift(a, np.asarray(b).astype(a.dtype))


BITVEC: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "bitwise_and": lambda a, b: np.bitwise_and(a, np.asarray(b).astype(a.dtype)),
    "bitwise_or": lambda a, b: np.bitwise_or(a, np.asarray(b).astype(a.dtype)),
    "bitwise_xor": lambda a, b: np.bitwise_xor(a, np.asarray(b).astype(a.dtype)),
    "left_shift": _lshift, "right_shift": _rshift,
}
BITVEC_UNARY = frozenset(("invert",))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.reciprocal(np.sqrt(x))


def _recip(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.reciprocal(x)


# Unary ALU ops usable as tensor_scalar op0 with operand0=0/None.
ALU_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs, "square": np.square, "relu": lambda x: np.maximum(x, F32(0)), "rsqrt": _rsqrt,
    "reciprocal": _recip,
}

# Reduction-legal ALU ops, their NumPy reductions and identities. nl.sum/max/min/prod spell them too.
REDUCE_ALIASES = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply"}
REDUCE_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -math.inf, "minimum": math.inf,
                   "logical_and": 1.0, "logical_or": 0.0, "logical_xor": 0.0, "bitwise_and": -1, "bitwise_or": 0,
                   "bitwise_xor": 0, "abs_max": 0.0, "abs_min": math.inf}


def _red_sub(a: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    flat = a.reshape(a.shape[:a.ndim - len(axis)] + (-1,))
    r = flat[..., 0] - flat[..., 1:].sum(axis=-1)
    return r.reshape(r.shape + (1,) * len(axis)) if keepdims else r


def _red_logical(f: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def g(a: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return f.reduce(np.not_equal(a, 0), axis=axis, keepdims=keepdims).astype(
            a.dtype if a.dtype.kind in "iu" else F32)
    return g


REDUCERS: dict[str, Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]] = {
    "add": lambda a, ax, k: np.add.reduce(a, axis=ax, keepdims=k, dtype=a.dtype),
    "multiply": lambda a, ax, k: np.multiply.reduce(a, axis=ax, keepdims=k, dtype=a.dtype),
    "maximum": lambda a, ax, k: np.maximum.reduce(a, axis=ax, keepdims=k),
    "minimum": lambda a, ax, k: np.minimum.reduce(a, axis=ax, keepdims=k),
    "subtract": _red_sub,
    "logical_and": _red_logical(np.logical_and), "logical_or": _red_logical(np.logical_or),
    "logical_xor": _red_logical(np.logical_xor),
    "bitwise_and": lambda a, ax, k: np.bitwise_and.reduce(a, axis=ax, keepdims=k),
    "bitwise_or": lambda a, ax, k: np.bitwise_or.reduce(a, axis=ax, keepdims=k),
    "bitwise_xor": lambda a, ax, k: np.bitwise_xor.reduce(a, axis=ax, keepdims=k),
}
BITVEC_REDUCE = frozenset(("bitwise_and", "bitwise_or", "bitwise_xor"))


def reduce_name(op: object) -> str | None:
    n = opname(op)
    return REDUCE_ALIASES.get(n, n) if n is not None else None


# ------------------------------------------------------------------------------- activation functions

def erf(x: np.ndarray) -> np.ndarray:
    """erf in fp32 (Abramowitz & Stegun 7.1.26 refined; |error| < 1.5e-7)."""
    a = np.abs(x, dtype=np.float64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t \
        * np.exp(-a * a)
    return np.copysign(y, x).astype(F32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(F32(0), x).astype(F32)


_SQRT2 = F32(math.sqrt(2.0))
_INV_SQRT_2PI = F32(1.0 / math.sqrt(2.0 * math.pi))
_GELU_C = F32(math.sqrt(2.0 / math.pi))


def _gelu(x: np.ndarray) -> np.ndarray:
    return (F32(0.5) * x * (F32(1) + erf(x / _SQRT2))).astype(F32)


def _gelu_dx(x: np.ndarray) -> np.ndarray:
    cdf = F32(0.5) * (F32(1) + erf(x / _SQRT2))
    return (cdf + x * _INV_SQRT_2PI * np.exp(F32(-0.5) * x * x)).astype(F32)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return (F32(0.5) * x * (F32(1) + np.tanh(_GELU_C * (x + F32(0.044715) * x * x * x)))).astype(F32)


def _gelu_sig(x: np.ndarray) -> np.ndarray:
    return (x * _sigmoid(F32(1.702) * x)).astype(F32)


def _gelu_sig_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(F32(1.702) * x)
    return (s + F32(1.702) * x * s * (F32(1) - s)).astype(F32)


def _silu_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return (s * (F32(1) + x * (F32(1) - s))).astype(F32)


def _mish(x: np.ndarray) -> np.ndarray:
    return (x * np.tanh(_softplus(x))).astype(F32)


def _erf_dx(x: np.ndarray) -> np.ndarray:
    return (F32(2.0 / math.sqrt(math.pi)) * np.exp(-x * x)).astype(F32)


# Odd degree-11 fit of sin on [-pi, pi], evaluated WITHOUT range reduction: accurate (< 3e-7) inside
# the documented range and diverging outside it, like ScalarE's polynomial (REFERENCE 2.6).
_SIN_COEFFS = (9.99999600e-01, -1.66665526e-01, 8.33240285e-03, -1.98086298e-04, 2.69971060e-06, -2.03620814e-08)


def sin_unreduced(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    x2 = x64 * x64
    acc = np.full_like(x64, _SIN_COEFFS[-1])
    for c in reversed(_SIN_COEFFS[:-1]):
        acc = acc * x2 + c
    return (acc * x64).astype(F32)


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.log(x)


def _sqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.sqrt(x)


def _exp(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(x)


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "copy": lambda x: x, "square": np.square, "sigmoid": _sigmoid, "relu": lambda x: np.maximum(x, F32(0)),
    "prelu": lambda x: np.maximum(x, F32(0)), "gelu": _gelu, "gelu_dx": _gelu_dx, "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": _gelu_sig, "gelu_apprx_sigmoid_dx": _gelu_sig_dx,
    "silu": lambda x: (x * _sigmoid(x)).astype(F32), "silu_dx": _silu_dx, "tanh": np.tanh,
    "softplus": _softplus, "mish": _mish, "erf": erf, "erf_dx": _erf_dx, "exp": _exp, "sign": np.sign,
    "abs": np.abs, "log": _log, "sin": sin_unreduced, "arctan": np.arctan, "sqrt": _sqrt, "rsqrt": _rsqrt,
    "reciprocal": _recip,
}

# Valid input ranges of the restricted activation functions (REFERENCE 2.6); outside them hardware
# returns garbage, so the simulator warns. Ranges are on |x| for reciprocal.
ACT_RANGES: dict[str, tuple[float, float]] = {
    "log": (2.0 ** -64, 2.0 ** 64), "sin": (-math.pi, math.pi), "arctan": (-math.pi / 2, math.pi / 2),
    "sqrt": (2.0 ** -116, 2.0 ** 118), "rsqrt": (2.0 ** -87, 2.0 ** 97), "reciprocal": (2.0 ** -42, 2.0 ** 42),
}

# Elementwise math outside the activation table (nl wrappers compute them on Vector/GpSimd).
EXTRA_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "cos": np.cos, "tan": np.tan, "ceil": np.ceil, "floor": np.floor, "trunc": np.trunc,
    "negative": np.negative, "sin_reduced": np.sin,
}
