"""Kernel body of the fused attention family (``attention.nki.j2``) from an :class:`AttentionKernel`.

Without an additive mask (bf16/fp32), :func:`attention_body` first renders the unshifted softmax
(:mod:`render_attention_u`: no row max, checked on chip) with the exact kernel as its rerun. The exact
kernel is the transposed-scores one (:mod:`render_attention_t`: no transpose of P at all) for heads of 32,
64 or 96 without a mask in bf16/fp32, and the standard flash-attention kernel below for everything else
(d = 128, masks, fp16 operands). Per batch element and head group (the heads whose rows fit
``GROUP_ROWS_BYTES``), unrolled:

1. Q, K, V rows of all the group's heads are loaded with one DMA each (rows on partitions,
   ``[128, tiles, heads, D]``; a ragged last tile gets its own DMA), and each head's Q, K are
   transposed on TensorE, four 128-row tiles per PSUM bank and one eviction, into ``Q^T``/``K^T``
   with D on partitions (the matmul contraction dim).
2. Per 128-query tile and head, the needed keys (all, or up to the diagonal when causal: fully
   masked key tiles are never computed) are split into equal steps of <= ``key_step`` keys. Per
   step: ``S = Q K^T`` into one PSUM bank per 512 keys; the causal diagonal block gets a 0 / -3e38
   bias accumulated onto PSUM by TensorE (identity x bias tile, both built once with
   ``affine_select``); an additive mask is applied at the PSUM read (``S * scale + mask``). The
   negated row max (``tensor_reduce(negate=True)``), the running bias ``b = -scale * m`` (min with
   the previous one), ``alpha = exp(b_new - b_old)`` and ``P = exp(scale * S + b)`` with the row
   sum accumulated across the step's chunks in ScalarE's registers give the online softmax; P is
   transposed on TensorE and ``P V`` accumulates over the step's key tiles in PSUM; the output
   accumulator is rescaled by alpha (``scalar_tensor_tensor``) only when there is more than one step.
3. ``out = O / max(l, tiny)`` (a fully masked row has ``l = 0`` and ``O = 0``: SDPA returns 0 there),
   cast to the output dtype; the rows of one query tile of every head in the group leave in one DMA.

Hardware limits respected: <= 128 partitions, matmul K/M <= 128 and N <= 512, every PSUM tile within
one 2 KiB bank (scores, transposed P, output, staging), only NKI 0.6 names; tile extents are
statically bounded (``min(<int>, ...)``) so ``tests/codegen/static_checks.py`` can verify them.
"""

from __future__ import annotations

import logging
import math

from neuron_compile.codegen.render import Lines, _offset
from neuron_compile.lowering.attention import SBUF_BUDGET, sbuf_bytes
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
FP32_MAX = 3.4028234663852886e38  # bias clamp: a fully -inf row keeps a finite running max
# Share of the transposed-P PSUM evictions done by ScalarE (activation copy) instead of VectorE, counted over the
# whole kernel: VectorE carries the row max (1 cycle per fp32 PSUM score), ScalarE the exp (1 cycle per score);
# 0.58 balances the two under the cost model for d=128 heads (issue 5 (c): 0.55 / 0.58 / 0.6 / 0.65 -> 2090 / 2038 / 2043 / 2086 us;
# heads of 32/64/96 without a mask use the transposed-scores kernel, which has no P evictions). The small per-row
# combines (chunk maxima, running max and sum) run on GpSimd, which is otherwise idle.
SCALAR_EVICT_SHARE = 0.58
# Per-partition SBUF for the Q/K/V/output rows of one head group: enough for 12 GPT-2 heads (1 KiB per tensor per
# head) or 4 heads of 2048 x 128 (4 KiB each); the rest of SBUF keeps the per-head working set and double buffers.
GROUP_ROWS_BYTES = 64 * 1024


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


def _group_pattern(s_head: int, group: int) -> str:
    return f"[{s_head}, {group}], " if group > 1 else ""


def _load_rows(out: Lines, name: str, arg: int, off: str, strides: tuple[int, ...], rows: int, cols: int,
               group: int, dtype: str) -> None:
    """``name[128, tiles, group, cols]``: row r of head ``hg + j`` on partition r % 128, tile r // 128, slot j.

    One DMA moves the rows of all ``group`` heads (a ragged last row tile gets its own): with the heads
    adjacent in memory (``[b, s, h, d]``) each partition reads ``group * cols`` contiguous elements per row.
    """
    s_head, s_row, s_col = strides[1], strides[2], strides[3]
    full, rem = divmod(rows, PMAX)
    tiles = full + (1 if rem else 0)
    heads = _group_pattern(s_head, group)
    out.add(f"{name} = nl.ndarray(({PMAX}, {tiles}, {group}, {cols}), dtype=nl.{dtype}, buffer=nl.sbuf)")
    if full:
        out.add(f"nisa.dma_copy(dst={name}[:, 0:{full}, :, :], src=in{arg}.ap(pattern=[[{s_row}, {PMAX}], "
                f"[{s_row * PMAX}, {full}], {heads}[{s_col}, {cols}]], offset={off}))")
    if rem:
        tail = f"{off} + {full * PMAX * s_row}" if full * s_row else off
        out.add(f"nisa.dma_copy(dst={name}[0:{rem}, {full}, :, :], src=in{arg}.ap(pattern=[[{s_row}, {rem}], "
                f"{heads}[{s_col}, {cols}]], offset={tail}))")


def _transpose_rows(out: Lines, src: str, dst: str, rows: int, cols: int, dtype: str, scale: float = 1.0,
                    on_scalar: bool = False) -> None:
    """``dst[cols, hh, rows] = scale * src[:, :, hh, :]^T`` through TensorE, TRANSPOSE_GROUP tiles per PSUM bank and
    eviction (``dst`` is allocated by the caller for the whole head group; VectorE evicts unless ``on_scalar``)."""
    tiles = -(-rows // PMAX)
    tg = TRANSPOSE_GROUP[2 if dtype in ("bfloat16", "float16") else 4]
    evict = (f"nisa.activation(dst={dst}[0:{cols}, hh, g * {PMAX}:g * {PMAX} + w], op=nl.copy, data=tp[:, 0:w], "
             f"scale={scale!r})") if on_scalar else (f"nisa.tensor_copy(dst={dst}[0:{cols}, hh, g * {PMAX}:g * {PMAX} + w], src=tp[:, 0:w])" if scale == 1.0 else
             f"nisa.tensor_scalar(dst={dst}[0:{cols}, hh, g * {PMAX}:g * {PMAX} + w], data=tp[:, 0:w], op0=nl.multiply, "
             f"operand0={scale!r})")
    out.add(f"""\
for g in range(0, {tiles}, {tg}):
    tp = nl.ndarray(({cols}, {tg * PMAX}), dtype=nl.{dtype}, buffer=nl.psum)
    for t in range(g, min(g + {tg}, {tiles})):
        r = min({PMAX}, {rows} - t * {PMAX})
        nisa.nc_transpose(dst=tp[:, (t - g) * {PMAX}:(t - g) * {PMAX} + r], data={src}[0:r, t, hh, :])
    w = min({rows}, (g + {tg}) * {PMAX}) - g * {PMAX}
    {evict}""")


def head_group(k: AttentionKernel, cap: int | None = None) -> int:
    """Heads whose Q/K/V/output rows move in one DMA each: the largest divisor of ``heads`` (at most ``cap``) whose
    rows fit ``GROUP_ROWS_BYTES`` per partition (and the kernel's SBUF budget with the per-head working set)."""
    csize, osize = (2 if k.compute_dtype in ("bfloat16", "float16") else 4), (2 if k.outputs[0].dtype in (
        "bfloat16", "float16") else 4)
    nq, nk = -(-k.sq // PMAX), -(-k.sk // PMAX)
    rows = (nq * k.d + nk * k.d + nk * k.dv) * csize + nq * k.dv * osize
    other = sbuf_bytes(k.sq, k.sk, k.d, k.dv, csize, osize, k.key_step) - rows
    best = 1
    for g in range(2, min(k.heads, cap or k.heads) + 1):
        if k.heads % g == 0 and g * rows <= GROUP_ROWS_BYTES and g * rows + other <= SBUF_BUDGET:
            best = g
    return best


def attention_body(k: AttentionKernel) -> str:
    """The unshifted kernel with the exact one as its checked fallback when it applies, else the exact one."""
    from neuron_compile.codegen.render_attention_u import unshifted_body, unshifted_group

    exact = exact_attention_body(k)
    group = unshifted_group(k)
    return unshifted_body(k, group, exact) if group else exact


def attention_plan(k: AttentionKernel) -> dict[str, object]:
    """How the kernel is rendered (for ``explain``): variant, heads per group, and the exact fallback if any."""
    from neuron_compile.codegen.render_attention_t import transposed_group
    from neuron_compile.codegen.render_attention_u import QUERY_BLOCK, unshifted_group

    tg = transposed_group(k)
    exact = {"variant": "transposed-scores" if tg else "standard", "head_group": tg or head_group(k)}
    if not tg:
        exact["key_step"] = k.key_step
    ug = unshifted_group(k)
    if not ug:
        return exact
    return {"variant": "unshifted", "head_group": ug, "query_block": QUERY_BLOCK,
            "fallback": " ".join(f"{a}={b}" for a, b in exact.items())}


def exact_attention_body(k: AttentionKernel) -> str:
    """Softmax with the row max: the transposed-scores kernel (heads of 32/64/96, no mask) or the standard one."""
    from neuron_compile.codegen.render_attention_t import transposed_group, transposed_scores_body

    group = transposed_group(k)
    if group:
        return transposed_scores_body(k, group)
    out = Lines()
    cdt = k.compute_dtype
    odt = k.outputs[0].dtype
    masked = k.mask is not None
    nq = -(-k.sq // PMAX)
    if k.causal:
        causal_tiles(out, cdt)
    if not masked and split_scale(k)[1] != 1.0:  # bf16/fp16: the scale's residual, to multiply the row max on GpSimd
        out.add(f"""\
s_scale = nl.ndarray(({PMAX}, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=s_scale, value={split_scale(k)[1]!r})""")
    group = head_group(k)
    out.add("n_evict = 0  # transposed-P evictions so far: a fixed share of them runs on ScalarE")
    group_loops(out, k, group)
    out.add(f"""\
qT = nl.ndarray(({k.d}, {group}, {k.sq}), dtype=nl.{cdt}, buffer=nl.sbuf)
kT = nl.ndarray(({k.d}, {group}, {k.sk}), dtype=nl.{cdt}, buffer=nl.sbuf)
for hh in range({group}):""")
    out.depth += 1
    # scores come out of PSUM scaled by q_scale (all of the scale in fp32, its power of two otherwise: split_scale)
    _transpose_rows(out, "q_rows", "qT", k.sq, k.d, cdt, split_scale(k)[0])
    _transpose_rows(out, "k_rows", "kT", k.sk, k.d, cdt)
    out.depth -= 1
    kend = f"min({k.sk}, q0 + P)" if k.causal else str(k.sk)
    # Query tiles outside, heads inside: the output rows of one query tile (all heads of the group) leave in one DMA
    # while the next tile computes.
    out.add(f"""\
for i in range({nq}):
    q0 = i * {PMAX}
    P = min({PMAX}, {k.sq} - q0)
    kend = {kend}
    nsteps = (kend + {k.key_step - 1}) // {k.key_step}
    wstep = ((kend + nsteps - 1) // nsteps + {PMAX - 1}) // {PMAX} * {PMAX}
    o_t = nl.ndarray(({PMAX}, {group}, {k.dv}), dtype=nl.{odt}, buffer=nl.sbuf)
    for hh in range({group}):
        h = hg + hh
        for k0 in range(0, kend, wstep):
            W = min({k.key_step}, wstep, kend - k0)
            nch = (W + {BANK_KEYS - 1}) // {BANK_KEYS}""")
    out.depth += 3
    _step(out, k, config.target != "trn1")
    out.depth -= 1
    recip_src = "l_run"
    if masked:
        out.add("""\
l_c = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_scalar(dst=l_c, data=l_run, op0=nl.maximum, operand0=1e-30)""")
        recip_src = "l_c"
    out.add(f"""\
rl = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.reciprocal(dst=rl, data={recip_src})
nisa.activation(dst=o_t[0:P, hh, :], op=nl.copy, data=o_run, scale=rl)""")
    out.depth -= 1
    ob, oh, os_, od = k.out_strides
    o_off = _offset(0, [("b", ob), ("hg", oh), ("q0", os_)])
    out.add(f"nisa.dma_copy(dst=out0.ap(pattern=[[{os_}, P], {_group_pattern(oh, group)}[{od}, {k.dv}]], "
            f"offset={o_off}), src=o_t[0:P, 0:{group}, :])")
    return out.text()


def group_loops(out: Lines, k: AttentionKernel, group: int) -> None:
    """Open the batch and head-group loops and load the group's q/k/v rows (``q_rows``, ``k_rows``, ``v_rows``)."""
    out.add(f"for b in range({k.batch}):")
    out.depth += 1
    out.add(f"for hg in range(0, {k.heads}, {group}):")
    out.depth += 1
    for name, (arg, off, strides), rows, cols in (("q_rows", k.q, k.sq, k.d), ("k_rows", k.k, k.sk, k.d),
                                                   ("v_rows", k.v, k.sk, k.dv)):
        base = _offset(off, [("b", strides[0]), ("hg", strides[1])])
        _load_rows(out, name, arg, base, strides, rows, cols, group, k.compute_dtype)


def causal_tiles(out: Lines, cdt: str) -> None:
    """``ident`` (128 x 128 diagonal, ``MASK_IDENT``) and ``cbias`` (0 on and below the diagonal, ``MASK_BIAS`` above),
    built once: ``ident x cbias`` is the causal bias TensorE adds to the scores."""
    out.add(f"""\
ident = nl.ndarray(({PMAX}, {PMAX}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.memset(dst=ident, value={MASK_IDENT.get(cdt, 1.0)!r})
nisa.affine_select(dst=ident, pattern=[[-1, {PMAX}]], channel_multiplier=1, on_true_tile=ident, on_false_value=0.0, cmp_op=nl.equal)
cbias = nl.ndarray(({PMAX}, {PMAX}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.memset(dst=cbias, value=0.0)
nisa.affine_select(dst=cbias, pattern=[[-1, {PMAX}]], channel_multiplier=1, on_true_tile=cbias, on_false_value={MASK_BIAS.get(cdt, MASK_BIAS_DEFAULT)!r}, cmp_op=nl.greater_equal)""")


def score_chunk(out: Lines, k: AttentionKernel, kc: str, cw: str) -> None:
    """``s_ps = Q^T[:, q0:q0+P]^T K^T[:, kc:kc+cw]`` (scaled scores of one PSUM bank of keys) for head ``hh``; the
    causal diagonal block gets the 0 / -3e38 bias accumulated by TensorE (identity x ``cbias``)."""
    out.add(f"""\
kc = {kc}
cw = {cw}
s_ps = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.psum)
nisa.nc_matmul(dst=s_ps, stationary=qT[0:{k.d}, hh, q0:q0 + P], moving=kT[0:{k.d}, hh, kc:kc + cw])""")
    if k.causal:
        out.add(f"""\
lo = max(q0, kc)
hi = min(q0 + P, kc + cw)
if lo < hi:
    n = min({PMAX}, hi - lo)
    c1 = lo - q0
    c2 = lo - kc
    nisa.nc_matmul(dst=s_ps[0:P, c2:c2 + n], stationary=ident[0:P, 0:P], moving=cbias[0:P, c1:c1 + n], accumulate=True)""")


def _step(out: Lines, k: AttentionKernel, scalar_copies: bool) -> None:
    """One online-softmax key step of W keys, processed in PSUM-bank chunks of 512 keys."""
    cdt, dv, masked = k.compute_dtype, k.dv, k.mask is not None
    nmax_ch = k.key_step // BANK_KEYS
    s_scale = split_scale(k)[1]  # the part of the scale not folded into Q^T (bf16/fp16), applied in fp32
    exp_scale = 1.0 if masked else s_scale  # masked: applied with the mask at the PSUM read
    out.add(f"""\
nparts = nl.ndarray((P, {nmax_ch}), dtype=nl.float32, buffer=nl.sbuf)
srcs = []
for c in range(nch):""")
    out.depth += 1
    score_chunk(out, k, f"k0 + c * {BANK_KEYS}", f"min({BANK_KEYS}, W - c * {BANK_KEYS})")
    src = "s_ps"
    if masked:
        ma = k.mask
        assert ma is not None
        m_off = _offset(ma[1], [("b", ma[2][0]), ("h", ma[2][1]), ("q0", ma[2][2]), ("kc", ma[2][3])])
        out.add(f"""\
mask_t = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)
nisa.dma_copy(dst=mask_t, src=in{ma[0]}.ap(pattern=[[{ma[2][2]}, P], [{ma[2][3]}, cw]], offset={m_off}))
s_sb = nl.ndarray((P, cw), dtype=nl.float32, buffer=nl.sbuf)""")
        out.add("nisa.tensor_tensor(dst=s_sb, data1=s_ps, data2=mask_t, op=nl.add)" if s_scale == 1.0 else
                f"nisa.scalar_tensor_tensor(dst=s_sb, data=s_ps, op0=nl.multiply, operand0={s_scale!r}, op1=nl.add, "
                "operand1=mask_t)")
        src = "s_sb"
    out.add(f"""\
nisa.tensor_reduce(dst=nparts[:, c:c + 1], op=nl.maximum, data={src}, axis=1, negate=True)
srcs.append({src})""")
    out.depth -= 1
    # The exp bias is -(running max); a masked row that is -inf so far keeps a finite one (FP32_MAX).
    first = (f"nb = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)\n"
             f"    nisa.tensor_scalar(dst=nb, data=nmax, op0=nl.minimum, operand0={FP32_MAX!r})" if masked else
             "nb = nmax")
    share = SCALAR_EVICT_SHARE if scalar_copies else 0.0
    # unmasked bf16/fp16: the max was taken over the PSUM scores, which exp scales by exp_scale (> 0) in fp32
    rescale = "" if exp_scale == 1.0 else (
        "\nnms = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)"
        "\nnisa.tensor_tensor(dst=nms, data1=nmax, data2=s_scale[0:P, :], op=nl.multiply, engine=nisa.engine.gpsimd)"
        "\nnmax = nms")
    escale = "" if exp_scale == 1.0 else f", scale={exp_scale!r}"
    grp = 2 if cdt in ("bfloat16", "float16") else 1  # 2 KiB PSUM bank: 8 bf16 / 4 fp32 [128, 128] blocks
    out.add(f"""\
nmax = nparts[:, 0:1]
for c in range(1, nch):
    nm = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=nm, data1=nmax, data2=nparts[:, c:c + 1], op=nl.minimum, engine=nisa.engine.gpsimd)
    nmax = nm{rescale}
if k0 == 0:
    {first}
else:
    nb = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=nb, data1=nmax, data2=nb_run, op=nl.minimum, engine=nisa.engine.gpsimd)
    alpha = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=alpha, op=nl.exp, data=nb_run, bias=nb, scale=-1.0)
nb_run = nb
rs = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
o_ps = nl.ndarray((P, {dv}), dtype=nl.float32, buffer=nl.psum)
for c in range(nch):
    cw = min({BANK_KEYS}, W - c * {BANK_KEYS})
    p_sb = nl.ndarray((P, cw), dtype=nl.{cdt}, buffer=nl.sbuf)
    # the row sum accumulates across the step's chunks in ScalarE's registers and is read out once
    if nch == 1:
        nisa.activation(dst=p_sb, op=nl.exp, data=srcs[c], bias=nb{escale}, reduce_op=nl.add, reduce_res=rs, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    elif c == 0:
        nisa.activation(dst=p_sb, op=nl.exp, data=srcs[c], bias=nb{escale}, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    elif c == nch - 1:
        nisa.activation(dst=p_sb, op=nl.exp, data=srcs[c], bias=nb{escale}, reduce_op=nl.add, reduce_res=rs, reduce_cmd=nisa.reduce_cmd.reduce)
    else:
        nisa.activation(dst=p_sb, op=nl.exp, data=srcs[c], bias=nb{escale}, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce)
    if c % {grp} == 0:  # bf16: the transposed P of two chunks share one PSUM bank and one eviction
        pt_ps = nl.ndarray(({PMAX}, {grp * BANK_KEYS // PMAX}, {PMAX}), dtype=nl.{cdt}, buffer=nl.psum)
    nsub = (cw + {PMAX - 1}) // {PMAX}
    for j in range(nsub):
        wj = min({PMAX}, cw - j * {PMAX})
        nisa.nc_transpose(dst=pt_ps[0:wj, (c % {grp}) * {BANK_KEYS // PMAX} + j, 0:P], data=p_sb[:, j * {PMAX}:j * {PMAX} + wj])
    if c % {grp} == {grp - 1} or c == nch - 1:
        c0 = c - c % {grp}
        kw = min({grp * BANK_KEYS}, W - c0 * {BANK_KEYS})
        pt = nl.ndarray(({PMAX}, {grp * BANK_KEYS // PMAX}, {PMAX}), dtype=nl.{cdt}, buffer=nl.sbuf)
        nfull = kw // {PMAX}
        on_scalar = int((n_evict + 1) * {share!r}) > int(n_evict * {share!r})
        n_evict += 1
        if nfull > 0 and on_scalar:
            nisa.activation(dst=pt[:, 0:nfull, 0:P], op=nl.copy, data=pt_ps[:, 0:nfull, 0:P])
        elif nfull > 0:
            nisa.tensor_copy(dst=pt[:, 0:nfull, 0:P], src=pt_ps[:, 0:nfull, 0:P])
        if kw % {PMAX} > 0:
            nisa.tensor_copy(dst=pt[0:kw % {PMAX}, nfull, 0:P], src=pt_ps[0:kw % {PMAX}, nfull, 0:P])
        for j in range((kw + {PMAX - 1}) // {PMAX}):
            wj = min({PMAX}, kw - j * {PMAX})
            kt = (k0 + c0 * {BANK_KEYS}) // {PMAX} + j
            nisa.nc_matmul(dst=o_ps, stationary=pt[0:wj, j, 0:P], moving=v_rows[0:wj, kt, hh, 0:{dv}], accumulate=(c0 + j > 0))
if k0 == 0:
    l_run = rs
else:
    l_a = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=l_a, data1=l_run, data2=alpha, op=nl.multiply, engine=nisa.engine.gpsimd)
    l_new = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=l_new, data1=l_a, data2=rs, op=nl.add, engine=nisa.engine.gpsimd)
    l_run = l_new
if nsteps == 1:
    o_run = o_ps
elif k0 == 0:
    o_run = nl.ndarray((P, {dv}), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o_run, src=o_ps)
else:
    o_new = nl.ndarray((P, {dv}), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=o_new, data=o_run, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=o_ps)
    o_run = o_new""")
