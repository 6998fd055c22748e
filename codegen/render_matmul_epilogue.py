"""Phase 3 of a matmul kernel: PSUM eviction fused with the epilogue, row groups of epilogue DMAs, row ops.

:class:`MatmulEpilogue` is the half of :class:`~neuron_compile.codegen.render_matmul.MatmulRenderer` that
writes what happens to a finished ``128 x NT`` accumulator tile: hoisted (row-constant) loads, the
``[128, RG, BN]`` epilogue load groups and ``SG``-tile stores (``eviction_loops``), the element-wise
epilogue read straight from PSUM (``epilogue``) with its engine choice (``epilogue_engines``), and the
row ops of a fused LayerNorm over the whole output row (``row_ops``). It reads the renderer's state:
``k``, ``mm``, ``rest``, ``loop``, ``M``/``N``, ``t`` (tiles), ``nt``, ``acc_src``, ``held``, ``post``,
``chunk_ops`` and ``row_dtype``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from neuron_compile.codegen import loop_schedule as ls
from neuron_compile.codegen.render import Lines
from neuron_compile.config import config
from neuron_compile.lowering.ir import TileOp
from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
EPILOGUE_SBUF_MARGIN = 8 * 1024  # per partition, kept free beside the counted epilogue tiles


class MatmulEpilogue:
    """Eviction, epilogue and row ops of :class:`~neuron_compile.codegen.render_matmul.MatmulRenderer`."""

    k: Any
    mm: TileOp
    rest: list[TileOp]
    loop: Any
    M: int
    N: int
    t: Any
    nt: int
    acc_src: str
    held: int
    post: list[TileOp]
    chunk_ops: list[TileOp]
    row_dtype: dict[str, str]

    def _row_constant_load(self, op: TileOp) -> bool:
        if op.opcode != "load" or op.kind != "full":  # a (P, 1) value stays a per-row load
            return False
        _, _, strides = op.attr("access")
        return strides[self.k.n_outer] == 0

    def hoist_loads(self, out: Lines) -> set[str]:
        """Loads constant over rows (bias): one partition-broadcast DMA per N block."""
        hoisted: set[str] = set()
        for op in self.rest:
            if not self._row_constant_load(op):
                continue
            acc = self.loop.view(op)["access"]
            width = min(self.t.bn, _ceil_to(self.N, self.nt))
            out.add(f"""
                {op.out}_blk = nl.ndarray(({PMAX}, {width}), dtype=nl.{_load_dtype(op)}, buffer=nl.sbuf)
                f0 = n0
                nisa.dma_copy(dst={op.out}_blk[0:{PMAX}, 0:BN], src=in{acc['arg']}.ap(pattern=[[0, {PMAX}], [{acc['sf']}, BN]], offset={acc['offset']}))
                """)
            hoisted.add(op.out)
            self.held += 2 * width * ITEMSIZE.get(_load_dtype(op), 4)  # allocated per N block: two live at the switch
        return hoisted

    def eviction_loops(self, out: Lines, hoisted: set[str], bn: int, tile_prologue: str) -> None:
        """Per output tile of the block: ``tile_prologue`` (matmuls or accumulator index), then the epilogue.

        Output tiles go in groups of ``RG`` row tiles (``Tiles.rg``, as many as SBUF holds). Per group,
        each row-varying epilogue operand (a residual) arrives in one ``[128, RG, BN]`` DMA in its
        storage dtype (engines convert on read). Each value stored to an output is written by its
        instruction straight into a ``[128, SG, BN]`` staging tile in the output dtype that leaves in
        one DMA per ``SG`` row tiles (``Tiles.sg`` <= RG: stores may stay more frequent than loads,
        so the work behind the last store stays short).
        """
        depth = out.depth
        staged = self.staged_stores()
        grouped = self.row_loads(hoisted)
        if self.post:  # fp32 rows of the row ops (chunk values they read, their own live tiles)
            resident = self.resident_values(staged, hoisted, {op.out for op in grouped})
            body = [op for op in self.post if not any(op is st for st in staged)]
            peak = ls.assign_buffers(body, self.loop.kinds, self.loop.dtypes, set(resident)).peak
            self.held += (sum(v is None for v in resident.values()) + peak) * self.N * 4
        rg, sg = self.row_group(bn, staged, grouped)
        out.add(f"""
            for i0 in range(0, BM, {rg * PMAX}):
                GR = min({rg * PMAX}, BM - i0)
                RF = GR // {PMAX}
            """)
        out.depth += 1
        for op in grouped:  # a per-row column (a bias broadcast along the row) is loaded once per row, [P, 1]
            width = 1 if self.column(op) else bn
            out.add(f"{op.out}_grp = nl.ndarray(({PMAX}, {rg}, {width}), dtype=nl.{_load_dtype(op)}, buffer=nl.sbuf)")
            self.group_dma(out, op, f"{op.out}_grp", "i0", "GR", "RF", load=True)
        if sg < rg:
            out.add(f"""
                for s0 in range(i0, i0 + GR, {sg * PMAX}):
                    SR = min({sg * PMAX}, i0 + GR - s0)
                    SF = SR // {PMAX}
                """)
            out.depth += 1
            s0, sr, sf = "s0", "SR", "SF"
        else:
            s0, sr, sf = "i0", "GR", "RF"
        for op in staged:
            out.add(f"{op.args[0]}_stage = nl.ndarray(({PMAX}, {sg}, {bn}), dtype=nl.{op.attr('dst_dtype')}, "
                    "buffer=nl.sbuf)")
        out.add(f"""
            for i in range({s0}, {s0} + {sr}, {PMAX}):
                P = min({PMAX}, BM - i)
                p0 = m0 + i
            """)
        out.depth += 1
        resident = self.resident_values(staged, hoisted, {op.out for op in grouped})
        for name, where in resident.items():
            if where is None:
                dt = self.row_dtype.get(name) or self.loop.dtypes.get(name, "float32")
                out.add(f"{name}_row = nl.ndarray(({PMAX}, {bn}), dtype=nl.{dt}, buffer=nl.sbuf)")
        out.add(f"""
            for j in range(0, BN, {self.nt}):
                F = min({self.nt}, BN - j)
                f0 = n0 + j
            """)
        out.depth += 1
        out.add(tile_prologue)
        self.epilogue(out, hoisted, staged, {op.out for op in grouped}, s0, resident)
        out.depth -= 1
        if self.post:
            self.row_ops(out, staged, s0, resident)
        out.depth -= 1
        for op in staged:
            self.group_dma(out, op, f"{op.args[0]}_stage", s0, sr, sf, load=False)
        out.depth = depth

    def group_dma(self, out: Lines, op: TileOp, tile: str, start: str, rows: str, full_tiles: str, load: bool) -> None:
        """One DMA between ``tile[0:128, 0:full_tiles, 0:BN]`` and rows ``m0 + start ...`` of ``op``'s tensor
        (+ one for a ragged last tile of ``rows % 128`` rows)."""
        acc = self.loop.view(op)["access"]
        sp, sf = acc["sp"], acc["sf"]
        width = "1" if load and self.column(op) else "BN"
        hbm = f"in{acc['arg']}" if load else f"out{acc['arg']}"
        full = f"{hbm}.ap(pattern=[[{sp}, {PMAX}], [{PMAX * sp}, {full_tiles}], [{sf}, {width}]], offset={acc['offset']})"
        rest = f"{hbm}.ap(pattern=[[{sp}, {rows} % {PMAX}], [{sf}, {width}]], offset={acc['offset']})"
        sb_full = f"{tile}[0:{PMAX}, 0:{full_tiles}, 0:{width}]"
        sb_rest = f"{tile}[0:{rows} % {PMAX}, {full_tiles}, 0:{width}]"
        pair = (f"dst={sb_full}, src={full}", f"dst={sb_rest}, src={rest}") if load else \
            (f"dst={full}, src={sb_full}", f"dst={rest}, src={sb_rest}")
        out.add(f"""
            f0 = n0
            if {full_tiles} > 0:
                p0 = m0 + {start}
                nisa.dma_copy({pair[0]})
            if {rows} % {PMAX}:
                p0 = m0 + {start} + {full_tiles} * {PMAX}
                nisa.dma_copy({pair[1]})
            """)

    def column(self, op: TileOp) -> bool:
        """A row-varying load constant along the row (free stride 0): one value per row, used broadcast."""
        return self.loop.view(op)["access"]["sf"] == 0

    def grouped_view(self, name: str, op: TileOp, cols: str, width: str) -> str:
        row = f"{name}_grp[0:P, (i - i0) // {PMAX}, "
        return row + f"0:1].broadcast(1, {width})" if self.column(op) else row + f"{cols}]"

    def row_loads(self, hoisted: set[str]) -> list[TileOp]:
        """Full-tile loads of the epilogue that vary over rows (e.g. a residual): loaded per row group."""
        return [op for op in self.rest if op.opcode == "load" and op.kind == "full" and op.out not in hoisted]

    def row_group(self, bn: int, staged: list[TileOp], grouped: list[TileOp]) -> tuple[int, int]:
        """Row tiles per epilogue load group and per store: ``Tiles.rg`` / ``Tiles.sg``, at most the block's,
        within SBUF (``sg <= rg``; the last store of a group may be shorter).

        Group tiles are allocated per group (two live when one group follows another), next to the
        operand blocks (``self.held``) and the per-tile epilogue temporaries (two of each live).
        """
        from neuron_compile.simulator.targets import LIMITS

        tiles = math.ceil(min(self.t.bm, _ceil_to(self.M, PMAX)) / PMAX)
        rg = max(1, min(self.t.rg, tiles))
        load_row = sum(ITEMSIZE.get(_load_dtype(op), 4) for op in grouped)
        store_row = sum(ITEMSIZE.get(op.attr("dst_dtype"), 4) for op in staged)
        if not grouped:
            rg = min(rg, self.t.sg or rg)  # stores only: the store group is the group
        sg = min(self.t.sg or rg, rg)
        if not load_row + store_row:
            return 1, 1
        temps = 2 * self.nt * sum(ITEMSIZE.get(op.dtype, 4) * (2 if op.opcode == "round" else 1)
                                  for op in self.chunk_ops if op.opcode not in ("load", "store"))
        free = LIMITS[config.target].sbuf_partition_bytes - self.held - temps - EPILOGUE_SBUF_MARGIN
        while rg > 1 and 2 * bn * (rg * load_row + min(sg, rg) * store_row) > free:
            rg -= 1
        return rg, min(sg, rg)

    def staged_stores(self) -> list[TileOp]:
        """Full stores of values computed in the epilogue (one store per value; hoisted loads excluded)."""
        computed = {op.out for op in self.rest if op.opcode not in ("load", "store")} | {self.mm.out}
        stores = [op for op in self.rest if op.opcode == "store" and op.kind == "full"]
        seen: set[str] = set()
        out = []
        for op in stores:
            v = op.args[0]
            if v in computed and v not in seen and (v == self.mm.out or self.producer(v).opcode != "select"):
                seen.add(v)
                out.append(op)
        return out

    def producer(self, name: str) -> TileOp:
        return next(op for op in self.rest if op.out == name)

    def epilogue(self, out: Lines, hoisted: set[str], staged: list[TileOp], grouped: set[str], s0: str,
                 resident: dict[str, str | None] | None = None) -> None:
        mm = self.mm
        resident = resident or {}
        stage_of = {op.args[0]: op for op in staged}
        users = [op for op in self.rest if mm.out in op.args]
        in_place = bool(users) and all(op.opcode not in ("store", "select", "predicate") for op in users) \
            and mm.out not in resident
        row_dst = {name: f"{name}_row[0:P, j:j + F]" for name, where in resident.items() if where is None}
        if in_place:
            out.add(f"{mm.out} = {self.acc_src}")
        else:
            dst = row_dst.get(mm.out) or (f"{mm.out}_stage[0:P, (i - {s0}) // {PMAX}, j:j + F]"
                                          if mm.out in stage_of else
                                          "nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)")
            out.add(f"""
                {mm.out} = {dst}
                nisa.tensor_copy(dst={mm.out}, src={self.acc_src})
                """)
            if mm.out in stage_of and mm.out in row_dst:
                out.add(f"nisa.tensor_copy(dst={mm.out}_stage[0:P, (i - {s0}) // {PMAX}, j:j + F], src={mm.out})")
        engines = self.epilogue_engines(in_place)
        skipped = self.skipped(resident, staged)
        for op in self.chunk_ops:
            view = self.loop.view(op)
            view["engine"] = engines.get(op.out)
            if op.out in hoisted:
                out.add(f"{op.out} = {op.out}_blk[0:P, j:j + F]")
            elif op.out in grouped:
                out.add(f"{op.out} = {self.grouped_view(op.out, op, 'j:j + F', 'F')}")
            elif any(op is st for st in staged):
                continue
            elif op.out in skipped:
                continue  # only row ops read it, from where it already is (a staged row)
            elif op.out in stage_of or op.out in row_dst:
                # the instruction writes its result (cast to the output dtype) into the staging row, or into
                # the fp32 row the row ops read after the tile's chunks
                text = str(self.loop.macros.render_op(view, self.loop.kinds, config.target))
                alloc = f"{op.out} = nl.ndarray((P, F), dtype=nl.{op.dtype}, buffer=nl.sbuf)"
                assert alloc in text, f"staged value {op.out} has no tile allocation to redirect"
                dst = row_dst.get(op.out) or f"{op.out}_stage[0:P, (i - {s0}) // {PMAX}, j:j + F]"
                out.add(text.replace(alloc, f"{op.out} = {dst}"))
                if op.out in stage_of and op.out in row_dst:
                    out.add(f"nisa.tensor_copy(dst={op.out}_stage[0:P, (i - {s0}) // {PMAX}, j:j + F], "
                            f"src={op.out})")
            else:
                self.loop._emit(out, view)

    def resident_values(self, staged: list[TileOp], hoisted: set[str], grouped: set[str]) -> dict[str, str | None]:
        """Chunk values the row ops read, mapped to the ``[P, BN]`` view holding the tile's whole row (None: a
        row tile ``{name}_row`` of the value's dtype that the chunk op writes into). A value stored in fp32 is read from its staging
        row; a bf16/fp16 rounding of a value stored in that dtype is read from the staged (rounded) row, exactly
        the value a separate kernel would load back."""
        if not self.post:
            return {}
        stage_of = {op.args[0]: op for op in staged}
        chunk = {op.out: op for op in self.chunk_ops}
        chunk[self.mm.out] = self.mm
        out: dict[str, str | None] = {}
        stage = f"[0:P, (i - {{s0}}) // {PMAX}, 0:BN]"
        for op in self.post:
            for a in op.args:
                if not isinstance(a, str) or a not in chunk or a in out or chunk[a].kind == "row":
                    continue  # (a row value, e.g. a row load: its (P, 1) tile is there as it is)
                src = chunk[a]
                if a in hoisted:
                    out[a] = f"{a}_blk[0:P, 0:BN]"
                elif a in grouped:
                    out[a] = self.grouped_view(a, src, "0:BN", "BN")
                elif a in stage_of and stage_of[a].attr("dst_dtype") == "float32":
                    out[a] = f"{a}_stage" + stage
                elif src.opcode == "round" and src.args[0] in stage_of \
                        and stage_of[src.args[0]].attr("dst_dtype") == src.attr("via"):
                    out[a] = f"{src.args[0]}_stage" + stage
                elif src.opcode == "round" and self.rounded_only(src):
                    # its source, read by nothing else, is written rounded into a row of the narrow dtype
                    out[src.args[0]] = None
                    self.row_dtype[src.args[0]] = src.attr("via")
                    out[a] = f"{src.args[0]}_row[0:P, 0:BN]"
                else:
                    out[a] = None
        return out

    def rounded_only(self, rnd: TileOp) -> bool:
        """Is ``rnd``'s source a chunk value read only by ``rnd`` (and stores in its narrow dtype)?"""
        x = rnd.args[0]
        src = next((op for op in self.chunk_ops if op.out == x), None)
        if src is None or src.opcode not in ("tensor_tensor", "tensor_scalar", "activation") or src.kind != "full":
            return False
        return all(op is rnd or (op.opcode == "store" and op.attr("dst_dtype") == rnd.attr("via"))
                   for op in self.rest if x in op.args)

    def row_ops(self, out: Lines, staged: list[TileOp], s0: str, resident: dict[str, str | None]) -> None:
        """The row ops of one 128-row tile after its chunks: reductions into ``[P, 1]`` values, then the full
        ops over ``[P, BN]`` views of the whole row; stored values go into their staging rows."""
        stage_of = {op.args[0]: op for op in staged}
        out.add("F = BN\nf0 = n0")
        for name, where in resident.items():
            out.add(f"{name} = " + (where.replace("{s0}", s0) if where is not None else f"{name}_row[0:P, 0:BN]"))
        body = [op for op in self.post if not any(op is st for st in staged)]
        kinds, dtypes = self.loop.kinds, self.loop.dtypes
        fused = ls.fuse_act_reduce(body)
        act_res = {a: r for r, a in fused.items()}
        for op in body:
            if op.opcode == "reduce":
                out.add(f"{op.out} = nl.ndarray((P, 1), dtype=nl.{op.dtype}, buffer=nl.sbuf)")
        computed = [op for op in body if op.opcode != "store"]
        base = self.chunk_load(self.skipped(resident, staged))
        engines = ls.assign_engines(computed, self.N, config.target, kinds, base, dtypes)
        stored = {op.out for op in body if op.out in stage_of}
        bufs = ls.assign_buffers(body, kinds, dtypes, set(resident) | stored)
        rename: dict[str, str] = {}
        for pos, op in enumerate(body):
            view = self.loop.view(op)
            view["args"] = [rename.get(a, a) if isinstance(a, str) else a for a in view["args"]]
            view["engine"] = engines.get(op.out)
            if op.opcode == "reduce":
                view["first"] = "True"
                view["fused"] = op.out in fused
            elif op.out in act_res:
                view["reduce_res"] = act_res[op.out]
            if op.opcode not in ("store", "reduce") and bufs.inplace[pos] and op.out not in stage_of:
                view["inplace"] = True
                view["out"] = bufs.writes[pos]
                rename[op.out] = view["out"]
            text = str(self.loop.macros.render_op(view, kinds, config.target))
            if op.out in stage_of:
                alloc = f"{op.out} = nl.ndarray((P, F), dtype=nl.{op.dtype}, buffer=nl.sbuf)"
                assert alloc in text, f"staged row value {op.out} has no tile allocation to redirect"
                text = text.replace(alloc, f"{op.out} = {op.out}_stage[0:P, (i - {s0}) // {PMAX}, 0:BN]")
            out.add("\n".join(line for line in text.splitlines() if line.strip()))

    def skipped(self, resident: dict[str, str | None], staged: list[TileOp]) -> set[str]:
        """Chunk values not computed per chunk: read only by row ops, from a row that already holds them."""
        chunk_users = {a for op in self.chunk_ops for a in op.args if isinstance(a, str)}
        stored = {op.args[0] for op in staged}
        return {name for name, where in resident.items()
                if where is not None and name not in chunk_users and name not in stored}

    def chunk_load(self, skipped: set[str]) -> dict[str, float]:
        """Engine time (ns) of one row tile's chunk epilogues, which the row ops balance against."""
        target, free, kinds = config.target, self.nt, self.loop.kinds
        chunks = math.ceil(self.N / self.nt)
        load = {"vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
        users = [op for op in self.rest if self.mm.out in op.args]
        in_place = bool(users) and all(op.opcode not in ("store", "select", "predicate") for op in users)
        engines = self.epilogue_engines(in_place)
        for op in self.chunk_ops:
            if op.opcode in ("load", "store") or op.out in skipped:
                continue
            e = engines.get(op.out) or ls._fixed_engine(op) or "vector"
            load[e] += chunks * ls.op_ns(op, e, free, target, kinds)
        if not in_place:
            load["vector"] += chunks * ls.op_ns(self.mm, "vector", free, target, kinds)
        return load

    def epilogue_engines(self, in_place: bool) -> dict[str, str]:
        """Engines of epilogue ops that several engines can run (``loop_schedule.assign_engines``).

        Ops reading the PSUM accumulator stay on VectorE (GpSimd has no PSUM access, REFERENCE 3.3) and
        count as VectorE load, like the eviction copy; the rest (e.g. a residual add of two SBUF
        tiles) balance against them, so GpSimd takes work VectorE would otherwise serialize.
        """
        target, free, kinds = config.target, self.nt, self.loop.kinds
        load = {"vector": 0.0, "scalar": 0.0, "gpsimd": 0.0}
        body = [op for op in self.chunk_ops if op.opcode not in ("load", "store")]
        psum = [op for op in body if in_place and self.mm.out in op.args]
        for op in psum:
            load["vector"] += ls.op_ns(op, "vector", free, target, kinds)
        if not in_place:
            load["vector"] += ls.op_ns(self.mm, "vector", free, target, kinds)
        return ls.assign_engines([op for op in body if op not in psum], free, target, kinds, load)



def _load_dtype(op: TileOp) -> str:
    """SBUF dtype of an epilogue load: its storage dtype when that widens exactly to the op's dtype
    (bf16/fp16 -> fp32: the DMA moves 2 bytes per element and the engines convert on read)."""
    src = op.attr("src_dtype")
    if src in ITEMSIZE and op.dtype in ITEMSIZE and ITEMSIZE[src] <= ITEMSIZE[op.dtype]:
        return str(src)
    return op.dtype


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m
