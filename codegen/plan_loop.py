"""Plans of the loop kernels (pointwise, reduction): tile sizes, phases, buffers, engines, row groups.

Input: a :class:`~neuron_compile.lowering.ir.LoopKernel` (not matmul: ``render_matmul.py``). Output: the plain-data
plan ``templates/pointwise.nki.j2`` (one row per partition) or ``templates/reduction.nki.j2`` (row groups) render as
the kernel body: loop extents, each tile op as a view dict (its attrs, operands mapped to the buffers holding them,
engine, access offsets), allocations and DMA accesses as numbers. Buffer and engine choices come from
:mod:`codegen.loop_schedule`. :func:`loop_body` renders the candidate row groups and keeps the one the cost model
estimates fastest; the launch split (``grid`` programs) is part of the plan.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

from neuron_compile.codegen import loop_schedule as ls
from neuron_compile.codegen.render import _macros, _offset, _wrap, render_block
from neuron_compile.lowering.ir import LoopKernel, TileOp

from neuron_compile import costmodel
from neuron_compile.config import config
from neuron_compile.simulator.targets import LIMITS
from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

# Target bytes per partition of one streamed DMA: >= 2 KiB approaches peak, >= 4 KiB saturates, and the
# ~1.3 us fixed cost per transfer (REFERENCE 4.3 DMA) is amortized over ~11 us of data at 32 KiB x 128.
DMA_TILE_BYTES = 32 * 1024
BN_STATS_FMAX = 512  # nl.tile_size.bn_stats_fmax: elements per partition one bn_stats reads


def loop_body(k: LoopKernel, grid: int = 1) -> tuple[str, int]:
    """(body, launch grid) of a pointwise/reduction kernel: one row per partition, or R rows per partition per DMA.

    Row groups (:meth:`LoopRenderer.row_group_options`) amortize the ~1.3 us fixed cost of every DMA
    (REFERENCE 4.3 DMA) over R rows at the price of more SBUF; they are chosen only when the cost model
    estimates the kernel's analytic instruction stream faster than with one row per partition. The chosen
    body's top loop is then split over ``grid`` programs when it can be (:meth:`LoopRenderer.split_grid`).
    """
    base = LoopRenderer(k)
    options = base.row_group_options()
    if not options:
        return _launch(base, base.body(), grid)
    from neuron_compile.costmodel import estimate
    from neuron_compile.instruction_stream import source_stream

    args = [(a.numel, a.dtype) for a in k.inputs]

    def cost(rows: int, split: bool = False, store_rows: int = 0) -> tuple[float, str, LoopRenderer]:
        r = base if rows == 1 else LoopRenderer(k, rows, split, store_rows)
        body = r.body()
        ns = estimate(source_stream(_wrap(k, body), k.name, args), config.target).time_ns
        log.debug("kernel %s: %d rows per partition%s, %d per store -> %.1f us", k.name, rows,
                  " (split engines)" * split, store_rows or rows, ns / 1e3)
        return ns, body, r

    best = cost(1)
    for rows in options:
        ns, body, r, split = min(((*cost(rows, s), s) for s in (False, True)), key=lambda c: (c[0], c[1], c[3]))
        # then fewer rows per store DMA (loads keep R rows): stores start before the whole group is done
        sub = rows // 2
        while sub >= 1:
            sub_ns, sub_body, sub_r = cost(rows, split, sub)
            if sub_ns >= ns:
                break
            ns, body, r, sub = sub_ns, sub_body, sub_r, sub // 2
        if ns < best[0]:
            best = (ns, body, r)
    return _launch(best[2], best[1], grid)


def _launch(r: LoopRenderer, body: str, grid: int) -> tuple[str, int]:
    split = r.split_grid(grid)
    return (r.body(split), split) if split > 1 else (body, 1)


class LoopRenderer:
    """Plan of a LoopKernel's loop nest: outer index loops, partition tiles, phases, free-dim chunks (rendered by
    ``pointwise.nki.j2``; row groups by ``reduction.nki.j2``). The matmul renderer reads its op views too.

    Tile size: the whole row stays resident in SBUF across phases (one HBM read per row) when the
    peak of live full tiles, with element-wise ops writing in place into dying operands
    (:func:`loop_schedule.assign_buffers`), fits ``config.row_resident_bytes`` per partition;
    otherwise rows stream in chunks as large as that budget allows (at least ``free_tile``, capped at
    ``DMA_TILE_BYTES`` per partition so every DMA moves >= 2 KiB per partition where the row allows,
    REFERENCE 4.3 DMA). Loads that do not depend on the partition tile (a broadcast gamma/beta row)
    are hoisted out of all loops when the row is a single chunk.
    """

    def __init__(self, k: LoopKernel, rows: int = 1, split_rows: bool = False, store_rows: int = 0) -> None:
        self.k = k
        self.rows = rows
        self.store_rows = store_rows or rows  # row groups: rows per store DMA (divides rows)
        self.split_rows = split_rows  # row groups: an op's rows may run on different engines
        self.macros = _macros()
        n = len(k.space)
        self.outer_vars = [f"o{i}" for i in range(k.n_outer)]
        self.part_dim = k.n_outer
        self.free_dim = n - 1
        self.red_outer = [d for d in k.reduce_dims if d != self.free_dim]
        # loops over reduced dims: "rd", not "r", which names the kernel's row values (r1, r2, ...)
        self.red_vars = [f"rd{j}" for j in range(len(self.red_outer))]
        self.ops = {op.out: op for op in k.ops}
        self.kinds = {op.out: op.kind for op in k.ops}
        self.dtypes = {op.out: op.dtype for op in k.ops}
        nf = k.space[self.free_dim]
        self.hoisted: list[TileOp] = []
        if k.family == "matmul":
            self.free_tile = min(k.free_tile, nf)
            self.resident = False
            return
        budget = config.row_resident_bytes
        if not self.red_outer:
            self._set_ops(self._moments_ops() or k.ops)  # a resident row's statistics pass (if it stays resident)
            hoist = self._hoistable()
            flat = self._flat(resident=True, hoisted={op.out for op in hoist})
            bufs = ls.assign_buffers(flat, self.kinds, self.dtypes, {op.out for op in hoist})
            hard = LIMITS[config.target].sbuf_partition_bytes * 0.9
            if (bufs.peak_bytes + self._bytes(op.out for op in hoist)) * nf <= budget \
                    and (bufs.alloc_bytes + self._bytes(op.out for op in hoist)) * nf <= hard:
                self.free_tile, self.resident, self.hoisted = nf, True, hoist
                return
            self._set_ops(k.ops)  # streamed rows keep their reductions
        flat = self._flat(resident=False, hoisted=set())
        bufs = ls.assign_buffers(flat, self.kinds, self.dtypes, set())
        peak = max(1, bufs.peak)
        cap = max(k.free_tile, DMA_TILE_BYTES // 4)
        tile = max(64, min(cap, budget // (4 * peak)))
        # Every tile a loop body allocates lives until the body's scope ends: long programs (special
        # functions, exact division) must fit their allocations, not only their peak of live values.
        hard = int(LIMITS[config.target].sbuf_partition_bytes * 0.9)
        if bufs.alloc_bytes * tile > hard:
            tile = max(1, hard // bufs.alloc_bytes)
        tile = tile // 64 * 64 if tile > 64 else tile
        self.free_tile = min(tile, nf)
        self.resident = False

    def _moments_ops(self) -> tuple[TileOp, ...] | None:
        """The ops with a resident row's mean and variance from VectorE's statistics instructions
        (:func:`loop_schedule.use_moments`), or None when the kernel has no such pair."""
        k = self.k
        if k.family != "reduction" or tuple(k.reduce_dims) != (self.free_dim,):
            return None
        ops = ls.use_moments(k.ops, k.space[self.free_dim])
        return None if ops is None else tuple(ops)

    def _set_ops(self, ops: tuple[TileOp, ...]) -> None:
        if ops is not self.k.ops:
            self.k = replace(self.k, ops=ops)
        self.ops = {op.out: op for op in ops}
        self.kinds = {op.out: op.kind for op in ops}
        self.dtypes = {op.out: op.dtype for op in ops}

    # -- planning ------------------------------------------------------------------------------------
    def _bodies(self, hoisted: set[str]) -> list[list[TileOp]]:
        done = set(hoisted)
        return [self._phase_body(phase, done, self.resident) for phase in range(self.k.n_phases)]

    def _wide_buffers(self, bodies: list[list[TileOp]], writes: list[str]) -> dict[str, str] | None:
        """Row-group mode: buffers held as ``[P, R, F]`` tiles (``{buffer: dtype}``), or None if unsupported.

        Loads and stored values move R rows per DMA, and a full tile read in a later phase than the one
        writing it must keep every row (each phase loops over the R rows); other tiles stay ``(P, F)``.
        """
        buf_of: dict[str, str] = {}
        written_in: dict[str, int] = {}
        wide: dict[str, str] = {}
        pos = 0
        for b, body in enumerate(bodies):
            for op in body:
                if op.opcode not in ("store", "reduce"):
                    buf_of[op.out] = writes[pos]
                    written_in.setdefault(writes[pos], b)
                    if op.opcode == "load":
                        wide[writes[pos]] = op.dtype
                pos += 1
        for b, body in enumerate(bodies):
            for op in body:
                for a in op.args:
                    if not isinstance(a, str) or self.kinds.get(a) != "full":
                        continue
                    if a not in buf_of:
                        if op.opcode == "store":
                            return None  # stores a hoisted tile: no per-row buffer to move
                        continue
                    buf = buf_of[a]
                    if op.opcode == "store" or written_in[buf] != b:
                        wide[buf] = self.dtypes[buf]
        return wide

    def row_group_options(self) -> list[int]:
        """Rows per partition (> 1) this kernel can move per DMA within the SBUF budget (resident rows only)."""
        k = self.k
        if self.rows != 1 or k.family != "reduction" or not self.resident or self.red_outer:
            return []
        for op in k.ops:
            if op.opcode in ("iota", "matmul") or "a" in dict(op.attrs) or \
                    (op.kind == "row" and op.opcode in ("load", "store")):
                return []
        _, _, _, invariant, bufs, wide = self._row_plan()
        if wide is None:
            return []
        ext, nf = k.space[self.part_dim], k.space[self.free_dim]
        out = []
        rows = 2
        while ext % (PMAX * rows) == 0 and rows <= 16:
            extra = sum(costmodel.itemsize(dt) for dt in wide.values()) * (rows - 1) + self._bytes(invariant)
            if (bufs.peak_bytes + self._bytes(op.out for op in self.hoisted) + extra) * nf \
                    > config.row_resident_bytes:
                break
            out.append(rows)
            rows *= 2
        return out

    def _row_plan(self) -> tuple[set[str], list[list[TileOp]], list[TileOp], set[str], Any, dict[str, str] | None]:
        """The row-group layout: hoisted names, phase bodies, their flat op list, outer-loop invariant loads,
        the buffer assignment, and the buffers that need a row per partition (None: unsupported)."""
        hoisted = {op.out for op in self.hoisted}
        bodies = self._bodies(hoisted)
        flat = [op for body in bodies for op in body]
        invariant = self._outer_invariant(hoisted)
        bufs = ls.assign_buffers(flat, self.kinds, self.dtypes, hoisted | invariant)
        return hoisted, bodies, flat, invariant, bufs, self._wide_buffers(bodies, bufs.writes)

    def _outer_invariant(self, hoisted: set[str]) -> set[str]:
        """Row groups: full loads that do not depend on the outer loops. The partition loop then runs
        outside the outer loops and loads them once per partition tile (e.g. a position embedding added to
        every batch), and no op writes into their tiles."""
        if not self.k.n_outer:
            return set()
        out = set()
        for op in self.k.ops:
            if op.opcode == "load" and op.kind == "full" and op.out not in hoisted:
                _, _, strides = op.attr("access")
                if all(strides[d] == 0 for d in range(self.part_dim)):
                    out.add(op.out)
        return out

    def _bytes(self, names: Any) -> int:
        """Bytes per free element of the full tiles ``names`` (their tile dtypes)."""
        return sum(costmodel.itemsize(self.dtypes[n]) for n in names)

    def _hoistable(self) -> list[TileOp]:
        """Full loads independent of the outer and partition loops (whole-row chunks only)."""
        k = self.k
        ext = k.space[self.part_dim]
        if ext > PMAX and ext % PMAX:
            return []  # the last partition tile is shorter: keep per-tile loads
        out = []
        for op in k.ops:
            if op.opcode == "load" and op.kind == "full":
                _, _, strides = op.attr("access")
                if all(strides[d] == 0 for d in range(self.part_dim + 1)):
                    out.append(op)
        return out

    def _phase_body(self, phase: int, done: set[str], resident: bool) -> list[TileOp]:
        k = self.k
        sinks = [op for op in k.ops if op.phase == phase and op.kind == "full" and op.opcode == "store"]
        reds = [op for op in k.ops if op.opcode == "reduce" and op.phase == phase]
        if not sinks and not reds:
            return []
        names = [str(a) for op in sinks + reds for a in op.args if isinstance(a, str)]
        body = self.deps(names, phase, done if resident else set())
        if resident:
            done.update(op.out for op in body)
        return body + reds + sinks

    def _flat(self, resident: bool, hoisted: set[str]) -> list[TileOp]:
        done = set(hoisted)
        flat: list[TileOp] = []
        for phase in range(self.k.n_phases):
            flat += self._phase_body(phase, done, resident)
        return flat

    # -- op views ------------------------------------------------------------------------------------
    def var_terms(self, strides: tuple[int, ...], with_free: bool = True, with_red: bool = True,
                  with_part: bool = True) -> list[tuple[str, int]]:
        terms = [(v, strides[i]) for i, v in enumerate(self.outer_vars)] if with_part else []
        if with_part:
            terms.append(("p0", strides[self.part_dim]))
        if with_red:
            terms += [(v, strides[d]) for v, d in zip(self.red_vars, self.red_outer, strict=True)]
        if with_free:
            terms.append(("f0", strides[self.free_dim]))
        return terms

    def view(self, op: TileOp, hoisted: bool = False) -> dict[str, Any]:
        """Template-facing dict of an op: its attrs plus resolved access patterns."""
        attrs = dict(op.attrs)
        d: dict[str, Any] = {"out": op.out, "opcode": op.opcode, "kind": op.kind, "dtype": op.dtype,
                             "args": [_literal(a) for a in op.args], "attrs": attrs, "bias_tile": False,
                             "inplace": False, "engine": None, "reduce_res": None}
        row = op.kind == "row"
        for key in ("access", "a", "b"):
            if key in attrs:
                arg, base, strides = attrs[key]
                terms = [] if hoisted else self.var_terms(strides, with_free=not row, with_red=not row)
                d[key] = {"arg": arg, "sp": strides[self.part_dim], "sf": strides[self.free_dim] if not row else 1,
                          "offset": _offset(base, terms)}
        if op.opcode == "iota":
            base, coeffs = attrs["coeffs"]
            d["iota"] = {"sp": coeffs[self.part_dim], "sf": coeffs[self.free_dim],
                         "offset": _offset(base, self.var_terms(coeffs))}
        if op.opcode == "activation" and config.target == "trn1" and op.args[2] != 0.0 \
                and not isinstance(op.args[2], str):
            d["bias_tile"] = True  # NC-v2 takes activation bias only as a (P, 1) tile
        if op.opcode == "reduce":
            conds = [f"{v} == 0" for v in [*self.red_vars, "f0"]]
            d["first"] = " and ".join(conds) if not self.resident else "True"
            if attrs.get("op") == "moments":  # bn_stats per chunk of at most bn_stats_fmax elements
                d["var"] = attrs["var"]
                d["chunks"] = math.ceil(attrs["count"] / BN_STATS_FMAX)
                d["fmax"] = BN_STATS_FMAX
        return d

    def deps(self, names: list[str], phase: int, done: set[str]) -> list[TileOp]:
        """Full ops needed (transitively) to produce ``names`` inside a chunk of ``phase``."""
        order: list[TileOp] = []
        seen = set(done)

        def visit(name: str) -> None:
            op = self.ops.get(name)
            if op is None or name in seen or op.kind == "row":
                return
            seen.add(name)
            for a in op.args:
                if isinstance(a, str):
                    visit(a)
            order.append(op)

        for n in names:
            visit(n)
        return order

    def _named(self, op: TileOp, rename: dict[str, str]) -> dict[str, Any]:
        """The op's view with operand names mapped to the buffers holding them."""
        view = self.view(op)
        view["args"] = [rename.get(a, a) if isinstance(a, str) else a for a in view["args"]]
        return view


    # -- the plan the templates render --------------------------------------------------------------
    def split_grid(self, grid: int) -> int:
        """Programs the body's top loop splits over: ``grid`` when its iterations are independent (disjoint output
        rows, no state carried between them: the row-tile loop ``p0``, or the first outer loop when it is not
        reduced) and there are at least ``grid`` of them, else 1."""
        k = self.k
        if grid <= 1 or self.red_outer or k.family == "matmul":
            return 1
        if k.n_outer and not self._rows_on_top():
            trips = k.space[0]
        elif k.n_outer:  # the row-tile loop on top, else the first outer loop inside it
            trips = max(self._row_trips(), k.space[0])
        else:
            trips = self._row_trips()
        return grid if trips >= grid else 1

    def _row_step(self) -> int:
        return PMAX * self.rows if self.rows > 1 else self.k.part_tile

    def _row_trips(self) -> int:
        """Iterations of the row-tile loop ``p0``."""
        return len(range(0, self.k.space[self.part_dim], self._row_step()))

    def _rows_on_top(self) -> bool:
        """Whether the row-tile loop runs outside the outer loops (row groups with an outer-invariant load, see
        :meth:`_outer_invariant`): it is then the top loop, the one the launch grid splits when it has a trip per
        program (else the first outer loop, inside it: each program loads the invariant rows)."""
        return self.rows > 1 and bool(self._outer_invariant({op.out for op in self.hoisted}))

    def body(self, grid: int = 1) -> str:
        """The kernel body (the frame's indentation level), its top loop split over ``grid`` programs when
        ``grid > 1`` (a grid :meth:`split_grid` allows)."""
        assert self.k.family != "matmul", "matmul kernels render through render_matmul"
        if self.rows > 1:
            return render_block("reduction.nki.j2", "row_groups", p=self._rows_plan(grid))
        return render_block("pointwise.nki.j2", "loop_body", p=self._plan(grid))

    def _loops(self, grid: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Outer index loops and the row-tile loop, the top one split over ``grid`` programs when ``grid > 1``."""
        k = self.k
        outer = [{"var": v, "start": 0, "stop": k.space[i], "step": None, "split": False}
                 for i, v in enumerate(self.outer_vars)]
        part = {"var": "p0", "start": 0, "stop": k.space[self.part_dim], "step": self._row_step(), "split": False}
        # the launch grid splits the top loop (the row-tile loop when it runs outside the outer loops and has a trip
        # per program), else the first outer loop
        if grid > 1 and (not outer or (self._rows_on_top() and self._row_trips() >= grid)):
            part["split"] = True
        elif grid > 1:
            outer[0].update(start=0, step=1, split=True)
        return outer, part

    def _base_plan(self, grid: int) -> dict[str, Any]:
        outer, part = self._loops(grid)
        return {"kinds": self.kinds, "target": config.target, "pmax": PMAX, "nf": self.k.space[self.free_dim],
                "outer": outer, "part": part}

    def _plan(self, grid: int) -> dict[str, Any]:
        """One row per partition: per phase, the row-value ops, then (when the phase has full ops) its reductions'
        accumulators, the reduced outer loops and the free-dim chunk loop with the chunk's ops."""
        k = self.k
        hoisted = {op.out for op in self.hoisted}
        flat = self._flat(self.resident, hoisted)
        bufs = ls.assign_buffers(flat, self.kinds, self.dtypes, hoisted)
        plan = self._base_plan(grid)
        plan.update(hoisted=[self.view(op, hoisted=True) for op in self.hoisted], free_tile=self.free_tile,
                    hoisted_p=min(PMAX, k.space[self.part_dim]), phases=[])
        done_row: set[str] = set()
        done_full = set(hoisted)
        rename: dict[str, str] = {}
        pos = 0
        engines = ls.assign_engines(flat, self.free_tile, config.target, self.kinds, dtypes=self.dtypes)
        for phase in range(k.n_phases):
            row_ops = []
            for op in k.ops:
                if op.kind == "row" and op.opcode not in ("reduce", "store", "moments_var") and op.phase <= phase \
                        and op.out not in done_row:
                    row_ops.append(self._named(op, rename))
                    done_row.add(op.out)
            ph: dict[str, Any] = {"row_ops": row_ops, "ops": []}
            plan["phases"].append(ph)
            body = self._phase_body(phase, done_full, self.resident)
            if not body:
                continue
            reds = [op for op in body if op.opcode == "reduce"]
            ph["reductions"] = ls.reduction_tiles(reds)
            ph["red_loops"] = [{"var": v, "start": 0, "stop": k.space[d], "step": None, "split": False}
                               for v, d in zip(self.red_vars, self.red_outer, strict=True)]
            fused = ls.fuse_act_reduce(body)
            act_res = {a: r for r, a in fused.items()}
            for op in body:
                view = self._named(op, rename)
                if bufs.inplace[pos]:
                    view["inplace"] = True
                    view["out"] = bufs.writes[pos]
                rename[op.out] = view["out"]
                view["engine"] = engines.get(op.out)
                view["partial"] = None  # a streamed fused reduction: the chunk's partial sum (P, 1)
                if op.out in act_res:
                    r = act_res[op.out]
                    view["reduce_res"] = r if self.resident else f"{r}_part"
                    if not self.resident:
                        view["partial"] = r
                if op.out in fused:
                    view["fused"] = True
                ph["ops"].append(view)
                pos += 1
            done_row.update(op.out for op in reds)
        plan["row_stores"] = [self.view(op) for op in k.ops if op.opcode == "store" and op.kind == "row"]
        return plan

    def _hw_load(self, op: TileOp, tile_dtype: str | None) -> bool:
        """A row-group load into a tile of ``tile_dtype`` may take its own DMA queue (see ``hw_queue``)."""
        return ls.hw_queue(op.attr("src_dtype"), tile_dtype or "", config.target)

    def _group_store(self, op: TileOp, src: str, wide: dict[str, str]) -> dict[str, Any]:
        """A row-group store of tile ``src``: its access, and whether it may take its own DMA queue."""
        return {"ap": self._group_ap(op), "src": src,
                "hw": ls.hw_queue(wide.get(src, ""), op.attr("dst_dtype"), config.target)}

    def _group_ap(self, op: TileOp) -> dict[str, Any]:
        """A row-group load/store's access: ``[[sp * R, P], [sp, R], [sf, F]]`` from ``offset``."""
        arg, base, strides = op.attr("access")
        return {"arg": arg, "sp": strides[self.part_dim], "sf": strides[self.free_dim],
                "offset": _offset(base, self.var_terms(strides, with_free=False, with_red=False))}

    def _rows_plan(self, grid: int) -> dict[str, Any]:
        """Row groups (R = ``rows`` per partition): the group tiles, then per phase the row-value ops (``batch``:
        once over the (P, R) tiles; ``row_block``: once per row q), the phase's loads, its ops per row (``block``)
        and its stores (``sub`` rows per store DMA)."""
        k, rows = self.k, self.rows
        hoisted, bodies, flat, invariant, bufs, wide = self._row_plan()
        assert wide is not None, "row groups requested for an unsupported kernel"
        if self.split_rows:
            engines = ls.assign_engines_rows(flat, self.free_tile, config.target, self.kinds, rows, dtypes=self.dtypes)
        else:
            engines = {name: (e,) for name, e in
                       ls.assign_engines(flat, self.free_tile, config.target, self.kinds, dtypes=self.dtypes).items()}
        row_tiles = {op.out: op.dtype for op in k.ops if op.kind == "row" and op.opcode not in ("load", "store")}
        plan = self._base_plan(grid)
        plan.update(rows=rows, hoisted=[self.view(op, hoisted=True) for op in self.hoisted],
                    row_tiles=list(row_tiles.items()), wide=list(wide.items()), phases=[],
                    invariant=[{"buf": op.out, "ap": self._group_ap(op), "hw": self._hw_load(op, wide.get(op.out))}
                               for op in k.ops if op.out in invariant])

        def block(views: list[dict[str, Any]]) -> dict[str, Any]:
            """Ops of row q, after row q's views of the group tiles they use (``(name, wide)``)."""
            used = dict.fromkeys(n for v in views for n in [v["out"], v.get("reduce_res"), v.get("var"), *v["args"]]
                                 if isinstance(n, str))
            return {"views": [(n, n in wide) for n in used if n in wide or n in row_tiles], "ops": views}

        done_row: set[str] = set()
        rename: dict[str, str] = {}
        pos = 0
        for phase, body in enumerate(bodies):
            views = []
            for op in k.ops:
                if op.kind == "row" and op.opcode not in ("reduce", "store", "moments_var") and op.phase <= phase \
                        and op.out not in done_row:
                    view = self._named(op, rename)
                    view["inplace"] = True  # writes its (P, 1) view of the (P, R) tile
                    views.append(view)
                    done_row.add(op.out)
            ph: dict[str, Any] = {"batch": [], "row_block": None, "block": None}
            plan["phases"].append(ph)
            if views and all(_row_batchable(v, row_tiles) for v in views):
                # Element-wise on row values with only literal operands: one instruction over the whole
                # (P, R) tile instead of R over (P, 1) views (same values; R - 1 fewer fixed costs).
                for view in views:
                    view["out"] = f"{view['out']}_rows"
                    view["args"] = [f"{a}_rows" if isinstance(a, str) and a in row_tiles else a for a in view["args"]]
                ph["batch"] = views
            elif views:
                ph["row_block"] = block(views)
            if not body:
                continue
            fused = ls.fuse_act_reduce(body)
            act_res = {a: r for r, a in fused.items()}
            views, stores, loads = [], [], []
            for op in body:
                if op.opcode == "load" and op.out in invariant:
                    rename[op.out] = bufs.writes[pos]
                elif op.opcode == "load":
                    rename[op.out] = bufs.writes[pos]
                    loads.append({"buf": bufs.writes[pos], "ap": self._group_ap(op),
                                  "hw": self._hw_load(op, wide.get(bufs.writes[pos]))})
                elif op.opcode == "store":
                    stores.append(op)
                else:
                    view = self._named(op, rename)
                    if bufs.inplace[pos] or bufs.writes[pos] in wide or op.opcode == "reduce":
                        view["inplace"] = True
                        view["out"] = bufs.writes[pos]
                    rename[op.out] = view["out"]
                    per_row = engines.get(op.out)
                    if per_row and len(set(per_row)) == 1:
                        view["engine"] = per_row[0]
                    elif per_row:  # rows of the group split between engines: row q on per_row[q]
                        view["row_engines"] = per_row
                    if op.out in act_res:
                        view["reduce_res"] = act_res[op.out]
                    if op.out in fused:
                        view["fused"] = True
                    if op.opcode == "reduce":
                        view["first"] = "True"
                    views.append(view)
                pos += 1
            ph.update(block=block(views), loads=loads,
                      sub=self.store_rows if stores and self.store_rows < rows else rows,
                      stores=[self._group_store(op, rename.get(op.args[0], op.args[0]), wide) for op in stores])
            done_row.update(op.out for op in body if op.opcode == "reduce")
        return plan


def _row_batchable(view: dict[str, Any], row_tiles: dict[str, str]) -> bool:
    """A row op that may run once over a ``(P, R)`` row tile: element-wise, its only tiles row values
    (the first operand, or both of a tensor_tensor), every other operand a literal."""
    args = view["args"]
    if view["opcode"] == "tensor_tensor":
        return all(isinstance(a, str) and a in row_tiles for a in args)
    if view["opcode"] not in ("tensor_scalar", "activation", "reciprocal") or view.get("bias_tile"):
        return False
    return bool(args) and isinstance(args[0], str) and args[0] in row_tiles \
        and not any(isinstance(a, str) for a in args[1:])


def _literal(a: Any) -> Any:
    if isinstance(a, float):
        if a != a:
            return "float('nan')"
        if a in (float("inf"), float("-inf")):
            return "float('inf')" if a > 0 else "-float('inf')"
        return a
    return a
