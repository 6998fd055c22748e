"""Matmul lowerings: mm and bmm as TensorE kernels with K accumulation in PSUM.

The matmul is the anchor of its kernel; elementwise consumers (bias add, activation, scaling,
residual add) fuse into the PSUM eviction as an epilogue. Operands are read through their strided
views, so transposed weights cost no copy.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Any

import torch
from neuron_compile.codegen.plan_matmul import (
    DT_A,
    DT_B,
    ITEMSIZE,
    Tiles,
    dma_transposable,
    geometry,
    moving_tile,
    operands,
    transpose_rows,
)
from neuron_compile.lowering.dtypes import DTYPES
from neuron_compile.lowering.ir import LoopKernel
from neuron_compile.lowering.registry import register_lowering
from torch import fx

from neuron_compile.config import config
from neuron_compile.errors import LoweringError
from neuron_compile.simulator_limits import PMAX, PSUM_BANK_FMAX

log = logging.getLogger(__name__)

aten = torch.ops.aten

_MM_DTYPES = tuple(d for d in DTYPES if d.is_floating_point)  # float64 runs as float32; FP8 as bf16 operand tiles


def _mm_check(node: fx.Node) -> str | None:
    for a in node.args[:2]:
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dtype not in _MM_DTYPES:
            return f"matmul on {val.dtype} is not supported (TensorE takes fp32/bf16/fp16)"
    return None


@register_lowering(aten.mm.default, aten.bmm.default, family="matmul", kind="matmul", check=_mm_check)
def lower_mm(ctx, node):
    """aten.mm/bmm: ``out[b, m, n] = sum_k a[b, m, k] b[b, k, n]`` (lowered by the loop-kernel emitter)."""
    raise AssertionError("matmul nodes are lowered by LoopGroupEmitter._matmul")


# -- tile configuration: candidates scored with the cost model ------------------------------------

SBUF_BUDGET_FRACTION = 0.7  # of the target's SBUF per partition: the rest holds epilogue tiles
MAX_ACCUMULATORS = 7  # PSUM tiles of [128, 512] fp32 (8 banks, one kept for TensorE transposes)
SPLIT_MIN_K_TILES = 16  # K-split blocks only pay off when full-K blocks can't be large (K > 2048)
SMALL_OPERAND = 128 * 512  # elements: below this a strided load may beat the transpose pass
ROW_GROUPS = (2, 4, 8, 16)  # epilogue row groups tried (Tiles.rg, then Tiles.sg) for the best block configurations
ROW_GROUP_FINALISTS = 4
SINGLE_BLOCK_K_TILES = 4  # K tiles (of 128) of a GEMM one block holds (single_block_choice): K <= 512
_TUNED: dict[str, Any] = {}


def candidates(kernel: LoopKernel, target: str) -> list[Tiles]:
    """Legal configurations, deduplicated after clamping to the shape.

    Streamed: K flows through (BM, BN) blocks in KB-tile chunks, each block's tiles owning a PSUM
    accumulator (BM/128 x BN/512 <= 7). Resident: an A block of all K stays in SBUF per M block and a
    B block of all K per (M, N) block (larger BM: B is re-read M/BM times instead of per 7 tiles).
    Split (large K only): up to 2048x2048 blocks whose K chunks add into SBUF fp32 partial sums, so
    neither operand is re-read more than N/BN or M/BM times however long K is. Resident and split
    blocks may also take their transposed operands straight from PE transposes (``direct``): no HBM
    scratch round trip, at the price of transposing B again for every M block (unless ``sb``: B
    alone still goes through the scratch, transposed once).
    An operand small enough is also tried without the TensorE transpose pass (strided load instead).
    """
    from neuron_compile.simulator.targets import LIMITS

    m, n, k = geometry(kernel)
    a, b = operands(kernel)
    nt = moving_tile(n)
    kt = math.ceil(k / PMAX)
    budget = LIMITS[target].sbuf_partition_bytes * SBUF_BUDGET_FRACTION
    isa, isb = ITEMSIZE[a.dtype], ITEMSIZE[b.dtype]

    def flags(op: Any) -> tuple[bool, ...]:
        if not op.transposable():
            return (False,)
        return (True, False) if op.rows * k <= SMALL_OPERAND else (True,)

    out: dict[tuple[Any, ...], Tiles] = {}
    whole_rows = any(op.opcode == "reduce" for op in kernel.ops)  # row ops in the epilogue: one N block

    def add(tm: int, tn: int, kb: int, resident: bool, split: bool = False) -> None:
        bm = min(tm * PMAX, _ceil_to(m, PMAX))
        bn = min(tn * nt, _ceil_to(n, nt))
        if whole_rows and bn < n:
            return
        kb = min(kb, kt)
        held = kt if resident else kb
        partials = bm // PMAX * bn * 4 if split else 0  # the SBUF fp32 partial sums of a block
        # double-buffered (plan_matmul): a resident B block, a split block's operand chunks
        # (resident with one N block: B once, the A blocks double-buffered)
        a_bufs, b_bufs = ((2, 1) if bn >= n else (1, 2)) if resident else (2, 2) if split else (1, 1)
        blocks = held * (a_bufs * bm * isa + b_bufs * bn * isb) + partials
        if blocks > budget:
            return
        for ta in flags(a):
            for tb in flags(b):
                t = Tiles(bm, bn, kb, ta, tb, resident, split)
                out.setdefault(t.to_attr(), t)
                kw = min(kb * PMAX, k)
                pipe_a = resident and ta and a.transposable() and k % PMAX == 0  # two row tiles of all of K
                # row staging of the direct transposes, two live per operand
                staging = 2 * ((ta and a.transposable()) * (k if pipe_a else kw * transpose_rows(a.dtype, kw, bm)) * isa
                               + (tb and b.transposable()) * kw * transpose_rows(b.dtype, kw, bn) * isb)
                # fp32 GEMMs are TensorE-bound (4x matmul cost): the scratch pass is never their bottleneck
                if (resident or split) and staging and max(isa, isb) == 2 and blocks + staging <= budget:
                    t = replace(t, direct=True)
                    variants = [t]
                    if ta and a.transposable() and tb and b.transposable() and m > bm:
                        # B transposed once into the HBM scratch, A straight into SBUF per M block
                        variants.append(replace(t, sb=True))
                    # ... each also with the DMA engines transposing what the HW-DGE transpose takes (TensorE free,
                    # the DMA queues busier: which is faster depends on the shape)
                    masks = dma_masks(ta, tb, a, b, k, target)
                    variants += [replace(v, dt=mask) for v in variants for mask in masks]
                    for v in variants:
                        out.setdefault(v.to_attr(), v)

    for tm in (1, 2, 4, 7):
        for tn in (1, 2, 4, 7):
            if tm * tn <= MAX_ACCUMULATORS:
                for kb in (4, 16):
                    add(tm, tn, kb, False)
    for tm in (1, 2, 4, 8, 12, 16, 32):
        for tn in (1, 2, 4):
            add(tm, tn, 16, True)
    if kt > SPLIT_MIN_K_TILES:
        for tm, tn in ((8, 2), (8, 4), (16, 1), (16, 2)):
            for kb in (8, 16, 32):
                add(tm, tn, kb, False, True)
    return list(out.values())


def dma_masks(ta: bool, tb: bool, a: Any, b: Any, k: int, target: str) -> list[int]:
    """The ``Tiles.dt`` values worth trying: each transposed operand the HW-DGE transpose takes, alone and together
    (B loaded once is often better on TensorE, A's row tiles on the DMA queues, or the reverse)."""
    bits = [bit for bit, flag, op in ((DT_A, ta, a), (DT_B, tb, b))
            if flag and op.transposable() and dma_transposable(op, k, target)]
    return bits + ([DT_A | DT_B] if len(bits) == 2 else [])


def _ceil_to(x: int, mult: int) -> int:
    return -(-x // mult) * mult


def _with_tiles(kernel: LoopKernel, tiles: Tiles) -> LoopKernel:
    ops = tuple(replace(op, attrs=tuple(sorted({**dict(op.attrs), "tiles": tiles.to_attr()}.items())))
                if op.opcode == "matmul" else op for op in kernel.ops)
    return replace(kernel, ops=ops)


def _score(kernel: LoopKernel, tiles: Tiles, target: str, budget_ns: float = math.inf) -> float:
    """The candidate's estimated time, or ``math.inf`` once its schedule passes ``budget_ns`` (it can't be picked)."""
    from neuron_compile.instruction_stream import kernel_time_ns

    ns = kernel_time_ns(_with_tiles(kernel, tiles), target, budget_ns)
    log.debug("%s: tiles %s -> %.1f us", kernel.name, tiles, ns / 1e3)
    return ns


def _finalist_budget(scored: list[tuple[float, Tiles]]) -> float:
    """The ROW_GROUP_FINALISTS-th best time scored so far (``math.inf`` until there are that many)."""
    if len(scored) < ROW_GROUP_FINALISTS:
        return math.inf
    return sorted(ns for ns, _ in scored)[ROW_GROUP_FINALISTS - 1]


def _signature(kernel: LoopKernel, target: str) -> str:
    """What the tile choice depends on: the GEMM's geometry and outer dims, its operands' layouts and dtypes, the
    result dtypes and the epilogue's op sequence (opcodes, kinds, dtypes; not the addresses of its operands). Layers
    and graphs repeating a GEMM shape (q/k/v projections, forward and backward) share one search."""
    a, b = operands(kernel)
    epilogue = [(op.opcode, op.kind, op.dtype) for op in kernel.ops if op.opcode != "matmul"]
    return json.dumps([target, config.lnc, kernel.space, kernel.n_outer, geometry(kernel),
                       [(o.rs, o.ks, o.rows, o.dtype) for o in (a, b)], [o.dtype for o in kernel.outputs],
                       len(kernel.inputs), epilogue], default=str)


def single_block_choice(kernel: LoopKernel, cands: list[Tiles]) -> Tiles | None:
    """The tiles of a GEMM one block holds (M <= 128, N within one moving tile, K <= 512, both operands small enough
    to load strided), chosen without scoring, else None.

    Every candidate of such a GEMM issues the same handful of instructions, give or take a transpose pass, so the
    cost model separates them by fixed costs of about a microsecond, while scoring each one takes tens of
    milliseconds (most of a small model's compile). Streamed blocks with strided operand loads (no TensorE
    transpose) are what the search picks for 9 in 10 of these GEMMs in the model zoo; when they are not a legal
    candidate (an operand that can't be loaded strided), the search runs as usual.
    """
    m, n, k = geometry(kernel)
    if m > PMAX or n > PSUM_BANK_FMAX or math.ceil(k / PMAX) > SINGLE_BLOCK_K_TILES:
        return None
    for t in cands:
        if not (t.ta or t.tb or t.resident or t.split or t.direct) and t.rg == 1 and not t.sg:
            return t
    return None


def _search(kernel: LoopKernel, cands: list[Tiles], target: str) -> tuple[Tiles, float]:
    """The fastest candidate: block configurations first (TensorE transposes), the DMA-transpose twins (``Tiles.dt``:
    A, B or both) of the best one, then epilogue row groups for the finalists and the best twin, then (rg, sg) for
    the best of each kind. Each kind's path is the search it would have without the other, so offering the DMA transposes never
    picks a slower kernel than leaving them out."""
    legal = set(cands)
    best, best_ns = cands[0], math.inf

    def score(cand: Tiles, budget: float) -> float:
        nonlocal best, best_ns
        ns = _score(kernel, cand, target, budget)
        if ns < best_ns:
            best, best_ns = cand, ns
        return ns

    # a candidate's schedule stops once it is slower than the ROW_GROUP_FINALISTS best so far (it can be neither
    # the choice nor a finalist: those only get faster), later ones once slower than the best: the same choice
    scored: list[tuple[float, Tiles]] = []
    for cand in cands:
        if not cand.dt:
            scored.append((score(cand, _finalist_budget(scored)), cand))
    scored.sort(key=lambda x: x[0])
    finalists = [top for _, top in scored[:ROW_GROUP_FINALISTS]]
    twins = [replace(finalists[0], dt=mask) for mask in (DT_A, DT_B, DT_A | DT_B)
             if finalists and replace(finalists[0], dt=mask) in legal]
    twin_ns = {twin: score(twin, _finalist_budget(scored)) for twin in twins}
    # the best of each kind (TensorE transposes; DMA transposes of any operand) is refined on its own
    kind_best = {False: min(scored, key=lambda x: x[0]) if scored else (math.inf, best)}
    if twin_ns:
        kind_best[True] = min(((ns, twin) for twin, ns in twin_ns.items()), key=lambda x: x[0])
    # epilogue row groups (fewer, larger epilogue DMAs vs fewer stores to pipeline behind) for the best blocks
    for top in finalists + ([kind_best[True][1]] if twin_ns else []):
        for rg in ROW_GROUPS:
            if rg == top.rg or (rg - 1) * PMAX >= top.bm:
                continue
            cand = replace(top, rg=rg)
            kind = bool(cand.dt)
            ns = score(cand, kind_best[kind][0])
            if ns < kind_best[kind][0]:
                kind_best[kind] = (ns, cand)
    # stores more frequent than residual loads (less work behind the last store): (rg, sg) for the best blocks
    for _, base in list(kind_best.values()):
        for rg in (1, *ROW_GROUPS):
            for sg in (1, *ROW_GROUPS):
                if sg >= rg or (rg - 1) * PMAX >= base.bm:
                    continue
                score(replace(base, rg=rg, sg=sg), best_ns)
    return best, best_ns


def tune(kernel: LoopKernel) -> LoopKernel:
    """The kernel with the candidate tile configuration the cost model estimates fastest.

    Cached in-process per GEMM signature (:func:`_signature`; a cached choice is reused only where its blocks are one
    of this kernel's legal candidates, before the epilogue row groups the search adds); the choice is written into
    the IR, so cached artifacts keep it.
    """
    target = config.target
    sig = _signature(kernel, target)
    cands = candidates(kernel, target)
    if not cands:
        raise LoweringError(f"{kernel.name}: no matmul tile configuration fits SBUF on {target}")
    cached = _TUNED.get(sig)
    if cached is not None and replace(cached, rg=1, sg=0) in cands:  # the search's row groups refine a candidate
        return _with_tiles(kernel, cached)
    best, best_ns = cands[0], math.inf
    rule = single_block_choice(kernel, cands) if len(cands) > 1 else None
    if rule is not None:
        best = rule
    elif len(cands) > 1:
        best, best_ns = _search(kernel, cands, target)
    log.debug("%s: chose tiles %s of %d candidates", kernel.name, best, len(cands))
    _TUNED[sig] = best
    return _with_tiles(kernel, best)
