"""The tile-program builder that lowering rules talk to (the ``ctx`` of a rule).

A rule receives its node's arguments already mapped: tensors as :class:`TileVal` (a full ``[P, F]``
or row ``[P, 1]`` tile in fp32 or int32, or a uint8 predicate), Python scalars as they are. It returns
the :class:`TileVal` of its result by calling the instruction helpers below, which pick the NKI
instruction from the operand kinds (tile with tile -> ``tensor_tensor``, tile with a scalar or a
row -> ``tensor_scalar``, transcendental -> ``activation``) and record one :class:`TileOp` each.

Integer mode (``int_mode``, set per node from :func:`lowering.intmath.is_int_compute`): every tile
operand is coerced to int32, scalars are memset into int32 tiles, and arithmetic, comparisons,
selects and reductions use only ``tensor_tensor`` (GpSimd native integer math, exact and wrapping
like int32), never the fp32 ``tensor_scalar``/``tensor_reduce``/``activation`` paths. Helpers that
have no exact integer form raise :class:`LoweringError` (the registry's ``check=`` functions refuse
those nodes earlier, with a reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from neuron_compile.lowering.ir import TileOp

from neuron_compile.errors import LoweringError

# ALU ops that commute (tensor_scalar needs reverse0=True otherwise when the scalar comes first).
COMMUTATIVE = {"add", "multiply", "maximum", "minimum", "equal", "not_equal", "logical_and", "logical_or",
               "logical_xor"}
# Activation-table functions (REFERENCE 2.6) the lowering may use directly on ScalarE.
ACTIVATIONS = {"copy", "square", "sigmoid", "relu", "gelu", "gelu_apprx_tanh", "silu", "tanh", "softplus", "erf",
               "exp", "sign", "abs", "log", "sqrt", "rsqrt", "reciprocal", "sin", "arctan", "gelu_dx", "silu_dx",
               "erf_dx", "mish", "gelu_apprx_sigmoid"}
REDUCE_OPS = {"add", "maximum", "minimum", "multiply"}
# ALU ops with an exact int32 tensor_tensor form (comparisons and logical ops produce int32 1/0).
INT_OPS = {"add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal", "greater", "greater_equal",
           "less", "less_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
           "bitwise_xor", "left_shift", "right_shift"}
_SWAPPED = {"greater": "less", "less": "greater", "greater_equal": "less_equal", "less_equal": "greater_equal"}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class TileVal:
    name: str
    kind: str  # 'full' | 'row'
    dtype: str = "float32"  # tile dtype (fp32 or int32 compute, uint8 predicates)
    phase: int = 0  # first phase in which the value is available


Operand = TileVal | float | int | bool


class ProgramBuilder:
    """Collects the SSA tile program of one fused kernel."""

    def __init__(self) -> None:
        self.ops: list[TileOp] = []
        self._n = 0
        self.node: torch.fx.Node | None = None  # the node being lowered (for error messages)
        self.int_mode = False  # the node computes in exact int32 (see the module docstring)

    # -- plumbing -------------------------------------------------------------------------------
    def fresh(self, prefix: str = "v") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def emit(self, opcode: str, kind: str, args: tuple[Any, ...], attrs: dict[str, Any] | None = None,
             dtype: str = "float32", phase: int | None = None) -> TileVal:
        if phase is None:
            phase = max((a.phase for a in args if isinstance(a, TileVal)), default=0)
        name = self.fresh("r" if kind == "row" else "v")
        arg_names = tuple(a.name if isinstance(a, TileVal) else a for a in args)
        self.ops.append(TileOp(name, opcode, kind, dtype, arg_names, tuple(sorted((attrs or {}).items())), phase))
        return TileVal(name, kind, dtype, phase)

    @staticmethod
    def _kind(*vals: Operand) -> str:
        return "full" if any(isinstance(v, TileVal) and v.kind == "full" for v in vals) else "row"

    def fail(self, why: str) -> LoweringError:
        where = ""
        if self.node is not None:
            where = f" (node {self.node.name}: {self.node.target})"
        return LoweringError(f"cannot lower{where}: {why}")

    @property
    def compute_dtype(self) -> str:
        return "int32" if self.int_mode else "float32"

    def cast(self, x: Operand, dtype: str) -> TileVal:
        """``x`` as a ``dtype`` tile (tensor_copy: bit-exact for equal dtypes, through fp32 otherwise); a constant
        (a value folded to a scalar: sin of a one-element window) becomes a filled tile."""
        if not isinstance(x, TileVal):
            x = self.as_tile(self.coerce(x))
        if x.dtype == dtype:
            return x
        return self.emit("cast", x.kind, (x,), dtype=dtype)

    def coerce(self, x: Operand) -> Operand:
        """A tile operand in this node's compute dtype (scalars unchanged)."""
        return self.cast(x, self.compute_dtype) if isinstance(x, TileVal) else x

    def int_scalar(self, v: Operand) -> int:
        """A scalar operand of an integer op as a Python int (it must be an integral int32 value)."""
        f = float(v)  # type: ignore[arg-type]
        if not (math.isfinite(f) and f == int(f) and INT32_MIN <= int(v) <= INT32_MAX):  # type: ignore[arg-type]
            raise self.fail(f"scalar {v!r} is not an int32 value (integer op)")
        return int(v)  # type: ignore[arg-type]

    # -- elementwise -----------------------------------------------------------------------------
    def binary(self, op: str, a: Operand, b: Operand) -> TileVal | float:
        """``a <op> b`` for ALU ``op`` (add, subtract, multiply, maximum, minimum, comparisons, logical, power)."""
        if self.int_mode:
            return self._int_binary(op, a, b)
        a, b = self.coerce(a), self.coerce(b)
        if not isinstance(a, TileVal) and not isinstance(b, TileVal):
            return _fold(op, float(a), float(b))
        if isinstance(a, TileVal) and isinstance(b, TileVal):
            if a.kind == b.kind:
                return self.emit("tensor_tensor", a.kind, (a, b), {"op": op})
            full, row, reverse = (a, b, False) if a.kind == "full" else (b, a, True)
            return self.emit("tensor_scalar", "full", (full, row), {"op0": op, "reverse0": reverse and op not in COMMUTATIVE})
        tile, scalar, reverse = (a, b, False) if isinstance(a, TileVal) else (b, a, True)
        if (op == "multiply" and float(scalar) == 1.0) or (op in ("add", "subtract") and float(scalar) == 0.0
                                                          and not (op == "subtract" and reverse)):
            return tile  # x*1, x+0, x-0: no instruction
        return self.emit("tensor_scalar", tile.kind, (tile, float(scalar)),
                         {"op0": op, "reverse0": reverse and op not in COMMUTATIVE})

    def _int_binary(self, op: str, a: Operand, b: Operand) -> TileVal | int:
        """Exact int32 ``a <op> b``: one GpSimd ``tensor_tensor`` (scalars memset into int32 tiles)."""
        if op not in INT_OPS:
            raise self.fail(f"{op} has no exact int32 form")
        if not isinstance(a, TileVal) and not isinstance(b, TileVal):
            return _int_fold(op, self.int_scalar(a), self.int_scalar(b))
        a, b = self.coerce(a), self.coerce(b)
        if not isinstance(b, TileVal) or not isinstance(a, TileVal):
            tile, scalar = (a, b) if isinstance(a, TileVal) else (b, a)
            assert isinstance(tile, TileVal)
            v = self.int_scalar(scalar)
            if (op == "add" and v == 0) or (op == "multiply" and v == 1) or (op == "subtract" and v == 0
                                                                              and tile is a):
                return tile
            const = self.fill(v, tile.kind)
            a, b = (tile, const) if tile is a else (const, tile)
        assert isinstance(a, TileVal) and isinstance(b, TileVal)
        if a.kind == "row" and b.kind == "full":
            if op in COMMUTATIVE or op in _SWAPPED:
                a, b, op = b, a, _SWAPPED.get(op, op)  # keep the broadcast (stride-0) row as data2
            else:
                a = self.broadcast_to(a, "full")
        return self.emit("tensor_tensor", self._kind(a, b), (a, b), {"op": op}, dtype="int32")

    def affine(self, x: TileVal, scale: float | TileVal = 1.0, bias: float | TileVal = 0.0) -> TileVal:
        """``x * scale + bias`` in one instruction (scale/bias scalars or rows)."""
        if self.int_mode:
            return self.as_tile(self.binary("add", self.binary("multiply", x, scale), bias))
        x = self.cast(x, "float32")
        if isinstance(scale, TileVal) and scale.kind == "full":
            return self.as_tile(self.binary("add", self.binary("multiply", x, scale), bias))
        if isinstance(bias, TileVal) and bias.kind == "full":
            return self.as_tile(self.binary("add", self.binary("multiply", x, scale), bias))
        return self.emit("tensor_scalar", x.kind, (x, scale, bias), {"op0": "multiply", "op1": "add"})

    def activation(self, func: str, x: Operand, scale: float | TileVal = 1.0, bias: float | TileVal = 0.0) -> TileVal:
        """ScalarE ``func(x * scale + bias)``; ``func`` from the activation table."""
        if func not in ACTIVATIONS:
            raise self.fail(f"{func} is not an activation-table function")
        self._no_int(f"activation {func}")
        x = self.cast(x, "float32")  # a constant operand (a scalar fill folded away) is computed on ScalarE too
        if (isinstance(scale, TileVal) and scale.kind == "full") or (isinstance(bias, TileVal) and bias.kind == "full"):
            x = self.affine(x, scale, bias)
            scale, bias = 1.0, 0.0
        return self.emit("activation", x.kind, (x, scale, bias), {"func": func})

    def unary_alu(self, op: str, x: TileVal) -> TileVal:
        """VectorE unary ALU op (abs, reciprocal, ...) through ``tensor_scalar`` with no operand."""
        self._no_int(f"unary {op}")
        x = self.cast(x, "float32")
        return self.emit("tensor_scalar", x.kind, (x,), {"op0": op})

    def reciprocal(self, x: TileVal) -> TileVal:
        self._no_int("reciprocal")
        return self.emit("reciprocal", x.kind, (self.cast(x, "float32"),))

    def _no_int(self, what: str) -> None:
        if self.int_mode:
            raise self.fail(f"{what} has no exact int32 form (fp32 only)")

    def divide(self, a: Operand, b: Operand) -> TileVal | float:
        """``a / b``: NeuronCores have no divide instruction, so multiply by the reciprocal (<= 1 ulp off)."""
        self._no_int("divide")
        if not isinstance(b, TileVal):
            b = float(b)
            if b == 0.0:
                return self.binary("multiply", a, math.copysign(math.inf, b))
            return self.binary("multiply", a, 1.0 / b)
        return self.binary("multiply", a, self.reciprocal(b))

    def select(self, cond: TileVal, on_true: Operand, on_false: Operand) -> TileVal:
        """``where(cond, on_true, on_false)``: a predicated copy, exact even for inf/nan operands."""
        pred = self.emit("predicate", cond.kind, (cond,), dtype="uint8")
        kind = self._kind(cond, on_true, on_false)
        base = self.broadcast_to(self.coerce(on_false), kind)
        if isinstance(on_true, TileVal):
            src: Operand = self.coerce(on_true)
        elif self.int_mode:
            src = self.fill(self.int_scalar(on_true), on_true_kind(kind, cond))
        else:
            src = float(on_true)
        return self.emit("select", kind, (pred, src, base), dtype=self.compute_dtype)

    def broadcast_to(self, x: Operand, kind: str) -> TileVal:
        if isinstance(x, TileVal):
            if x.kind == kind:
                return x
            return self.emit("broadcast", kind, (x,), dtype=x.dtype)
        return self.fill(x, kind)

    def as_tile(self, x: TileVal | float) -> TileVal:
        if isinstance(x, TileVal):
            return x
        return self.fill(x, "row")

    def fill(self, value: float, kind: str = "full") -> TileVal:
        """A memset tile; an int32 tile of the integer ``value`` in integer mode."""
        if self.int_mode:
            return self.emit("fill", kind, (self.int_scalar(value),), dtype="int32")
        return self.emit("fill", kind, (float(value),))

    def iota(self, coeffs_name: str) -> TileVal:
        """A full tile whose value is an affine function of the element index (see ``GroupLowering.iota``)."""
        return self.emit("iota", "full", (), {"coeffs": coeffs_name})

    def round_to(self, x: TileVal, dtype: str) -> TileVal:
        """Round through ``dtype`` (bf16/fp16/fp8) and back, as eager does between ops of that dtype.

        float8_e4m3fn has no infinity: torch saturates out-of-range values (inf too) to +-448, where a
        conversion on write would give NaN, so the value is clamped first (NaN stays NaN)."""
        x = self.cast(x, "float32")
        if dtype == "float8_e4m3fn":
            x = self.saturate_e4m3fn(x)
        return self.emit("round", x.kind, (x,), {"via": dtype})

    def saturate_e4m3fn(self, x: TileVal) -> TileVal:
        """``x`` clamped to float8_e4m3fn's finite range (NaN stays NaN), as torch's conversion saturates."""
        return self.binary("minimum", self.binary("maximum", self.cast(x, "float32"), -E4M3FN_MAX), E4M3FN_MAX)

    def rounded_via(self, x: TileVal, dtype: str) -> bool:
        """Whether ``x`` is the result of ``round_to(..., dtype)`` (or a load of a ``dtype`` value: stored as is)."""
        producer = next((op for op in reversed(self.ops) if op.out == x.name), None)
        return producer is not None and (producer.opcode == "round" and producer.attr("via") == dtype
                                         or producer.opcode == "load" and producer.attr("src_dtype") == dtype)

    # -- reductions -------------------------------------------------------------------------------
    def reduce(self, op: str, x: TileVal, negate: bool = False) -> TileVal:
        """Reduce a full tile over the kernel's reduced dims into a row (fp32 accumulation).

        Integer mode: an exact int32 log-step tree of ``tensor_tensor`` ops over free-dim slices per
        chunk, accumulated across chunks with int32 ``tensor_tensor`` (add, maximum, minimum only).
        """
        if op not in REDUCE_OPS:
            raise self.fail(f"{op} is not a reduction op")
        if self.int_mode and (op == "multiply" or negate):
            raise self.fail(f"reduce {op} has no exact int32 form")
        x = self.cast(x, self.compute_dtype)
        if x.kind != "full":
            # Constant along the reduced dims (an expanded input, or reduced dims of size 1): reduce the
            # broadcast tile, so sum counts every element and prod/max/min see the same values as torch.
            x = self.broadcast_to(x, "full")
        val = self.emit("reduce", "row", (x,), {"op": op, "negate": negate}, dtype=x.dtype, phase=x.phase)
        return TileVal(val.name, "row", val.dtype, x.phase + 1)


E4M3FN_MAX = 448.0  # the largest finite float8_e4m3fn


def on_true_kind(kind: str, cond: TileVal) -> str:
    """Kind of a materialized ``where`` scalar: a row when the result is a row, else a full tile."""
    return "row" if kind == "row" and cond.kind == "row" else "full"


def _int_fold(op: str, a: int, b: int) -> int:
    """Constant-fold an int32 op with int32 wrap-around (as the GpSimd ALU)."""
    import operator

    table = {"add": operator.add, "subtract": operator.sub, "multiply": operator.mul, "maximum": max,
             "minimum": min, "equal": operator.eq, "not_equal": operator.ne, "greater": operator.gt,
             "greater_equal": operator.ge, "less": operator.lt, "less_equal": operator.le,
             "bitwise_and": operator.and_, "bitwise_or": operator.or_, "bitwise_xor": operator.xor,
             "left_shift": lambda x, y: x << y, "right_shift": lambda x, y: (x % 2**32) >> y,
             "logical_and": lambda x, y: int(bool(x) and bool(y)), "logical_or": lambda x, y: int(bool(x) or bool(y)),
             "logical_xor": lambda x, y: int(bool(x) != bool(y))}
    if op not in table:
        raise LoweringError(f"cannot constant-fold integer {op}")
    r = int(table[op](a, b))
    return (r - INT32_MIN) % 2**32 + INT32_MIN


def _fold(op: str, a: float, b: float) -> float:
    """``a <op> b`` of two constants as the fp32 ALU computes it: operands and result rounded to fp32 (a double
    fold would make rint's (x + 2**23) - 2**23 the identity)."""
    import operator

    table = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
             "minimum": np.minimum, "power": np.power, "equal": operator.eq, "not_equal": operator.ne,
             "greater": operator.gt, "greater_equal": operator.ge, "less": operator.lt, "less_equal": operator.le,
             "logical_and": lambda x, y: bool(x) and bool(y), "logical_or": lambda x, y: bool(x) or bool(y),
             "logical_xor": lambda x, y: bool(x) != bool(y)}
    if op not in table:
        raise LoweringError(f"cannot constant-fold {op}")
    with np.errstate(all="ignore"):
        return float(table[op](np.float32(a), np.float32(b)))
