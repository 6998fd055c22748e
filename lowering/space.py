"""Iteration-space algebra for fused loop kernels.

A fused kernel iterates over one *space* (a tuple of dim sizes). Every tensor it touches is
described by strides over that space (0 = broadcast). This module relates a node's shape to the
space (``coarsen_map``, ``refine``), turns a strided view consumed with broadcasting into strides
over the space (``broadcast_strides``), and canonicalizes a space into the tiled form the templates
render (``canonicalize``): size-1 dims dropped, compatible neighbours merged, dims ordered
``outer..., part, [reduce-outer...], free``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Free elements per partition a flattened elementwise space is split to: 8192 fp32 = 32 KiB per partition,
# so each [128, F] DMA moves 4 MiB and amortizes the ~1.3 us fixed DMA cost (REFERENCE 4.3 DMA).
STREAM_FREE_ELEMS = 8192

DimMap = tuple[tuple[int, ...], ...]  # for each dim of a shape: the consecutive space dims it covers


def refine(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """The coarsest shape of which both ``a`` and ``b`` are merges of consecutive dims (size-1 dims dropped)."""
    a = [d for d in a if d != 1]
    b = [d for d in b if d != 1]
    if math.prod(a) != math.prod(b):
        return None
    if math.prod(a) == 0:
        return (0,)  # both empty: one dim of nothing (the kernel has no element to visit)
    out: list[int] = []
    i = j = 0
    ra = a[0] if a else 1
    rb = b[0] if b else 1
    while i < len(a) and j < len(b):
        if ra == rb:
            out.append(ra)
            i += 1
            j += 1
            ra = a[i] if i < len(a) else 1
            rb = b[j] if j < len(b) else 1
        elif ra % rb == 0:
            out.append(rb)
            ra //= rb
            j += 1
            rb = b[j] if j < len(b) else 1
        elif rb % ra == 0:
            out.append(ra)
            rb //= ra
            i += 1
            ra = a[i] if i < len(a) else 1
        else:
            return None
    return tuple(out)


def coarsen_map(shape: Sequence[int], space: Sequence[int]) -> DimMap | None:
    """Map each dim of ``shape`` to the consecutive ``space`` dims it merges; size-1 dims map to ()."""
    result: list[tuple[int, ...]] = []
    c = 0
    for size in shape:
        if size == 1:
            result.append(())
            continue
        covered: list[int] = []
        prod = 1
        while prod < size and c < len(space):
            if space[c] == 1:
                c += 1
                continue
            prod *= space[c]
            covered.append(c)
            c += 1
        if prod != size:
            return None
        result.append(tuple(covered))
    while c < len(space) and space[c] == 1:
        c += 1
    return tuple(result) if c == len(space) else None


def project_map(shape: Sequence[int], space: Sequence[int], dims: Sequence[int]) -> DimMap | None:
    """Like ``coarsen_map`` but onto the sub-space ``dims`` (e.g. the kept dims of a reduction)."""
    sub = [space[d] for d in dims]
    m = coarsen_map(shape, sub)
    if m is None:
        return None
    return tuple(tuple(dims[c] for c in cov) for cov in m)


def broadcast_strides(src_shape: Sequence[int], src_strides: Sequence[int], dst_shape: Sequence[int]) -> list[int]:
    """Strides of ``src`` broadcast (numpy rules, right-aligned) to ``dst_shape``, per dst dim."""
    out = [0] * len(dst_shape)
    off = len(dst_shape) - len(src_shape)
    if off < 0:
        raise ValueError(f"cannot broadcast shape {tuple(src_shape)} to {tuple(dst_shape)}")
    for i, (size, stride) in enumerate(zip(src_shape, src_strides, strict=True)):
        target = dst_shape[off + i]
        if size == target:
            out[off + i] = stride if size != 1 else 0
        elif size != 1:
            raise ValueError(f"cannot broadcast shape {tuple(src_shape)} to {tuple(dst_shape)}")
    return out


def to_space(strides_over_shape: Sequence[int], shape: Sequence[int], dim_map: DimMap, space: Sequence[int]) -> tuple[int, ...]:
    """Re-express strides over ``shape`` as strides over ``space`` through ``dim_map`` (splits always work)."""
    out = [0] * len(space)
    for stride, covered in zip(strides_over_shape, dim_map, strict=True):
        inner = 1
        for c in reversed(covered):
            out[c] = stride * inner
            inner *= space[c]
    return tuple(out)


@dataclass(frozen=True)
class Canonical:
    space: tuple[int, ...]  # outer..., part, [red_outer...], free
    n_outer: int
    reduce_dims: tuple[int, ...]  # indices in `space`
    perm: tuple[tuple[int, ...], ...]  # for each canonical dim: original dims merged into it (outer->inner); () = inserted size-1

    def apply(self, strides: Sequence[int]) -> tuple[int, ...]:
        """Strides over the original space -> strides over the canonical space."""
        return tuple(strides[dims[-1]] if dims else 0 for dims in self.perm)


def canonicalize(space: Sequence[int], roles: Sequence[str], stride_sets: Sequence[Sequence[int]], *,
                 part_role: str, free_role: str, split_limit: int, split_above: int | None = None) -> Canonical:
    """Tile-friendly form of ``space``.

    ``roles`` tags each dim ('keep', 'red', 'm', 'n', 'batch'); dims are merged only with a neighbour of
    the same role when every stride vector allows it. The part dim is the last dim of ``part_role``,
    the free dim the last of ``free_role``; a lone dim larger than ``split_above`` (default
    ``split_limit``) is split in two, ``[rows, free]`` with ``free <= split_limit``, so that partitions
    are used.
    """
    groups: list[list[int]] = [[d] for d in range(len(space)) if space[d] != 1]
    merged: list[list[int]] = []
    for g in groups:
        if merged:
            prev = merged[-1]
            a, b = prev[-1], g[0]
            if roles[a] == roles[b] and all(s[a] == s[b] * space[b] for s in stride_sets):
                prev.extend(g)
                continue
        merged.append(list(g))
    # Order: everything else, then part-role dims, then reduce/free-role dims (stable within a role).
    order_key = {part_role: 1, free_role: 2}
    if part_role == free_role:
        order_key = {part_role: 1}
    ordered = sorted(merged, key=lambda g: order_key.get(roles[g[0]], 0))
    sizes = [math.prod(space[d] for d in g) for g in ordered]
    free_idx = max((i for i, g in enumerate(ordered) if roles[g[0]] == free_role), default=None)
    perm: list[tuple[int, ...]] = [tuple(g) for g in ordered]
    split: tuple[int, int] | None = None
    if free_idx is None:
        perm.append(())
        sizes.append(1)
        free_idx = len(perm) - 1
    part_candidates = [i for i, g in enumerate(ordered) if g and roles[g[0]] == part_role and i != free_idx]
    if part_candidates:
        part_idx = part_candidates[-1]
    else:
        part_idx = None
    threshold = split_limit if split_above is None else split_above
    if part_idx is None and part_role == free_role and sizes[free_idx] > threshold:
        split = _split(sizes[free_idx], split_limit)
    if split is not None:
        # Split the lone free dim into (part, free): strides derive from the last merged original dim.
        a, b = split
        dims = perm[free_idx]
        perm[free_idx:free_idx + 1] = [("split", *dims), dims]  # type: ignore[list-item]
        sizes[free_idx:free_idx + 1] = [a, b]
        part_idx, free_idx = free_idx, free_idx + 1
    if part_idx is None:
        perm.insert(free_idx, ())
        sizes.insert(free_idx, 1)
        part_idx = free_idx
        free_idx += 1
    # Move part right before the reduce-outer/free block.
    n = len(perm)
    rest = [i for i in range(n) if i not in (part_idx, free_idx)]
    if free_role == "red":  # other reduced dims loop inside each phase; the rest are outer loops
        others = [i for i in rest if not _is_role(perm[i], roles, free_role)]
        red_outer = [i for i in rest if _is_role(perm[i], roles, free_role)]
    else:
        others, red_outer = rest, []
    final = others + [part_idx] + red_outer + [free_idx]
    new_perm = [perm[i] for i in final]
    new_sizes = [sizes[i] for i in final]
    reduce_dims: tuple[int, ...] = ()
    if free_role == "red":
        reduce_dims = tuple(range(len(others) + 1, len(final)))
    return Canonical(tuple(new_sizes), len(others), reduce_dims, tuple(_resolve(p, space, split) for p in new_perm))


def _is_role(dims: tuple, roles: Sequence[str], role: str) -> bool:
    real = [d for d in dims if isinstance(d, int)]
    return bool(real) and roles[real[0]] == role


def _resolve(p: tuple, space: Sequence[int], split: tuple[int, int] | None) -> tuple[int, ...]:
    # A split part dim is encoded as ("split", dims...): mark it with a negative sentinel handled by apply_split.
    if p and p[0] == "split":
        return (-1, *p[1:])
    return p


def canonical_strides(canon: Canonical, strides: Sequence[int]) -> tuple[int, ...]:
    """Strides over the original space -> over the canonical space (handles the split dim)."""
    out = []
    for i, dims in enumerate(canon.perm):
        if not dims:
            out.append(0)
        elif dims[0] == -1:  # split part dim: stride of the inner free part times its size
            inner = canon.space[i + 1]
            out.append(strides[dims[-1]] * inner)
        else:
            out.append(strides[dims[-1]])
    return tuple(out)


def _split(n: int, limit: int) -> tuple[int, int] | None:
    """Split a lone dim ``n`` into (rows, free): fill the 128 partitions first, keep free <= limit."""
    divisors = [b for b in range(1, min(limit, n) + 1) if n % b == 0]
    enough = [b for b in divisors if n // b <= 128]
    b = min(enough) if enough else max(divisors)
    if b in (1, n):
        return None  # n prime (or tiny): one partition row is all we can do
    return n // b, b
