"""Attention with an unshifted softmax: ``P = exp(s)`` without the row max, checked on chip, exact kernel as fallback.

Any shift that is the same for a whole row cancels in ``O / l``; the row max is only there to keep
``exp`` in range. When every row's largest score lies in about [-69, 83] (most attention layers) the
shift can be left out, and with it everything that makes flash attention expensive on a NeuronCore:
the row-max pass (one VectorE read of every fp32 score in PSUM), the online rescaling, and (because the
max runs along the free axis) the q-major score layout that forces a TensorE transpose of P before
``P V``. This kernel computes the scores already transposed, keys on partitions:

* ``S^T = K Q^T`` (stationary ``K^T`` tile, moving up to 512 queries: one PSUM bank),
* ``P^T = exp(S^T)`` by one ScalarE instruction per key tile (the scale is folded into ``Q^T``; the
  causal diagonal tile is zeroed by GpSimd's ``affine_select``),
* ``[O | l] += P V_aug`` per 128-query tile (a ones column on V gives the row sums),
* ``out = O * (1 / l)`` on VectorE, whose accumulators also give the row sum of the output.

So TensorE makes two passes over the scores and ScalarE one, and nothing else touches them. The
idea of a softmax with a fixed shift and a recomputation when it overflows follows FlashDecoding++
("asynchronized softmax with unified max value", Hong et al., 2023).

**The guard.** A row is safe when ``2^-100 <= l <= 2^120`` and its output is finite: then its largest
probability is at least ``l / sk`` (``>= 2^-114`` up to 16K keys: a normal number in bf16 and fp32, so
every probability keeps full relative precision; what flushes to zero is below 2^-126, a relative
``sk * 2^-26`` of ``l`` even summed over every key), nothing overflowed in ``exp`` or its bf16 rounding
(an inf makes ``l`` inf), and ``O`` did not overflow in PSUM (its row sum would be inf or NaN;
``x - x == 0`` is false exactly for those). The
checks are kept per row and query tile (``1 / l`` and the output's row sum, one column each), folded per
head group into one flag per partition, and at the end reduced across partitions into one int32 that a
sequencer register reads. If any row failed, ``nl.while_loop`` runs the exact kernel once (the
transposed-scores kernel with the row max for heads of 32/64/96, the standard flash-attention kernel
for 128), which rewrites the whole output: the result is never the unchecked one. The fallback costs
one extra run of the exact kernel; ``config.attention_unshifted = False`` always uses the exact kernel.

Hardware rules: every PSUM tile within one 2 KiB bank (output accumulators pack
``2048 // (4 * (dv + 1))`` query tiles per bank); <= 128 partitions; NKI 0.6 names only (registers and
``nl.while_loop`` are current runtime control flow, REFERENCE 1.5).
"""

from __future__ import annotations

from neuron_compile.codegen.render import Lines
from neuron_compile.codegen.render_attention import BANK_KEYS, _transpose_rows, group_loops, head_group, split_scale
from neuron_compile.codegen.render_attention_t import QUERY_BLOCK, _size, head_bytes, scores_exp_pv, store_query_block
from neuron_compile.config import config
from neuron_compile.lowering.attention import SBUF_BUDGET
from neuron_compile.lowering.ir import AttentionKernel
from neuron_compile.simulator_limits import PMAX

PSUM_BANK_BYTES = 2048
# A row passes when 2^-100 <= l <= 2^120, i.e. 2^-120 <= 1 / l <= 2^100 (0, inf and NaN fail both ways).
RECIP_MIN = 2.0 ** -120
RECIP_MAX = 2.0 ** 100


def sbuf_bytes_u(k: AttentionKernel, group: int) -> int:
    """Per-partition SBUF of the unshifted kernel with ``group`` heads resident (the fallback runs after it)."""
    out_block = QUERY_BLOCK // PMAX * k.dv * _size(k.outputs[0].dtype)
    checks = 4 * 4 * -(-k.sq // PMAX)  # 1 / l, output row sums and two scratch columns per query tile
    return group * (head_bytes(k) + out_block + checks) + 2 * QUERY_BLOCK * _size(k.compute_dtype) + 64


def unshifted_group(k: AttentionKernel) -> int:
    """Heads per group for the unshifted kernel, or 0 when it doesn't apply: an additive mask, the knob off, or
    fp16 operands (P is stored in the matmul dtype, and fp16's range, 2^-14..65504, would hold unshifted
    probabilities only for scores in about [-7, 11]; bf16 and fp32 share fp32's exponent range)."""
    if not config.attention_unshifted or k.mask is not None or k.d > PMAX or k.dv + 1 > BANK_KEYS \
            or k.compute_dtype not in ("bfloat16", "float32"):
        return 0
    group = head_group(k)
    while group > 0 and (k.heads % group or sbuf_bytes_u(k, group) > SBUF_BUDGET):
        group -= 1
    return group


def _indent(text: str) -> str:
    return "\n".join("    " + line if line.strip() else "" for line in text.splitlines())


def unshifted_body(k: AttentionKernel, group: int, exact: str) -> str:
    """The unshifted kernel for ``group`` heads at a time; ``exact`` (the exact kernel's body) is the rerun."""
    out = Lines()
    cdt, odt, d, dv, G = k.compute_dtype, k.outputs[0].dtype, k.d, k.dv, group
    nk, nqt = -(-k.sk // PMAX), -(-k.sq // PMAX)
    tiles_per_block = QUERY_BLOCK // PMAX
    tpb = min(tiles_per_block, PSUM_BANK_BYTES // (4 * (dv + 1)))  # query tiles per output PSUM bank
    out.add(f"""\
# Unshifted softmax, P = exp(s): every row's sum and output are checked (ok_run, 1.0 per partition while all rows
# pass) and the exact kernel reruns at the end if one failed.
ok_run = nl.ndarray(({PMAX}, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=ok_run, value=1.0)""")
    group_loops(out, k, G)
    out.add(f"""\
v_aug = nl.ndarray(({PMAX}, {nk}, {G}, {dv + 1}), dtype=nl.{cdt}, buffer=nl.sbuf)
nisa.memset(dst=v_aug[:, :, :, {dv}:{dv + 1}], value=1.0, engine=nisa.engine.gpsimd)
nisa.tensor_copy(dst=v_aug[:, :, :, 0:{dv}], src=v_rows, engine=nisa.engine.gpsimd)
# per query row and tile: 1 / l and the row sum of the output (rows past a ragged last tile keep passing values)
rchk = nl.ndarray(({PMAX}, {G * nqt}), dtype=nl.float32, buffer=nl.sbuf)
ochk = nl.ndarray(({PMAX}, {G * nqt}), dtype=nl.float32, buffer=nl.sbuf)""")
    if k.sq % PMAX:
        out.add("""\
nisa.memset(dst=rchk, value=1.0)
nisa.memset(dst=ochk, value=0.0)""")
    out.add(f"""\
qT = nl.ndarray(({d}, {G}, {k.sq}), dtype=nl.{cdt}, buffer=nl.sbuf)
kT = nl.ndarray(({d}, {G}, {k.sk}), dtype=nl.{cdt}, buffer=nl.sbuf)
for hh in range({G}):""")
    out.depth += 1
    # VectorE evicts the transposes: ScalarE's only job is the exp
    _transpose_rows(out, "q_rows", "qT", k.sq, d, cdt, split_scale(k)[0])  # PSUM scores: scaled but for s_scale
    _transpose_rows(out, "k_rows", "kT", k.sk, d, cdt)
    out.depth -= 1
    jend = f"min({k.sk}, qb + NB)" if k.causal else str(k.sk)
    out.add(f"""\
for qb in range(0, {k.sq}, {QUERY_BLOCK}):
    NB = min({QUERY_BLOCK}, {k.sq} - qb)
    ntq = (NB + {PMAX - 1}) // {PMAX}
    o_blk = nl.ndarray(({PMAX}, {tiles_per_block}, {G}, {dv}), dtype=nl.{odt}, buffer=nl.sbuf)
    jend = {jend}
    for hh in range({G}):
        o_ps = []
        for ib in range(0, ntq, {tpb}):
            o_ps.append(nl.ndarray(({PMAX}, {tpb}, {dv + 1}), dtype=nl.float32, buffer=nl.psum))""")
    out.depth += 2
    scores_exp_pv(out, k, d, f"o_ps[it // {tpb}][0:P, it % {tpb}, :]", split_scale(k)[1])
    out.add(f"""\
for it in range(ntq):
    P = min({PMAX}, {k.sq} - qb - it * {PMAX})
    col = hh * {nqt} + qb // {PMAX} + it
    acc = o_ps[it // {tpb}]
    nisa.reciprocal(dst=rchk[0:P, col:col + 1], data=acc[0:P, it % {tpb}, {dv}:{dv + 1}])
    nisa.tensor_scalar_reduce(dst=o_blk[0:P, it, hh, :], data=acc[0:P, it % {tpb}, 0:{dv}], op0=nl.multiply, operand0=rchk[0:P, col:col + 1], reduce_op=nl.add, reduce_res=ochk[0:P, col:col + 1])""")
    out.depth -= 1
    store_query_block(out, k, G)
    out.depth -= 1
    out.add(f"""\
# fold the group's checks into ok_run: 2^-120 <= 1/l <= 2^100 and a finite output row sum (x - x == 0)
ok_a = nl.ndarray(({PMAX}, {G * nqt}), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_scalar(dst=ok_a, data=rchk, op0=nl.greater_equal, operand0={RECIP_MIN!r})
nisa.scalar_tensor_tensor(dst=ok_a, data=rchk, op0=nl.less_equal, operand0={RECIP_MAX!r}, op1=nl.multiply, operand1=ok_a)
fin = nl.ndarray(({PMAX}, {G * nqt}), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_tensor(dst=fin, data1=ochk, data2=ochk, op=nl.subtract)
nisa.scalar_tensor_tensor(dst=ok_a, data=fin, op0=nl.equal, operand0=0.0, op1=nl.multiply, operand1=ok_a)
ok_g = nl.ndarray(({PMAX}, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_reduce(dst=ok_g, op=nl.minimum, data=ok_a, axis=1)
nisa.tensor_tensor(dst=ok_run, data1=ok_run, data2=ok_g, op=nl.minimum)""")
    out.depth -= 2
    out.add(f"""\
# any failed row (over all partitions) -> one int32 -> a sequencer register -> rerun with the exact kernel
bad = nl.ndarray(({PMAX}, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_scalar(dst=bad, data=ok_run, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)
bad_any = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_partition_reduce(dst=bad_any, op=nl.maximum, data=bad)
bad_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
nisa.tensor_copy(dst=bad_i, src=bad_any)
rerun = nisa.register_alloc()
nisa.register_load(dst=rerun, src=bad_i)


def exact_softmax(again):
{_indent(exact)}
    nisa.register_move(dst=again, src=0)
    return again


nl.while_loop(rerun, exact_softmax)""")
    return out.text()
