"""Black-box tests of the NKI simulator with complete kernels in the NKI 0.6 tutorial style.

Each kernel is written from scratch against the current API only (``nl.ndarray(..., buffer=...)``,
``nisa.*`` with ``dst=``, outputs in ``nl.shared_hbm``, Python ``range`` loops, ``min()``-bounded slices
for ragged edges, ``nl.ds``), run through ``simulate(kernel)(...)`` in fp32 and bf16, and compared with
a NumPy reference computed in float64 from the same (rounded) inputs, with per-dtype tolerances.
A second group of kernels must fail with :class:`SimulatorConstraintError` (hardware limits), and one
reads uninitialised SBUF to check the NaN / 4 sentinels.
"""

from __future__ import annotations

import logging
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.simulator import nisa, nki, nl, simulate, trace, use_target

log = logging.getLogger(__name__)

P = 128
FP32_MIN = -3.4028235e38

# nl dtype name -> NumPy storage type used for inputs and references.
NP_DTYPES: dict[str, Any] = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3": ml_dtypes.float8_e4m3,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
}
# (rtol, atol) per kernel I/O dtype: bf16 results carry one output rounding (2**-8 relative).
TOL: dict[str, tuple[float, float]] = {"float32": (1e-4, 1e-5), "bfloat16": (1.6e-2, 1e-2)}
IO_DTYPES = ["float32", "bfloat16"]


def make(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    """Random normal input stored in ``dtype`` (so the reference sees the same rounded values)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(NP_DTYPES[dtype])


def f64(a: Any) -> np.ndarray:
    """A simulator result (NumPy of any float dtype, or a torch tensor) as float64."""
    if isinstance(a, torch.Tensor):
        a = a.float().numpy()
    return np.asarray(a).astype(np.float32).astype(np.float64)


def check_close(out: Any, ref: np.ndarray, dtype: str) -> None:
    """Per-dtype rtol; atol scaled by the result's magnitude (fp32 sums of many terms round too)."""
    rtol, atol = TOL[dtype]
    atol *= max(1.0, float(np.abs(ref).max()))
    if not isinstance(out, torch.Tensor):
        assert np.asarray(out).dtype == np.dtype(NP_DTYPES[dtype]), f"result dtype {np.asarray(out).dtype}"
    assert tuple(out.shape) == ref.shape
    np.testing.assert_allclose(f64(out), ref, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------


@nki.jit
def matmul_kernel(lhsT, rhs):
    """C[M, N] = lhsT.T @ rhs, K accumulated in one PSUM tile per output tile."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK = nl.tile_size.pmax
    TM = nl.tile_size.gemm_stationary_fmax
    TN = nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m0 in range(0, M, TM):
        ms = min(TM, M - m0)
        for n0 in range(0, N, TN):
            ns = min(TN, N - n0)
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k0 in range(0, K, TK):
                ks = min(TK, K - k0)
                a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a[0:ks, 0:ms], src=lhsT[nl.ds(k0, ks), nl.ds(m0, ms)])
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b[0:ks, 0:ns], src=rhs[k0 : k0 + ks, n0 : n0 + ns])
                nisa.nc_matmul(
                    dst=acc[0:ms, 0:ns], stationary=a[0:ks, 0:ms], moving=b[0:ks, 0:ns], accumulate=(k0 > 0)
                )
            res = nl.ndarray((TM, TN), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res[0:ms, 0:ns], src=acc[0:ms, 0:ns])
            nisa.dma_copy(dst=out[m0 : m0 + ms, n0 : n0 + ns], src=res[0:ms, 0:ns])
    return out


@nki.jit
def softmax_kernel(x):
    """Row softmax: negated row max, exp with bias and fused row sum, reciprocal, per-row scale."""
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        rs = min(P, R - r0)
        t = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rs, :], src=x[r0 : r0 + rs, :])
        neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max[0:rs], op=nl.maximum, data=t[0:rs], axis=1, negate=True)
        e = nl.ndarray((P, C), dtype=nl.float32, buffer=nl.sbuf)
        row_sum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=e[0:rs],
            op=nl.exp,
            data=t[0:rs],
            bias=neg_max[0:rs],
            reduce_op=nl.add,
            reduce_res=row_sum[0:rs],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv[0:rs], data=row_sum[0:rs])
        res = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=res[0:rs], data=e[0:rs], op0=nl.multiply, operand0=inv[0:rs])
        nisa.dma_copy(dst=out[r0 : r0 + rs, :], src=res[0:rs])
    return out


@nki.jit
def rmsnorm_kernel(x, gamma, eps):
    """y = x * rsqrt(mean(x**2) + eps) * gamma, gamma (H,) broadcast over partitions from HBM."""
    R, H = x.shape
    out = nl.ndarray((R, H), dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=gamma.expand_dim(0).broadcast(0, P))
    eps_t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_t, value=eps)
    for r0 in range(0, R, P):
        rs = min(P, R - r0)
        t = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rs], src=x[r0 : r0 + rs, :])
        sq = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=sq[0:rs],
            op=nl.square,
            data=t[0:rs],
            reduce_op=nl.add,
            reduce_res=ss[0:rs],
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd[0:rs], op=nl.rsqrt, data=ss[0:rs], scale=1.0 / H, bias=eps_t[0:rs])
        y = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y[0:rs], data=t[0:rs], op0=nl.multiply, operand0=rstd[0:rs])
        res = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res[0:rs], data1=y[0:rs], data2=g[0:rs], op=nl.multiply)
        nisa.dma_copy(dst=out[r0 : r0 + rs, :], src=res[0:rs])
    return out


@nki.jit
def layernorm_kernel(x, gamma, beta, eps):
    """LayerNorm over H (> 512) with one bn_stats per 512-chunk and a single bn_aggr."""
    R, H = x.shape
    FMAX = nl.tile_size.bn_stats_fmax
    n_chunks = (H + FMAX - 1) // FMAX
    out = nl.ndarray((R, H), dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=gamma.expand_dim(0).broadcast(0, P))
    b = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=beta.expand_dim(0).broadcast(0, P))
    eps_t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_t, value=eps)
    for r0 in range(0, R, P):
        rs = min(P, R - r0)
        t = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rs], src=x[r0 : r0 + rs, :])
        stats = nl.ndarray((P, 6 * n_chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(n_chunks):
            c0 = c * FMAX
            cs = min(FMAX, H - c0)
            nisa.bn_stats(dst=stats[0:rs, 6 * c : 6 * c + 6], data=t[0:rs, c0 : c0 + cs])
        mv = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv[0:rs], data=stats[0:rs])
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd[0:rs], op=nl.rsqrt, data=mv[0:rs, 1:2], bias=eps_t[0:rs])
        y = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=y[0:rs],
            data=t[0:rs],
            op0=nl.subtract,
            operand0=mv[0:rs, 0:1],
            op1=nl.multiply,
            operand1=rstd[0:rs],
        )
        nisa.tensor_tensor(dst=y[0:rs], data1=y[0:rs], data2=g[0:rs], op=nl.multiply)
        res = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res[0:rs], data1=y[0:rs], data2=b[0:rs], op=nl.add)
        nisa.dma_copy(dst=out[r0 : r0 + rs, :], src=res[0:rs])
    return out


@nki.jit
def pe_transpose_kernel(x):
    """2-D transpose on TensorE, one 128x128 block at a time (PSUM in the input dtype)."""
    R, C = x.shape
    out = nl.ndarray((C, R), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        rs = min(P, R - r0)
        for c0 in range(0, C, P):
            cs = min(P, C - c0)
            t = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t[0:rs, 0:cs], src=x[r0 : r0 + rs, c0 : c0 + cs])
            tp = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=tp[0:cs, 0:rs], data=t[0:rs, 0:cs], engine=nisa.engine.tensor)
            res = nl.ndarray((P, P), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res[0:cs, 0:rs], src=tp[0:cs, 0:rs])
            nisa.dma_copy(dst=out[c0 : c0 + cs, r0 : r0 + rs], src=res[0:cs, 0:rs])
    return out


@nki.jit
def dma_transpose_kernel(x):
    """2-D transpose with the DMA engine: HBM [rows, <=128 cols] -> SBUF [cols, rows]."""
    R, C = x.shape
    F = 512
    out = nl.ndarray((C, R), dtype=x.dtype, buffer=nl.shared_hbm)
    for c0 in range(0, C, P):
        cs = min(P, C - c0)
        for r0 in range(0, R, F):
            rs = min(F, R - r0)
            t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_transpose(dst=t[0:cs, 0:rs], src=x[r0 : r0 + rs, c0 : c0 + cs])
            nisa.dma_copy(dst=out[c0 : c0 + cs, r0 : r0 + rs], src=t[0:cs, 0:rs])
    return out


@nki.jit
def scale_bias_kernel(x, row_scale, col_bias):
    """out1 = x * s[row] + c[col] as tensor_scalar + tensor_tensor; out2 the same as one scalar_tensor_tensor.

    x is (R, G, C); s (R,) is a per-partition (P, 1) operand; c (C,) is broadcast over partitions by a
    stride-0 HBM view and over G by a stride-0 on-chip view.
    """
    R, G, C = x.shape
    out1 = nl.ndarray((R, G, C), dtype=x.dtype, buffer=nl.shared_hbm)
    out2 = nl.ndarray((R, G, C), dtype=x.dtype, buffer=nl.shared_hbm)
    cb = nl.ndarray((P, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cb, src=col_bias.expand_dim(0).broadcast(0, P))
    for r0 in range(0, R, P):
        rs = min(P, R - r0)
        t = nl.ndarray((P, G, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rs], src=x[r0 : r0 + rs])
        sc = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sc[0:rs], src=row_scale[r0 : r0 + rs])
        cb_view = cb[0:rs].expand_dim(1).broadcast(1, G)
        y = nl.ndarray((P, G, C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y[0:rs], data=t[0:rs], op0=nl.multiply, operand0=sc[0:rs])
        res1 = nl.ndarray((P, G, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res1[0:rs], data1=y[0:rs], data2=cb_view, op=nl.add)
        nisa.dma_copy(dst=out1[r0 : r0 + rs], src=res1[0:rs])
        res2 = nl.ndarray((P, G, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            dst=res2[0:rs], data=t[0:rs], op0=nl.multiply, operand0=sc[0:rs], op1=nl.add, operand1=cb_view
        )
        nisa.dma_copy(dst=out2[r0 : r0 + rs], src=res2[0:rs])
    return out1, out2


@nki.jit
def embedding_kernel(table, ids):
    """out[t, :] = table[ids[t], :] with an indirect (vector_offset) DMA per 128 tokens and 256 columns."""
    V, D = table.shape
    (T,) = ids.shape
    TD = 256
    out = nl.ndarray((T, D), dtype=table.dtype, buffer=nl.shared_hbm)
    for t0 in range(0, T, P):
        ts = min(P, T - t0)
        idx = nl.ndarray((P, 1), dtype=ids.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx[0:ts], src=ids.ap(pattern=[[1, ts], [1, 1]], offset=t0))
        for d0 in range(0, D, TD):
            ds_ = min(TD, D - d0)
            rows = nl.ndarray((P, TD), dtype=table.dtype, buffer=nl.sbuf)
            nisa.dma_copy(
                dst=rows[0:ts, 0:ds_],
                src=table.ap(pattern=[[D, ts], [1, ds_]], offset=d0, vector_offset=idx[0:ts], indirect_dim=0),
            )
            nisa.dma_copy(dst=out[t0 : t0 + ts, d0 : d0 + ds_], src=rows[0:ts, 0:ds_])
    return out


@nki.jit
def causal_mask_kernel(scores, q_offset):
    """Keep scores[i, j] where j <= i + q_offset, else FP32_MIN (affine_select per 128-row tile)."""
    R, C = scores.shape
    out = nl.ndarray((R, C), dtype=scores.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        rs = min(P, R - r0)
        t = nl.ndarray((P, C), dtype=scores.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rs], src=scores[r0 : r0 + rs, :])
        res = nl.ndarray((P, C), dtype=scores.dtype, buffer=nl.sbuf)
        # v = (r0 + q_offset) + p - j; keep where v >= 0
        nisa.affine_select(
            dst=res[0:rs],
            pattern=[[-1, C]],
            channel_multiplier=1,
            on_true_tile=t[0:rs],
            on_false_value=FP32_MIN,
            cmp_op=nl.greater_equal,
            offset=r0 + q_offset,
        )
        nisa.dma_copy(dst=out[r0 : r0 + rs, :], src=res[0:rs])
    return out


@nki.jit
def cast_chain_kernel(x, mid_dtype, out_dtype):
    """fp32 HBM -> SBUF -> tensor_copy to mid_dtype -> tensor_copy to out_dtype -> HBM."""
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=out_dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    mid = nl.ndarray((R, C), dtype=mid_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=mid, src=t)
    res = nl.ndarray((R, C), dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=mid)
    nisa.dma_copy(dst=out, src=res)
    return out


# ------------------------------------------------------------------------------------------------
# Numerical tests
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(
    ("K", "M", "N"),
    [(256, 128, 512), (128, 256, 1024), (300, 200, 700), (64, 17, 33)],
    ids=["tiles", "multi-tile", "ragged", "small"],
)
def test_matmul(dtype: str, K: int, M: int, N: int) -> None:
    rng = np.random.default_rng(K + M + N)
    lhsT = make(rng, (K, M), dtype)
    rhs = make(rng, (K, N), dtype)
    out = simulate(matmul_kernel)(lhsT, rhs)
    ref = f64(lhsT).T @ f64(rhs)
    check_close(out, ref, dtype)


def test_matmul_torch_bf16_and_trace() -> None:
    """Torch tensors in, torch tensor out; one nc_matmul record per (m, n, k) tile."""
    gen = torch.Generator().manual_seed(0)
    lhsT = torch.randn(300, 200, generator=gen).to(torch.bfloat16)
    rhs = torch.randn(300, 700, generator=gen).to(torch.bfloat16)
    with trace() as tr:
        out = simulate(matmul_kernel)(lhsT, rhs)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    ref = lhsT.double().T @ rhs.double()
    check_close(out, ref.numpy(), "bfloat16")
    matmuls = [r for r in tr.records if r.instruction.endswith("nc_matmul")]
    assert len(matmuls) == 2 * 2 * 3  # M tiles x N tiles x K tiles


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(("R", "C"), [(256, 384), (200, 1000)], ids=["tiles", "ragged"])
def test_softmax(dtype: str, R: int, C: int) -> None:
    rng = np.random.default_rng(R * C)
    x = make(rng, (R, C), dtype, scale=3.0)
    out = simulate(softmax_kernel)(x)
    xf = f64(x)
    e = np.exp(xf - xf.max(axis=1, keepdims=True))
    check_close(out, e / e.sum(axis=1, keepdims=True), dtype)


def test_softmax_torch_matches_torch_softmax() -> None:
    x = torch.randn(130, 257, generator=torch.Generator().manual_seed(1)) * 4
    out = simulate(softmax_kernel)(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.softmax(x, dim=-1), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(("R", "H"), [(256, 384), (200, 1100)], ids=["tiles", "ragged"])
def test_rmsnorm(dtype: str, R: int, H: int) -> None:
    rng = np.random.default_rng(R + H)
    x = make(rng, (R, H), dtype)
    gamma = make(rng, (H,), dtype)
    eps = 1e-5
    out = simulate(rmsnorm_kernel)(x, gamma, eps)
    xf = f64(x)
    ref = xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps) * f64(gamma)[None, :]
    check_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(("R", "H"), [(128, 1024), (200, 1100)], ids=["tiles", "ragged"])
def test_layernorm_bn_stats(dtype: str, R: int, H: int) -> None:
    rng = np.random.default_rng(R * 7 + H)
    x = (make(rng, (R, H), "float32") * 2.0 + 0.5).astype(NP_DTYPES[dtype])
    gamma = make(rng, (H,), dtype)
    beta = make(rng, (H,), dtype)
    eps = 1e-5
    out = simulate(layernorm_kernel)(x, gamma, beta, eps)
    xf = f64(x)
    mean = xf.mean(axis=1, keepdims=True)
    var = xf.var(axis=1, keepdims=True)
    ref = (xf - mean) / np.sqrt(var + eps) * f64(gamma)[None, :] + f64(beta)[None, :]
    check_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.parametrize(("R", "C"), [(256, 128), (200, 300)], ids=["tiles", "ragged"])
def test_pe_transpose(dtype: str, target: str, R: int, C: int) -> None:
    x = make(np.random.default_rng(R + C), (R, C), dtype)
    with use_target(target):
        out = simulate(pe_transpose_kernel)(x)
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, x.T)  # bit-exact from NC-v3 on


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(("R", "C"), [(512, 128), (700, 200)], ids=["tiles", "ragged"])
def test_dma_transpose(dtype: str, R: int, C: int) -> None:
    x = make(np.random.default_rng(R * C), (R, C), dtype)
    out = simulate(dma_transpose_kernel)(x)
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(out, x.T)


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(("R", "G", "C"), [(128, 4, 64), (150, 3, 50)], ids=["tiles", "ragged"])
def test_scale_bias_broadcast(dtype: str, R: int, G: int, C: int) -> None:
    rng = np.random.default_rng(R + G + C)
    x = make(rng, (R, G, C), dtype)
    s = make(rng, (R,), dtype)
    c = make(rng, (C,), dtype)
    out1, out2 = simulate(scale_bias_kernel)(x, s, c)
    ref = f64(x) * f64(s)[:, None, None] + f64(c)[None, None, :]
    check_close(out1, ref, dtype)
    check_close(out2, ref, dtype)


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(("V", "D", "T"), [(64, 256, 128), (1000, 300, 200)], ids=["tiles", "ragged"])
def test_embedding_gather(dtype: str, V: int, D: int, T: int) -> None:
    rng = np.random.default_rng(V + D + T)
    table = make(rng, (V, D), dtype)
    ids = rng.integers(0, V, size=T).astype(np.int32)
    ids[:3] = [V - 1, 0, V - 1]  # first/last rows and a repeated id
    out = simulate(embedding_kernel)(table, ids)
    assert out.dtype == table.dtype
    np.testing.assert_array_equal(out, table[ids])


@pytest.mark.parametrize("dtype", IO_DTYPES)
@pytest.mark.parametrize(("R", "C", "q_offset"), [(128, 128, 0), (200, 300, 50)], ids=["square", "offset"])
def test_causal_mask(dtype: str, R: int, C: int, q_offset: int) -> None:
    x = make(np.random.default_rng(R + C), (R, C), dtype)
    out = simulate(causal_mask_kernel)(x, q_offset)
    i, j = np.indices((R, C))
    fill = np.array(FP32_MIN, dtype=np.float32).astype(NP_DTYPES[dtype])
    ref = np.where(j <= i + q_offset, x, fill)
    np.testing.assert_array_equal(out, ref)


FLOAT_DTYPES = ["float32", "bfloat16", "float16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("mid", FLOAT_DTYPES)
@pytest.mark.parametrize("dst", FLOAT_DTYPES)
def test_cast_every_float_pair(mid: str, dst: str) -> None:
    """fp32 -> mid -> dst with round-to-nearest-even at each step, values inside every format's range."""
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            (rng.standard_normal(4 * 96) * 20).astype(np.float32),
            np.array([0.0, -0.0, 1.0, -1.0, 0.1, 3.3, 100.0, -200.0], np.float32).repeat(12),
        ]
    ).reshape(8, 60)
    x = np.clip(x, -200, 200)
    out = simulate(cast_chain_kernel)(x, getattr(nl, mid), getattr(nl, dst))
    ref = x.astype(NP_DTYPES[mid]).astype(NP_DTYPES[dst])
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(out.astype(np.float32), ref.astype(np.float32))


INT_DTYPES = ["int8", "int16", "int32", "uint8", "uint16", "uint32"]


@pytest.mark.parametrize("dst", INT_DTYPES)
def test_cast_float_to_int_rounds_half_even_and_saturates(dst: str) -> None:
    vals = [-1e10, -70000.0, -300.5, -128.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 126.5, 127.5, 128.0]
    vals += [254.5, 255.5, 256.0, 32767.5, 40000.0, 65535.5, 3e9, 5e9, 1e10]
    x = np.array(vals, dtype=np.float32).reshape(2, -1)
    out = simulate(cast_chain_kernel)(x, nl.float32, getattr(nl, dst))
    info = np.iinfo(NP_DTYPES[dst])
    ref = np.clip(np.rint(x.astype(np.float64)), info.min, info.max).astype(NP_DTYPES[dst])
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(out, ref)


# ------------------------------------------------------------------------------------------------
# Hardware-constraint violations and uninitialised memory
# ------------------------------------------------------------------------------------------------


@nki.jit
def single_matmul_kernel(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    a = nl.ndarray((K, M), dtype=lhsT.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT)
    b = nl.ndarray((K, N), dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=rhs)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_matmul_moving_1024_rejected_on_trn2_accepted_on_trn3() -> None:
    rng = np.random.default_rng(0)
    lhsT = make(rng, (128, 64), "bfloat16")
    rhs = make(rng, (128, 1024), "bfloat16")
    with use_target("trn2"), pytest.raises(SimulatorConstraintError) as info:
        simulate(single_matmul_kernel)(lhsT, rhs)
    err = info.value
    assert (err.instruction, err.operand, err.value) == ("nisa.nc_matmul", "moving", 1024)
    assert "512" in str(err.limit)
    assert "nisa.nc_matmul: operand 'moving' = 1024 violates limit" in str(err)
    with use_target("trn3"):  # NC-v4: N <= 4096 with an fp32 PSUM destination
        out = simulate(single_matmul_kernel)(lhsT, rhs)
    np.testing.assert_allclose(out, f64(lhsT).T @ f64(rhs), rtol=1e-5, atol=1e-4)


@nki.jit
def too_many_partitions_kernel(x):
    t = nl.ndarray((256, 64), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray((256, 64), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_partition_dim_256_rejected() -> None:
    x = np.zeros((256, 64), np.float32)
    with pytest.raises(SimulatorConstraintError) as info:
        simulate(too_many_partitions_kernel)(x)
    err = info.value
    assert (err.instruction, err.operand, err.value) == ("nl.ndarray", "shape", (256, 64))
    assert "partition" in str(err.limit) and "128" in str(err.limit)
    assert str(err).startswith("nl.ndarray: operand 'shape' = (256, 64) violates limit")


@nki.jit
def psum_to_hbm_kernel(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    a = nl.ndarray((K, M), dtype=lhsT.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT)
    b = nl.ndarray((K, N), dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=rhs)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_dma_from_psum_rejected() -> None:
    rng = np.random.default_rng(1)
    with pytest.raises(SimulatorConstraintError) as info:
        simulate(psum_to_hbm_kernel)(make(rng, (64, 32), "float32"), make(rng, (64, 48), "float32"))
    err = info.value
    assert (err.instruction, err.operand, err.value) == ("nisa.dma_copy", "src", "nl.psum")
    assert "PSUM" in str(err.limit)
    assert "tensor_copy" in str(err)  # the message says how to fix it


@nki.jit
def psum_psum_add_kernel(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    a = nl.ndarray((K, M), dtype=lhsT.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT)
    b = nl.ndarray((K, N), dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=rhs)
    acc1 = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc1, stationary=a, moving=b)
    acc2 = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc2, stationary=a, moving=b)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=res, data1=acc1, data2=acc2, op=nl.add)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_tensor_tensor_both_psum_rejected() -> None:
    rng = np.random.default_rng(2)
    with pytest.raises(SimulatorConstraintError) as info:
        simulate(psum_psum_add_kernel)(make(rng, (64, 32), "float32"), make(rng, (64, 48), "float32"))
    err = info.value
    assert (err.instruction, err.operand, err.value) == ("nisa.tensor_tensor", "data2", "nl.psum")
    assert "both" in str(err.limit) and "PSUM" in str(err.limit)


@nki.jit
def half_written_kernel(x):
    """Writes only the first half of the free dim of an SBUF tile, then copies the whole tile out."""
    R, C = x.shape
    t = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0 : C // 2], src=x[:, 0 : C // 2])
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def uninit_sum_kernel(x):
    """Row sums over a tile whose second half was never written: the NaN sentinel must propagate."""
    R, C = x.shape
    t = nl.ndarray((R, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0 : C // 2], src=x[:, 0 : C // 2])
    s = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s, op=nl.add, data=t, axis=1)
    out = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=s)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_uninitialised_sbuf_reads_nan(dtype: str) -> None:
    x = make(np.random.default_rng(3), (16, 40), dtype)
    out = simulate(half_written_kernel)(x)
    np.testing.assert_array_equal(out[:, :20], x[:, :20])
    assert np.isnan(out[:, 20:].astype(np.float32)).all()
    sums = simulate(uninit_sum_kernel)(x.astype(np.float32))
    assert np.isnan(sums).all()


def test_uninitialised_int_sbuf_reads_four() -> None:
    x = np.arange(16 * 40, dtype=np.int32).reshape(16, 40)
    out = simulate(half_written_kernel)(x)
    np.testing.assert_array_equal(out[:, :20], x[:, :20])
    assert (out[:, 20:] == 4).all()
