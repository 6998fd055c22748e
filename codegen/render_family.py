"""Plans for the kernel families whose template is the whole kernel (sort, ...).

Each family template (``templates/<family>.nki.j2``) extends the shared frame and renders the kernel
from the IR (``k``) and a plan this module computes as plain data: loop extents, the outer-loop offset
terms, network stages, sentinel values. No NKI text is built here; :func:`family_plan` only returns
numbers, tuples and strings naming NKI ops.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from neuron_compile.lowering.ir import Access, SearchKernel, SortKernel

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
NAN_KEY = 0x7FC00000  # every NaN's key: above +inf's (0x7F800000), below the ascending pad key


def outer_terms(space: tuple[int, ...], n_outer: int, access: Access | None) -> list[tuple[int, int, int]]:
    """(divisor, size, stride) per outer dim: the dim's index is ``o // divisor % size`` of one flat loop ``o``."""
    if access is None:
        return []
    terms = []
    div = 1
    for d in range(n_outer - 1, -1, -1):
        if access.strides[d] and space[d] > 1:
            terms.append((div, space[d], access.strides[d]))
        div *= space[d]
    return terms[::-1]


def _sort_plan(k: SortKernel) -> dict[str, Any]:
    n = k.space[-1]
    n_pad = 1 << max(n - 1, 0).bit_length()
    stages = []
    size = 2
    while size <= n_pad:
        half = size // 2
        while half >= 1:
            # one compare-exchange step: pairs (i, i + half) inside blocks of `size` (sorted up, then down)
            stages.append((size, half, max(n_pad // (2 * size), 1), min(2, n_pad // size), size // (2 * half)))
            half //= 2
        size *= 2
    lo, hi = k.keep
    return {
        "n": n, "n_pad": n_pad, "rows": k.space[-2], "outer": math.prod(k.space[:k.n_outer]),
        "src_terms": outer_terms(k.space, k.n_outer, k.src),
        "val_terms": outer_terms(k.space, k.n_outer, k.values),
        "idx_terms": outer_terms(k.space, k.n_outer, k.indices),
        "stages": tuple(stages), "lo": lo, "width": hi - lo,
        "key_cmp": "less" if k.descending else "greater",
        "pad_key": INT32_MIN if k.descending else INT32_MAX, "nan_key": NAN_KEY,
        "carry_values": k.key == "float" and (k.values is not None or bool(k.select)),
    }


SEARCH_CHUNK = 2048  # values per partition per chunk: ~10 live [P, F] int32 tiles, 80 KiB


def _search_plan(k: SearchKernel) -> dict[str, Any]:
    m = k.space[-1]
    return {
        "m": m, "rows": k.space[-2], "outer": math.prod(k.space[:k.n_outer]), "chunk": max(1, min(SEARCH_CHUNK, m)),
        "steps": k.n_seq.bit_length(),  # each step at least halves every [lo, hi): n_seq -> 0
        "val_terms": outer_terms(k.space, k.n_outer, k.values), "out_terms": outer_terms(k.space, k.n_outer, k.out),
        "seq_terms": outer_terms(k.space, k.n_outer, k.seq), "sorter_terms": outer_terms(k.space, k.n_outer, k.sorter),
    }


_PLANS = {SortKernel: _sort_plan, SearchKernel: _search_plan}


def family_plan(kernel: Any) -> dict[str, Any]:
    return _PLANS[type(kernel)](kernel)
