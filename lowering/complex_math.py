"""Complex functions as real pairs (see :mod:`lowering.complex_pairs`): log1p and expm1, powers, the inverse
trigonometric and hyperbolic functions, silu, and products (``prod``, ``cumprod``).

Each follows what eager computes, to the special values where they are defined:

- ``pow`` with a scalar exponent takes eager's shortcuts (0: ones, 1: a copy, 2 and 3: products, 0.5: sqrt,
  -0.5: rsqrt, -1: reciprocal, -2: one over the square); any other power is ``std::pow``, which glibc computes as
  ``cexp(w * clog(z))``, and so does this, with C's ``cexp`` at infinite arguments (so ``0 ** w`` is 0 for
  ``Re w > 0``, ``inf + NaN i`` for ``Re w < 0``, and NaN for ``w = 0``, as eager).
- ``log1p`` and ``expm1`` keep their accuracy near 0, as eager's (``log1p`` corrects ``log(1 + z)`` by
  ``z / ((1 + z) - 1)``; ``expm1`` is ``expm1(a) cos b - 2 sin^2(b / 2) + i e^a sin b``).
- ``asinh`` is ``log(w + sqrt(w^2 + 1))`` on ``w = |a| + bi``, its real part then signed as ``a``: as
  ``log1p(w + w^2 / (1 + sqrt(w^2 + 1)))`` below ``|w| = 1/2`` (no cancellation), as ``log(2w)`` past ``|w| = 1e9``,
  with ``Re(w^2 + 1) = (1 - b)(1 + b) + a^2`` (exact beside the branch points ``+-i``). ``asin``, ``acos`` and ``acosh`` follow from
  it by ``asin z = -i asinh(iz)``, ``acos z = pi/2 - asin z`` and ``acosh z = |Im acos z| + i copysign(Re acos z, b)``.
  ``atanh`` is ``(log1p(4|a| / ((1 - |a|)^2 + b^2)) / 4, atan2(2b, (1 - a)(1 + a) - b^2) / 2)``, its real part signed
  as ``a``; ``atan z = -i atanh(iz)``. These are the principal branches of C99's Annex G, as eager's.
- ``prod`` multiplies halves (a tree of ``log2 n`` complex products), ``cumprod`` is a Hillis-Steele scan of
  complex products: the same factors as eager's, grouped differently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from neuron_compile.lowering.complex_more import (
    ComplexUnsupported,
    _val,
    exp_pair,
    log_pair,
    one_plus_exp_neg,
    sqrt_pair,
)
from torch import fx

aten = torch.ops.aten

_BIG = 1e9  # past this |w|, asinh(w) is log(2w) to within 1 / (4 |w|^2)


def _re_im(rw: Any, z: fx.Node) -> tuple[fx.Node, fx.Node]:
    return rw.part(z, 0), rw.part(z, 1)


def _mul(rw: Any, p: fx.Node, q: fx.Node) -> fx.Node:
    return rw.binary(aten.mul.Tensor, ("complex", p), ("complex", q))


def _plus(rw: Any, p: fx.Node, q: fx.Node) -> fx.Node:
    """p + q, part by part (no promotion terms: both are pairs)."""
    return rw.emit(aten.add.Tensor, p, q)


def _real_dtype(node: fx.Node) -> torch.dtype:
    return torch.float64 if _val(node).dtype == torch.complex128 else torch.float32


def _ones(rw: Any, node: fx.Node) -> fx.Node:
    shape, real = list(_val(node).shape), _real_dtype(node)
    return rw.pair(*(rw.emit(aten.full.default, shape, v, dtype=real) for v in (1.0, 0.0)))


# ---- log1p, expm1, cexp ------------------------------------------------------------------------------------------

def log1p_pair(rw: Any, z: fx.Node) -> fx.Node:
    """log(1 + z) as eager's CPU kernel: with u = 1 + z, z where u == 1, log u where u - 1 == z, else
    log u * (z / (u - 1)) (which undoes the rounding of 1 + z); log u as accurate near |u| = 1 as glibc's clog."""
    e = rw.emit
    a, b = _re_im(rw, z)
    a1 = e(aten.add.Scalar, a, 1.0)
    d = e(aten.sub.Scalar, a1, 1.0)
    log_u = log_pair(rw, rw.pair(a1, b))
    scaled = _mul(rw, log_u, rw.divide(("complex", z), ("complex", rw.pair(d, b))))
    exact = e(aten.logical_and.default, e(aten.eq.Tensor, d, a), e(aten.eq.Tensor, b, b))  # u - 1 == z
    one = e(aten.logical_and.default, e(aten.eq.Scalar, a1, 1.0), e(aten.eq.Scalar, b, 0.0))  # u == 1
    keep = e(aten.unsqueeze.default, one, -1)
    return e(aten.where.self, keep, z, e(aten.where.self, e(aten.unsqueeze.default, exact, -1), log_u, scaled))


def _log1p(rw: Any, node: fx.Node) -> fx.Node:
    return log1p_pair(rw, rw.env[node.args[0]])


def _expm1(rw: Any, node: fx.Node) -> fx.Node:
    """exp(z) - 1 = (expm1(a) cos b - 2 sin^2(b / 2)) + i e^a sin b."""
    e = rw.emit
    a, b = _re_im(rw, rw.env[node.args[0]])
    half = e(aten.sin.default, e(aten.mul.Scalar, b, 0.5))
    re = e(aten.sub.Tensor, e(aten.mul.Tensor, e(aten.expm1.default, a), e(aten.cos.default, b)),
           e(aten.mul.Scalar, e(aten.mul.Tensor, half, half), 2.0))
    return rw.pair(re, e(aten.mul.Tensor, e(aten.exp.default, a), e(aten.sin.default, b)))


def cexp_pair(rw: Any, p: fx.Node) -> fx.Node:
    """C's cexp (Annex G) of the pair ``p``: e^a (cos b, sin b), except e^-inf (any b) is 0, e^+inf with an infinite
    or NaN b is inf + NaN i, and a zero b stays the imaginary part (e^inf + 0i is inf + 0i)."""
    e = rw.emit
    a, b = _re_im(rw, p)
    plain = exp_pair(rw, p)
    re, im = _re_im(rw, plain)
    zero = e(aten.full_like.default, a, 0.0)
    to_zero = e(aten.eq.Scalar, a, float("-inf"))
    blown = e(aten.logical_and.default, e(aten.eq.Scalar, a, float("inf")),
              e(aten.logical_not.default, e(aten.isfinite.default, b)))
    re = e(aten.where.self, to_zero, zero, e(aten.where.self, blown, e(aten.full_like.default, a, float("inf")), re))
    im = e(aten.where.self, to_zero, zero, e(aten.where.self, e(aten.eq.Scalar, b, 0.0), b, im))
    return rw.pair(re, im)


# ---- powers ------------------------------------------------------------------------------------------------------

def _c_product(rw: Any, w: tuple[fx.Node, fx.Node], z: tuple[fx.Node, fx.Node]) -> fx.Node:
    """w * z as C multiplies complex numbers (Annex G, libgcc's __mulsc3): the textbook product, except that where
    both its parts are NaN and an operand is infinite (or a partial product overflowed), the operands are boxed
    (an infinite part to +-1, the others to +-0, NaNs to 0) and the product recomputed times infinity."""
    e = rw.emit
    a, b = w
    c, d = z
    ac, bd, ad, bc = (e(aten.mul.Tensor, p, q) for p, q in ((a, c), (b, d), (a, d), (b, c)))
    x, y = e(aten.sub.Tensor, ac, bd), e(aten.add.Tensor, ad, bc)

    def isinf(v: fx.Node) -> fx.Node:
        return e(aten.isinf.default, v)

    def either(p: fx.Node, q: fx.Node) -> fx.Node:
        return e(aten.logical_or.default, p, q)

    def boxed(v: fx.Node) -> fx.Node:  # +-1 for an infinite part, else +-0
        return e(aten.copysign.Tensor, e(aten._to_copy.default, isinf(v), dtype=_val(v).dtype), v)

    def unnan(v: fx.Node, when: fx.Node) -> fx.Node:  # a NaN part becomes +-0 (where ``when``)
        nan = e(aten.logical_and.default, when, e(aten.isnan.default, v))
        return e(aten.where.self, nan, e(aten.copysign.Tensor, e(aten.full_like.default, v, 0.0), v), v)

    w_inf, z_inf = either(isinf(a), isinf(b)), either(isinf(c), isinf(d))
    overflow = e(aten.logical_and.default, e(aten.logical_not.default, either(w_inf, z_inf)),
                 either(either(isinf(ac), isinf(bd)), either(isinf(ad), isinf(bc))))
    a2, b2 = (unnan(e(aten.where.self, w_inf, boxed(v), v), either(z_inf, overflow)) for v in (a, b))
    c2, d2 = (unnan(e(aten.where.self, z_inf, boxed(v), v), either(w_inf, overflow)) for v in (c, d))
    both_nan = e(aten.logical_and.default, e(aten.isnan.default, x), e(aten.isnan.default, y))
    recalc = e(aten.logical_and.default, both_nan, either(either(w_inf, z_inf), overflow))
    x2 = e(aten.mul.Scalar, e(aten.sub.Tensor, e(aten.mul.Tensor, a2, c2), e(aten.mul.Tensor, b2, d2)), float("inf"))
    y2 = e(aten.mul.Scalar, e(aten.add.Tensor, e(aten.mul.Tensor, a2, d2), e(aten.mul.Tensor, b2, c2)), float("inf"))
    return rw.pair(e(aten.where.self, recalc, x2, x), e(aten.where.self, recalc, y2, y))


def _general_pow(rw: Any, z: fx.Node, w: fx.Node | complex) -> fx.Node:
    """std::pow(z, w) as glibc's cpow: cexp(w * clog(z)), the product as C's."""
    log_z = _re_im(rw, log_pair(rw, z))
    if isinstance(w, complex):
        like = log_z[0]
        w_parts = (rw.emit(aten.full_like.default, like, w.real), rw.emit(aten.full_like.default, like, w.imag))
    else:
        w_parts = _re_im(rw, w)
    return cexp_pair(rw, _c_product(rw, w_parts, log_z))


def _pow(rw: Any, node: fx.Node) -> fx.Node:
    t, a = node.target, node.args
    if t == aten.pow.Tensor_Scalar:
        z, k = rw.as_pair(a[0]), complex(a[1])
        if k == 0:  # eager fills ones (0 ** 0 too)
            return _ones(rw, node)
        if k == 1:
            return rw.emit(aten.clone.default, z)

        def one_over(p: fx.Node) -> fx.Node:
            return rw.divide(("scalar", 1.0), ("complex", p))

        shortcut = {2: lambda: _mul(rw, z, z), 3: lambda: _mul(rw, _mul(rw, z, z), z),
                    0.5: lambda: sqrt_pair(rw, z), -0.5: lambda: one_over(sqrt_pair(rw, z)),
                    -1: lambda: one_over(z), -2: lambda: one_over(_mul(rw, z, z))}
        if k.imag == 0 and k.real in shortcut:
            return shortcut[k.real]()
        return _general_pow(rw, z, k)
    if t == aten.pow.Scalar:  # a Python base: 1 gives ones, any other a 0-d base tensor of the result's dtype
        base = complex(a[0])
        if base == 1:
            return _ones(rw, node)
        z = rw.pair(*(rw.emit(aten.full.default, [], v, dtype=_real_dtype(node)) for v in (base.real, base.imag)))
        return _general_pow(rw, z, rw.as_pair(a[1]))
    assert t == aten.pow.Tensor_Tensor
    return _general_pow(rw, rw.as_pair(a[0]), rw.as_pair(a[1]))


# ---- inverse functions -------------------------------------------------------------------------------------------

def _asinh_parts(rw: Any, a: fx.Node, b: fx.Node) -> tuple[fx.Node, fx.Node]:
    """asinh(a + bi) as (real, imaginary) nodes (see the module docstring). w^2 + 1 has the real part
    (1 - b)(1 + b) + a^2, exact near the branch points +-i where 1 - b^2 would round; a real argument keeps b (its
    sign of zero) as the imaginary part."""
    e = rw.emit
    ax = e(aten.abs.default, a)
    w = rw.pair(ax, b)
    one_minus_b_sq = e(aten.mul.Tensor, e(aten.rsub.Scalar, b, 1.0), e(aten.add.Scalar, b, 1.0))
    s = sqrt_pair(rw, rw.pair(e(aten.add.Tensor, one_minus_b_sq, e(aten.mul.Tensor, ax, ax)),
                              e(aten.mul.Scalar, e(aten.mul.Tensor, ax, b), 2.0)))
    s_re, s_im = _re_im(rw, s)
    w2 = rw.pair(e(aten.mul.Tensor, e(aten.sub.Tensor, ax, b), e(aten.add.Tensor, ax, b)),
                 e(aten.mul.Scalar, e(aten.mul.Tensor, ax, b), 2.0))
    u = _plus(rw, w, rw.divide(("complex", w2), ("complex", rw.pair(e(aten.add.Scalar, s_re, 1.0), s_im))))
    small_re, small_im = _re_im(rw, log1p_pair(rw, u))  # |w| < 1/2: log1p(w + s - 1), no cancellation
    mid_re, mid_im = _re_im(rw, log_pair(rw, _plus(rw, w, s)))
    far_re, far_im = _re_im(rw, log_pair(rw, w))
    size = rw.hypot(w)
    small, big = e(aten.lt.Scalar, size, 0.5), e(aten.gt.Scalar, size, _BIG)
    re = e(aten.where.self, big, e(aten.add.Scalar, far_re, math.log(2.0)), e(aten.where.self, small, small_re, mid_re))
    im = e(aten.where.self, big, far_im, e(aten.where.self, small, small_im, mid_im))
    return e(aten.copysign.Tensor, re, a), e(aten.where.self, e(aten.eq.Scalar, b, 0.0), b, im)


def _atanh_parts(rw: Any, a: fx.Node, b: fx.Node) -> tuple[fx.Node, fx.Node]:
    """atanh(a + bi) as (real, imaginary) nodes (see the module docstring). Where 4|a| / den overflows (beside the
    branch points +-1), the real part is (log 4|a| - log den) / 4 with log den = 2 log hypot(1 - |a|, b); at an
    infinite argument it is (+-0, +-pi/2), as C's catanh."""
    e = rw.emit
    ax = e(aten.abs.default, a)
    one_minus = e(aten.rsub.Scalar, ax, 1.0)
    den = e(aten.add.Tensor, e(aten.mul.Tensor, one_minus, one_minus), e(aten.mul.Tensor, b, b))
    ratio = e(aten.div.Tensor, e(aten.mul.Scalar, ax, 4.0), den)
    re = e(aten.mul.Scalar, e(aten.log1p.default, ratio), 0.25)
    log_den = e(aten.mul.Scalar, e(aten.log.default, rw.hypot(rw.pair(one_minus, b))), 2.0)
    re_split = e(aten.mul.Scalar, e(aten.sub.Tensor, e(aten.log.default, e(aten.mul.Scalar, ax, 4.0)), log_den), 0.25)
    re = e(aten.where.self, e(aten.isinf.default, ratio), re_split, re)
    x = e(aten.sub.Tensor, e(aten.mul.Tensor, e(aten.rsub.Scalar, a, 1.0), e(aten.add.Scalar, a, 1.0)),
          e(aten.mul.Tensor, b, b))
    im = e(aten.mul.Scalar, e(aten.atan2.default, e(aten.mul.Scalar, b, 2.0), x), 0.5)
    a_inf, b_inf = e(aten.isinf.default, ax), e(aten.isinf.default, b)
    re = e(aten.where.self, e(aten.logical_or.default, a_inf, b_inf), e(aten.full_like.default, re, 0.0), re)
    quarter_turn = e(aten.logical_or.default, b_inf, e(aten.logical_and.default, a_inf, e(aten.logical_not.default,
                                                                                          e(aten.isnan.default, b))))
    im = e(aten.where.self, quarter_turn, e(aten.copysign.Tensor, e(aten.full_like.default, im, math.pi / 2), b), im)
    re = e(aten.where.self, e(aten.eq.Scalar, a, 0.0), a, re)  # the imaginary axis: atanh(iy) = i atan(y)
    return e(aten.copysign.Tensor, re, a), im


def _inverse(rw: Any, node: fx.Node) -> fx.Node:
    e = rw.emit
    a, b = _re_im(rw, rw.env[node.args[0]])
    t = node.target
    if t == aten.asinh.default:
        return rw.pair(*_asinh_parts(rw, a, b))
    if t == aten.atanh.default:
        return rw.pair(*_atanh_parts(rw, a, b))
    if t == aten.atan.default:  # -i atanh(iz), iz = -b + ai
        p, q = _atanh_parts(rw, e(aten.neg.default, b), a)
        return rw.pair(q, e(aten.neg.default, p))
    p, q = _asinh_parts(rw, e(aten.neg.default, b), a)  # asinh(iz) = p + qi; asin z = q - pi
    # (+-inf, NaN): glibc's casin gives (NaN, +inf), whatever the sign of NaN neg(b) carries
    blown = e(aten.logical_and.default, e(aten.isinf.default, a), e(aten.isnan.default, b))
    p = e(aten.where.self, blown, e(aten.full_like.default, p, float("-inf")), p)
    if t == aten.asin.default:
        return rw.pair(q, e(aten.neg.default, p))
    acos_re = e(aten.rsub.Scalar, q, math.pi / 2)  # acos z = pi/2 - asin z = (pi/2 - q) + p i
    if t == aten.acos.default:
        return rw.pair(acos_re, p)
    assert t == aten.acosh.default
    return rw.pair(e(aten.abs.default, p), e(aten.copysign.Tensor, acos_re, b))


def _silu(rw: Any, node: fx.Node) -> fx.Node:
    """z / (1 + exp(-z)), as eager's complex silu."""
    z = rw.env[node.args[0]]
    return rw.divide(("complex", z), ("complex", one_plus_exp_neg(rw, z)))


# ---- products ----------------------------------------------------------------------------------------------------

def _same_dtype(node: fx.Node) -> None:
    dtype = node.kwargs.get("dtype")
    if dtype is not None and dtype != _val(node.args[0]).dtype:
        raise ComplexUnsupported(f"a complex product cast to {dtype}")


def _tree_product(rw: Any, p: fx.Node, dim: int, n: int) -> fx.Node:
    """The product along ``dim`` (of size n >= 1) of the pairs ``p``, kept as a dim of size 1: halves multiplied."""
    e = rw.emit
    while n > 1:
        h = n // 2
        m = _mul(rw, e(aten.slice.Tensor, p, dim, 0, h), e(aten.slice.Tensor, p, dim, h, 2 * h))
        if n % 2:
            m = e(aten.cat.default, [m, e(aten.slice.Tensor, p, dim, 2 * h, n)], dim)
        p, n = m, h + n % 2
    return p


def _prod(rw: Any, node: fx.Node) -> fx.Node:
    _same_dtype(node)
    src, z = node.args[0], rw.env[node.args[0]]
    shape = list(_val(src).shape)
    if node.target == aten.prod.default or not shape:  # every element (a 0-d value is its own product)
        if not shape:
            return rw.emit(aten.clone.default, z)
        z, dim, keep = rw.emit(aten.view.default, rw.emit(aten.clone.default, z, memory_format=torch.contiguous_format),
                               [-1, 2]), 0, False
        n = math.prod(shape)
    else:
        dim, keep = rw.dim(src, node.args[1]), bool(node.args[2]) if len(node.args) > 2 else False
        n = shape[dim]
    if n == 0:
        return _ones(rw, node)
    p = _tree_product(rw, z, dim, n)
    return p if keep else rw.emit(aten.squeeze.dim, p, dim)


def _cumprod(rw: Any, node: fx.Node) -> fx.Node:
    """A Hillis-Steele scan: after the step of stride k, each element holds the product of the 2k elements up to it."""
    _same_dtype(node)
    src, p = node.args[0], rw.env[node.args[0]]
    if _val(src).dim() == 0:
        return rw.emit(aten.clone.default, p)
    dim = rw.dim(src, node.args[1])
    n, k, e = _val(src).shape[dim], 1, rw.emit
    while k < n:
        shifted = _mul(rw, e(aten.slice.Tensor, p, dim, k, n), e(aten.slice.Tensor, p, dim, 0, n - k))
        p = e(aten.cat.default, [e(aten.slice.Tensor, p, dim, 0, k), shifted], dim)
        k *= 2
    return e(aten.clone.default, p)


RULES: dict[Any, Callable[[Any, fx.Node], fx.Node]] = {
    aten.log1p.default: _log1p, aten.expm1.default: _expm1,
    aten.pow.Tensor_Scalar: _pow, aten.pow.Tensor_Tensor: _pow, aten.pow.Scalar: _pow,
    aten.asin.default: _inverse, aten.acos.default: _inverse, aten.atan.default: _inverse,
    aten.asinh.default: _inverse, aten.acosh.default: _inverse, aten.atanh.default: _inverse,
    aten.silu.default: _silu,
    aten.prod.default: _prod, aten.prod.dim_int: _prod, aten.cumprod.default: _cumprod,
}
TAKES_KWARGS = {aten.prod.default, aten.prod.dim_int, aten.cumprod.default}  # dtype=, checked
