"""The sympy index algebra (lowering/index_algebra.py) agrees with torch's own views.

Seeded property tests: random strided tensors (permuted, sliced, expanded, 0-d, size-0 and size-1
dims) and random view chains are applied both to a real torch tensor and to the algebra; every
element the algebra addresses in the source buffer must hold the value torch's result holds, the
algebra must find an affine access whenever torch returns a view, and its strides/offset must then
be torch's ``stride()``/``storage_offset()``.
"""

from __future__ import annotations

import itertools
import logging
import math
import random

import pytest
import sympy
import torch
from neuron_compile.lowering import index_algebra as ia
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

log = logging.getLogger(__name__)

SIZES = (0, 1, 1, 2, 2, 3, 4)


def _factorization(rng: random.Random, numel: int) -> tuple[int, ...]:
    """A random shape (rank 0-4, size-1 dims included) with ``numel`` elements."""
    if numel == 0:
        rank = rng.randint(1, 4)
        shape = [rng.choice((1, 2, 3)) for _ in range(rank)]
        shape[rng.randrange(rank)] = 0
        return tuple(shape)
    dims: list[int] = []
    rest = numel
    for _ in range(rng.randint(0, 3)):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = rng.choice(divisors)
        dims.append(d)
        rest //= d
    if rest != 1 or not dims and numel != 1:
        dims.append(rest)
    if rng.random() < 0.3:
        dims.insert(rng.randint(0, len(dims)), 1)
    rng.shuffle(dims)
    return tuple(dims)


def _random_strided(rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, x): ``x`` is a permuted/sliced/expanded view of the contiguous ``base``."""
    shape = [rng.choice(SIZES) if rng.random() < 0.15 else rng.choice(SIZES[1:]) for _ in range(rng.randint(0, 4))]
    base = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
    x = base
    if x.dim() > 1 and rng.random() < 0.7:
        x = x.permute(*rng.sample(range(x.dim()), x.dim()))
    if x.dim() and rng.random() < 0.5:
        d = rng.randrange(x.dim())
        x = x[(slice(None),) * d + (slice(rng.randint(0, 1), None, rng.randint(1, 2)),)]
    if x.dim() and rng.random() < 0.3:
        ones = [d for d in range(x.dim()) if x.shape[d] == 1]
        if ones:
            target = list(x.shape)
            target[rng.choice(ones)] = rng.randint(2, 3)
            x = x.expand(target)
    return base, x


def _source(x: torch.Tensor) -> ia.IndexedView:
    return ia.source(tuple(x.shape), tuple(x.stride()), x.storage_offset())


def _check_values(base: torch.Tensor, got: ia.IndexedView, expected: torch.Tensor) -> None:
    assert got.shape == tuple(expected.shape)
    flat = base.reshape(-1)
    for idx in itertools.product(*(range(s) for s in got.shape)):
        at = ia.evaluate(got.index, idx)
        assert flat[at].item() == expected[idx].item(), (idx, sympy.sstr(got.index))


def _is_view_of(y: torch.Tensor, base: torch.Tensor) -> bool:
    return y is base or y._base is base


@pytest.mark.parametrize("seed", range(6))
def test_reshape_agrees_with_torch_view(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        base, x = _random_strided(rng)
        new_shape = _factorization(rng, x.numel())
        got = ia.reshape(_source(x), new_shape)
        try:
            view = x.view(new_shape)
        except RuntimeError:
            view = None
        where = f"{tuple(x.shape)} strides {x.stride()} -> {new_shape}"
        assert (view is not None) == got.affine, f"{where}: torch view {view is not None}, algebra: {got.reason}"
        y = x.reshape(new_shape)
        assert y._is_view() == got.affine or y is x, where
        if view is not None:
            assert got.strides == view.stride(), where
            assert got.offset == view.storage_offset() or view.numel() == 0, where
        else:
            assert "floor-division/modulo" in got.reason and got.strides is None, where
        if y.numel():
            _check_values(base, got, y)


@pytest.mark.parametrize("seed", range(4))
def test_reshape_access_matches_compute_stride(seed: int) -> None:
    """The lowering's decision (reshape_access) is torch's: a view exactly when x.view() works, same strides."""
    rng = random.Random(100 + seed)
    for _ in range(80):
        _, x = _random_strided(rng)
        new_shape = _factorization(rng, x.numel())
        got = ia.reshape_access(tuple(x.shape), tuple(x.stride()), new_shape)
        try:
            expected = x.view(new_shape).stride()
        except RuntimeError:
            expected = None
        if expected is None:
            assert isinstance(got, ia.NotAffine) and got.reason.startswith(f"reshape {tuple(x.shape)} -> {new_shape}: ")
        else:
            assert got == expected, f"{tuple(x.shape)} {x.stride()} -> {new_shape}"


def _random_op(rng: random.Random, y: torch.Tensor, first: bool) -> tuple[str, tuple]:
    n = y.dim()
    choices = ["reshape", "unsqueeze"] + (["permute", "slice", "squeeze", "expand"] if n else [])
    if n and all(s > 0 for s in y.shape):
        choices.append("select")
    if first:
        choices.append("as_strided")
    op = rng.choice(choices)
    if op == "reshape":
        return op, (_factorization(rng, y.numel()),)
    if op == "unsqueeze":
        return op, (rng.randint(-n - 1, n),)
    if op == "permute":
        return op, (tuple(rng.sample(range(n), n)),)
    if op == "slice":
        d = rng.randrange(n)
        return op, (d, rng.choice((None, 0, 1, -2)), rng.choice((None, -1, 3, 2)), rng.randint(1, 3))
    if op == "squeeze":
        return op, (None if rng.random() < 0.5 else (rng.randrange(n),),)
    if op == "expand":
        target = tuple(s if s != 1 or rng.random() < 0.5 else 3 for s in y.shape)
        return op, (((2,) if rng.random() < 0.3 else ()) + target,)
    if op == "select":
        d = rng.randrange(n)
        return op, (d, rng.randrange(-y.shape[d], y.shape[d]))
    # as_strided over the base storage (only as the first op: torch's copies have their own storage)
    numel = y.numel()
    shape = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 2)))
    strides = tuple(rng.randint(0, 2) for _ in shape)
    extent = sum((s - 1) * st for s, st in zip(shape, strides, strict=True))
    if numel <= extent:
        return "unsqueeze", (0,)
    return op, (shape, strides, rng.randint(0, numel - 1 - extent))


def _torch_apply(y: torch.Tensor, op: str, args: tuple) -> torch.Tensor:
    if op == "reshape":
        return y.reshape(args[0])
    if op == "permute":
        return y.permute(*args[0])
    if op == "slice":
        d, start, end, step = args
        return y[(slice(None),) * d + (slice(start, end, step),)]
    if op == "squeeze":
        return y.squeeze() if args[0] is None else y.squeeze(args[0])
    if op == "as_strided":
        return y.as_strided(*args)
    return getattr(y, op)(*args)


@pytest.mark.parametrize("seed", range(8))
def test_view_chains_address_torch_values(seed: int) -> None:
    """Random chains of view ops: same elements as torch; torch's strides whenever torch kept a view."""
    rng = random.Random(1000 + seed)
    improved = 0
    for _ in range(40):
        base, x = _random_strided(rng)
        y, v = x, _source(x)
        for step in range(rng.randint(1, 4)):
            op, args = _random_op(rng, y, first=step == 0 and x is base)
            y = _torch_apply(y, op, args)
            v = _algebra_apply(v, op, args)
            where = f"{op}{args} -> {tuple(y.shape)}"
            if _is_view_of(y, base):
                assert v.affine, f"{where}: torch kept a view, algebra says: {v.reason}"
                assert v.strides == y.stride(), where
                assert v.offset == y.storage_offset() or y.numel() == 0, where
            elif v.affine:
                improved += 1  # torch copied; the composed access still reaches the base buffer directly
        if y.numel():
            _check_values(base, v, y)
    log.info("seed %d: %d chain steps affine where torch copies", seed, improved)


def _algebra_apply(v: ia.IndexedView, op: str, args: tuple) -> ia.IndexedView:
    if op == "reshape":
        return ia.reshape(v, tuple(args[0]))
    if op == "permute":
        return ia.permute(v, tuple(args[0]))
    if op == "slice":
        return ia.slice_(v, *args)
    if op == "squeeze":
        return ia.squeeze(v, args[0])
    if op == "expand":
        return ia.expand(v, tuple(args[0]))
    if op == "select":
        return ia.select(v, *args)
    if op == "unsqueeze":
        return ia.unsqueeze(v, *args)
    return ia.as_strided(v, *args)


def test_reshape_of_a_permuted_tensor_needs_a_copy_with_a_reason() -> None:
    x = torch.arange(24.0).reshape(2, 3, 4).permute(0, 2, 1)  # (2, 4, 3) strides (12, 1, 4)
    got = ia.reshape_access(tuple(x.shape), tuple(x.stride()), (2, 12))
    assert isinstance(got, ia.NotAffine)
    assert got.reason == ("reshape (2, 4, 3) -> (2, 12): result dim 1 (size 12) indexes the source only "
                          "through floor-division/modulo (index 12*i0 + ((i1//3)) + 4*(ModularIndexing(i1, 1, 3))): "
                          "no single stride per dim")
    with pytest.raises(RuntimeError):
        x.view(2, 12)


def test_reshape_back_after_a_non_affine_reshape_is_affine_again() -> None:
    """permute -> flatten -> unflatten: torch copies at the flatten; the composed index is the permute's."""
    x = torch.arange(24.0).reshape(2, 3, 4)
    v = ia.permute(_source(x), (0, 2, 1))
    flat = ia.reshape(v, (2, 12))
    back = ia.reshape(flat, (2, 4, 3))
    assert not flat.affine and back.affine
    assert (back.strides, back.offset) == ((12, 1, 4), 0)
    y = x.permute(0, 2, 1).reshape(2, 12).reshape(2, 4, 3)
    assert not _is_view_of(y, x)
    assert torch.equal(x.as_strided(back.shape, back.strides, back.offset), y)


def test_simplify_merges_digits_and_drops_wrapped_terms() -> None:
    i0, i1 = ia.index_symbol(0), ia.index_symbol(1)
    flat = 2 * i0 + i1  # (3, 2) row-major over a (2, 3) source
    expr = 3 * ModularIndexing(flat, 3, 2) + ModularIndexing(flat, 1, 3)
    assert ia.simplify(expr, {i0: 3, i1: 2}) == 2 * i0 + i1
    assert ia.simplify(ModularIndexing(6 * i0 + i1, 1, 6), {i0: 5, i1: 6}) == i1
    assert ia.simplify(ModularIndexing(i1, 2, 3), {i1: 6}) == FloorDiv(i1, 2)  # i1 // 2 < 3: no wrap
    assert ia.simplify(ModularIndexing(i1, 2, 3), {i1: 8}) == ModularIndexing(i1, 2, 3)


def test_zero_dim_and_empty_views() -> None:
    s = torch.tensor(5.0)
    got = ia.reshape(_source(s), (1, 1, 1))
    assert got.strides == s.view(1, 1, 1).stride() and got.index == 0
    e = torch.empty(0, 3).t()  # (3, 0) strides (1, 3)
    assert ia.reshape(_source(e), (3, 0)).strides == e.view(3, 0).stride()  # same shape keeps strides
    assert ia.reshape(_source(e), (0, 3)).strides == e.view(0, 3).stride()


def test_errors_say_what_is_wrong() -> None:
    v = ia.source((2, 3), (3, 1))
    with pytest.raises(ValueError, match=r"cannot reshape \(2, 3\) \(6 elements\) to \(4,\)"):
        ia.reshape(v, (4,))
    with pytest.raises(ValueError, match=r"cannot expand \(2, 3\) to \(2, 4\)"):
        ia.expand(v, (2, 4))
    with pytest.raises(ValueError, match=r"permute dims \(0, 0\) are not a permutation of 2 dims"):
        ia.permute(v, (0, 0))
    with pytest.raises(IndexError, match="select index 3 out of range for dim 0 of size 2"):
        ia.select(v, 0, 3)
    with pytest.raises(ValueError, match=r"not an affine access: reshape"):
        ia.reshape(ia.permute(v, (1, 0)), (6,)).pattern()
