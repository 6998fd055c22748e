"""Attention with transposed scores: no transpose of the probabilities (heads of 32, 64 or 96, no additive mask).

The standard flash-attention kernel (:mod:`render_attention`) computes ``S = Q K^T`` with queries on
partitions, so the probabilities must be transposed on TensorE (and evicted from PSUM) before ``P V``,
which contracts over keys. When the head dim ``d`` leaves partitions free, the score matrix can come
out of TensorE already transposed *and* shifted by the row max: with ``2G`` augmentation rows below
the head's ``d`` contraction rows,

* ``K^T`` of head ``j`` carries ones in rows ``d + j`` and ``d + G + j`` and zeros in the other augmentation rows,
* ``Q^T`` carries, in rows ``d + j`` and ``d + G + j``, the negated row max of head ``j`` for every query as two
  matmul-dtype parts (hi, lo),

so ``nc_matmul(stationary=K^T_aug, moving=Q^T_aug)`` gives ``S^T - max`` (keys on partitions), ScalarE's
exp turns it into ``P^T`` in SBUF, and ``P V`` follows with no transpose and no PSUM eviction of P. The
row sums come from a ones column appended to V (``[P V | P 1]``), the exact row max (a first, q-major
``Q K^T`` pass whose only consumer is VectorE's ``tensor_reduce``) is known before any exp, so no online
rescaling is needed.

Per (batch, head group), per block of up to 512 queries:

1. phase 1: for each 128-query tile and head, ``S`` in 512-key PSUM chunks (causal diagonal: a -3e38
   bias accumulated by TensorE), negated chunk maxima combined on GpSimd into two columns per head of
   ``mx`` (hi, lo); ``mx`` is transposed (TensorE) so that head ``j``'s maxima land on partitions ``d + j`` and
   ``d + G + j``, copied
   to SBUF (ScalarE) and broadcast into every head's ``Q^T`` (GpSimd);
2. phase 2: per head and 128-key tile, ``S^T - max`` for the block's queries that see the keys (one PSUM
   bank), ``P^T = exp(.)`` (ScalarE), causal diagonal zeroed by ``affine_select`` (GpSimd),
   ``[O | l] += P V_aug`` per query tile (TensorE, one PSUM bank per head and block);
3. ``out = O / l`` (VectorE reciprocal, ScalarE scale), one store per query tile for the whole head group.

The max is taken in fp32 and stored as hi = round(max), lo = round(max - hi) in the matmul dtype: the same
value shifts every score of a row, so it cancels in ``O / l`` (it is only a stabiliser), and hi + lo is within
~2^-17 of the max, so ``exp(s - max)`` stays in range for any score (hi alone, in bf16, is off by up to
|max| 2^-9: inf rows once |max| >= 2^15). Only the scale's power of two is folded into ``Q^T`` in bf16; the rest
is applied in fp32 by the exp (``split_scale``). Hardware rules: augmentation rows start at partition ``d`` (a
multiple of 32) and are at most 32 (start/count alignment); every PSUM tile fits one
2 KiB bank; <= 128 partitions; NKI 0.6 names only.
"""

from __future__ import annotations

import textwrap

from neuron_compile.codegen.render import Lines, _offset
from neuron_compile.codegen.render_attention import (
    BANK_KEYS,
    _group_pattern,
    _transpose_rows,
    causal_tiles,
    group_loops,
    head_group,
    score_chunk,
    split_scale,
)
from neuron_compile.lowering.attention import SBUF_BUDGET
from neuron_compile.lowering.ir import AttentionKernel

from neuron_compile.simulator_limits import PMAX

QUERY_BLOCK = 4 * PMAX  # queries per S^T matmul: 512 fp32 scores per partition = one PSUM bank
MAX_AUG_ROWS = 32  # augmentation rows start at partition d: a count <= 32 may start at 0/32/64/96
AUG_PER_HEAD = 2  # the negated row max in two matmul-dtype parts (hi, lo): rows d + j and d + G + j of head j


def _size(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


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


def transposed_group(k: AttentionKernel) -> int:
    """Heads per group for the transposed-scores kernel, or 0 when the kernel doesn't apply: a mask, heads it can't
    augment, or fp16 operands. The row max it shifts by is rounded to the matmul dtype, so ``exp(s - max)`` reaches
    ``exp(ulp(max) / 2)``: fp16 P overflows (> 65504 = e^11.09) once |max| >= 2^15 (an ulp of 32), giving inf/NaN rows,
    and the scale (folded into Q^T here) can't be split off in fp32 as the standard kernel does for fp16."""
    if k.mask is not None or k.d % 32 or k.d >= PMAX or k.dv + 1 > PMAX or k.compute_dtype == "float16":
        return 0
    group = head_group(k, cap=min(MAX_AUG_ROWS, PMAX - k.d) // AUG_PER_HEAD)
    while group > 0 and (k.heads % group or sbuf_bytes_t(k, group) > SBUF_BUDGET):
        group -= 1
    return group


def transposed_scores_body(k: AttentionKernel, group: int) -> str:
    out = Lines()
    cdt, odt, d, dv, G = k.compute_dtype, k.outputs[0].dtype, k.d, k.dv, group
    ka = d + AUG_PER_HEAD * G  # contraction rows of the shifted S^T matmul
    nk = -(-k.sk // PMAX)
    nch_max = -(-k.sk // BANK_KEYS)
    tiles_per_block = QUERY_BLOCK // PMAX
    if k.causal:
        causal_tiles(out, cdt)
    out.add(f"""\
mx = nl.ndarray(({PMAX}, {tiles_per_block}, {ka}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.memset(dst=mx, value=0.0)
# The augmentation rows of K^T: row d + j of head j is 1, built once on partitions 0..G-1 and copied to d.. of each
# group's K^T (a move of <= 32 partitions may cross quadrants).
onehot = nl.ndarray(({2 * G}, {G}, {k.sk}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.memset(dst=onehot, value=1.0, engine=nisa.engine.gpsimd)
nisa.affine_select(dst=onehot, pattern=[[-1, {G}], [0, {k.sk}]], channel_multiplier=1, on_true_tile=onehot, on_false_value=0.0, cmp_op=nl.equal)
onehot_lo = nl.ndarray(({2 * G}, {G}, {k.sk}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.memset(dst=onehot_lo, value=1.0, engine=nisa.engine.gpsimd)
nisa.affine_select(dst=onehot_lo, pattern=[[-1, {G}], [0, {k.sk}]], channel_multiplier=1, on_true_tile=onehot_lo, on_false_value=0.0, cmp_op=nl.equal, offset={-G})
nisa.tensor_tensor(dst=onehot, data1=onehot, data2=onehot_lo, op=nl.add, engine=nisa.engine.gpsimd)
""")
    group_loops(out, k, G)
    out.add(f"""\
v_aug = nl.ndarray(({PMAX}, {nk}, {G}, {dv + 1}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.memset(dst=v_aug[:, :, :, {dv}:{dv + 1}], value=1.0, engine=nisa.engine.gpsimd)
nisa.tensor_copy(dst=v_aug[:, :, :, 0:{dv}], src=v_rows, engine=nisa.engine.gpsimd)
qT = nl.ndarray(({ka}, {G}, {k.sq}), dtype=nl.{cdt}, buffer=nl.sbuf)
kT = nl.ndarray(({ka}, {G}, {k.sk}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.tensor_copy(dst=kT[{d}:{ka}, :, :], src=onehot, engine=nisa.engine.gpsimd)
for hh in range({G}):""")
    out.depth += 1
    _transpose_rows(out, "q_rows", "qT", k.sq, d, cdt, split_scale(k)[0])  # PSUM scores: scaled but for s_scale
    _transpose_rows(out, "k_rows", "kT", k.sk, d, cdt, on_scalar=True)  # VectorE carries the row max
    out.depth -= 1
    kend = f"min({k.sk}, q0 + P)" if k.causal else str(k.sk)
    out.add(f"""\
for qb in range(0, {k.sq}, {QUERY_BLOCK}):
    NB = min({QUERY_BLOCK}, {k.sq} - qb)
    ntq = (NB + {PMAX - 1}) // {PMAX}
    for it in range(ntq):
        q0 = qb + it * {PMAX}
        P = min({PMAX}, {k.sq} - q0)
        kend = {kend}
        nch = (kend + {BANK_KEYS - 1}) // {BANK_KEYS}
        for hh in range({G}):
            nparts = nl.ndarray((P, {nch_max}), dtype=nl.float32, buffer=nl.sbuf)
            for c in range(nch):""")
    out.depth += 4
    score_chunk(out, k, f"c * {BANK_KEYS}", f"min({BANK_KEYS}, kend - c * {BANK_KEYS})")
    out.add("nisa.tensor_reduce(dst=nparts[:, c:c + 1], op=nl.maximum, data=s_ps, axis=1, negate=True)")
    out.depth -= 1
    # negated maxima combine with min (fp32); head hh's columns of mx get it as hi = round(max) and lo = round(max - hi):
    # their sum is within ~2^-17 of the max, so exp(s - max) stays in range for any score (hi alone is off by up to
    # |max| 2^-9 in bf16: inf at |max| >= 2^15)
    out.add(f"""\
nmax = nparts[:, 0:1]
for c in range(1, nch):
    nm = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=nm, data1=nmax, data2=nparts[:, c:c + 1], op=nl.minimum, engine=nisa.engine.gpsimd)
    nmax = nm
nisa.tensor_copy(dst=mx[0:P, it, {d} + hh:{d} + hh + 1], src=nmax, engine=nisa.engine.gpsimd)
nisa.tensor_tensor(dst=mx[0:P, it, {d + G} + hh:{d + G} + hh + 1], data1=nmax, data2=mx[0:P, it, {d} + hh:{d} + hh + 1], op=nl.subtract, engine=nisa.engine.gpsimd)""")
    out.depth -= 2
    out.add(f"""\
# every head's negated maxima onto partitions d.. of its Q^T: transpose, copy, broadcast over the heads
mt_ps = nl.ndarray(({ka}, {QUERY_BLOCK}), dtype=nl.{cdt}, buffer=nl.psum)
for it in range(ntq):
    P = min({PMAX}, {k.sq} - qb - it * {PMAX})
    nisa.nc_transpose(dst=mt_ps[:, it * {PMAX}:it * {PMAX} + P], data=mx[0:P, it, :])
mrow = nl.ndarray(({ka}, {QUERY_BLOCK}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.activation(dst=mrow[{d}:{ka}, 0:NB], op=nl.copy, data=mt_ps[{d}:{ka}, 0:NB])
for hh in range({G}):
    nisa.tensor_copy(dst=qT[{d}:{ka}, hh, qb:qb + NB], src=mrow[{d}:{ka}, 0:NB], engine=nisa.engine.gpsimd)
o_blk = nl.ndarray(({PMAX}, {tiles_per_block}, {G}, {dv}), dtype=nl.{odt}, buffer=nl.sbuf)
jend = {f"min({k.sk}, qb + NB)" if k.causal else k.sk}
for hh in range({G}):
    o_ps = nl.ndarray(({PMAX}, {tiles_per_block}, {dv + 1}), dtype=nl.float32, buffer=nl.psum)""")
    out.depth += 1
    scores_exp_pv(out, k, ka, "o_ps[0:P, it, :]", split_scale(k)[1])
    out.add(f"""\
# one reciprocal for the block's row sums (rows past a ragged last tile are never read)
rl = nl.ndarray(({PMAX}, {tiles_per_block}), dtype=nl.float32, buffer=nl.sbuf)
nisa.reciprocal(dst=rl[:, 0:ntq], data=o_ps[:, 0:ntq, {dv}])
for it in range(ntq):
    P = min({PMAX}, {k.sq} - qb - it * {PMAX})
    nisa.activation(dst=o_blk[0:P, it, hh, :], op=nl.copy, data=o_ps[0:P, it, 0:{dv}], scale=rl[0:P, it:it + 1])""")
    out.depth -= 1
    store_query_block(out, k, G)
    return out.text()


def store_query_block(out: Lines, k: AttentionKernel, group: int) -> None:
    """One DMA per query tile of the block stores the rows of every head in the group (``o_blk``)."""
    ob, oh, os_, od = k.out_strides
    o_off = _offset(0, [("b", ob), ("hg", oh), ("q0", os_)])
    out.add(f"""\
for it in range(ntq):
    q0 = qb + it * {PMAX}
    P = min({PMAX}, {k.sq} - q0)
    nisa.dma_copy(dst=out0.ap(pattern=[[{os_}, P], {_group_pattern(oh, group)}[{od}, {k.dv}]], offset={o_off}), src=o_blk[0:P, it, :, :])""")


def scores_exp_pv(out: Lines, k: AttentionKernel, rows: int, o_dst: str, exp_scale: float) -> None:
    """The key loop of one head and query block (``qb``, ``NB``, ``ntq``, ``jend`` set): per 128-key tile,
    ``S^T = K Q^T`` over contraction rows ``0..rows`` (one PSUM bank), ``P^T = exp(exp_scale * .)`` (ScalarE, the
    part of the softmax scale kept in fp32; the causal diagonal tile zeroed by GpSimd's ``affine_select``, so an inf
    exp there is harmless) and ``[O | l] += P V_aug`` per query tile into ``o_dst`` (an expression of ``it`` and
    ``P``)."""
    escale = "" if exp_scale == 1.0 else f", scale={exp_scale!r}"
    qs = "max(qb, k1)" if k.causal else "qb"
    # Software-pipelined by one key tile: TensorE issues the scores of tile j + 1 before the P V matmuls of tile j,
    # so ScalarE's exp of tile j + 1 does not wait behind them (each engine runs its instructions in order).
    scores = (f"kn1 = min({PMAX}, {k.sk} - k1)\n"
              f"qs1 = {qs}\n"
              f"nw1 = min({QUERY_BLOCK}, qb + NB - qs1)\n"
              f"st_next = nl.ndarray(({PMAX}, {QUERY_BLOCK}), dtype=nl.float32, buffer=nl.psum)\n"
              f"nisa.nc_matmul(dst=st_next[0:kn1, 0:nw1], stationary=kT[0:{rows}, hh, k1:k1 + kn1], "
              f"moving=qT[0:{rows}, hh, qs1:qs1 + nw1])")
    out.add(f"""\
nj = (jend + {PMAX - 1}) // {PMAX}
k1 = 0
{scores}
for j in range(nj):
    k0 = j * {PMAX}
    kn = min({PMAX}, {k.sk} - k0)
    qs = {"max(qb, k0)" if k.causal else "qb"}
    nw = min({QUERY_BLOCK}, qb + NB - qs)
    st_ps = st_next
    pt = nl.ndarray(({PMAX}, {QUERY_BLOCK}), dtype=nl.{k.compute_dtype}, buffer=nl.sbuf)
    nisa.activation(dst=pt[0:kn, 0:nw], op=nl.exp, data=st_ps[0:kn, 0:nw]{escale})""")
    out.depth += 1
    out.add(f"""\
if j + 1 < nj:
    k1 = k0 + {PMAX}
{textwrap.indent(scores, "    ")}""")
    if k.causal:
        out.add(f"""\
if qs == k0:
    w = min({PMAX}, nw)
    nisa.affine_select(dst=pt[0:kn, 0:w], pattern=[[1, w]], channel_multiplier=-1, on_true_tile=pt[0:kn, 0:w], on_false_value=0.0, cmp_op=nl.greater_equal)""")
    out.add(f"""\
for it in range((qs - qb) // {PMAX}, ntq):
    c0 = qb + it * {PMAX} - qs
    P = min({PMAX}, {k.sq} - qb - it * {PMAX})
    nisa.nc_matmul(dst={o_dst}, stationary=pt[0:kn, c0:c0 + P], moving=v_aug[0:kn, j, hh, 0:{k.dv + 1}], accumulate=(j > 0))""")
    out.depth -= 1
