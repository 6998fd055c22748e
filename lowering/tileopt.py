"""Peephole rewrites of a loop kernel's tile program (before canonicalization and rendering).

Input: the SSA :class:`~neuron_compile.lowering.ir.TileOp` list a :class:`ProgramBuilder` recorded for one
fused group. Output: an equivalent, shorter list. Every rewrite is bit-exact under the fp32 rules the
simulator and the hardware follow (each stage rounds to fp32 exactly as the unfused pair did):

- ``tensor_scalar(x, a, op0)`` feeding only ``tensor_scalar(t, b, op1)`` -> one two-stage
  ``tensor_scalar(x, a, op0, b, op1)`` (REFERENCE 3.3: "one op costs the same as two");
- ``x * s`` / ``x + b`` / ``x * s + b`` feeding only ``activation(f, t)`` -> ``activation(f, x, scale=s,
  bias=b)`` (scale and bias are free inside one activation, REFERENCE 4.3, PERF Opt #6);
- ``max(x, x * -1)`` -> ScalarE ``activation(abs, x)`` (exact; frees VectorE for the rest of the chain);
- ``x * x`` reduced by ``add`` (sum of squares) -> ``activation(square, x)`` whose reduction the renderer
  fuses into the activation's accumulator;
- ``x - row`` -> ``x + (-row)`` (a (P, 1) negation), so the op can run on ScalarE, whose
  ``tensor_scalar`` on trn2 has no subtract (REFERENCE 3.3).

Only fp32 values that are used exactly once are folded away; integer tiles are never touched.

After these rewrites, :func:`narrow_tiles` (loop kernels) gives tiles their storage dtype where no value
changes (bf16 loads, bf16 results written straight into the stored tile, rounds as one cast or none), and
:func:`eliminate_dead` (every kernel) drops ops whose results no store reads.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from neuron_compile.lowering.ir import TileOp

log = logging.getLogger(__name__)

_F32 = "float32"
_SCALAR_STAGE = {"add", "subtract", "multiply", "maximum", "minimum"}


def optimize(ops: Sequence[TileOp], keep: set[str]) -> list[TileOp]:
    """Rewrite ``ops``; names in ``keep`` (stored values, values read by later kernels) stay materialized."""
    prog = list(ops)
    for _ in range(8):  # each pass folds one level; chains are short
        changed, prog = _pass(prog, keep)
        if not changed:
            break
    return prog


def _uses(prog: Sequence[TileOp]) -> Counter[str]:
    c: Counter[str] = Counter()
    for op in prog:
        for a in op.args:
            if isinstance(a, str):
                c[a] += 1
    return c


def _attrs(op: TileOp) -> dict[str, Any]:
    return dict(op.attrs)


def _with(op: TileOp, **changes: Any) -> TileOp:
    fields = {"out": op.out, "opcode": op.opcode, "kind": op.kind, "dtype": op.dtype, "args": op.args,
              "attrs": op.attrs, "phase": op.phase}
    fields.update(changes)
    if isinstance(fields["attrs"], dict):
        fields["attrs"] = tuple(sorted(fields["attrs"].items()))
    return TileOp(**fields)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _pass(prog: list[TileOp], keep: set[str]) -> tuple[bool, list[TileOp]]:
    uses = _uses(prog)
    by_name = {op.out: op for op in prog}
    kinds = {op.out: op.kind for op in prog}

    def single(name: Any) -> TileOp | None:
        """The producer of ``name`` if it may be folded into its only consumer."""
        if not isinstance(name, str) or uses[name] != 1 or name in keep:
            return None
        p = by_name.get(name)
        if p is None or p.dtype != _F32:
            return None
        return p

    out: list[TileOp] = []
    dead: set[str] = set()
    changed = False
    for op in prog:
        new = _rewrite(op, single, kinds, dead, out, prog, keep) if op.dtype == _F32 else None
        if new is None:
            new = op
        else:
            changed = True
            by_name[new.out] = new  # later rewrites in this pass must see the rewritten producer
        out.append(new)
    if not changed:
        return False, prog
    return True, [op for op in out if op.out not in dead]


def _rewrite(op: TileOp, single: Any, kinds: dict[str, str], dead: set[str], out: list[TileOp],
             prog: list[TileOp], keep: set[str]) -> TileOp | None:
    a = _attrs(op)
    # abs: max(x, x * -1) -> activation(abs, x)
    if op.opcode == "tensor_tensor" and a.get("op") == "maximum" and op.kind == "full":
        x, y = op.args
        for src, neg in ((x, y), (y, x)):
            p = single(neg)
            if p is not None and p.opcode == "tensor_scalar" and p.args[0] == src and len(p.args) == 2 \
                    and p.args[1] == -1.0 and _attrs(p).get("op0") == "multiply" and "op1" not in _attrs(p) \
                    and kinds.get(src) == "full":
                dead.add(p.out)
                return _with(op, opcode="activation", args=(src, 1.0, 0.0), attrs={"func": "abs"})
    # sum of squares: x * x (only read by an add-reduce) -> activation(square, x)
    if op.opcode == "tensor_tensor" and a.get("op") == "multiply" and op.args[0] == op.args[1] \
            and op.kind == "full" and kinds.get(op.args[0]) == "full" and op.out not in keep:
        readers = [r for r in prog if op.out in r.args]
        if readers and all(r.opcode == "reduce" and _attrs(r).get("op") == "add" for r in readers):
            return _with(op, opcode="activation", args=(op.args[0], 1.0, 0.0), attrs={"func": "square"})
    # x - row -> x + (-row): lets ScalarE run it (trn2 ScalarE tensor_scalar: add / multiply only)
    if op.opcode == "tensor_scalar" and op.kind == "full" and len(op.args) == 2 and a.get("op0") == "subtract" \
            and not a.get("reverse0") and "op1" not in a and isinstance(op.args[1], str) \
            and kinds.get(op.args[1]) == "row":
        neg = TileOp(op.out + "n", "tensor_scalar", "row", _F32, (op.args[1], -1.0),
                     (("op0", "multiply"), ("reverse0", False)), op.phase)
        out.append(neg)
        kinds[neg.out] = "row"
        return _with(op, args=(op.args[0], neg.out), attrs=dict(a, op0="add"))
    # two single-stage tensor_scalars -> one two-stage tensor_scalar
    if op.opcode == "tensor_scalar" and len(op.args) == 2 and "op1" not in a and a.get("op0") in _SCALAR_STAGE:
        p = single(op.args[0])
        pa = _attrs(p) if p is not None else {}
        if p is not None and p.opcode == "tensor_scalar" and len(p.args) == 2 and "op1" not in pa \
                and pa.get("op0") in _SCALAR_STAGE and p.kind == op.kind:
            dead.add(p.out)
            attrs = dict(pa)
            attrs.update(op1=a["op0"])
            if a.get("reverse0"):
                attrs["reverse1"] = True
            return _with(op, args=(p.args[0], p.args[1], op.args[1]), attrs=attrs)
    # x * s + b feeding an activation(f, ., scale=s0) -> activation(f, x, scale=s * s0, bias=b * s0)
    if op.opcode == "activation" and _is_num(op.args[1]) and op.args[2] == 0.0:
        p = single(op.args[0])
        if p is None or p.opcode != "tensor_scalar" or p.kind != op.kind:
            return None
        pa = _attrs(p)
        if pa.get("reverse0") or pa.get("reverse1"):
            return None
        stages = [(pa.get("op0"), p.args[1])] + ([(pa["op1"], p.args[2])] if "op1" in pa else [])
        scale: Any = 1.0
        bias: Any = 0.0
        if stages[0][0] == "multiply":
            scale = stages.pop(0)[1]
        if stages and stages[0][0] == "add":
            bias = stages.pop(0)[1]
        elif stages and stages[0][0] == "subtract" and _is_num(stages[0][1]):
            bias = -float(stages.pop(0)[1])
        if stages:
            return None
        s0 = float(op.args[1])
        if s0 != 1.0:  # the activation's own scale multiplies the producer's scale and bias: numbers only
            if not (_is_num(scale) and _is_num(bias)):
                return None
            scale, bias = float(scale) * s0, float(bias) * s0
        dead.add(p.out)
        return _with(op, args=(p.args[0], scale, bias))
    return None


# ------------------------------------------------------------------------------------ storage dtypes
_LOW = ("bfloat16", "float16")
# Compute ops whose tile may take a narrow dtype: the engine computes in fp32 and rounds (RNE) once on the
# write, which is what a converting store (or a round through the narrow dtype) did to the fp32 tile.
_NARROW_WRITERS = {"tensor_tensor", "tensor_scalar", "activation", "reciprocal"}


def narrow_tiles(ops: Sequence[TileOp], keep: set[str] | frozenset[str] = frozenset()) -> list[TileOp]:
    """Tiles in the storage dtype where that changes no value (loop kernels' SBUF tiles; REFERENCE 4.3 DMA).

    - a full load of a bf16/fp16 argument keeps that dtype (no converting DMA; every engine reads any
      dtype and widens exactly to fp32);
    - a full fp32 compute value whose only readers are stores to dtype D and ``round``\\ s through D is
      written straight into a D tile (the engine rounds once, RNE, as the converting store did);
    - ``round(x, via=D)`` of a D tile is ``x`` itself (its users read the D tile); of an fp32 tile it is
      one ``cast`` into a D tile (the D value widens exactly, so readers see fp32(D(x)) as before).
    """
    users: dict[str, list[TileOp]] = {}
    for op in ops:
        for a in op.args:
            if isinstance(a, str):
                users.setdefault(a, []).append(op)
    # tensor_copy_predicated copies its source bit for bit: it must have the select's (fp32) dtype; a bitcast
    # reads its source's fp32 bits.
    fp32_only = {op.args[1] for op in ops if op.opcode == "select" and isinstance(op.args[1], str)} \
        | {op.args[0] for op in ops if op.opcode == "bitcast"}
    dtype: dict[str, str] = {}
    for op in ops:
        if op.out in fp32_only:
            continue
        if op.opcode == "load" and op.kind == "full" and op.dtype == _F32 and op.attr("src_dtype") in _LOW:
            dtype[op.out] = op.attr("src_dtype")
        elif op.opcode in _NARROW_WRITERS and op.kind == "full" and op.dtype == _F32 and op.out not in keep:
            readers = users.get(op.out, [])
            wants = {r.attr("dst_dtype") if r.opcode == "store" else r.attr("via") if r.opcode == "round" else None
                     for r in readers}
            if readers and len(wants) == 1 and next(iter(wants)) in _LOW:
                dtype[op.out] = next(iter(wants))
    alias: dict[str, str] = {}
    out: list[TileOp] = []
    for op in ops:
        args = tuple(alias.get(a, a) if isinstance(a, str) else a for a in op.args)
        if op.opcode == "round" and op.kind == "full" and op.attr("via") in _LOW and op.out not in keep \
                and op.out not in fp32_only:
            src = args[0]
            if dtype.get(src) == op.attr("via"):
                alias[op.out] = src
                continue
            out.append(_with(op, opcode="cast", dtype=op.attr("via"), args=args, attrs={}))
            continue
        out.append(_with(op, dtype=dtype.get(op.out, op.dtype), args=args))
    return out


def eliminate_dead(ops: Sequence[TileOp]) -> list[TileOp]:
    """Drop ops whose results no store reads, directly or through other ops (stores are the only effects)."""
    live: set[str] = set()
    keep: list[TileOp] = []
    for op in reversed(ops):
        if op.opcode != "store" and op.out not in live:
            continue
        keep.append(op)
        live.update(a for a in op.args if isinstance(a, str))
    return keep[::-1]


def store_rounds_as_is(ops: Sequence[TileOp]) -> list[TileOp]:
    """``store(round(x, via=D), dst_dtype=D)`` -> ``store(x)``: the store's conversion to D rounds (RNE) exactly
    as the round did (used by matmul epilogues, whose staged stores write the D tile directly)."""
    rounds = {op.out: op for op in ops if op.opcode == "round" and op.kind == "full"}
    out = []
    for op in ops:
        src = rounds.get(op.args[0]) if op.opcode == "store" and op.args and isinstance(op.args[0], str) else None
        if src is not None and src.attr("via") == op.attr("dst_dtype"):
            op = _with(op, args=(src.args[0], *op.args[1:]))
        out.append(op)
    return out


def fold_centering(ops: Sequence[TileOp]) -> list[TileOp]:
    """``t = x + row`` read only by ``activation(f, t)`` and single-stage ``tensor_scalar(t, s, op)``s ->
    ``activation(f, x, bias=row)`` and ``tensor_scalar(x, row, s, add, op)``: ``t`` is never written (one pass
    over the row fewer: a LayerNorm's centering feeds its sum of squares and its normalization). Bit-exact:
    ``x * 1.0 + row`` and each tensor_scalar stage round to fp32 exactly as the separate add did."""
    kinds = {op.out: op.kind for op in ops}
    users: dict[str, list[TileOp]] = {}
    for op in ops:
        for a in op.args:
            if isinstance(a, str):
                users.setdefault(a, []).append(op)
    fold: dict[str, TileOp] = {}
    for op in ops:
        a = _attrs(op)
        if op.opcode != "tensor_scalar" or op.kind != "full" or op.dtype != _F32 or a.get("op0") != "add" \
                or a.get("op1") or a.get("reverse0") or len(op.args) != 2 or not isinstance(op.args[0], str) \
                or kinds.get(op.args[1]) != "row":
            continue
        us = users.get(op.out, [])
        if len(us) < 2 or not all(_centering_user(u, op.out) for u in us):
            continue
        fold[op.out] = op
    if not fold:
        return list(ops)
    out = []
    for op in ops:
        if op.out in fold:
            continue
        t = op.args[0] if op.args and isinstance(op.args[0], str) else None
        if t in fold:
            x, row = fold[t].args
            if op.opcode == "activation":
                op = _with(op, args=(x, 1.0, row))
            else:
                a = _attrs(op)
                op = _with(op, args=(x, row, op.args[1]), attrs={"op0": "add", "reverse0": False,
                                                                  "op1": a["op0"], "reverse1": False})
        out.append(op)
    return out


def _centering_user(u: TileOp, t: str) -> bool:
    a = _attrs(u)
    if u.args[0] != t or t in u.args[1:] or u.dtype != _F32 or u.kind != "full":
        return False
    if u.opcode == "activation":
        return len(u.args) == 3 and u.args[1] == 1.0 and u.args[2] == 0.0
    return u.opcode == "tensor_scalar" and len(u.args) == 2 and not a.get("op1") and not a.get("reverse0") \
        and a.get("op0") in _SCALAR_STAGE
