"""Index algebra: views and access patterns as sympy expressions of loop indices.

A view of a buffer is described by its result ``shape`` and one sympy expression, ``index``: the flat
element index into the source buffer in terms of the result's indices ``i0, i1, ...`` (symbol ``ik``
ranges over ``0 .. shape[k] - 1``; size-1 dims have no symbol, their index is 0). View ops
(reshape/view, permute/transpose, expand, slice/narrow, select, unsqueeze/squeeze, as_strided) map
the result's indices to the input's and substitute: a reshape re-derives each input index from the
result's flat position with ``FloorDiv``/``ModularIndexing`` (torch's own sympy functions). Each result
is simplified once, with the ranges of the indices, and decomposed:

- *affine* (``offset + sum(stride_k * ik)``): one strided access, what ``.ap(pattern=[[stride, size],
  ...], offset=...)`` takes. Strides of size-1 dims do not address anything; they follow torch's
  convention for the op (so :attr:`IndexedView.strides` equal ``torch.Tensor.stride()`` whenever torch
  itself returns a view).
- *not affine*: some result index still sits inside a floor-division or modulo (a reshape merging
  dims of a permuted tensor). :attr:`IndexedView.reason` says which dims and shows the expression;
  the lowering then materializes the input with a contiguous copy and logs that reason.

Everything is cached per shape (``functools.lru_cache`` on hashable inputs): sympy is slow, and a
graph repeats the same few view shapes many times.

:func:`offset_text` prints an affine offset the way the kernel templates write it (constant first,
then the terms in the order given, ``var * stride``, ``var`` for stride 1, ``0`` when empty).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

log = logging.getLogger(__name__)

_MAX_PASSES = 8  # simplification passes to a fixed point (a reshape of a reshape needs 2-3)


@functools.cache
def index_symbol(k: int) -> sympy.Symbol:
    """The index of result dim ``k``: ``ik``, a nonnegative integer."""
    return sympy.Symbol(f"i{k}", integer=True, nonnegative=True)


@functools.cache
def _scratch_symbol(k: int) -> sympy.Symbol:
    # Fresh indices while substituting (old ik -> expression of new jk), renamed to ik afterwards.
    return sympy.Symbol(f"j{k}", integer=True, nonnegative=True)


@functools.cache
def loop_symbol(name: str) -> sympy.Symbol:
    """A named loop variable of a kernel (``p0``, ``f0``, ``o1``, ...)."""
    return sympy.Symbol(name, integer=True)


# -- simplification ----------------------------------------------------------------------------------


def _bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> tuple[int, int] | None:
    """Inclusive (min, max) of ``expr`` over the index ranges, or None when unknown."""
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        size = ranges.get(expr)
        return None if size is None else (0, max(size - 1, 0))
    if expr.is_Add:
        lo = hi = 0
        for term in expr.args:
            b = _bounds(term, ranges)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer or rest.is_Mul:
            return None
        b = _bounds(rest, ranges)
        if b is None:
            return None
        lo, hi = int(coeff) * b[0], int(coeff) * b[1]
        return min(lo, hi), max(lo, hi)
    if isinstance(expr, ModularIndexing):
        base, div, mod = expr.args
        b = _bounds(base, ranges)
        if b is None or b[0] < 0 or not (div.is_Integer and mod.is_Integer):
            return None
        q_lo, q_hi = b[0] // int(div), b[1] // int(div)
        if q_hi - q_lo < int(mod) and q_lo % int(mod) <= q_hi % int(mod):
            return q_lo % int(mod), q_hi % int(mod)
        return 0, int(mod) - 1
    if isinstance(expr, FloorDiv):
        base, div = expr.args
        b = _bounds(base, ranges)
        if b is None or not div.is_Integer or int(div) <= 0:
            return None
        return b[0] // int(div), b[1] // int(div)
    return None


def _split_terms(base: sympy.Expr, div: int, ranges: dict[sympy.Symbol, int]) -> sympy.Expr | None:
    """``base // div`` without a floor when the terms not divisible by ``div`` stay in ``[0, div)``."""
    whole, rest = [], []
    for term in sympy.Add.make_args(base):
        coeff, _ = term.as_coeff_Mul()
        (whole if coeff.is_Integer and int(coeff) % div == 0 else rest).append(term)
    b = _bounds(sympy.Add(*rest), ranges)
    if b is None or b[0] < 0 or b[1] >= div:
        return None
    return sympy.expand(sympy.Add(*whole) / div)


def _rewrite(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """One bottom-up pass of range-aware rules over FloorDiv/ModularIndexing nodes (nonnegative bases)."""
    if not expr.args or expr.is_Atom:
        return expr
    args = [_rewrite(a, ranges) for a in expr.args]
    if isinstance(expr, ModularIndexing):
        base, div, mod = args
        if not (div.is_Integer and mod.is_Integer):
            return expr.func(*args)
        d, m = int(div), int(mod)
        if isinstance(base, ModularIndexing) and base.args[2].is_Integer and int(base.args[2]) % (d * m) == 0:
            # ((x // c) % s // d) % m == (x // (c d)) % m when d m divides s
            return _rewrite(ModularIndexing(base.args[0], base.args[1] * d, m), ranges)
        b = _bounds(base, ranges)
        if b is not None and b[0] >= 0 and b[1] < d * m:
            return _rewrite(FloorDiv(base, div), ranges)  # the modulo never wraps
        quotient = _split_terms(base, d, ranges)
        if quotient is not None:
            kept = [t for t in sympy.Add.make_args(quotient) if not (t.as_coeff_Mul()[0].is_Integer
                                                                     and int(t.as_coeff_Mul()[0]) % m == 0)]
            q = sympy.Add(*kept)
            qb = _bounds(q, ranges)
            if qb is not None and qb[0] >= 0 and qb[1] < m:
                return q
            return ModularIndexing(q, 1, m)
        return ModularIndexing(base, div, mod)
    if isinstance(expr, FloorDiv):
        base, div = args
        if not div.is_Integer:
            return expr.func(*args)
        d = int(div)
        if isinstance(base, ModularIndexing) and base.args[2].is_Integer and int(base.args[2]) % d == 0:
            # ((x // c) % s) // d == (x // (c d)) % (s / d) when d divides s
            return _rewrite(ModularIndexing(base.args[0], base.args[1] * d, int(base.args[2]) // d), ranges)
        quotient = _split_terms(base, d, ranges)
        return FloorDiv(base, div) if quotient is None else quotient
    return expr.func(*args)


def _combine(expr: sympy.Expr) -> sympy.Expr:
    """Merge digit pairs: ``a*((x//c)%s) + a*s*((x//(c s))%t) == a*((x//c)%(s t))`` (and with a floor on top)."""
    terms = list(sympy.Add.make_args(sympy.expand(expr)))
    changed = True
    while changed:
        changed = False
        for i, ti in enumerate(terms):
            ci, fi = ti.as_coeff_Mul()
            if not isinstance(fi, ModularIndexing):
                continue
            x, c, s = fi.args
            for j, tj in enumerate(terms):
                cj, fj = tj.as_coeff_Mul()
                if j == i or cj != ci * s:
                    continue
                if isinstance(fj, ModularIndexing) and fj.args[0] == x and fj.args[1] == c * s:
                    merged = ci * ModularIndexing(x, c, s * fj.args[2])
                elif isinstance(fj, FloorDiv) and fj.args[0] == x and fj.args[1] == c * s:
                    merged = ci * FloorDiv(x, c)
                else:
                    continue
                terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [merged]
                changed = True
                break
            if changed:
                break
    return sympy.Add(*terms)


def simplify(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Simplify an index expression knowing each symbol's range (``0 .. size - 1``), to a fixed point."""
    for _ in range(_MAX_PASSES):
        new = sympy.expand(_rewrite(_combine(expr), ranges))
        if new == expr:
            break
        expr = new
    return expr


# -- views ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexedView:
    """A view as the flat source index of each result element.

    ``strides``/``offset`` are set when ``index`` is affine (``reason`` is then empty); otherwise
    ``strides`` is None and ``reason`` says why no strided access reaches these elements.
    """

    shape: tuple[int, ...]
    index: sympy.Expr
    strides: tuple[int, ...] | None
    offset: int
    reason: str = ""

    @property
    def affine(self) -> bool:
        return self.strides is not None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def pattern(self) -> list[list[int]]:
        """``.ap`` pattern, outermost first: ``[[stride, size], ...]`` (affine views only)."""
        if self.strides is None:
            raise ValueError(f"not an affine access: {self.reason}")
        return [[st, sz] for st, sz in zip(self.strides, self.shape, strict=True)]


def _ranges(shape: Sequence[int]) -> dict[sympy.Symbol, int]:
    return {index_symbol(k): size for k, size in enumerate(shape) if size != 1}


def _source_index(shape: Sequence[int], strides: Sequence[int], offset: int) -> sympy.Expr:
    return sympy.Integer(offset) + sympy.Add(*(st * index_symbol(k) for k, (sz, st) in
                                               enumerate(zip(shape, strides, strict=True)) if sz != 1))


def _decompose(shape: tuple[int, ...], index: sympy.Expr) -> tuple[int, dict[int, int]] | str:
    """(offset, {dim: stride}) of an affine index, or the reason it is not affine."""
    offset = 0
    coeffs: dict[int, int] = {}
    names = {index_symbol(k): k for k in range(len(shape))}
    bad: list[sympy.Expr] = []
    for term in sympy.Add.make_args(sympy.expand(index)):
        coeff, rest = term.as_coeff_Mul()
        if rest == 1 and coeff.is_Integer:
            offset += int(coeff)
        elif coeff.is_Integer and rest in names:
            coeffs[names[rest]] = coeffs.get(names[rest], 0) + int(coeff)
        else:
            bad.append(term)
    if not bad:
        return offset, coeffs
    dims = sorted({names[s] for t in bad for s in t.free_symbols if s in names})
    where = ", ".join(f"{d} (size {shape[d]})" for d in dims)
    verb = "dims {} index" if len(dims) > 1 else "dim {} indexes"
    return (f"result {verb.format(where)} the source only through floor-division/modulo "
            f"(index {sympy.sstr(index)}): no single stride per dim")


def _finish(shape: tuple[int, ...], index: sympy.Expr, size1: Sequence[int | None] | None,
            what: str) -> IndexedView:
    """Simplify ``index`` once and decompose it; ``size1`` gives torch's stride for size-1 dims."""
    if math.prod(shape) == 0:  # no element is addressed: keep the layout the op gives
        strides = tuple(int(s or 0) for s in size1) if size1 is not None else _contiguous(shape)
        return IndexedView(shape, index, strides, _offset_of(index))
    index = simplify(index, _ranges(shape))
    found = _decompose(shape, index)
    if isinstance(found, str):
        return IndexedView(shape, index, None, 0, f"{what}: {found}")
    offset, coeffs = found
    strides = [0] * len(shape)
    for k in reversed(range(len(shape))):
        if shape[k] != 1:
            strides[k] = coeffs.get(k, 0)
        elif size1 is not None and size1[k] is not None:
            strides[k] = int(size1[k])  # type: ignore[arg-type]
        else:  # torch's computeStride: a size-1 dim continues its inner neighbour
            strides[k] = strides[k + 1] * shape[k + 1] if k + 1 < len(shape) else 1
    return IndexedView(shape, index, tuple(strides), offset)


def _offset_of(index: sympy.Expr) -> int:
    const = index.as_coeff_Add()[0]
    return int(const) if const.is_Integer else 0


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(out))


def _substitute(v: IndexedView, new_shape: tuple[int, ...], old_of_new: dict[int, sympy.Expr]) -> sympy.Expr:
    """``v.index`` with each old index ``ik`` replaced by ``old_of_new[k]`` (written in ``jk``), renamed to ``ik``."""
    mapping = {index_symbol(k): e for k, e in old_of_new.items()}
    index = v.index.xreplace(mapping)
    return index.xreplace({_scratch_symbol(k): index_symbol(k) for k in range(len(new_shape))})


def _j(k: int, shape: Sequence[int]) -> sympy.Expr:
    return sympy.Integer(0) if shape[k] == 1 else _scratch_symbol(k)


@functools.lru_cache(maxsize=4096)
def source(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> IndexedView:
    """A strided tensor: ``offset + sum(strides[k] * ik)``."""
    if len(shape) != len(strides):
        raise ValueError(f"shape {shape} and strides {strides} differ in rank")
    return IndexedView(shape, _source_index(shape, strides, offset), strides, offset)


@functools.lru_cache(maxsize=4096)
def reshape(v: IndexedView, new_shape: tuple[int, ...]) -> IndexedView:
    """``view``/``reshape``: each old index from the result's flat position (row-major), then simplified."""
    if math.prod(new_shape) != v.numel:
        raise ValueError(f"cannot reshape {v.shape} ({v.numel} elements) to {new_shape}")
    if v.numel == 0:  # torch: the same shape keeps its strides, any other is contiguous
        strides = v.strides if (new_shape == v.shape and v.strides is not None) else _contiguous(new_shape)
        return IndexedView(new_shape, _source_index(new_shape, strides, v.offset), strides, v.offset)
    flat = sympy.Add(*(c * _j(k, new_shape) for k, c in enumerate(_contiguous(new_shape))))
    old_c = _contiguous(v.shape)
    mapping = {k: ModularIndexing(flat, old_c[k], size) for k, size in enumerate(v.shape) if size != 1}
    index = _substitute(v, new_shape, mapping)
    size1: list[int | None] = [None] * len(new_shape)
    if new_shape and new_shape[-1] == 1:  # computeStride starts from the innermost source stride
        size1[-1] = v.strides[-1] if (v.strides and v.shape) else 1
    return _finish(new_shape, index, size1, f"reshape {v.shape} -> {new_shape}")


@functools.lru_cache(maxsize=4096)
def permute(v: IndexedView, dims: tuple[int, ...]) -> IndexedView:
    """``permute``/``transpose``/``t``: result dim k is input dim ``dims[k]``."""
    n = len(v.shape)
    if sorted(d % max(n, 1) for d in dims) != list(range(n)):
        raise ValueError(f"permute dims {dims} are not a permutation of {n} dims")
    dims = tuple(d % max(n, 1) for d in dims)
    shape = tuple(v.shape[d] for d in dims)
    mapping = {d: _j(k, shape) for k, d in enumerate(dims)}
    size1 = [v.strides[d] if v.strides is not None else None for d in dims]
    return _finish(shape, _substitute(v, shape, mapping), size1, f"permute {dims}")


@functools.lru_cache(maxsize=4096)
def expand(v: IndexedView, shape: tuple[int, ...]) -> IndexedView:
    """``expand``: new leading dims and expanded size-1 dims read index 0 (stride 0)."""
    off = len(shape) - len(v.shape)
    if off < 0 or any(s != t and s != 1 for s, t in zip(v.shape, shape[off:], strict=True)):
        raise ValueError(f"cannot expand {v.shape} to {shape}")
    mapping = {k: _j(k + off, shape) for k, s in enumerate(v.shape) if s != 1}
    size1 = [0] * off + [(v.strides[k] if v.strides is not None else None) if s == t else 0
                         for k, (s, t) in enumerate(zip(v.shape, shape[off:], strict=True))]
    return _finish(shape, _substitute(v, shape, mapping), size1, f"expand {shape}")


@functools.lru_cache(maxsize=4096)
def slice_(v: IndexedView, dim: int, start: int | None, end: int | None, step: int = 1) -> IndexedView:
    """``slice``/``narrow`` with a positive step (bounds clamped like torch)."""
    if step <= 0:
        raise ValueError(f"slice step must be positive, got {step}")
    dim %= len(v.shape)
    size = v.shape[dim]
    lo = 0 if start is None else (start + size if start < 0 else start)
    hi = size if end is None else (end + size if end < 0 else end)
    lo = min(max(lo, 0), size)
    hi = min(max(hi, lo), size)
    shape = v.shape[:dim] + ((hi - lo + step - 1) // step,) + v.shape[dim + 1:]
    mapping = {k: _j(k, shape) for k in range(len(shape)) if v.shape[k] != 1}
    mapping[dim] = lo + step * _j(dim, shape)
    size1 = [None if v.strides is None else v.strides[k] * (step if k == dim else 1) for k in range(len(shape))]
    index = _substitute(v, shape, mapping)
    if math.prod(shape) == 0:  # torch keeps the start offset of an empty slice
        index = _source_index(shape, size1, _offset_of(v.index) + lo * (v.strides[dim] if v.strides else 0))  # type: ignore[arg-type]
    return _finish(shape, index, size1, f"slice dim {dim} [{lo}:{hi}:{step}]")


@functools.lru_cache(maxsize=4096)
def select(v: IndexedView, dim: int, index: int) -> IndexedView:
    """``select``: drop ``dim`` at a fixed position."""
    dim %= len(v.shape)
    if not -v.shape[dim] <= index < v.shape[dim]:
        raise IndexError(f"select index {index} out of range for dim {dim} of size {v.shape[dim]}")
    index %= v.shape[dim]
    shape = v.shape[:dim] + v.shape[dim + 1:]
    mapping = {k: (_j(k if k < dim else k - 1, shape) if k != dim else sympy.Integer(index))
               for k in range(len(v.shape)) if v.shape[k] != 1}
    size1 = None if v.strides is None else list(v.strides[:dim] + v.strides[dim + 1:])
    return _finish(shape, _substitute(v, shape, mapping), size1, f"select dim {dim} [{index}]")


@functools.lru_cache(maxsize=4096)
def unsqueeze(v: IndexedView, dim: int) -> IndexedView:
    """``unsqueeze``: a size-1 dim at ``dim`` (stride: torch's ``size * stride`` of the dim it precedes)."""
    dim %= len(v.shape) + 1
    shape = v.shape[:dim] + (1,) + v.shape[dim:]
    mapping = {k: _j(k if k < dim else k + 1, shape) for k in range(len(v.shape)) if v.shape[k] != 1}
    size1: list[int | None] = [None] * len(shape)
    if v.strides is not None:
        size1 = list(v.strides[:dim]) + [v.strides[dim] * v.shape[dim] if dim < len(v.shape) else 1] \
            + list(v.strides[dim:])
    return _finish(shape, _substitute(v, shape, mapping), size1, f"unsqueeze {dim}")


@functools.lru_cache(maxsize=4096)
def squeeze(v: IndexedView, dims: tuple[int, ...] | None = None) -> IndexedView:
    """``squeeze``: drop size-1 dims (all, or those of ``dims`` that have size 1)."""
    n = len(v.shape)
    if dims is None:
        drop = {k for k, s in enumerate(v.shape) if s == 1}
    else:
        drop = {d % n for d in dims if n and v.shape[d % n] == 1}
    keep = [k for k in range(n) if k not in drop]
    shape = tuple(v.shape[k] for k in keep)
    mapping = {k: _j(i, shape) for i, k in enumerate(keep) if v.shape[k] != 1}
    size1 = None if v.strides is None else [v.strides[k] for k in keep]
    return _finish(shape, _substitute(v, shape, mapping), size1, "squeeze")


@functools.lru_cache(maxsize=4096)
def as_strided(v: IndexedView, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> IndexedView:
    """``as_strided``: addresses the underlying storage directly (``offset`` from its start)."""
    return IndexedView(shape, _source_index(shape, strides, offset), strides, offset)


def compose(shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
            chain: Sequence[tuple[str, tuple]]) -> IndexedView:
    """Apply a view chain (``("reshape", (shape,))``, ``("permute", (dims,))``, ...) to a strided source."""
    ops = {"reshape": reshape, "view": reshape, "permute": permute, "expand": expand, "slice": slice_,
           "select": select, "unsqueeze": unsqueeze, "squeeze": squeeze, "as_strided": as_strided}
    v = source(tuple(shape), tuple(strides), offset)
    for name, args in chain:
        v = ops[name](v, *args)
    return v


def evaluate(expr: sympy.Expr, values: Sequence[int]) -> int:
    """The integer value of an index expression at result index ``values`` (exact, no floats)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return int(values[int(expr.name[1:])])
    if expr.is_Add:
        return sum(evaluate(a, values) for a in expr.args)
    if expr.is_Mul:
        return math.prod(evaluate(a, values) for a in expr.args)
    if isinstance(expr, ModularIndexing):
        base, div, mod = (evaluate(a, values) for a in expr.args)
        return (base // div) % mod
    if isinstance(expr, FloorDiv):
        base, div = (evaluate(a, values) for a in expr.args)
        return base // div
    raise TypeError(f"not an index expression: {sympy.sstr(expr)}")


@dataclass(frozen=True)
class NotAffine:
    """A view that no strided access of its buffer can express: the caller copies it first."""

    reason: str


@functools.lru_cache(maxsize=4096)
def reshape_access(shape: tuple[int, ...], strides: tuple[int, ...], new_shape: tuple[int, ...]
                   ) -> tuple[int, ...] | NotAffine:
    """Strides of ``(shape, strides)`` viewed as ``new_shape`` (torch's strides), or why it needs a copy."""
    if math.prod(shape) and math.prod(new_shape) == math.prod(shape) and strides == _contiguous(shape):
        # Row-major source: its flat index *is* the result's flat index, so the result is row-major too.
        # (What reshape() derives, without building the expression: most reshapes of a graph are these.)
        return _contiguous(new_shape)
    v = reshape(source(shape, strides, 0), new_shape)
    return v.strides if v.strides is not None else NotAffine(v.reason)


# -- printing --------------------------------------------------------------------------------------------


def offset_expr(base: int, terms: Sequence[tuple[str, int]]) -> sympy.Expr:
    """``base + sum(stride * var)`` over named loop variables."""
    return sympy.Integer(base) + sympy.Add(*(s * loop_symbol(var) for var, s in terms))


def print_offset(expr: sympy.Expr, order: Sequence[str]) -> str:
    """An affine offset as template text: constant first, then ``var * stride`` (``var`` for 1) in ``order``."""
    const, rest = expr.as_coeff_Add()
    coeffs = rest.as_coefficients_dict()
    parts = [str(int(const))] if const else []
    for var in order:
        s = coeffs.get(loop_symbol(var), 0)
        if s:
            parts.append(var if s == 1 else f"{var} * {int(s)}")
    return " + ".join(parts) or "0"


@functools.lru_cache(maxsize=16384)
def offset_text(base: int, terms: tuple[tuple[str, int], ...]) -> str:
    """Template text of ``base + sum(stride * var)``: a repeated variable's strides add up into one term."""
    order = list(dict.fromkeys(var for var, _ in terms))
    return print_offset(offset_expr(base, terms), order)
