"""More complex ops as real pairs (see :mod:`lowering.complex_pairs`): data movement, comparisons, cumulative sums,
matrix products, and the elementary functions (exp, log, sqrt, the trigonometric and hyperbolic ones, sigmoid).

Each rule takes the rewriter and the complex node and returns the pair node. A complex value of shape ``S`` is a
real ``S + [2]`` tensor, so data movement is the same op on the leading dims (the pair dim rides along, last);
comparisons and tests combine the two parts; a matrix product is four real ones; exp is its textbook form, as
eager's vectorised CPU kernel computes it (``exp(a) * (cos b, sin b)``), and log is ``(log|z|, atan2(b, a))``, with
``log|z|`` kept accurate near ``|z| = 1``, as glibc's ``clog`` (which eager calls) keeps it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
from neuron_compile.lowering.decomp_scatter import GATHER_LINES, SCATTER_LINES
from torch import fx

aten = torch.ops.aten


class ComplexUnsupported(Exception):
    """A case of a listed op the pairs can't express (the graph is then left complex and refused by name)."""


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def is_complex(n: Any) -> bool:
    v = _val(n)
    return isinstance(v, torch.Tensor) and v.is_complex()


def _pair_last(rw: Any, t: fx.Node, pair_at: int) -> fx.Node:
    """``t`` with its dim ``pair_at`` (the pair, moved by an op that appends a dim) moved back to the end."""
    n = _val(t).dim()
    order = [d for d in range(n) if d != pair_at % n] + [pair_at % n]
    return rw.emit(aten.permute.default, t, order)


def _same_op(rw: Any, node: fx.Node, dim_args: tuple[int, ...] = (), dim_lists: tuple[int, ...] = ()) -> fx.Node:
    """The op itself on the pair, its dim arguments (positions ``dim_args``, lists at ``dim_lists``) made
    non-negative for the complex value so that they never name the pair dim."""
    args = list(node.args)
    args[0] = rw.env[args[0]]
    for i in dim_args:
        if i < len(args):
            args[i] = rw.dim(node.args[0], args[i])
    for i in dim_lists:
        if i < len(args):
            args[i] = [rw.dim(node.args[0], d) for d in args[i]]
    return rw.emit(node.target, *args)


def _flip(rw: Any, node: fx.Node) -> fx.Node:
    return _same_op(rw, node, dim_lists=(1,))


def _roll(rw: Any, node: fx.Node) -> fx.Node:
    shifts, dims = node.args[1], node.args[2] if len(node.args) > 2 else []
    if not dims:  # a roll of the flattened value: the pairs as rows
        shape = list(_val(node).shape)
        rows = rw.emit(aten.view.default, rw.emit(aten.clone.default, rw.env[node.args[0]],
                                                  memory_format=torch.contiguous_format), [-1, 2])
        rolled = rw.emit(aten.roll.default, rows, list(shifts), [0])
        return rw.emit(aten.view.default, rw.emit(aten.clone.default, rolled), [*shape, 2])
    return _same_op(rw, node, dim_lists=(2,))


def _split(rw: Any, node: fx.Node) -> fx.Node:
    return _same_op(rw, node, dim_args=(2,)) if len(node.args) > 2 else rw.emit(node.target, rw.env[node.args[0]],
                                                                                  node.args[1], 0)


def _unbind(rw: Any, node: fx.Node) -> fx.Node:
    return rw.emit(node.target, rw.env[node.args[0]], rw.dim(node.args[0], node.args[1] if len(node.args) > 1 else 0))


def _item(rw: Any, node: fx.Node) -> fx.Node:
    """An item of a rewritten multi-output op (split, unbind): its pair."""
    item = rw.emit(operator.getitem, rw.env[node.args[0]], node.args[1])
    if _val(item).is_complex():  # the producer has no real form (it was copied as it is): nothing to pair
        raise ComplexUnsupported(f"an item of {node.args[0].target}, which makes complex values")
    return item


def _as_strided(rw: Any, node: fx.Node) -> fx.Node:
    """A strided view of the complex storage: sizes, strides and offset counted in reals (a value is two)."""
    a = node.args
    size, stride = list(a[1]), list(a[2])
    offset = a[3] if len(a) > 3 and a[3] is not None else None
    args = [rw.env[a[0]], [*size, 2], [2 * s for s in stride] + [1]]
    if offset is not None:
        args.append(2 * offset)
    return rw.emit(node.target, *args)


def _diagonal(rw: Any, node: fx.Node) -> fx.Node:
    a = node.args
    offset = a[1] if len(a) > 1 else 0
    d1, d2 = (rw.dim(a[0], d) for d in (a[2] if len(a) > 2 else 0, a[3] if len(a) > 3 else 1))
    diag = rw.emit(aten.diagonal.default, rw.env[a[0]], offset, d1, d2)  # the diagonal dim comes last, after the pair
    return _pair_last(rw, diag, -2)


def _index_select(rw: Any, node: fx.Node) -> fx.Node:
    return rw.emit(aten.index_select.default, rw.env[node.args[0]], rw.dim(node.args[0], node.args[1]),
                   rw.env[node.args[2]])


def _gather(rw: Any, node: fx.Node) -> fx.Node:
    idx = rw.env[node.args[2]]
    shape = list(_val(node.args[2]).shape)
    idx2 = rw.emit(aten.expand.default, rw.emit(aten.unsqueeze.default, idx, -1), [*shape, 2])
    return rw.emit(aten.gather.default, rw.env[node.args[0]], rw.dim(node.args[0], node.args[1]), idx2)


def _index(rw: Any, node: fx.Node) -> fx.Node:
    indices = [rw.env[i] if isinstance(i, fx.Node) else i for i in node.args[1]]
    return rw.emit(aten.index.Tensor, rw.env[node.args[0]], indices)


def _pad(rw: Any, node: fx.Node) -> fx.Node:
    value = node.args[2] if len(node.args) > 2 else 0
    if complex(value) != 0:
        raise ComplexUnsupported("a constant pad of a complex value with a nonzero fill")
    return rw.emit(aten.constant_pad_nd.default, rw.env[node.args[0]], [0, 0, *node.args[1]], 0.0)


def _unfold(rw: Any, node: fx.Node) -> fx.Node:
    windows = rw.emit(aten.unfold.default, rw.env[node.args[0]], rw.dim(node.args[0], node.args[1]), *node.args[2:])
    return _pair_last(rw, windows, -2)  # the window dim is appended after the pair


def _cumsum(rw: Any, node: fx.Node) -> fx.Node:
    dtype = node.kwargs.get("dtype")
    if dtype is not None and dtype != _val(node.args[0]).dtype:
        raise ComplexUnsupported(f"a complex cumsum cast to {dtype}")
    return rw.emit(aten.cumsum.default, rw.env[node.args[0]], rw.dim(node.args[0], node.args[1]))


def _contiguous_part(rw: Any, v: Any, i: int) -> fx.Node | None:
    """Part ``i`` of an operand (a pair, or a real as r + 0i) as a contiguous real tensor; None for None."""
    if v is None:
        return None
    if not is_complex(v):
        return rw.env[v] if i == 0 else rw.emit(aten.full_like.default, rw.env[v], 0.0)
    return rw.emit(aten.clone.default, rw.part(rw.env[v], i), memory_format=torch.contiguous_format)


def _lines(rw: Any, node: fx.Node) -> fx.Node:
    """This package's gather_lines / scatter_lines (lowering/decomp_scatter.py) part by part: the same indices on
    the real and the imaginary parts. A scatter that assigns, sums or averages is linear, so it splits; a scalar
    fill is real (a complex one arrives as a source tensor), so the imaginary part's fill is 0."""
    a = list(node.args)
    if node.target == SCATTER_LINES and a[5] not in ("assign", "sum", "mean"):
        raise ComplexUnsupported(f"a complex scatter with reduce={a[5]!r}")
    parts = []
    for i in (0, 1):
        args = [_contiguous_part(rw, a[0], i), a[1], rw.env[a[2]], *a[3:]]
        if node.target == SCATTER_LINES:
            args[3] = _contiguous_part(rw, a[3], i)
            args[4] = a[4] if i == 0 else 0.0
        parts.append(rw.emit(node.target, *args))
    return rw.pair(*parts)


def _index_put(rw: Any, node: fx.Node) -> fx.Node:
    """index_put on the pairs: the indices address the leading dims, the values' pairs broadcast as they do."""
    a = node.args
    x, values = rw.as_pair(a[0]), rw.as_pair(a[2])
    indices = [rw.env[i] if isinstance(i, fx.Node) else i for i in a[1]]
    return rw.emit(aten.index_put.default, x, indices, values, *a[3:])


def _as_strided_scatter(rw: Any, node: fx.Node) -> fx.Node:
    """as_strided_scatter of complex storage: sizes, strides and offset counted in reals, as as_strided's."""
    a = node.args
    x, src = rw.as_pair(a[0]), rw.as_pair(a[1])
    offset = a[4] if len(a) > 4 and a[4] is not None else 0
    return rw.emit(node.target, x, src, [*a[2], 2], [2 * st for st in a[3]] + [1], 2 * offset)


def _parts(rw: Any, v: Any) -> tuple[Any, Any]:
    """Real and imaginary parts of an operand of the original graph (a complex node, a real node promoted as r + 0i,
    or a number)."""
    if isinstance(v, fx.Node):
        return rw.parts(("complex" if is_complex(v) else "real", rw.env[v]))
    return rw.parts(("scalar", v))


def _compare(rw: Any, node: fx.Node) -> fx.Node:
    """== / != : both parts equal (a NaN part is unequal, as eager's)."""
    (ar, ai), (br, bi) = _parts(rw, node.args[0]), _parts(rw, node.args[1])
    eq = node.target in (aten.eq.Tensor, aten.eq.Scalar)

    def one(x: Any, y: Any) -> fx.Node:
        op = (aten.eq if eq else aten.ne).Tensor if isinstance(y, fx.Node) else (aten.eq if eq else aten.ne).Scalar
        if not isinstance(x, fx.Node):
            x, y = y, x
        return rw.emit(op, x, y)

    both = aten.logical_and.default if eq else aten.logical_or.default
    return rw.emit(both, one(ar, br), one(ai, bi))


def _test(rw: Any, node: fx.Node) -> fx.Node:
    """isnan / isinf: either part; isfinite: both parts."""
    z = rw.env[node.args[0]]
    test = {aten.isnan.default: aten.isnan.default, aten.isinf.default: aten.isinf.default,
            aten.isfinite.default: aten.isfinite.default}[node.target]
    parts = [rw.emit(test, rw.part(z, i)) for i in (0, 1)]
    return rw.emit(aten.logical_and.default if node.target == aten.isfinite.default else aten.logical_or.default, *parts)


def _truth(rw: Any, v: Any) -> fx.Node:
    """A complex value as a bool: nonzero in either part."""
    if not is_complex(v):
        return rw.emit(aten.ne.Scalar, rw.env[v], 0) if _val(v).dtype != torch.bool else rw.env[v]
    z = rw.env[v]
    return rw.emit(aten.logical_or.default, *(rw.emit(aten.ne.Scalar, rw.part(z, i), 0.0) for i in (0, 1)))


def _logical(rw: Any, node: fx.Node) -> fx.Node:
    if node.target == aten.logical_not.default:
        return rw.emit(aten.logical_not.default, _truth(rw, node.args[0]))
    return rw.emit(node.target, _truth(rw, node.args[0]), _truth(rw, node.args[1]))


def _matmul(rw: Any, node: fx.Node) -> fx.Node:
    """mm / bmm of complex matrices: (Ar Br - Ai Bi) + (Ar Bi + Ai Br) i, four real products."""
    (ar, ai), (br, bi) = _parts(rw, node.args[0]), _parts(rw, node.args[1])
    if not all(isinstance(p, fx.Node) for p in (ar, ai, br, bi)):
        raise ComplexUnsupported("a matrix product with a scalar")
    mm = node.target
    re = rw.emit(aten.sub.Tensor, rw.emit(mm, ar, br), rw.emit(mm, ai, bi))
    im = rw.emit(aten.add.Tensor, rw.emit(mm, ar, bi), rw.emit(mm, ai, br))
    return rw.pair(re, im)


def exp_pair(rw: Any, z: fx.Node) -> fx.Node:
    """exp of the pair ``z``: e^a (cos b, sin b)."""
    a, b = rw.part(z, 0), rw.part(z, 1)
    ea = rw.emit(aten.exp.default, a)
    return rw.pair(rw.emit(aten.mul.Tensor, ea, rw.emit(aten.cos.default, b)),
                   rw.emit(aten.mul.Tensor, ea, rw.emit(aten.sin.default, b)))


def log_pair(rw: Any, z: fx.Node) -> fx.Node:
    """The principal log of the pair ``z``: (log |z|, atan2(b, a)). Near |z| = 1, where log |z| would keep only the
    rounding of |z|, the real part is log1p(|z|^2 - 1) / 2 with |z|^2 - 1 = (m - 1)(m + 1) + n^2 (m the larger part,
    whose m - 1 is exact there): relative accuracy beside z = 1 as eager's clog, ~1e-8 absolute elsewhere on the
    circle (where clog forms |z|^2 - 1 exactly)."""
    e = rw.emit
    a, b = (e(aten.abs.default, rw.part(z, i)) for i in (0, 1))
    h = rw.hypot(z)
    m, n = e(aten.maximum.default, a, b), e(aten.minimum.default, a, b)
    size_sq_minus_1 = e(aten.add.Tensor, e(aten.mul.Tensor, e(aten.sub.Scalar, m, 1.0), e(aten.add.Scalar, m, 1.0)),
                        e(aten.mul.Tensor, n, n))
    near = e(aten.mul.Scalar, e(aten.log1p.default, size_sq_minus_1), 0.5)
    band = e(aten.logical_and.default, e(aten.gt.Scalar, h, 0.75), e(aten.lt.Scalar, h, 1.5))
    return rw.pair(e(aten.where.self, band, near, e(aten.log.default, h)),
                   e(aten.atan2.default, rw.part(z, 1), rw.part(z, 0)))


def _exp(rw: Any, node: fx.Node) -> fx.Node:
    return exp_pair(rw, rw.env[node.args[0]])


def _log(rw: Any, node: fx.Node) -> fx.Node:
    return log_pair(rw, rw.env[node.args[0]])


def _ab(rw: Any, node: fx.Node) -> tuple[fx.Node, fx.Node]:
    z = rw.env[node.args[0]]
    return rw.part(z, 0), rw.part(z, 1)


def _trig(rw: Any, node: fx.Node) -> fx.Node:
    """sin, cos, sinh, cosh of a + bi by their addition formulas (as std::complex computes them)."""
    a, b = _ab(rw, node)
    mul = aten.mul.Tensor
    sa, ca, sb, cb = (rw.emit(op, v) for op, v in ((aten.sin.default, a), (aten.cos.default, a), (aten.sin.default, b),
                                                   (aten.cos.default, b)))
    sha, cha, shb, chb = (rw.emit(op, v) for op, v in ((aten.sinh.default, a), (aten.cosh.default, a),
                                                       (aten.sinh.default, b), (aten.cosh.default, b)))
    t = node.target
    if t == aten.sin.default:  # sin a cosh b + i cos a sinh b
        return rw.pair(rw.emit(mul, sa, chb), rw.emit(mul, ca, shb))
    if t == aten.cos.default:  # cos a cosh b - i sin a sinh b
        return rw.pair(rw.emit(mul, ca, chb), rw.emit(aten.neg.default, rw.emit(mul, sa, shb)))
    if t == aten.sinh.default:  # sinh a cos b + i cosh a sin b
        return rw.pair(rw.emit(mul, sha, cb), rw.emit(mul, cha, sb))
    assert t == aten.cosh.default  # cosh a cos b + i sinh a sin b
    return rw.pair(rw.emit(mul, cha, cb), rw.emit(mul, sha, sb))


def _tanh_parts(rw: Any, a: fx.Node, b: fx.Node) -> tuple[fx.Node, fx.Node]:
    """tanh(a + bi) = (sinh 2a + i sin 2b) / (cosh 2a + cos 2b), with tanh's limit +-1 once |a| is large (where both
    sinh and cosh overflow)."""
    a2, b2 = rw.emit(aten.mul.Scalar, a, 2.0), rw.emit(aten.mul.Scalar, b, 2.0)
    den = rw.emit(aten.add.Tensor, rw.emit(aten.cosh.default, a2), rw.emit(aten.cos.default, b2))
    re = rw.emit(aten.div.Tensor, rw.emit(aten.sinh.default, a2), den)
    im = rw.emit(aten.div.Tensor, rw.emit(aten.sin.default, b2), den)
    big = rw.emit(aten.gt.Scalar, rw.emit(aten.abs.default, a), 20.0)
    return (rw.emit(aten.where.self, big, rw.emit(aten.sign.default, a), re),
            rw.emit(aten.where.self, big, rw.emit(aten.mul.Scalar, b, 0.0), im))


def _tanh(rw: Any, node: fx.Node) -> fx.Node:
    return rw.pair(*_tanh_parts(rw, *_ab(rw, node)))


def _tan(rw: Any, node: fx.Node) -> fx.Node:
    """tan z = -i tanh(i z): with tanh(-b + ai) = x + yi, tan(a + bi) = y - xi (its limit i sign(b) for large |b|)."""
    a, b = _ab(rw, node)
    x, y = _tanh_parts(rw, rw.emit(aten.neg.default, b), a)
    return rw.pair(y, rw.emit(aten.neg.default, x))


def sqrt_pair(rw: Any, z: fx.Node) -> fx.Node:
    """The principal square root of the pair ``z`` without cancellation: t = sqrt((|a| + |z|) / 2); a >= 0:
    (t, b / 2t), else (|b| / 2t, copysign(t, b)); z itself for 0."""
    a, b = rw.part(z, 0), rw.part(z, 1)
    r = rw.hypot(z)
    t = rw.emit(aten.sqrt.default, rw.emit(aten.mul.Scalar, rw.emit(aten.add.Tensor, rw.emit(aten.abs.default, a), r), 0.5))
    two_t = rw.emit(aten.mul.Scalar, t, 2.0)
    q = rw.emit(aten.div.Tensor, b, two_t)
    pos = rw.emit(aten.ge.Scalar, a, 0.0)
    re = rw.emit(aten.where.self, pos, t, rw.emit(aten.abs.default, q))
    im = rw.emit(aten.where.self, pos, q, rw.emit(aten.copysign.Tensor, t, b))
    zero = rw.emit(aten.eq.Scalar, t, 0.0)  # z = +-0: (0, b), its sign kept
    return rw.pair(rw.emit(aten.where.self, zero, t, re), rw.emit(aten.where.self, zero, b, im))


def _sqrt(rw: Any, node: fx.Node) -> fx.Node:
    return sqrt_pair(rw, rw.env[node.args[0]])


def _log_base(rw: Any, node: fx.Node) -> fx.Node:
    """log2 / log10: log z over ln 2 / ln 10."""
    scale = 1.0 / math.log(2.0 if node.target == aten.log2.default else 10.0)
    return rw.emit(aten.mul.Scalar, _log(rw, node), scale)


def one_plus_exp_neg(rw: Any, z: fx.Node) -> fx.Node:
    """1 + exp(-z) of the pair ``z`` (sigmoid's and silu's denominator): exp(-z) = e^-a (cos b - i sin b)."""
    a, b = rw.part(z, 0), rw.part(z, 1)
    ea = rw.emit(aten.exp.default, rw.emit(aten.neg.default, a))
    e = rw.pair(rw.emit(aten.mul.Tensor, ea, rw.emit(aten.cos.default, b)),
                rw.emit(aten.neg.default, rw.emit(aten.mul.Tensor, ea, rw.emit(aten.sin.default, b))))
    return rw.binary(aten.add.Tensor, ("complex", e), ("scalar", 1.0))


def _sigmoid(rw: Any, node: fx.Node) -> fx.Node:
    """1 / (1 + exp(-z))."""
    return rw.divide(("scalar", 1.0), ("complex", one_plus_exp_neg(rw, rw.env[node.args[0]])))


def _rsqrt(rw: Any, node: fx.Node) -> fx.Node:
    return rw.divide(("scalar", 1.0), ("complex", _sqrt(rw, node)))


def _exp2(rw: Any, node: fx.Node) -> fx.Node:
    """2^z = exp(z ln 2)."""
    return exp_pair(rw, rw.emit(aten.mul.Scalar, rw.env[node.args[0]], math.log(2.0)))


def _angle(rw: Any, node: fx.Node) -> fx.Node:
    """arg z = atan2(b, a) (a real result)."""
    a, b = _ab(rw, node)
    return rw.emit(aten.atan2.default, b, a)


def _var(rw: Any, node: fx.Node) -> fx.Node:
    """The variance of complex values, mean |z - mean z|^2 (corrected), is the real part's plus the imaginary
    part's (a real result)."""
    a, b = _ab(rw, node)
    rest = list(node.args[1:])
    if rest and rest[0] is not None:
        rest[0] = [rw.dim(node.args[0], d) for d in rest[0]]
    elif _val(node.args[0]).dim():
        rest = [list(range(_val(node.args[0]).dim()))] + rest[1:]
    return rw.emit(aten.add.Tensor, rw.emit(aten.var.correction, a, *rest, **node.kwargs),
              rw.emit(aten.var.correction, b, *rest, **node.kwargs))


def _any_all(rw: Any, node: fx.Node) -> fx.Node:
    """any / all of complex values: of their truth (either part nonzero)."""
    return rw.emit(node.target, _truth(rw, node.args[0]), *node.args[1:])


def _scalar_as_1d(rule: Callable[[Any, fx.Node], fx.Node]) -> Callable[[Any, fx.Node], fx.Node]:
    """``rule`` for a 0-d complex input too: its dim 0 is a dim of size 1, which its pair (whose only dim is the pair)
    lacks. Every listed op then reads the one value: flip and cumsum keep it, index_select and gather pick it
    (their index can only be 0), unfold makes one window of it."""
    def run(rw: Any, node: fx.Node) -> fx.Node:
        src = node.args[0]
        if not isinstance(src, fx.Node) or _val(src).dim() != 0:
            return rule(rw, node)
        if node.target not in (aten.flip.default, aten.cumsum.default, aten.index_select.default, aten.gather.default,
                               aten.unfold.default):
            raise ComplexUnsupported(f"{node.target} of a 0-d complex value")
        one = rw.emit(aten.clone.default, rw.env[src], memory_format=torch.contiguous_format)
        return rw.emit(aten.view.default, one, [*_val(node).shape, 2])

    return run


RULES: dict[Any, Callable[[Any, fx.Node], fx.Node]] = {
    aten.flip.default: _flip,
    aten.roll.default: _roll,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.unbind.int: _unbind,
    operator.getitem: _item,
    aten.diagonal.default: _diagonal,
    aten.as_strided.default: _as_strided,
    aten.index_select.default: _index_select,
    aten.gather.default: _gather,
    aten.index.Tensor: _index,
    aten.constant_pad_nd.default: _pad,
    aten.unfold.default: _unfold,
    aten.cumsum.default: _cumsum,
    GATHER_LINES: _lines, SCATTER_LINES: _lines,
    aten.index_put.default: _index_put,
    aten.as_strided_scatter.default: _as_strided_scatter,
    torch.ops.prims.as_strided_scatter.default: _as_strided_scatter,
    aten.eq.Tensor: _compare, aten.eq.Scalar: _compare, aten.ne.Tensor: _compare, aten.ne.Scalar: _compare,
    aten.isnan.default: _test, aten.isinf.default: _test, aten.isfinite.default: _test,
    aten.logical_not.default: _logical, aten.logical_and.default: _logical, aten.logical_or.default: _logical,
    aten.logical_xor.default: _logical,
    aten.mm.default: _matmul, aten.bmm.default: _matmul,
    aten.exp.default: _exp,
    aten.log.default: _log,
    aten.sin.default: _trig, aten.cos.default: _trig, aten.sinh.default: _trig, aten.cosh.default: _trig,
    aten.tanh.default: _tanh, aten.sqrt.default: _sqrt, aten.rsqrt.default: _rsqrt, aten.sigmoid.default: _sigmoid,
    aten.log2.default: _log_base, aten.log10.default: _log_base,
    aten.tan.default: _tan, aten.exp2.default: _exp2, aten.angle.default: _angle, aten.var.correction: _var,
    aten.any.default: _any_all, aten.any.dim: _any_all, aten.any.dims: _any_all,
    aten.all.default: _any_all, aten.all.dim: _any_all, aten.all.dims: _any_all,
}
TAKES_KWARGS = {aten.var.correction, aten.cumsum.default}  # rules that read the node's keyword arguments (others refuse)
for _op in (aten.flip.default, aten.index_select.default, aten.gather.default, aten.unfold.default, aten.cumsum.default):
    RULES[_op] = _scalar_as_1d(RULES[_op])
