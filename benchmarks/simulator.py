"""Benchmark of the NKI CPU simulator against plain NumPy computing the same results.

Run ``python benchmarks/simulator.py`` (``--help`` for sizes, repeats and ``--profile``). It times, in one
process and best of N runs each:

(a) a tiled bf16 matmul (2048^3 by default) with K accumulated in PSUM, on the simulator, against NumPy
    computing ``lhsT.T @ rhs`` from the same bf16-rounded inputs in fp32 (result rounded to bf16);
(b) a row softmax over a 4096x4096 fp32 matrix on the simulator against a NumPy softmax.

It checks that both pairs of results agree, prints a table of times, ratios and targets ((a) <= 3x,
(b) <= 5x), and exits 1 if a result is wrong (a missed ratio is only reported). ``--profile`` prints the
top cProfile entries of one simulator run of each kernel, to find what is slow.

BLAS threads matter: the simulator runs many small GEMMs (128x128x512), for which OpenBLAS's threading
costs more than it gains on a busy machine, while NumPy's one big GEMM profits from it.
``--blas-threads N`` re-executes the script with ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``/
``MKL_NUM_THREADS`` set to N for both sides (these must be set before NumPy is imported).
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from neuron_compile.simulator import nisa, nki, nl, simulate

log = logging.getLogger(__name__)

BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
MATMUL_TARGET = 3.0
SOFTMAX_TARGET = 5.0


@nki.jit
def bench_matmul_kernel(lhsT, rhs):
    """C[M, N] = lhsT.T @ rhs; lhsT tiles of one M block are loaded once and reused over N."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK = nl.tile_size.pmax
    TM = nl.tile_size.gemm_stationary_fmax
    TN = nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m0 in range(0, M, TM):
        ms = min(TM, M - m0)
        a_tiles = []
        for k0 in range(0, K, TK):
            ks = min(TK, K - k0)
            a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a[0:ks, 0:ms], src=lhsT[k0 : k0 + ks, m0 : m0 + ms])
            a_tiles.append(a)
        for n0 in range(0, N, TN):
            ns = min(TN, N - n0)
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for i, k0 in enumerate(range(0, K, TK)):
                ks = min(TK, K - k0)
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b[0:ks, 0:ns], src=rhs[k0 : k0 + ks, n0 : n0 + ns])
                nisa.nc_matmul(
                    dst=acc[0:ms, 0:ns],
                    stationary=a_tiles[i][0:ks, 0:ms],
                    moving=b[0:ks, 0:ns],
                    accumulate=(i > 0),
                )
            res = nl.ndarray((TM, TN), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res[0:ms, 0:ns], src=acc[0:ms, 0:ns])
            nisa.dma_copy(dst=out[m0 : m0 + ms, n0 : n0 + ns], src=res[0:ms, 0:ns])
    return out


@nki.jit
def bench_softmax_kernel(x):
    """Row softmax, 128 rows per tile: -max, exp with fused row sum, reciprocal, per-row scale."""
    R, C = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, P):
        rs = min(P, R - r0)
        t = nl.ndarray((P, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rs], src=x[r0 : r0 + rs, :])
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


def numpy_matmul(lhsT: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """The same product computed directly: bf16 inputs widened to fp32, fp32 accumulate, bf16 result."""
    return (lhsT.astype(np.float32).T @ rhs.astype(np.float32)).astype(ml_dtypes.bfloat16)


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall time of ``repeats`` calls, and the last result."""
    best = float("inf")
    result: Any = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


@dataclass(frozen=True)
class Row:
    name: str
    sim_s: float
    numpy_s: float
    target: float
    correct: bool
    max_err: float

    @property
    def ratio(self) -> float:
        return self.sim_s / self.numpy_s


def agree(sim: np.ndarray, ref: np.ndarray, rtol: float, atol_frac: float) -> tuple[bool, float]:
    s = np.asarray(sim).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    if s.shape != r.shape or not np.isfinite(s).all():
        return False, float("nan")
    atol = atol_frac * float(np.abs(r).max())
    err = float(np.abs(s - r).max())
    return bool(np.allclose(s, r, rtol=rtol, atol=atol)), err


def profile(label: str, fn: Callable[[], Any], top: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    print(f"\n--- cProfile: {label} (top {top} by own time) ---")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matmul-size", type=int, default=2048, help="M = N = K of the bf16 matmul")
    parser.add_argument("--softmax-rows", type=int, default=4096)
    parser.add_argument("--softmax-cols", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--profile", action="store_true", help="print cProfile of one simulator run each")
    parser.add_argument("--top", type=int, default=25, help="cProfile entries to print")
    parser.add_argument(
        "--blas-threads", type=int, default=None, help="BLAS threads for both sides (re-executes)"
    )
    args = parser.parse_args(argv)
    if args.blas_threads is not None and os.environ.get(BLAS_ENV[0]) != str(args.blas_threads):
        for var in BLAS_ENV:
            os.environ[var] = str(args.blas_threads)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])

    rng = np.random.default_rng(0)
    n = args.matmul_size
    lhsT = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    x = (rng.standard_normal((args.softmax_rows, args.softmax_cols), dtype=np.float32) * 4).astype(np.float32)

    def sim_mm() -> Any:
        return simulate(bench_matmul_kernel)(lhsT, rhs)

    def np_mm() -> Any:
        return numpy_matmul(lhsT, rhs)

    def sim_sm() -> Any:
        return simulate(bench_softmax_kernel)(x)

    def np_sm() -> Any:
        return numpy_softmax(x)

    rows = []
    sim_t, sim_out = best_of(sim_mm, args.repeats)
    np_t, np_out = best_of(np_mm, args.repeats)
    ok, err = agree(sim_out, np_out, rtol=1e-2, atol_frac=1e-2)
    ok = ok and np.asarray(sim_out).dtype == np.dtype(ml_dtypes.bfloat16)
    rows.append(Row(f"matmul bf16 {n}x{n}x{n}", sim_t, np_t, MATMUL_TARGET, ok, err))

    sim_t, sim_out = best_of(sim_sm, args.repeats)
    np_t, np_out = best_of(np_sm, args.repeats)
    ok, err = agree(sim_out, np_out, rtol=1e-4, atol_frac=1e-6)
    rows.append(
        Row(f"softmax fp32 {args.softmax_rows}x{args.softmax_cols}", sim_t, np_t, SOFTMAX_TARGET, ok, err)
    )

    threads = os.environ.get(BLAS_ENV[0], "default")
    print(f"best of {args.repeats} runs each; {BLAS_ENV[0]}={threads}; {os.cpu_count()} CPUs")
    header = f"{'case':<28} {'simulator s':>12} {'numpy s':>10} {'ratio':>7} {'target':>7} {'ratio ok':>9} {'result':>8} {'max err':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.name:<28} {r.sim_s:>12.3f} {r.numpy_s:>10.3f} {r.ratio:>6.2f}x {r.target:>6.1f}x "
            f"{'yes' if r.ratio <= r.target else 'MISSED':>9} {'ok' if r.correct else 'WRONG':>8} {r.max_err:>10.3g}"
        )

    if args.profile:
        profile("simulator matmul", sim_mm, args.top)
        profile("simulator softmax", sim_sm, args.top)

    return 0 if all(r.correct for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
