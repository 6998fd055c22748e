"""Plans of the fused attention kernels: which variant, heads per group, scales, tiles, as plain data.

An :class:`AttentionKernel` renders through one of three body templates (``templates/attention_*.nki.j2``,
shared pieces in ``_attention_macros.nki.j2``; ``attention.nki.j2`` is the frame around the body):

* ``standard``: flash attention with the online softmax (any head size up to 128, additive masks, fp16);
* ``transposed``: transposed scores shifted by the exact row max, no transpose of P (heads of 32, 64 or 96,
  no mask, bf16/fp32);
* ``unshifted``: ``P = exp(s)`` without the row max, checked on chip, with the exact kernel (one of the
  two above) as its rerun (no mask, bf16/fp32, ``config.attention_unshifted``).

This module chooses the variant and computes what its template needs: the head group (the heads whose
rows move in one DMA each), the split of the softmax scale between ``Q^T`` and fp32, the causal bias
values, the per-tensor row loads (full 128-row tiles and a ragged tail), the offset terms of every HBM
access as ``(loop variable, stride)`` pairs, buffer shapes and the engine share of the P evictions. No NKI
text is built here: the templates write every statement.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from neuron_compile.lowering.attention import sbuf_budget, sbuf_bytes
from neuron_compile.lowering.ir import AttentionKernel

from neuron_compile.config import config
from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

# 128-row tiles transposed into one 2 KiB PSUM bank before a single eviction: 8 of 2-byte, 4 of fp32 values
TRANSPOSE_GROUP = {2: 8, 4: 4}
# Finite "minus infinity" of the causal bias tile, in the matmul dtype (identity x bias must stay NaN-free: an inf
# there makes 0 x inf): -3e38 in bf16/fp32. fp16 tops out at 65504, while its scores (fp32 in PSUM) reach 1e5 and
# more (|q|, |k| ~ 150 at d = 64): the diagonal of the fp16 identity is 65504 too, so TensorE adds -65504^2 ~ -4.3e9.
MASK_BIAS = {"float16": -65504.0}
MASK_BIAS_DEFAULT = -3.0e38
MASK_IDENT = {"float16": 65504.0}  # diagonal of the identity that adds the bias tile (default 1.0)
BANK_KEYS = 512  # fp32 scores per partition in one 2 KiB PSUM bank (also the matmul N limit)
PSUM_BANK_BYTES = 2048
PSUM_BANKS = 8
FP32_MAX = 3.4028234663852886e38  # bias clamp: a fully -inf row keeps a finite running max
# Per-partition SBUF for the Q/K/V/output rows of one head group: enough for 12 GPT-2 heads (1 KiB per tensor per
# head) or 4 heads of 2048 x 128 (4 KiB each); the rest of SBUF keeps the per-head working set and double buffers.
GROUP_ROWS_BYTES = 64 * 1024
QUERY_BLOCK = 4 * PMAX  # queries per S^T matmul (transposed/unshifted): 512 fp32 scores per partition = one PSUM bank
MAX_AUG_ROWS = 32  # augmentation rows start at partition d: a count <= 32 may start at 0/32/64/96
AUG_PER_HEAD = 2  # the negated row max in two matmul-dtype parts (hi, lo): rows d + j and d + G + j of head j
# Unshifted guard: a row passes when 2^-100 <= l <= 2^120, i.e. 2^-120 <= 1 / l <= 2^100 (0, inf and NaN fail both).
RECIP_MIN = 2.0 ** -120
RECIP_MAX = 2.0 ** 100


def _size(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def split_scale(k: AttentionKernel) -> tuple[float, float]:
    """``(q_scale, s_scale)``: ``Q^T`` is multiplied by ``q_scale`` as it is transposed (rounded to the matmul dtype)
    and the scores by ``s_scale`` in fp32 at the PSUM read; ``q_scale * s_scale == scale``.

    fp32: the whole scale is folded into ``Q^T``. bf16/fp16: only its nearest power of two (exact), the rest
    (within 2^+-0.5) is applied in fp32, as eager does: a rounded ``scale * q`` is off by up to 2^-9 (bf16) or 2^-12
    (fp16) relative, so a score ``s`` moves by up to ~``|s| 2^-9`` (bf16, d = 128, scores of +-10: output errors 4x
    eager's; fp16, +-1000: wrong rows). The residual can't make the causal bias (added to the p2-scaled scores)
    anything but hugely negative (bf16: -3e38 x r may become -inf in fp32, and exp(-inf) = 0)."""
    scale = k.scale
    if k.compute_dtype == "float32" or scale == 0 or not math.isfinite(scale):
        return scale, 1.0
    p2 = math.copysign(2.0 ** round(math.log2(abs(scale))), scale)
    return p2, scale / p2


def head_group(k: AttentionKernel, cap: int | None = None, grid: int = 1) -> int:
    """Heads whose Q/K/V/output rows move in one DMA each: the largest divisor of ``heads`` (at most ``cap``, and few
    enough that ``grid`` programs get a group each: ``lnc_cap``) whose rows fit ``GROUP_ROWS_BYTES`` per partition
    (and the kernel's SBUF budget with the per-head working set)."""
    rows, other = _standard_bytes(k)
    best = 1
    for g in range(2, min(k.heads, cap or k.heads, lnc_cap(k, grid)) + 1):
        if k.heads % g == 0 and g * rows <= GROUP_ROWS_BYTES and g * rows + other <= sbuf_budget():
            best = g
    return best


def lnc_cap(k: AttentionKernel, grid: int) -> int:
    """The most heads per group that still leave every one of ``grid`` programs a (batch, head group) unit: with
    fewer batches than programs (one batch on an LNC2 core) the heads of a batch are split over the programs."""
    if grid <= 1 or k.batch >= grid:
        return k.heads
    return max(1, k.heads // -(-grid // k.batch))


def rows_bytes(k: AttentionKernel) -> int:
    """Per-partition SBUF of one head's Q, K and V rows (what a group's prefetch keeps a second copy of)."""
    nq, nk = -(-k.sq // PMAX), -(-k.sk // PMAX)
    return (nq * k.d + nk * k.d + nk * k.dv) * _size(k.compute_dtype)


def _standard_bytes(k: AttentionKernel) -> tuple[int, int]:
    """Per-partition SBUF of the standard kernel: (one head's Q/K/V/output rows, the rest of its working set)."""
    osize = _size(k.outputs[0].dtype)
    rows = rows_bytes(k) + -(-k.sq // PMAX) * k.dv * osize
    working = sbuf_bytes(k.sq, k.sk, k.d, k.dv, _size(k.compute_dtype), osize, k.key_step, k.mask is not None)
    return rows, working - rows + mask_rows_bytes(k)


def mask_rows_bytes(k: AttentionKernel) -> int:
    """Per-partition SBUF of the mask rows the heads of a group share, or 0 when the mask is loaded per chunk.

    A mask with head stride 0 (a padding mask, [b, 1, s, s] or [b, 1, 1, s]) is the same for every head: its rows for
    a query tile (all keys, in the mask's own dtype) load once and serve the tile's steps of every head of the group,
    the next tile's rows loading meanwhile (two buffers), instead of one DMA per (head, 512-key chunk). A mask that
    varies by head (ALiBi, T5's position bias), or rows that don't fit the SBUF budget beside one head's working set,
    keep the per-chunk loads."""
    if k.mask is None or k.mask[2][1] != 0:
        return 0
    need = 2 * k.sk * _size(k.inputs[k.mask[0]].dtype)
    base = sbuf_bytes(k.sq, k.sk, k.d, k.dv, _size(k.compute_dtype), _size(k.outputs[0].dtype), k.key_step,
                      k.mask is not None)
    return need if base + need <= sbuf_budget() else 0


def prefetch_fits(k: AttentionKernel, group: int, resident: int, extra: int = 0) -> bool:
    """Whether the next group's rows (loaded while this group computes), and ``extra`` bytes a variant prepares
    from them ahead, fit beside the ``resident`` bytes."""
    return resident + group * rows_bytes(k) + extra <= sbuf_budget()


def _fitting(k: AttentionKernel, cap: int, size: Any, extra: Any = None) -> int:
    """The largest divisor of ``heads`` up to ``cap`` whose ``size(k, group)`` fits the SBUF budget together with a
    prefetched second copy of the group's rows when there is a next group (one group for every head of a single
    batch needs none), else the largest that fits without."""
    fits = [g for g in range(cap, 0, -1) if k.heads % g == 0 and size(k, g) <= sbuf_budget()]
    ahead = [g for g in fits if k.batch * k.heads <= g or prefetch_fits(k, g, size(k, g), extra(k, g) if extra else 0)]
    return (ahead or fits or [0])[0]


def head_bytes(k: AttentionKernel) -> int:
    """Per-partition SBUF of one resident head in the transposed-scores layouts: q, k, v rows, V | 1, Q^T and K^T."""
    cs = _size(k.compute_dtype)
    nq, nk = -(-k.sq // PMAX), -(-k.sk // PMAX)
    return (nq * k.d + nk * k.d + nk * k.dv + nk * (k.dv + 1) + k.sq + k.sk) * cs


def sbuf_bytes_t(k: AttentionKernel, group: int) -> int:
    """Per-partition SBUF of the transposed-scores kernel with ``group`` heads resident."""
    cs, os_ = _size(k.compute_dtype), _size(k.outputs[0].dtype)
    per_block = QUERY_BLOCK // PMAX * (k.dv * os_ + (k.d + AUG_PER_HEAD * group) * cs)  # output rows, mx
    onehot = AUG_PER_HEAD * group * k.sk * cs
    return group * head_bytes(k) + per_block * group + onehot + 2 * QUERY_BLOCK * cs + 8 * -(-k.sk // BANK_KEYS)


def transposed_group(k: AttentionKernel, grid: int = 1) -> int:
    """Heads per group for the transposed-scores kernel, or 0 when the kernel doesn't apply: a mask, heads it can't
    augment, or fp16 operands. The row max it shifts by is rounded to the matmul dtype, so ``exp(s - max)`` reaches
    ``exp(ulp(max) / 2)``: fp16 P overflows (> 65504 = e^11.09) once |max| >= 2^15 (an ulp of 32), giving inf/NaN rows,
    and the scale (folded into Q^T here) can't be split off in fp32 as the standard kernel does for fp16."""
    if k.mask is not None or k.d % 32 or k.d >= PMAX or k.dv + 1 > PMAX or k.compute_dtype == "float16":
        return 0
    return _fitting(k, head_group(k, cap=min(MAX_AUG_ROWS, PMAX - k.d) // AUG_PER_HEAD, grid=grid), sbuf_bytes_t)


def sbuf_bytes_u(k: AttentionKernel, group: int) -> int:
    """Per-partition SBUF of the unshifted kernel with ``group`` heads resident (the fallback runs after it)."""
    out_block = QUERY_BLOCK // PMAX * k.dv * _size(k.outputs[0].dtype)
    checks = 4 * 4 * -(-k.sq // PMAX)  # 1 / l, output row sums and two scratch columns per query tile
    # two output blocks: a block's last head is evicted (and the block stored) while the next block computes
    return group * (head_bytes(k) + 2 * out_block + checks) + 2 * QUERY_BLOCK * _size(k.compute_dtype) + 64


def transposed_ahead_bytes(k: AttentionKernel, group: int) -> int:
    """Per-partition SBUF of the next group's Q^T and K^T, which the unshifted kernel transposes (from the prefetched
    rows) during this group's last query block."""
    return group * (k.sq + k.sk) * _size(k.compute_dtype)


def unshifted_group(k: AttentionKernel, grid: int = 1) -> int:
    """Heads per group for the unshifted kernel, or 0 when it doesn't apply: an additive mask, the knob off, or
    fp16 operands (P is stored in the matmul dtype, and fp16's range, 2^-14..65504, would hold unshifted
    probabilities only for scores in about [-7, 11]; bf16 and fp32 share fp32's exponent range)."""
    if not config.attention_unshifted or k.mask is not None or k.d > PMAX or k.dv + 1 > BANK_KEYS \
            or k.compute_dtype not in ("bfloat16", "float32"):
        return 0
    return _fitting(k, head_group(k, grid=grid), sbuf_bytes_u, transposed_ahead_bytes)


def attention_plan(k: AttentionKernel) -> dict[str, object]:
    """How the kernel is rendered (for ``explain``): variant, heads per group, and the exact fallback if any."""
    tg = transposed_group(k)
    exact: dict[str, object] = {"variant": "transposed-scores" if tg else "standard", "head_group": tg or head_group(k)}
    if not tg:
        exact["key_step"] = k.key_step
    ug = unshifted_group(k)
    if not ug:
        return exact
    return {"variant": "unshifted", "head_group": ug, "query_block": QUERY_BLOCK,
            "fallback": " ".join(f"{a}={b}" for a, b in exact.items())}


def _load(name: str, access: tuple[int, int, tuple[int, ...]], rows: int, cols: int) -> dict[str, Any]:
    """``name[128, tiles, group, cols]``: row r of head ``hg + j`` on partition r % 128, tile r // 128, slot j; the
    full tiles move in one DMA and a ragged last tile in another, starting ``tail`` elements after the first."""
    arg, offset, (s_b, s_head, s_row, s_col) = access
    full, rem = divmod(rows, PMAX)
    return {"name": name, "arg": arg, "offset": offset, "terms": [("b", s_b), ("hg", s_head)], "s_head": s_head,
            "s_row": s_row, "s_col": s_col, "cols": cols, "full": full, "rem": rem, "tiles": full + (1 if rem else 0),
            "tail": full * PMAX * s_row}


def split_grid(k: AttentionKernel, grid: int) -> int:
    """Programs the kernel's (batch, head group) units spread over on a logical core of ``grid`` physical cores:
    ``grid`` when there are at least as many (batch, head) pairs, else 1 (disjoint output rows; with fewer batches
    than programs the head groups are capped so that every program gets one, ``lnc_cap``)."""
    return grid if grid > 1 and k.batch * k.heads >= grid else 1


def _common(k: AttentionKernel, group: int, resident: int, grid: int = 1, extra: int = 0) -> dict[str, Any]:
    """What every variant shares: the head group, its row loads (one group ahead when the next group's rows fit
    beside the ``resident`` bytes and there is a next group), the transposes of Q and K, the output store, and
    the launch grid its batch loop spreads over."""
    ob, oh, os_, od = k.out_strides
    prefetch = k.batch * k.heads > group and prefetch_fits(k, group, resident, extra)
    # later groups' Q^T, K^T from HBM (heads of 128 only, so never the transposed-scores kernel): the whole scale is
    # then applied in fp32 by the exp
    dma_t = prefetch and dma_transposable(k)
    q_scale, s_scale = (1.0, k.scale) if dma_t else split_scale(k)
    return {
        "group": group, "grid": grid, "prefetch": prefetch, "q_scale": q_scale, "s_scale": s_scale,
        "tg": TRANSPOSE_GROUP[_size(k.compute_dtype)],
        "rows": {"q": _load("q_rows", k.q, k.sq, k.d), "k": _load("k_rows", k.k, k.sk, k.d),
                 "v": _load("v_rows", k.v, k.sk, k.dv)},
        "out": {"terms": [("b", ob), ("hg", oh), ("q0", os_)], "s_head": oh, "s_row": os_, "s_col": od},
        "ident": MASK_IDENT.get(k.compute_dtype, 1.0), "mask_bias": MASK_BIAS.get(k.compute_dtype, MASK_BIAS_DEFAULT),
        "dma_t": dma_t,  # else Q and K rows transposed by TensorE
    }


def standard_plan(k: AttentionKernel, grid: int = 1) -> dict[str, Any]:
    """The flash-attention kernel: online softmax over key steps of <= ``key_step`` keys (one PSUM tile each)."""
    group = head_group(k, grid=grid)
    rows, other = _standard_bytes(k)
    p = _common(k, group, other + group * rows, grid)
    masked = k.mask is not None
    s_scale = p["s_scale"]
    p.update({
        "variant": "standard", "nq": -(-k.sq // PMAX), "key_step": k.key_step,
        # unmasked: the scale's residual multiplies the row max (in its last combine) and the exp; masked: it is
        # applied with the mask at the PSUM read
        "exp_scale": 1.0 if masked else s_scale,
        "fp32_max": FP32_MAX, "mask": None,
    })
    if k.mask is not None:
        arg, offset, (s_b, s_h, s_q, s_k) = k.mask
        p["mask"] = {"arg": arg, "offset": offset, "terms": [("b", s_b), ("h", s_h), ("q0", s_q), ("k0", s_k)],
                     "s_q": s_q, "s_k": s_k, "rows": mask_rows_bytes(k) > 0, "row_terms": [("b", s_b), ("qm", s_q)],
                     "dtype": k.inputs[arg].dtype}
    return p


def transposed_plan(k: AttentionKernel, group: int, grid: int = 1) -> dict[str, Any]:
    """The transposed-scores kernel: ``2 * group`` augmentation rows below the ``d`` contraction rows."""
    p = _common(k, group, sbuf_bytes_t(k, group), grid)
    p.update({"variant": "transposed", "ka": k.d + AUG_PER_HEAD * group, "nch_max": -(-k.sk // BANK_KEYS),
              "query_block": QUERY_BLOCK, "block_tiles": QUERY_BLOCK // PMAX})
    return p


def exact_plan(k: AttentionKernel, grid: int = 1) -> dict[str, Any]:
    """The exact kernel (softmax with the row max): transposed scores when they apply, else the standard one; its
    batches spread over ``split_grid(k, grid)`` programs."""
    grid = split_grid(k, grid)
    group = transposed_group(k, grid)
    return transposed_plan(k, group, grid) if group else standard_plan(k, grid)


def dma_transposable(k: AttentionKernel) -> bool:
    """Whether the DMA engines load the next head group's Q^T and K^T (HW-DGE ``nisa.dma_transpose``, NC-v3+: 2-byte
    elements, each row's ``d`` elements contiguous, row counts a multiple of 16) instead of TensorE transposing the
    loaded rows: the transposes and their PSUM evictions leave TensorE and VectorE (which carry the kernel) for a
    transfer at the transpose's share of the DMA bandwidth, hidden behind a whole group's compute. Heads of 128 only:
    a transpose's partitions are the head's d elements, and below 128 fewer of the 16 DMA engines serve it (GPT-2's
    d = 64 under the cost model: 8 engines at 128-byte runs, 45 us per group's Q^T against ~37 us of compute, so
    the kernel went DMA-bound, 150.6 -> 173.5 us). config.attention_dma_transpose."""
    from neuron_compile.simulator.targets import LIMITS

    return (config.attention_dma_transpose and LIMITS[config.target].nc_version >= 3 and _size(k.compute_dtype) == 2
            and k.d == PMAX and k.sq % 16 == 0 and k.sk % 16 == 0 and k.q[2][3] == 1 and k.k[2][3] == 1
            and all(k.inputs[a[0]].dtype == k.compute_dtype for a in (k.q, k.k)))


Tile = tuple[int, int, int, int]  # a key tile of a query block: (key tile, keys, queries that see it, first query)
Step = list[tuple[int, int, int, int, int]]  # its tiles: (key tile, column offset, keys, queries, first query)


def _pack_one_bank(tiles: list[Tile]) -> list[Step]:
    """Steps of one PSUM bank: each tile joins the step before it when it has as many keys and fits after it."""
    steps: list[Step] = []
    for j, kn, nw, qs in tiles:
        if steps and steps[-1][0][2] == kn:
            off = steps[-1][-1][1] + steps[-1][-1][3]
            if off + nw <= BANK_KEYS:
                steps[-1].append((j, off, kn, nw, qs))
                continue
        steps.append([(j, 0, kn, nw, qs)])
    return steps


def _pack_two_banks(tiles: list[Tile]) -> list[Step]:
    """Steps of up to two PSUM banks, balanced: the tiles of each run with as many keys go into banks first fit by
    decreasing width (no tile across a bank boundary); a step is a full bank and then any bank (an exp reads its
    columns without a gap), full banks paired with partial ones first so that the steps' widths (the exps' lengths)
    stay even: a short exp right before a two-bank step leaves ScalarE waiting for that step's scores (the diagonal
    tiles of a causal block, 512 384 256 128 queries, go as 512 | 256 and 384 + 128, not 512 | 384 and 256 + 128).
    The step holding the widest tile (every query tile: it starts the block's [O | l] accumulations) comes first."""
    steps: list[Step] = []
    start = 0
    while start < len(tiles):
        end = start
        while end < len(tiles) and tiles[end][1] == tiles[start][1]:
            end += 1
        banks: list[list[Tile]] = []
        for t in sorted(tiles[start:end], key=lambda t: -t[2]):
            fit = next((b for b in banks if sum(x[2] for x in b) + t[2] <= BANK_KEYS), None)
            if fit is None:
                banks.append([t])
            else:
                fit.append(t)
        full = [b for b in banks if sum(x[2] for x in b) == BANK_KEYS]
        part = [b for b in banks if sum(x[2] for x in b) < BANK_KEYS]
        pairs = [[f, p] for f, p in zip(full, part, strict=False)]
        rest = full[len(pairs):]
        pairs += [rest[i:i + 2] for i in range(0, len(rest), 2)] + [[p] for p in part[len(pairs):]]
        for pair in pairs:
            steps.append([(j, bi * BANK_KEYS + sum(x[2] for x in bank[:ti]), kn, nw, qs)
                          for bi, bank in enumerate(pair) for ti, (j, kn, nw, qs) in enumerate(bank)])
        start = end
    if not steps:
        return steps
    widest = max(range(len(steps)), key=lambda i: max(e[3] for e in steps[i]))
    return [steps[widest]] + steps[:widest] + steps[widest + 1:]


def score_steps(k: AttentionKernel, step_banks: int) -> tuple[list[list[Step]], list[int]]:
    """Per query block of the unshifted kernel, its key tiles in issue order, in steps of ``step_banks`` PSUM banks:
    the tiles of one step have their scores side by side in one ring slot and share one exp. In a causal block the
    diagonal tiles (masked, their P V waiting for GpSimd) form their own steps, the first of them first (its widest
    tile starts the [O | l] accumulations); the others are spread evenly among the full ones (one-bank steps) or go
    last (two-bank steps: the next unit's first step is a diagonal one too, as short, so ScalarE finds its scores
    ready). Also per block: the step from which the next group's TensorE transposes are spread."""
    order, lead = [], []
    for qb in range(0, k.sq, QUERY_BLOCK):
        nb = min(QUERY_BLOCK, k.sq - qb)
        diag: list[Tile] = []
        full: list[Tile] = []
        for j in range(-(-(min(k.sk, qb + nb) if k.causal else k.sk) // PMAX)):
            qs = max(qb, j * PMAX) if k.causal else qb
            (diag if k.causal and j * PMAX >= qb else full).append((j, min(PMAX, k.sk - j * PMAX), qb + nb - qs, qs))
        pack = _pack_two_banks if step_banks == 2 else _pack_one_bank
        ds, fs = pack(diag), pack(full)
        if step_banks == 2:
            js = ds[:1] + fs + ds[1:]
        else:
            js, di = [], 0
            for i in range(len(fs) + 1):
                while di < len(ds) and di * (len(fs) + 1) <= i * len(ds):
                    js.append(ds[di])
                    di += 1
                if i < len(fs):
                    js.append(fs[i])
            js += ds[di:]
        order.append(js)
        lead.append(min(2 * len(ds), len(js) - 1))
    return order, lead


def unshifted_plan(k: AttentionKernel, group: int, grid: int = 1) -> dict[str, Any]:
    """The unshifted kernel for ``group`` heads at a time, with the exact kernel's plan for its rerun; its batches
    (and the rerun's) spread over ``split_grid(k, grid)`` programs, which agree on the rerun (one flag exchanged)."""
    grid = split_grid(k, grid)
    p = _common(k, group, sbuf_bytes_u(k, group), grid, transposed_ahead_bytes(k, group))
    bank_tiles = min(QUERY_BLOCK // PMAX, PSUM_BANK_BYTES // (4 * (k.dv + 1)))  # query tiles per [O | l] bank (fp32)
    out_banks = 2 * -(-(QUERY_BLOCK // PMAX) // bank_tiles)  # the [O | l] accumulators of two units
    two = 2 * 2 + out_banks + (0 if p["dma_t"] else 1) <= PSUM_BANKS  # (+ one bank of PE transposes)
    p.update({
        "variant": "unshifted", "nqt": -(-k.sq // PMAX), "query_block": QUERY_BLOCK, "block_tiles": QUERY_BLOCK // PMAX,
        "bank_tiles": bank_tiles,
        "recip_min": RECIP_MIN, "recip_max": RECIP_MAX, "exact": exact_plan(k, grid),
        # the scores' PSUM ring: two slots of two banks (one exp per 1024 scores) when they fit beside the outputs
        # of two units (two banks each at dv = 128, one at dv <= 127) and, without Q^T and K^T by DMA, one bank of
        # TensorE transposes; else three slots of one
        "step_banks": 2 if two else 1, "score_ring": 2 if two else 3,
    })
    p["order"], p["lead"] = score_steps(k, p["step_banks"])
    # The first unit checked on its own (a failed one skips the rest of the pass) when every program has another and
    # its pass is long enough that the check's drain and flag exchange (~8 us on trn2) hardly matter: at least
    # config.attention_check_first_flops (2^34, ~200 us of TensorE at its bf16 peak), e.g. 4 x 16 x 2048 x 128 causal
    # on two cores (34 GFLOP per core), not GPT-2 small's 4 x 12 x 1024 x 64 (3.2 GFLOP: the drain would be ~8% of it).
    units = min(program_units(k, group, grid))
    p["check_first"] = config.attention_check_first and units >= 2 \
        and units * group * _pairs(k) * 2 * (k.d + k.dv) >= config.attention_check_first_flops
    # names a unit leaves for the next one: the ring position, the next unit's first scores (issued ahead) and, with
    # prefetch, its rows (and Q^T, K^T)
    rows = ["qT_next", "kT_next", "v_next"] if p["dma_t"] else ["q_next", "k_next", "v_next", "qT_next", "kT_next"]
    p["carried"] = ["gbase", "ahead", "st_n1", "st_n2"] + (rows if p["prefetch"] else [])
    return p


def _pairs(k: AttentionKernel) -> int:
    """(query, key) pairs a head computes: all, or with a causal mask (top-left aligned) min(sk, i + 1) per query."""
    if not k.causal:
        return k.sq * k.sk
    if k.sk >= k.sq:
        return k.sq * (k.sq + 1) // 2
    return k.sk * (k.sk + 1) // 2 + (k.sq - k.sk) * k.sk


def program_units(k: AttentionKernel, group: int, grid: int) -> list[int]:
    """(batch, head group) units of each program, as _attention_macros.batch_loop spreads them."""
    per_batch = k.heads // group
    if grid > 1 and k.batch >= grid:
        return [len(range(pid, k.batch, grid)) * per_batch for pid in range(grid)]
    return [len(range(pid, k.batch * per_batch, grid)) for pid in range(grid)]


def plan(k: AttentionKernel, grid: int = 1) -> dict[str, Any]:
    """The plan of the kernel that runs on a logical core of ``grid`` physical cores: the unshifted one (with the
    exact rerun) when it applies, else the exact one, batches spread over ``split_grid(k, grid)`` programs."""
    grid = split_grid(k, grid)
    group = unshifted_group(k, grid)
    return unshifted_plan(k, group, grid) if group else exact_plan(k, grid)
