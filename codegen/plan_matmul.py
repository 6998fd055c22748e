"""Plan of a matmul kernel: the numbers ``templates/matmul.nki.j2`` renders into a blocked TensorE GEMM.

Input: a :class:`~neuron_compile.lowering.ir.LoopKernel` of family ``matmul`` whose first op is a
``matmul`` (accesses ``a``/``b`` over the canonical space ``(outer..., m, n)``, contraction strides
``ak``/``bk``, size ``k``, and a ``tiles`` configuration chosen by the autotuner in
:mod:`neuron_compile.lowering.ops.matmul`). Output: a dict of plain data (numbers, names, small offset
expressions, the epilogue ops' template views); the template holds every line of NKI.

Structure of the kernel, per outer (batch) index:

1. *Transposes on TensorE* (only for an operand whose contraction dim is its contiguous one, e.g.
   ``x [M, K]`` and a Linear weight ``W [N, K]``): contiguous row blocks ``[128, <=2048]`` are loaded
   (>= 2 KiB per partition), transposed 128x128 at a time with ``nisa.nc_transpose`` into a PSUM
   tile, evicted four at a time, and written once to an HBM scratch ``[K, rows]`` with runs of
   ``rows_per_group x itemsize`` bytes (``scratch``). Every element is transposed exactly once, never by
   an element-strided DMA. With ``Tiles.direct`` the transposes go straight into the SBUF blocks
   (``direct``: row DMAs of ``lg`` row tiles, ``g`` transposes per half of a one-bank PSUM tile). Resident
   blocks with A straight into SBUF and B through the scratch (``Tiles.sb``) fill B's scratch during each
   program's first M block instead of in a pass before it (``b_fill``): there each N block of B is transposed
   straight into its SBUF block, used at once and stored; the later M blocks load it back. A pipelined A (``pipe_a``)
   loads the next M block's first row tile during the first N block of the one before (``a_next``).
2. *Blocked GEMM* (``variant``): for each ``(BM, BN)`` output block and each ``KB``-tile chunk of K, one
   DMA loads the stationary block ``aT [128, KB, BM]`` and one the moving block ``b [128, KB, BN]`` (both in
   their storage dtype); TensorE accumulates every ``128 x NT`` output tile over all of K in its own PSUM
   tile (``streamed``), or blocks hold all of K and tiles accumulate one after the other in rotating PSUM
   tiles (``resident``), or K chunks add into SBUF fp32 partial sums (``split``).
3. *Eviction with the epilogue* (:mod:`neuron_compile.codegen.plan_matmul_epilogue`): the PSUM tile is read
   in place by the first epilogue instruction, row-constant loads are hoisted per N block, row-varying ones
   arrive per group of ``RG`` row tiles and results leave per ``SG`` row tiles; a fused LayerNorm runs its
   row ops over the whole output row.

On a logical core of ``grid`` physical cores the M blocks of an unbatched GEMM are spread cyclically over the
programs (``split_m``): program ``i`` runs M blocks ``i, i + grid, ...``; a GEMM of fewer M blocks than cores, or
whose B (the larger operand, N > M) is transposed on TensorE, spreads its N blocks instead (``split_n``; a B scratch
pass then transposes only the program's own N blocks).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from neuron_compile.codegen import loop_schedule as ls
from neuron_compile.codegen.plan_matmul_epilogue import ITEMSIZE, EpiloguePlanner, _ceil_to
from neuron_compile.codegen.render import LoopRenderer, _offset
from neuron_compile.lowering.ir import LoopKernel, TileOp

from neuron_compile.config import config
from neuron_compile.errors import TemplateRenderError
from neuron_compile.simulator_limits import PMAX, PSUM_BANK_FMAX

log = logging.getLogger(__name__)

TRANSPOSE_ROW_GROUP = 8  # row tiles transposed per scratch store: 8 x 128 bf16 -> 2 KiB runs
MAX_PSUM_TILES = 7  # [128, 512] fp32 accumulators (8 banks, one kept for TensorE transposes)
PSUM_BANK_BYTES = PSUM_BANK_FMAX * 4  # per partition
PSUM_BANKS = 8  # 16 KiB of PSUM per partition
DT_A, DT_B = 1, 2  # Tiles.dt bits: A, B transposed by the DMA engines
TRANSPOSE_K_CHUNK = 2048  # contraction elements loaded per row DMA (4 KiB bf16 per partition)
TRANSPOSE_ROWS_BYTES = 16 * 1024  # per partition and row DMA of a direct transpose (4 x 4 KiB K runs)
SPLIT_TRANSPOSE_BANKS = 4  # PSUM banks of the direct transposes of split and resident blocks (their accumulators rotate)


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
    sb: bool = False  # with direct: B still goes through the HBM scratch (transposed once, not per M block; resident
    # blocks fill it during the program's first M block)
    dt: int = 0  # with direct: the operands the DMA engines transpose instead of TensorE (DT_A | DT_B, where the
    # HW-DGE transpose takes them: dma_transposable)

    def to_attr(self) -> tuple[int, int, int, bool, bool, bool, bool, bool, int, int, bool, int]:
        return (self.bm, self.bn, self.kb, self.ta, self.tb, self.resident, self.split, self.direct, self.rg, self.sg,
                self.sb, self.dt)

    @classmethod
    def from_attr(cls, attr: Any) -> Tiles:
        bm, bn, kb, ta, tb, res, *rest = attr
        split, direct, rg, sg, sb, dt = (list(rest) + [False, False, 1, 0, False, 0][len(rest):])[:6]
        return cls(int(bm), int(bn), int(kb), bool(ta), bool(tb), bool(res), bool(split), bool(direct), int(rg),
                   int(sg), bool(sb), int(dt))


@dataclass(frozen=True)
class Operand:
    """One matmul operand over (non-contraction index r, contraction index k)."""

    arg: str  # source tensor name
    offset: str  # base offset expression (outer loop vars included)
    rs: int  # stride along the non-contraction dim (m for A, n for B)
    ks: int  # stride along K
    rows: int  # non-contraction size
    dtype: str  # its tiles' dtype
    src_dtype: str = ""  # the HBM tensor's, when a converting DMA loads it (FP8 into bfloat16 tiles)

    def transposable(self) -> bool:
        """Contraction dim contiguous, the other not: a PE transpose gives contiguous loads."""
        return self.ks == 1 and self.rs != 1 and self.rows > 1


def dma_transposable(op: Operand, K: int, target: str | None = None) -> bool:
    """Whether the DMA engines transpose ``op``'s rows instead of TensorE: the HW-DGE ``nisa.dma_transpose``
    (NC-v3+: trn2, trn3) of 2-byte elements, in row groups of 16 (``op.rows`` a multiple of 16; the blocks are
    multiples of 128 rows) and whole 128-element K tiles."""
    from neuron_compile.simulator.targets import LIMITS

    return (LIMITS[target or config.target].nc_version >= 3 and ITEMSIZE[op.dtype] == 2 and op.rows % 16 == 0
            and K % PMAX == 0 and op.src_dtype in ("", op.dtype))  # a DMA transpose converts no dtype


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
                int(mm.attr("ak")), m, mm.attr("a_dtype"), k.inputs[a_arg].dtype)
    b = Operand(f"in{b_arg}", _offset(b_off, list(zip(outer, b_st[:k.n_outer], strict=True))), b_st[-1],
                int(mm.attr("bk")), n, mm.attr("b_dtype"), k.inputs[b_arg].dtype)
    return a, b


def moving_tile(n: int) -> int:
    return min(PSUM_BANK_FMAX, n)


def transpose_rows(dtype: str, kw: int, rows: int) -> int:
    """Row tiles per direct-transpose row DMA: whole transpose groups, up to ``TRANSPOSE_ROWS_BYTES`` per partition
    (at least one group) and no more than a block's ``rows`` need, so a DMA of short K rows still moves
    enough to amortise its fixed cost."""
    g = _transpose_group(dtype)
    return g * max(1, min(TRANSPOSE_ROWS_BYTES // (g * kw * ITEMSIZE[dtype]), math.ceil(rows / (g * PMAX))))


def b_loaded_once(t: Tiles, bn: int, n: int) -> bool:
    """Resident blocks of a GEMM with one N block (``bn`` covers ``n``): B is the same for every M block, so the kernel
    loads (and transposes) it once before the M loop and double-buffers the A blocks instead of the B block."""
    return t.resident and bn >= n


def _transpose_group(dtype: str) -> int:
    """Row tiles per direct-transpose group: two groups fill one 2 KiB PSUM bank."""
    return PSUM_BANK_BYTES // (2 * PMAX * ITEMSIZE[dtype])


def matmul_plan(k: LoopKernel, grid: int) -> dict[str, Any]:
    """The template context of a matmul kernel on a logical core of ``grid`` physical cores (``plan["grid"]``: the
    programs it launches on). Identical kernels (one per transformer layer) are planned once per codegen config."""
    from neuron_compile.codegen.render import _snapshot

    plan = _cached_plan(replace(k, name=""), grid, _snapshot())
    if plan["psum_banks"] > PSUM_BANKS:
        raise TemplateRenderError(f"matmul kernel {k.name}: {plan['n_acc']} accumulators and "
                                  f"{len(plan['banks'])} transpose banks need {plan['psum_banks']} PSUM banks, more "
                                  f"than the {PSUM_BANKS} there are; pick smaller blocks (a bug in the tile search: "
                                  "please report it)")
    return plan


@functools.lru_cache(maxsize=1024)
def _cached_plan(k: LoopKernel, grid: int, snapshot: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return MatmulPlanner(k).plan(grid)


class MatmulPlanner(EpiloguePlanner):
    """Tile sizes, loop bounds, buffers and the epilogue of one matmul kernel (see the module docstring)."""

    def __init__(self, k: LoopKernel) -> None:
        self.k = k
        self.mm = matmul_op(k)
        self.rest = [op for op in k.ops if op is not self.mm]
        self.loop = LoopRenderer(k)
        self.M, self.N, self.K = geometry(k)
        self.a, self.b = operands(k)
        self.t = Tiles.from_attr(self.mm.attr("tiles"))
        self.nt = moving_tile(self.N)
        self.acc_src = "acc"  # where the epilogue reads the finished sum: the accumulator, or the SBUF partial
        self.held = 0  # SBUF bytes per partition of the operand blocks, partial sums and staging rows
        # Row ops (a LayerNorm after the residual add): the first row reduction and everything after it run
        # once per 128-row tile over the whole output row ([P, BN], BN = N), after the tile's chunks.
        red = any(op.opcode == "reduce" for op in self.rest)
        if red:  # a LayerNorm's mean and variance: one VectorE statistics pass over the row (no square pass)
            moments = ls.use_moments(self.rest, self.N)
            self.rest = moments if moments is not None else self.rest
        self.row_dtype: dict[str, str] = {}  # row tiles of values held in a narrow dtype (resident_values)
        self.pre = {}  # (eviction: pre_added)
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

    def plan(self, grid: int) -> dict[str, Any]:
        k, t = self.k, self.t
        M, N, K, nt = self.M, self.N, self.K, self.nt
        bm, bn = min(t.bm, _ceil_to(M, PMAX)), min(t.bn, _ceil_to(N, nt))
        kb = max(1, min(t.kb, math.ceil(K / PMAX)))
        a, b = self.a, self.b
        scratch = []
        for name, op, flag in (("a_t", a, t.ta and a.transposable() and not t.direct),
                               ("b_t", b, t.tb and b.transposable() and (not t.direct or t.sb))):
            if flag:
                g = min(TRANSPOSE_ROW_GROUP, math.ceil(op.rows / PMAX))
                kw = min(TRANSPOSE_K_CHUNK, K)
                # PSUM tiles of the pass (one bank each): two when the accumulators rotate (resident, split blocks)
                scratch.append({"name": name, "src": op, "rows": op.rows, "dtype": op.dtype, "g": g, "kw": kw,
                                "kwt": math.ceil(kw / PMAX), "banks": 2 if (t.resident or t.split) else 1})
        scratched = {s["name"][0] for s in scratch}
        b_once = b_loaded_once(t, bn, N)
        # B's scratch filled during the program's first M block (resident blocks, A straight into SBUF): each N block of
        # B is transposed straight into its SBUF block there, used at once and stored into the scratch, which the later
        # M blocks read; no prologue pass holds TensorE up before the first matmul
        b_fill = None
        if "b" in scratched and t.resident and t.direct and not b_once and K % PMAX == 0:
            b_fill = b
            scratch = [s for s in scratch if s["name"] != "b_t"]
        if "a" in scratched:
            a = Operand("a_t", "0", 1, a.rows, a.rows, a.dtype)
        if "b" in scratched:
            b = Operand("b_t", "0", 1, b.rows, b.rows, b.dtype)
        # TensorE transposes straight into the SBUF blocks: row staging per operand, one PSUM bank per dtype
        block_rows = {"a": bm, "b": bn}
        kw = min(kb * PMAX, K)
        direct: dict[str, dict[str, Any]] = {}
        banks: list[dict[str, Any]] = []
        # resident blocks, A transposed straight into SBUF, whole K tiles: A's row tiles arrive pipelined (see the
        # template), in their own two PSUM banks, staged one row tile of all of K at a time (two live)
        pipe_a = bool(t.resident and t.ta and t.direct and a.transposable() and K % PMAX == 0)
        # ... by the DMA engines where the HW-DGE transpose takes them (NC-v3+: 2-byte rows, row tiles of 16k rows):
        # no TensorE transposes, PSUM banks or row staging
        a_dma = pipe_a and bool(t.dt & DT_A) and dma_transposable(a, K)
        # PSUM slots of a transpose group (two per bank): four when the accumulators rotate (resident, split), so
        # TensorE transposes into two slots while the other two are evicted
        slots = 2 * SPLIT_TRANSPOSE_BANKS if (t.resident or t.split) else 2
        if pipe_a and not a_dma:
            self.held += 2 * K * ITEMSIZE[a.dtype]
        for name, op, flag in (("a", a, t.ta), ("b", b, t.tb), ("b_fill", b_fill, b_fill is not None)):
            if name == "a" and a_dma:
                continue
            if name == "a" and pipe_a:
                direct["a"] = {"g": _transpose_group(a.dtype), "dtype": a.dtype, "pipe": True, "bank": False}
                continue
            if flag and op is not None and t.direct and t.dt & (DT_A if name == "a" else DT_B) and op.transposable() \
                    and dma_transposable(op, K):
                direct[name] = {"dma": True, "dtype": op.dtype, "bank": False}
                continue
            if flag and op is not None and t.direct and op.transposable():
                new_bank = op.dtype not in [bank["dtype"] for bank in banks]
                # the fill's bank takes the two banks the scratch pass had (a PE transpose group fills one while the
                # other is evicted)
                slots = 4 if name == "b_fill" and new_bank else slots
                direct[name] = {"lg": transpose_rows(op.dtype, kw, block_rows[name[0]]), "g": _transpose_group(op.dtype),
                                "dtype": op.dtype, "kw": kw, "bank": new_bank, "slots": slots}
                self.held += 2 * direct[name]["lg"] * kw * ITEMSIZE[op.dtype]  # row staging: two live
                if new_bank:
                    banks.append({"dtype": op.dtype, "g": _transpose_group(op.dtype), "slots": slots})
        tm, tn = bm // PMAX, bn // nt
        kc = kb * PMAX
        n_chunks = math.ceil(K / kc)
        operand_bytes = bm * ITEMSIZE[a.dtype] + bn * ITEMSIZE[b.dtype]
        # PSUM banks besides the accumulators: transposes (and, where the accumulators rotate, the scratch pass's
        # before the blocks, counted as live: they are the tiles its two banks take from the accumulators)
        tp_banks = sum(bank["slots"] // 2 for bank in banks) + 2 * (pipe_a and not a_dma)
        if t.resident or t.split:
            tp_banks += sum(s["banks"] for s in scratch)
        if t.split:  # the operand chunks are double-buffered: the next ones load while TensorE works on these
            variant = "split"
            n_acc = min(PSUM_BANKS - max(1, tp_banks), math.ceil(M / PMAX) * math.ceil(N / nt))
            self.held += 2 * kb * operand_bytes + bm // PMAX * bn * 4
            if n_chunks > 1:
                self.acc_src = "part"
        elif t.resident:  # the B block is double-buffered: the next one loads while TensorE works on this one
            variant = "resident"
            n_acc = min(PSUM_BANKS - max(1, tp_banks), math.ceil(M / PMAX) * math.ceil(N / nt))
            # (one N block: B loaded once and A double-buffered instead)
            self.held += math.ceil(K / PMAX) * (operand_bytes + (bm * ITEMSIZE[a.dtype] if b_once else
                                                                 bn * ITEMSIZE[b.dtype]))
        else:
            variant, n_acc = "streamed", tm * tn
            self.held += kb * operand_bytes
        hoisted = self.hoist_loads()
        evict = self.eviction(set(hoisted), bn)
        if "a" in direct and direct["a"].get("pipe"):
            # A's row-tile transposes leave PSUM on ScalarE alone when the epilogue has row ops (a LayerNorm: VectorE
            # carries its statistics and normalisation) and no activation over whole tiles to keep ScalarE busy;
            # else alternately on VectorE and ScalarE (VectorE's copies are the faster ones)
            direct["a"]["scalar"] = bool(self.post) and not any(op.opcode == "activation" and op.kind == "full"
                                                                for op in self.rest)
        # The programs split the M blocks, or the N blocks when there are fewer M blocks than cores or when B, the
        # larger operand, is transposed on TensorE (each core then transposes its half of B's rows, A on both)
        spread = grid > 1 and k.n_outer == 0
        m_ok, n_ok = len(range(0, M, bm)) >= grid, len(range(0, N, bn)) >= grid
        b_transposed = "b" in scratched or "b" in direct
        split_n = spread and n_ok and (not m_ok or (b_transposed and N > M))
        split_m = spread and m_ok and not split_n
        for s in scratch:
            s["blocks"] = bn if split_n and s["name"] == "b_t" else 0
        return {
            "M": M, "N": N, "K": K, "nt": nt, "bm": bm, "bn": bn, "kb": kb, "kc": kc, "tm": tm, "tn": tn,
            "kt_all": math.ceil(K / PMAX), "n_chunks": n_chunks, "last_k0": (n_chunks - 1) * kc,
            "variant": variant, "n_acc": n_acc, "acc_src": self.acc_src,
            "outer": list(k.space[:k.n_outer]), "scratch": scratch, "a": a, "b": b, "direct": direct, "banks": banks,
            "hoisted": list(hoisted.values()), "evict": evict,
            "kinds": self.loop.kinds, "target": config.target,
            "a_hw": ls.hw_queue(a.src_dtype or a.dtype, a.dtype, config.target),
            "grid": grid if split_m or split_n else 1, "split_m": split_m, "split_n": split_n,
            "psum_banks": n_acc * math.ceil(nt * 4 / PSUM_BANK_BYTES) + tp_banks, "pipe_a": pipe_a, "a_dma": a_dma, "b_once": b_once,
            "b_fill": b_fill,
        }
