"""Render matmul loop kernels: blocked TensorE GEMM with PE transposes and a fused PSUM-eviction epilogue.

Input: a :class:`~neuron_compile.lowering.ir.LoopKernel` of family ``matmul`` whose first op is a
``matmul`` (accesses ``a``/``b`` over the canonical space ``(outer..., m, n)``, contraction strides
``ak``/``bk``, size ``k``, and a ``tiles`` configuration chosen by the autotuner in
:mod:`neuron_compile.lowering.ops.matmul`). Output: the kernel body (NKI source text).

Structure, per outer (batch) index:

1. *Transposes on TensorE* (only for an operand whose contraction dim is its contiguous one, e.g.
   ``x [M, K]`` and a Linear weight ``W [N, K]``): contiguous row blocks ``[128, <=2048]`` are loaded
   (>= 2 KiB per partition), transposed 128x128 at a time with ``nisa.nc_transpose`` into a PSUM
   tile, evicted four at a time, and written once to an HBM scratch ``[K, rows]`` with runs of
   ``rows_per_group x itemsize`` bytes. Every element is transposed exactly once, never by an
   element-strided DMA.
2. *Blocked GEMM*: for each ``(BM, BN)`` output block and each ``KB``-tile chunk of K, one DMA
   loads the stationary block ``aT [128, KB, BM]`` and one the moving block ``b [128, KB, BN]``
   (both in their storage dtype: bf16 stays bf16); TensorE accumulates every ``128 x NT`` output
   tile of the block over all of K in its own PSUM tile (up to 7 in rotation, so the next tile fills
   while the previous one is evicted).
3. *Eviction with the epilogue*: the PSUM tile is read in place by the first epilogue instruction
   (bias add, activation, scaling), so eviction and epilogue are one pass; a result stored as-is is
   evicted by one ``tensor_copy`` in the output dtype. Loads of the epilogue that are constant over
   rows (a Linear bias) are hoisted to one partition-broadcast DMA per N block; row-varying ones (a
   residual) arrive in one ``[128, RG, BN]`` DMA per group of ``RG`` row tiles, and results leave in
   one store per ``SG`` row tiles, all in their storage dtype (engines convert on read and write).
   This phase is :class:`~neuron_compile.codegen.render_matmul_epilogue.MatmulEpilogue`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from neuron_compile.codegen.render import Lines, LoopRenderer, _offset
from neuron_compile.codegen.render_matmul_epilogue import ITEMSIZE, MatmulEpilogue, _ceil_to
from neuron_compile.lowering.ir import LoopKernel, TileOp

from neuron_compile.errors import TemplateRenderError
from neuron_compile.simulator_limits import PMAX, PSUM_BANK_FMAX

log = logging.getLogger(__name__)

TRANSPOSE_ROW_GROUP = 8  # row tiles transposed per scratch store: 8 x 128 bf16 -> 2 KiB runs
MAX_PSUM_TILES = 7  # [128, 512] fp32 accumulators (8 banks, one kept for TensorE transposes)
PSUM_BANK_BYTES = PSUM_BANK_FMAX * 4  # per partition
PSUM_BANKS = 8  # 16 KiB of PSUM per partition
TRANSPOSE_K_CHUNK = 2048  # contraction elements loaded per row DMA (4 KiB bf16 per partition)
TRANSPOSE_ROWS_BYTES = 16 * 1024  # per partition and row DMA of a direct transpose (4 x 4 KiB K runs)


@dataclass(frozen=True)
class Tiles:
    """A matmul tile configuration (part of the kernel IR, chosen by the autotuner)."""

    bm: int  # output rows per block (multiple of 128)
    bn: int  # output columns per block (multiple of nt)
    kb: int  # contraction tiles (of 128) per operand DMA
    ta: bool  # transpose A on TensorE (via HBM scratch) instead of an element-strided load
    tb: bool  # same for B
    resident: bool = False  # blocks hold all of K: A once per M block, B once per (M, N) block
    split: bool = False  # K in KB-tile chunks, partial sums of the whole block kept in SBUF fp32
    direct: bool = False  # ta/tb transposes go straight into the SBUF blocks (no HBM scratch round trip)
    rg: int = 1  # row tiles per epilogue group: one DMA per group loads a row-varying operand (a residual)
    sg: int = 0  # row tiles per store of a result (<= rg); 0: rg
    sb: bool = False  # with direct: B still goes through the HBM scratch (transposed once, not per M block)

    def to_attr(self) -> tuple[int, int, int, bool, bool, bool, bool, bool, int, int, bool]:
        return (self.bm, self.bn, self.kb, self.ta, self.tb, self.resident, self.split, self.direct, self.rg, self.sg,
                self.sb)

    @classmethod
    def from_attr(cls, attr: Any) -> Tiles:
        bm, bn, kb, ta, tb, res, *rest = attr
        split, direct, rg, sg, sb = (list(rest) + [False, False, 1, 0, False][len(rest):])[:5]
        return cls(int(bm), int(bn), int(kb), bool(ta), bool(tb), bool(res), bool(split), bool(direct), int(rg),
                   int(sg), bool(sb))


@dataclass(frozen=True)
class Operand:
    """One matmul operand over (non-contraction index r, contraction index k)."""

    arg: str  # source tensor name
    offset: str  # base offset expression (outer loop vars included)
    rs: int  # stride along the non-contraction dim (m for A, n for B)
    ks: int  # stride along K
    rows: int  # non-contraction size
    dtype: str

    def transposable(self) -> bool:
        """Contraction dim contiguous, the other not: a PE transpose gives contiguous loads."""
        return self.ks == 1 and self.rs != 1 and self.rows > 1


def geometry(k: LoopKernel) -> tuple[int, int, int]:
    """(M, N, K) of a matmul kernel."""
    return k.space[k.n_outer], k.space[-1], int(matmul_op(k).attr("k"))


def matmul_op(k: LoopKernel) -> TileOp:
    return next(op for op in k.ops if op.opcode == "matmul")


def operands(k: LoopKernel) -> tuple[Operand, Operand]:
    mm = matmul_op(k)
    outer = [f"o{i}" for i in range(k.n_outer)]
    m, n, _ = geometry(k)
    a_arg, a_off, a_st = mm.attr("a")
    b_arg, b_off, b_st = mm.attr("b")
    a = Operand(f"in{a_arg}", _offset(a_off, list(zip(outer, a_st[:k.n_outer], strict=True))), a_st[k.n_outer],
                int(mm.attr("ak")), m, mm.attr("a_dtype"))
    b = Operand(f"in{b_arg}", _offset(b_off, list(zip(outer, b_st[:k.n_outer], strict=True))), b_st[-1],
                int(mm.attr("bk")), n, mm.attr("b_dtype"))
    return a, b


def moving_tile(n: int) -> int:
    return min(PSUM_BANK_FMAX, n)


class MatmulRenderer(MatmulEpilogue):
    def __init__(self, k: LoopKernel) -> None:
        self.k = k
        self.mm = matmul_op(k)
        self.rest = [op for op in k.ops if op is not self.mm]
        self.loop = LoopRenderer(k)
        self.M, self.N, self.K = geometry(k)
        self.a, self.b = operands(k)
        self.t = Tiles.from_attr(self.mm.attr("tiles"))
        self.nt = moving_tile(self.N)
        self.acc_src = "acc[t % len(acc)][0:P, 0:F]"  # where the epilogue reads the finished sum
        self.direct: set[str] = set()  # blocks ("a_blk"/"b_blk") filled by TensorE transposes
        self.kb = 1  # K tiles per operand block chunk (clamped to K)
        self.block_rows = {"a_blk": PMAX, "b_blk": PMAX}  # rows of each operand block (clamped to M / N)
        self.held = 0  # SBUF bytes per partition of the operand blocks, partial sums and staging rows
        self.n_acc = 0  # PSUM accumulators (set when they are allocated)
        # Row ops (a LayerNorm after the residual add): the first row reduction and everything after it run
        # once per 128-row tile over the whole output row ([P, BN], BN = N), after the tile's chunks.
        red = any(op.opcode == "reduce" for op in self.rest)
        self.row_dtype: dict[str, str] = {}  # row tiles of values held in a narrow dtype (resident_values)
        self.post: list[TileOp] = []
        done: set[str] = set()
        for op in self.rest if red else ():  # and every op reading one of theirs
            if op.opcode != "load" and (op.opcode == "reduce" or op.phase >= 1 or op.kind == "row"
                                        or any(a in done for a in op.args if isinstance(a, str))):
                self.post.append(op)
                done.add(op.out)
        post_ids = {id(op) for op in self.post}
        self.chunk_ops = [op for op in self.rest if id(op) not in post_ids]
        if self.post:
            assert self.t.bn >= self.N, f"{k.name}: row ops need one N block (BN {self.t.bn} < N {self.N})"

    # -- phase 1: transposes into HBM scratch ------------------------------------------------------
    def transpose_to_scratch(self, out: Lines, op: Operand, name: str) -> Operand:
        """Emit PE transposes of ``op`` ([rows, K], K contiguous) into scratch ``name`` ([K, rows])."""
        rows, kk, dt = op.rows, self.K, op.dtype
        g = min(TRANSPOSE_ROW_GROUP, math.ceil(rows / PMAX))
        kw = min(TRANSPOSE_K_CHUNK, kk)
        kwt = math.ceil(kw / PMAX)
        out.add(f"""
            {name}_rows = nl.ndarray(({PMAX}, {g}, {kw}), dtype=nl.{dt}, buffer=nl.sbuf)
            {name}_cols = nl.ndarray(({PMAX}, {kwt}, {g * PMAX}), dtype=nl.{dt}, buffer=nl.sbuf)
            {name}_tp = nl.ndarray(({PMAX}, {4 * PMAX}), dtype=nl.{dt}, buffer=nl.psum)
            for r0 in range(0, {rows}, {g * PMAX}):
                RW = min({g * PMAX}, {rows} - r0)
                for k0 in range(0, {kk}, {kw}):
                    KW = min({kw}, {kk} - k0)
                    for g in range(0, RW, {PMAX}):
                        R = min({PMAX}, RW - g)
                        nisa.dma_copy(dst={name}_rows[0:R, g // {PMAX}, 0:KW], src={op.arg}.ap(pattern=[[{op.rs}, R], [1, KW]], offset={op.offset} + (r0 + g) * {op.rs} + k0))
                    for kt in range(0, KW, {PMAX}):
                        KK = min({PMAX}, KW - kt)
                        for g4 in range(0, RW, {4 * PMAX}):
                            W4 = min({4 * PMAX}, RW - g4)
                            for g in range(g4, g4 + W4, {PMAX}):
                                R = min({PMAX}, RW - g)
                                nisa.nc_transpose(dst={name}_tp[0:KK, g - g4:g - g4 + R], data={name}_rows[0:R, g // {PMAX}, kt:kt + KK])
                            nisa.tensor_copy(dst={name}_cols[0:KK, kt // {PMAX}, g4:g4 + W4], src={name}_tp[0:KK, 0:W4])
                    KF = KW // {PMAX}
                    if KF > 0:
                        nisa.dma_copy(dst={name}.ap(pattern=[[{rows}, {PMAX}], [{PMAX * rows}, KF], [1, RW]], offset=k0 * {rows} + r0), src={name}_cols[0:{PMAX}, 0:KF, 0:RW])
                    if KW % {PMAX}:
                        nisa.dma_copy(dst={name}.ap(pattern=[[{rows}, KW % {PMAX}], [1, RW]], offset=(k0 + KF * {PMAX}) * {rows} + r0), src={name}_cols[0:KW % {PMAX}, KF, 0:RW])
            """)
        return Operand(name, "0", 1, rows, rows, dt)

    # -- phase 2: blocked GEMM ---------------------------------------------------------------------
    def load_block(self, out: Lines, op: Operand, dst: str, r0: str, width: str, kt0: str = "0") -> None:
        """DMA ``op[r0:r0+width, k0:k0+KW]`` transposed into ``dst[k, kt0 + kt, r]`` (full K tiles in one DMA)."""
        if dst in self.direct:
            self.load_block_transposed(out, op, dst, r0, width, kt0)
            return
        out.add(f"""
            KF = KW // {PMAX}
            if KF > 0:
                nisa.dma_copy(dst={dst}[0:{PMAX}, {kt0}:{kt0} + KF, 0:{width}], src={op.arg}.ap(pattern=[[{op.ks}, {PMAX}], [{op.ks * PMAX}, KF], [{op.rs}, {width}]], offset={op.offset} + k0 * {op.ks} + {r0} * {op.rs}))
            if KW % {PMAX}:
                nisa.dma_copy(dst={dst}[0:KW % {PMAX}, {kt0} + KF, 0:{width}], src={op.arg}.ap(pattern=[[{op.ks}, KW % {PMAX}], [{op.rs}, {width}]], offset={op.offset} + (k0 + KF * {PMAX}) * {op.ks} + {r0} * {op.rs}))
            """)

    def load_block_transposed(self, out: Lines, op: Operand, dst: str, r0: str, width: str, kt0: str) -> None:
        """``op[r0:r0+width, k0:k0+KW]`` (K contiguous) into ``dst[k, kt0 + kt, r]`` by TensorE transposes.

        Rows arrive ``L`` row tiles at a time in one DMA of K-contiguous runs (``transpose_rows``);
        each 128x128 transpose lands in one half of a one-bank PSUM tile and the ``G`` of a half leave
        together, alternately on VectorE and ScalarE, so no element goes through an HBM scratch.
        """
        g = _transpose_group(op.dtype)
        lg = transpose_rows(op.dtype, min(self.kb * PMAX, self.K), self.block_rows[dst])
        rows, tp = f"{dst}_tr_rows", f"tr_tp_{op.dtype}"
        out.add(f"""
            for g8 in range(0, {width}, {lg * PMAX}):
                W8 = min({lg * PMAX}, {width} - g8)
                GF = W8 // {PMAX}
                if GF > 0:
                    nisa.dma_copy(dst={rows}[0:{PMAX}, 0:GF, 0:KW], src={op.arg}.ap(pattern=[[{op.rs}, {PMAX}], [{PMAX * op.rs}, GF], [1, KW]], offset={op.offset} + ({r0} + g8) * {op.rs} + k0))
                if W8 % {PMAX}:
                    nisa.dma_copy(dst={rows}[0:W8 % {PMAX}, GF, 0:KW], src={op.arg}.ap(pattern=[[{op.rs}, W8 % {PMAX}], [1, KW]], offset={op.offset} + ({r0} + g8 + GF * {PMAX}) * {op.rs} + k0))
                for g4 in range(g8, g8 + W8, {g * PMAX}):
                    W4 = min({g * PMAX}, g8 + W8 - g4)
                    for kt in range(0, KW, {PMAX}):
                        KK = min({PMAX}, KW - kt)
                        h = (kt // {PMAX}) % 2
                        for g in range(0, W4, {PMAX}):
                            R = min({PMAX}, W4 - g)
                            nisa.nc_transpose(dst={tp}[0:KK, h, g:g + R], data={rows}[0:R, (g4 - g8 + g) // {PMAX}, kt:kt + KK])
                        if h == 0:
                            nisa.tensor_copy(dst={dst}[0:KK, {kt0} + kt // {PMAX}, g4:g4 + W4], src={tp}[0:KK, 0, 0:W4])
                        else:
                            nisa.activation(dst={dst}[0:KK, {kt0} + kt // {PMAX}, g4:g4 + W4], op=nl.copy, data={tp}[0:KK, 1, 0:W4])
            """)

    def transpose_buffers(self, out: Lines, kb: int) -> None:
        """Row staging per transposed operand and one PSUM bank per dtype (two halves) for its transposes."""
        kw = min(kb * PMAX, self.K)
        dtypes: list[str] = []
        for op, dst in ((self.a, "a_blk"), (self.b, "b_blk")):
            if dst in self.direct:
                lg = transpose_rows(op.dtype, kw, self.block_rows[dst])
                out.add(f"{dst}_tr_rows = nl.ndarray(({PMAX}, {lg}, {kw}), dtype=nl.{op.dtype}, buffer=nl.sbuf)")
                self.held += lg * kw * ITEMSIZE[op.dtype]
                if op.dtype not in dtypes:
                    dtypes.append(op.dtype)
                    out.add(f"tr_tp_{op.dtype} = nl.ndarray(({PMAX}, 2, {_transpose_group(op.dtype) * PMAX}), "
                            f"dtype=nl.{op.dtype}, buffer=nl.psum)")

    def body(self) -> str:
        k, t = self.k, self.t
        out = Lines()
        M, N, K = self.M, self.N, self.K
        bm, bn = min(t.bm, _ceil_to(M, PMAX)), min(t.bn, _ceil_to(N, self.nt))
        kb = max(1, min(t.kb, math.ceil(K / PMAX)))
        self.kb = kb
        self.block_rows = {"a_blk": bm, "b_blk": bn}
        a, b = self.a, self.b
        scratch_a = t.ta and a.transposable() and not t.direct
        scratch_b = t.tb and b.transposable() and (not t.direct or t.sb)
        for name, op, flag in (("a_t", a, scratch_a), ("b_t", b, scratch_b)):
            if flag:
                out.add(f"{name} = nl.ndarray(({K * op.rows},), dtype=nl.{op.dtype}, buffer=nl.private_hbm)")
        for i in range(k.n_outer):
            out.add(f"for o{i} in range({k.space[i]}):")
            out.depth += 1
        if scratch_a:
            a = self.transpose_to_scratch(out, a, "a_t")
        if scratch_b:
            b = self.transpose_to_scratch(out, b, "b_t")
        self.direct = {dst for dst, op, flag in (("a_blk", a, t.ta), ("b_blk", b, t.tb))
                       if flag and t.direct and op.transposable()}
        self.transpose_buffers(out, kb)
        if t.split:
            self.split_loop(out, a, b, bm, bn, kb)
        elif t.resident:
            self.resident_loop(out, a, b, bm, bn, kb)
        else:
            self.streamed_loop(out, a, b, bm, bn, kb)
        self.prove_psum_budget()
        return out.text()

    def prove_psum_budget(self) -> None:
        """The PSUM tiles one outer iteration allocates (its accumulators and transpose banks, all used
        until the iteration ends; the HBM-scratch transposes' bank dies before the accumulators exist)
        fit the 8 banks, so consecutive iterations never need more: each iteration's tiles are dead
        after its last instruction, as the NKI allocator sees them."""
        direct = {op.dtype for op, dst in ((self.a, "a_blk"), (self.b, "b_blk")) if dst in self.direct}
        banks = self.n_acc * math.ceil(self.nt * 4 / PSUM_BANK_BYTES) + len(direct)
        if banks > PSUM_BANKS:
            raise TemplateRenderError(f"matmul kernel {self.k.name}: {self.n_acc} accumulators and {len(direct)} "
                                      f"transpose banks need {banks} PSUM banks, more than the {PSUM_BANKS} there are; "
                                      "pick smaller blocks (a bug in the tile search: please report it)")

    def accumulators(self, out: Lines, n_acc: int) -> None:
        self.n_acc = n_acc
        for i in range(n_acc):
            out.add(f"acc{i} = nl.ndarray(({PMAX}, {self.nt}), dtype=nl.float32, buffer=nl.psum)")
        out.add(f"acc = [{', '.join(f'acc{i}' for i in range(n_acc))}]")

    def streamed_loop(self, out: Lines, a: Operand, b: Operand, bm: int, bn: int, kb: int) -> None:
        """K streamed in KB-tile chunks through both blocks; every tile of the block owns an accumulator."""
        K, nt = self.K, self.nt
        tm, tn = bm // PMAX, bn // nt
        n_acc = tm * tn
        self.accumulators(out, n_acc)
        self.held += kb * (bm * ITEMSIZE[a.dtype] + bn * ITEMSIZE[b.dtype])
        hoisted = self.block_loops(out, a, b, bm, bn, kb, "")
        out.add(f"for k0 in range(0, {K}, {kb * PMAX}):")
        out.depth += 1
        out.add(f"KW = min({kb * PMAX}, {K} - k0)")
        self.load_block(out, a, "a_blk", "m0", "BM")
        self.load_block(out, b, "b_blk", "n0", "BN")
        out.add(f"""
            for kt in range(0, KW, {PMAX}):
                KK = min({PMAX}, KW - kt)
                for i in range(0, BM, {PMAX}):
                    P = min({PMAX}, BM - i)
                    for j in range(0, BN, {nt}):
                        F = min({nt}, BN - j)
                        t = (i // {PMAX}) * {tn} + j // {nt}
                        nisa.nc_matmul(dst=acc[t % {n_acc}][0:P, 0:F], stationary=a_blk[0:KK, kt // {PMAX}, i:i + P], moving=b_blk[0:KK, kt // {PMAX}, j:j + F], accumulate=(k0 + kt > 0))
            """)
        out.depth -= 1
        self.eviction_loops(out, hoisted, bn, f"t = (i // {PMAX}) * {tn} + j // {nt}")

    def block_loops(self, out: Lines, a: Operand, b: Operand, bm: int, bn: int, kb: int, setup: str) -> set[str]:
        """``a_blk``/``b_blk`` of ``kb`` K tiles, ``setup``, the (m0, n0) block loops (left open) and the hoisted
        loads of each N block."""
        M, N = self.M, self.N
        out.add(f"""
            a_blk = nl.ndarray(({PMAX}, {kb}, {bm}), dtype=nl.{a.dtype}, buffer=nl.sbuf)
            b_blk = nl.ndarray(({PMAX}, {kb}, {bn}), dtype=nl.{b.dtype}, buffer=nl.sbuf)
            """)
        if setup:
            out.add(setup)
        out.add(f"""
            for m0 in range(0, {M}, {bm}):
                BM = min({bm}, {M} - m0)
                for n0 in range(0, {N}, {bn}):
                    BN = min({bn}, {N} - n0)
            """)
        out.depth += 2
        return self.hoist_loads(out)

    def resident_loop(self, out: Lines, a: Operand, b: Operand, bm: int, bn: int, kb: int) -> None:
        """Blocks hold all of K; output tiles accumulate one after the other in rotating PSUM tiles."""
        M, N, K, nt = self.M, self.N, self.K, self.nt
        kt_all = math.ceil(K / PMAX)
        n_acc = min(MAX_PSUM_TILES, math.ceil(M / PMAX) * math.ceil(N / nt))
        self.accumulators(out, n_acc)
        self.held += kt_all * (bm * ITEMSIZE[a.dtype] + bn * ITEMSIZE[b.dtype])
        out.add(f"""
            a_blk = nl.ndarray(({PMAX}, {kt_all}, {bm}), dtype=nl.{a.dtype}, buffer=nl.sbuf)
            b_blk = nl.ndarray(({PMAX}, {kt_all}, {bn}), dtype=nl.{b.dtype}, buffer=nl.sbuf)
            t = 0
            for m0 in range(0, {M}, {bm}):
                BM = min({bm}, {M} - m0)
                for k0 in range(0, {K}, {kb * PMAX}):
                    KW = min({kb * PMAX}, {K} - k0)
            """)
        out.depth += 2
        self.load_block(out, a, "a_blk", "m0", "BM", f"k0 // {PMAX}")
        out.depth -= 1
        out.add(f"""
            for n0 in range(0, {N}, {bn}):
                BN = min({bn}, {N} - n0)
            """)
        out.depth += 1
        hoisted = self.hoist_loads(out)
        out.add(f"""
            for k0 in range(0, {K}, {kb * PMAX}):
                KW = min({kb * PMAX}, {K} - k0)
            """)
        out.depth += 1
        self.load_block(out, b, "b_blk", "n0", "BN", f"k0 // {PMAX}")
        out.depth -= 1
        self.eviction_loops(out, hoisted, bn, f"""
            t = t + 1
            for kt in range(0, {K}, {PMAX}):
                KK = min({PMAX}, {K} - kt)
                nisa.nc_matmul(dst=acc[t % {n_acc}][0:P, 0:F], stationary=a_blk[0:KK, kt // {PMAX}, i:i + P], moving=b_blk[0:KK, kt // {PMAX}, j:j + F], accumulate=(kt > 0))
            """)

    def split_loop(self, out: Lines, a: Operand, b: Operand, bm: int, bn: int, kb: int) -> None:
        """Large (BM, BN) blocks, K in KB-tile chunks: each tile's chunk sum goes from PSUM into an SBUF fp32
        partial (a ScalarE copy for the first chunk, a VectorE add after), so operands are re-read only
        N/BN and M/BM times while PSUM holds just the tiles in flight. The last chunk's matmuls run in
        the eviction loop; its add into the partial is the value the epilogue reads."""
        M, N, K, nt = self.M, self.N, self.K, self.nt
        kc = kb * PMAX
        n_chunks = math.ceil(K / kc)
        n_acc = min(MAX_PSUM_TILES, math.ceil(M / PMAX) * math.ceil(N / nt))
        self.accumulators(out, n_acc)
        self.held += kb * (bm * ITEMSIZE[a.dtype] + bn * ITEMSIZE[b.dtype]) + bm // PMAX * bn * 4
        hoisted = self.block_loops(out, a, b, bm, bn, kb, f"""
            part = nl.ndarray(({PMAX}, {bm // PMAX}, {bn}), dtype=nl.float32, buffer=nl.sbuf)
            t = 0
            """)
        mm = f"""
            t = t + 1
            for kt in range(0, KW, {PMAX}):
                KK = min({PMAX}, KW - kt)
                nisa.nc_matmul(dst=acc[t % {n_acc}][0:P, 0:F], stationary=a_blk[0:KK, kt // {PMAX}, i:i + P], moving=b_blk[0:KK, kt // {PMAX}, j:j + F], accumulate=(kt > 0))
            """
        part = f"part[0:P, i // {PMAX}, j:j + F]"
        if n_chunks > 1:
            out.add(f"""
                for k0 in range(0, {(n_chunks - 1) * kc}, {kc}):
                    KW = {kc}
                """)
            out.depth += 1
            self.load_block(out, a, "a_blk", "m0", "BM")
            self.load_block(out, b, "b_blk", "n0", "BN")
            out.add(f"""
                for i in range(0, BM, {PMAX}):
                    P = min({PMAX}, BM - i)
                    for j in range(0, BN, {nt}):
                        F = min({nt}, BN - j)
                """)
            out.depth += 2
            out.add(mm)
            out.add(f"""
                if k0 == 0:
                    nisa.activation(dst={part}, op=nl.copy, data=acc[t % {n_acc}][0:P, 0:F])
                else:
                    nisa.tensor_tensor(dst={part}, data1=acc[t % {n_acc}][0:P, 0:F], data2={part}, op=nl.add)
                """)
            out.depth -= 3
        out.add(f"""
            k0 = {(n_chunks - 1) * kc}
            KW = {K - (n_chunks - 1) * kc}
            """)
        self.load_block(out, a, "a_blk", "m0", "BM")
        self.load_block(out, b, "b_blk", "n0", "BN")
        if n_chunks > 1:
            mm += f"nisa.tensor_tensor(dst={part}, data1=acc[t % {n_acc}][0:P, 0:F], data2={part}, op=nl.add)\n"
            self.acc_src = part
        self.eviction_loops(out, hoisted, bn, mm)


def transpose_rows(dtype: str, kw: int, rows: int) -> int:
    """Row tiles per direct-transpose row DMA: whole transpose groups, up to ``TRANSPOSE_ROWS_BYTES`` per partition
    (at least one group) and no more than a block's ``rows`` need, so a DMA of short K rows still moves
    enough to amortise its fixed cost."""
    g = _transpose_group(dtype)
    return g * max(1, min(TRANSPOSE_ROWS_BYTES // (g * kw * ITEMSIZE[dtype]), math.ceil(rows / (g * PMAX))))


def _transpose_group(dtype: str) -> int:
    """Row tiles per direct-transpose group: two groups fill one 2 KiB PSUM bank."""
    return PSUM_BANK_BYTES // (2 * PMAX * ITEMSIZE[dtype])


def render_body(k: LoopKernel) -> str:
    return MatmulRenderer(k).body()
