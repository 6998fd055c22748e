"""Plan of phase 3 of a matmul kernel: PSUM eviction fused with the epilogue, epilogue DMA row groups, row ops.

:class:`EpiloguePlanner` is the half of :class:`~neuron_compile.codegen.plan_matmul.MatmulPlanner` that decides
what happens to a finished ``128 x NT`` accumulator tile: hoisted (row-constant) loads, the ``[128, RG, BN]``
epilogue load groups and ``SG``-tile stores (``eviction``), the element-wise epilogue read straight from PSUM
(``epilogue``) with its engine choice (``epilogue_engines``), and the row ops of a fused LayerNorm over the
whole output row (``row_ops``). It returns plain data for ``templates/matmul.nki.j2``: names, sizes, DMA
strides and offset expressions, and each epilogue op's template view (the dict ``_macros.render_op`` renders).

Where a value lives is a tag the template turns into a tile view: ``blk`` (a hoisted load's ``[128, BN]`` tile),
``grp`` (its row group's ``[128, RG, BN]`` load tile; ``column``: one value per row, used broadcast), ``stage``
(the ``[128, SG, BN]`` staging tile of a store), ``row`` (a ``[128, BN]`` row tile of a value the row ops read).
It reads the planner's state: ``k``, ``mm``, ``rest``, ``loop``, ``M``/``N``, ``t`` (tiles), ``nt``, ``acc_src``,
``held``, ``post``, ``chunk_ops``, ``row_dtype`` and ``pre`` (set by ``eviction``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from neuron_compile.codegen import loop_schedule as ls
from neuron_compile.lowering.ir import TileOp

from neuron_compile.config import config
from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
EPILOGUE_SBUF_MARGIN = 8 * 1024  # per partition, kept free beside the counted epilogue tiles


class EpiloguePlanner:
    """Eviction, epilogue and row ops of :class:`~neuron_compile.codegen.plan_matmul.MatmulPlanner`."""

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
    pre: dict[str, tuple[TileOp, str, str]]  # residual adds of a bias add, the residual + bias added per group

    def _row_constant_load(self, op: TileOp) -> bool:
        if op.opcode != "load" or op.kind != "full":  # a (P, 1) value stays a per-row load
            return False
        _, _, strides = op.attr("access")
        return strides[self.k.n_outer] == 0

    def hoist_loads(self) -> dict[str, dict[str, Any]]:
        """Loads constant over rows (bias): one partition-broadcast DMA per N block."""
        hoisted: dict[str, dict[str, Any]] = {}
        for op in self.rest:
            if not self._row_constant_load(op):
                continue
            acc = self.loop.view(op)["access"]
            width = min(self.t.bn, _ceil_to(self.N, self.nt))
            hoisted[op.out] = {"out": op.out, "width": width, "dtype": _load_dtype(op), "arg": acc["arg"],
                               "sf": acc["sf"], "offset": acc["offset"]}
            self.held += 2 * width * ITEMSIZE.get(_load_dtype(op), 4)  # allocated per N block: two live at the switch
        return hoisted

    def eviction(self, hoisted: set[str], bn: int) -> dict[str, Any]:
        """Per output tile of the block, after its matmuls (the template's tile prologue): the epilogue.

        Output tiles go in groups of ``RG`` row tiles (``Tiles.rg``, as many as SBUF holds). Per group,
        each row-varying epilogue operand (a residual) arrives in one ``[128, RG, BN]`` DMA in its
        storage dtype (engines convert on read). Each value stored to an output is written by its
        instruction straight into a ``[128, SG, BN]`` staging tile in the output dtype that leaves in
        one DMA per ``SG`` row tiles (``Tiles.sg`` <= RG: stores may stay more frequent than loads,
        so the work behind the last store stays short).
        """
        staged = self.staged_stores()
        grouped = self.row_loads(hoisted)
        grouped_names = {op.out for op in grouped}
        self.pre = self.pre_added(hoisted, grouped_names, {op.args[0] for op in staged})
        if self.post:  # fp32 rows of the row ops (chunk values they read, their own live tiles)
            resident = self.resident_values(staged, hoisted, grouped_names)
            body = [op for op in self.post if not any(op is st for st in staged)]
            peak = ls.assign_buffers(body, self.loop.kinds, self.loop.dtypes, set(resident)).peak
            self.held += (sum(v is None for v in resident.values()) + peak) * self.N * 4
        rg, sg = self.row_group(bn, staged, grouped)
        resident = self.resident_values(staged, hoisted, grouped_names)
        return {
            "rg": rg, "sg": sg,
            "grouped": [{"out": op.out, "width": 1 if self.column(op) else bn, "dtype": _load_dtype(op),
                         "dma": self.group_dma(op, load=True)} for op in grouped],
            "pre_added": [{"out": f"{x}b", "src": x, "bias": bias, "width": bn} for x, bias in
                          sorted({(x, bias) for _, x, bias in self.pre.values()})],
            "staged": [{"name": op.args[0], "dtype": op.attr("dst_dtype"), "dma": self.group_dma(op, load=False)}
                       for op in staged],
            "rows": [{"name": name, "dtype": self.row_dtype.get(name) or self.loop.dtypes.get(name, "float32")}
                     for name, where in resident.items() if where is None],
            "epilogue": self.epilogue(hoisted, staged, grouped_names, resident),
            "row_ops": self.row_ops(staged, resident) if self.post else None,
        }

    def group_dma(self, op: TileOp, load: bool) -> dict[str, Any]:
        """One DMA between a ``[128, tiles, BN]`` group tile and rows of ``op``'s tensor (+ one for a ragged last tile
        of ``rows % 128`` rows): the HBM side's strides and offset."""
        acc = self.loop.view(op)["access"]
        # a staged tile holds the store's dtype
        src, dst = (op.attr("src_dtype"), _load_dtype(op)) if load else (op.attr("dst_dtype"), op.attr("dst_dtype"))
        hw = ls.hw_queue(src, dst, config.target)
        return {"load": load, "hbm": f"in{acc['arg']}" if load else f"out{acc['arg']}", "sp": acc["sp"],
                "sf": acc["sf"], "width": "1" if load and self.column(op) else "BN", "offset": acc["offset"], "hw": hw}

    def column(self, op: TileOp) -> bool:
        """A row-varying load constant along the row (free stride 0): one value per row, used broadcast."""
        return self.loop.view(op)["access"]["sf"] == 0

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
        load_row = sum(ITEMSIZE.get(_load_dtype(op), 4) for op in grouped) \
            + 4 * len({x for _, x, _ in self.pre.values()})  # fp32 residual + bias group tiles
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

    def pre_added(self, hoisted: set[str], grouped: set[str], stored: set[str]) -> dict[str, tuple[TileOp, str, str]]:
        """``{r.out: (a, x, bias)}`` for a residual add ``r = x + a`` (either order) of a bias add ``a = acc + bias``
        (fp32 adds, ``bias`` a hoisted row-constant load, ``x`` a row-varying group load, ``a`` read by ``r`` alone).
        The kernel adds ``x + bias`` once per row group on GpSimd, before the group's tiles are ready, and each tile's
        epilogue is one VectorE add reading the accumulator: the tile's chain loses an instruction and a cross-engine
        hop. (fp32 addition reassociated: within an ulp of fp32, far below the bf16/fp16 rounding of the result.)"""
        mm = self.mm
        users: dict[str, list[TileOp]] = {}
        for op in self.rest:
            for arg in op.args:
                if isinstance(arg, str):
                    users.setdefault(arg, []).append(op)
        if len(users.get(mm.out, [])) != 1 or mm.out in stored:
            return {}
        out: dict[str, tuple[TileOp, str, str]] = {}
        a = users[mm.out][0]
        if not (a.opcode == "tensor_tensor" and a.attr("op") == "add" and a.kind == "full" and a.dtype == "float32"
                and len(a.args) == 2 and mm.out in a.args and a in self.chunk_ops):
            return {}
        bias = a.args[1] if a.args[0] == mm.out else a.args[0]
        if bias not in hoisted or a.out in stored or len(users.get(a.out, [])) != 1:
            return {}
        r = users[a.out][0]
        if not (r.opcode == "tensor_tensor" and r.attr("op") == "add" and r.kind == "full" and r.dtype == "float32"
                and len(r.args) == 2 and a.out in r.args and r in self.chunk_ops):
            return {}
        x = r.args[1] if r.args[0] == a.out else r.args[0]
        if x not in grouped or x == a.out or self.column(self.producer(x)):
            return {}
        out[r.out] = (a, x, bias)
        return out

    def producer(self, name: str) -> TileOp:
        return next(op for op in self.rest if op.out == name)

    def epilogue(self, hoisted: set[str], staged: list[TileOp], grouped: set[str],
                 resident: dict[str, tuple[str, str, bool] | None]) -> list[dict[str, Any]]:
        """The epilogue of one output tile, in order: the sum (read in place, or evicted by a copy), then the chunk
        ops. Each item: ``alias`` (a name for a tile view: ``where`` a tag), ``evict`` (the copy out of PSUM into
        ``dst``), ``op`` (an instruction; ``dst``: it writes into a staging tile or a row instead of a new tile;
        ``stage_copy``: the value is also copied into its staging tile)."""
        mm = self.mm
        stage_of = {op.args[0] for op in staged}
        in_place = self.reads_in_place() and mm.out not in resident
        row_dst = {name for name, where in resident.items() if where is None}

        def dst_of(name: str) -> str:
            return "row" if name in row_dst else "stage" if name in stage_of else "new"

        items: list[dict[str, Any]] = []
        if in_place:
            items.append({"kind": "alias", "out": mm.out, "where": "acc", "stage_copy": False})
        else:
            items.append({"kind": "evict", "out": mm.out, "dst": dst_of(mm.out),
                          "stage_copy": mm.out in stage_of and mm.out in row_dst})
        engines = self.epilogue_engines(in_place)
        skipped = self.skipped(resident, staged)
        pre = self.pre
        skip = {a.out for a, _, _ in pre.values()}
        for x, _ in sorted({(x, bias) for _, x, bias in pre.values()}):
            items.append({"kind": "alias", "out": f"{x}b", "where": "grp", "column": False, "stage_copy": False})
        for op in self.chunk_ops:
            view = self.loop.view(op)
            view["engine"] = engines.get(op.out)
            if op.out in pre:  # (acc + bias) + x as acc + (x + bias): x + bias added per group, off the tile's chain
                _, x, _ = pre[op.out]
                view["args"] = [mm.out, f"{x}b"]
                view["engine"] = None  # reads PSUM: VectorE
            if op.out in skip:
                continue
            if op.out in hoisted:
                items.append({"kind": "alias", "out": op.out, "where": "blk", "stage_copy": False})
            elif op.out in grouped:
                items.append({"kind": "alias", "out": op.out, "where": "grp", "column": self.column(op), "stage_copy": False})
            elif any(op is st for st in staged) or op.out in skipped:
                continue  # a store leaves with its group; a skipped value is only read by row ops, from its row
            elif op.out in stage_of or op.out in row_dst:
                # the instruction writes its result (cast to the output dtype) into the staging row, or into
                # the fp32 row the row ops read after the tile's chunks
                items.append({"kind": "op", "out": op.out, "view": view, "dst": dst_of(op.out),
                              "stage_copy": op.out in stage_of and op.out in row_dst})
            else:
                items.append({"kind": "op", "out": op.out, "view": view, "dst": None, "stage_copy": False})
        return items

    def resident_values(self, staged: list[TileOp], hoisted: set[str],
                        grouped: set[str]) -> dict[str, tuple[str, str, bool] | None]:
        """Chunk values the row ops read, mapped to where the tile's whole ``[P, BN]`` row is: ``(tag, buffer name,
        column)``, or None: a row tile ``{name}_row`` of the value's dtype that the chunk op writes into. A value
        stored in fp32 is read from its staging row; a bf16/fp16 rounding of a value stored in that dtype is read
        from the staged (rounded) row, exactly the value a separate kernel would load back."""
        if not self.post:
            return {}
        stage_of = {op.args[0]: op for op in staged}
        chunk = {op.out: op for op in self.chunk_ops}
        chunk[self.mm.out] = self.mm
        out: dict[str, tuple[str, str, bool] | None] = {}
        for op in self.post:
            for a in op.args:
                if not isinstance(a, str) or a not in chunk or a in out or chunk[a].kind == "row":
                    continue  # (a row value, e.g. a row load: its (P, 1) tile is there as it is)
                src = chunk[a]
                if a in hoisted:
                    out[a] = ("blk", a, False)
                elif a in grouped:
                    out[a] = ("grp", a, self.column(src))
                elif a in stage_of and stage_of[a].attr("dst_dtype") == "float32":
                    out[a] = ("stage", a, False)
                elif src.opcode == "round" and src.args[0] in stage_of \
                        and stage_of[src.args[0]].attr("dst_dtype") == src.attr("via"):
                    out[a] = ("stage", src.args[0], False)
                elif src.opcode == "round" and self.rounded_only(src):
                    # its source, read by nothing else, is written rounded into a row of the narrow dtype
                    out[src.args[0]] = None
                    self.row_dtype[src.args[0]] = src.attr("via")
                    out[a] = ("row", src.args[0], False)
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

    def row_ops(self, staged: list[TileOp], resident: dict[str, tuple[str, str, bool] | None]) -> dict[str, Any]:
        """The row ops of one 128-row tile after its chunks: reductions into ``[P, 1]`` values, then the full
        ops over ``[P, BN]`` views of the whole row; stored values go into their staging rows."""
        stage_of = {op.args[0] for op in staged}
        body = [op for op in self.post if not any(op is st for st in staged)]
        kinds, dtypes = self.loop.kinds, self.loop.dtypes
        fused = ls.fuse_act_reduce(body)
        act_res = {a: r for r, a in fused.items()}
        computed = [op for op in body if op.opcode != "store"]
        base = self.chunk_load(self.skipped(resident, staged))
        engines = ls.assign_engines(computed, self.N, config.target, kinds, base, dtypes)
        bufs = ls.assign_buffers(body, kinds, dtypes, set(resident) | {op.out for op in body if op.out in stage_of})
        rename: dict[str, str] = {}
        ops = []
        for pos, op in enumerate(body):
            view = self.loop.view(op)
            view["args"] = [rename.get(a, a) if isinstance(a, str) else a for a in view["args"]]
            view["engine"] = engines.get(op.out)
            if op.opcode == "reduce":
                view["first"] = "True"
                view["fused"] = op.out in fused
                view["moments_views"] = True  # its mean / variance tiles are the template's to bind (reduction_tiles)
            elif op.out in act_res:
                view["reduce_res"] = act_res[op.out]
            if op.opcode not in ("store", "reduce") and bufs.inplace[pos] and op.out not in stage_of:
                view["inplace"] = True
                view["out"] = bufs.writes[pos]
                rename[op.out] = view["out"]
            ops.append({"view": view, "staged": op.out in stage_of})
        # software pipelining: tile i's leading row values ([P, 1]: statistics) up to their last ScalarE op (the rstd's
        # sqrt), then the rest of tile i - 1's ops, whose VectorE steps would otherwise wait for that ScalarE op
        lead = next((k for k, o in enumerate(ops) if o["view"]["kind"] == "full"), len(ops))
        split = max((k + 1 for k, o in enumerate(ops[:lead]) if o["view"]["opcode"] == "activation"), default=lead)
        made = {o["view"]["out"] for o in ops[:split]}
        carry = sorted({a for o in ops[split:] for a in o["view"]["args"] if isinstance(a, str) and a in made})
        return {"resident": [{"name": name, "where": where or ("row", name, False)}
                             for name, where in resident.items()],
                "reduces": ls.reduction_tiles([op for op in body if op.opcode == "reduce"], views=True),
                "ops": ops, "split": split, "carry": carry,
                "pipelined": config.pipeline_row_ops and bool(carry) and split < len(ops)
                and all(o["view"]["opcode"] != "reduce" for o in ops[split:])}

    def skipped(self, resident: dict[str, tuple[str, str, bool] | None], staged: list[TileOp]) -> set[str]:
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
        in_place = self.reads_in_place()
        engines = self.epilogue_engines(in_place)
        for op in self.chunk_ops:
            if op.opcode in ("load", "store") or op.out in skipped:
                continue
            e = engines.get(op.out) or ls._fixed_engine(op) or "vector"
            load[e] += chunks * ls.op_ns(op, e, free, target, kinds)
        if not in_place:
            load["vector"] += chunks * ls.op_ns(self.mm, "vector", free, target, kinds)
        return load

    def reads_in_place(self) -> bool:
        """Whether the epilogue reads the sum straight from PSUM instead of evicting it first: not when a store,
        select or predicate takes it, nor when one instruction reads it twice (``h * h``: an engine instruction
        takes at most one PSUM operand), nor when a bitcast reads its bits (from the SBUF copy)."""
        users = [op for op in self.rest if self.mm.out in op.args]
        return bool(users) and all(op.opcode not in ("store", "select", "predicate", "bitcast")
                                   and op.args.count(self.mm.out) == 1 for op in users)

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
