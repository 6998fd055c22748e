"""Render kernel IR as NKI 0.6 source through the Jinja2 templates in ``templates/``.

One template per kernel family extends ``_frame.nki.j2`` (imports, ``@nki.jit`` signature, HBM
outputs in ``nl.shared_hbm``, return). Instruction text comes from the macros in
``_macros.nki.j2`` (one per tile opcode, plus tile loops and DMA access patterns); this module only
decides the loop nest and which ops run in which phase. Every render is ``ast.parse``d; a failure
raises :class:`TemplateRenderError` naming the template, line and kernel.
"""

from __future__ import annotations

import ast
import functools
import logging
import textwrap
from dataclasses import replace
from typing import Any

import jinja2
from neuron_compile.codegen import loop_schedule as ls
from neuron_compile.lowering.ir import (
    FAMILY_KERNELS,
    AttentionKernel,
    CopyKernel,
    GatherKernel,
    IndexAddKernel,
    Kernel,
    LoopKernel,
    TileOp,
)

from neuron_compile import costmodel
from neuron_compile.config import config
from neuron_compile.errors import TemplateRenderError
from neuron_compile.simulator.targets import LIMITS
from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

# Target bytes per partition of one streamed DMA: >= 2 KiB approaches peak, >= 4 KiB saturates, and the
# ~1.3 us fixed cost per transfer (REFERENCE 4.3 DMA) is amortized over ~11 us of data at 32 KiB x 128.
DMA_TILE_BYTES = 32 * 1024


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("neuron_compile.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _macros() -> Any:
    return environment().get_template("_macros.nki.j2").make_module({"pmax": PMAX})


def render_kernel(kernel: Kernel) -> str:
    context = _template_context(kernel)
    if context is not None:  # the template is the whole kernel; Python gives it the plan (one core)
        return _wrap(kernel, "", 1, **context)
    body, grid = _cached_body(replace(kernel, name=""), lnc(), _snapshot(), _renderers())
    return _wrap(kernel, body, grid)


def _template_context(kernel: Kernel) -> dict[str, Any] | None:
    """The template context of a kernel whose family template renders the whole kernel (sort, search, scatter,
    line_gather and scan: codegen/render_family.py; conv, conv_wgrad, pool, resample: codegen/render_conv.py), else
    None. These run on one physical core (their loops live in the template, not in a body :func:`_spmd` splits)."""
    if isinstance(kernel, FAMILY_KERNELS):
        from neuron_compile.codegen.render_family import family_plan

        return {"k": kernel, "plan": family_plan(kernel), "pmax": PMAX}
    from neuron_compile.codegen.render_conv import TEMPLATE_KERNELS, template_context

    if isinstance(kernel, TEMPLATE_KERNELS):
        return template_context(kernel)
    return None


def launch_grid(kernel: Kernel) -> int:
    """Programs (physical cores) the kernel is launched on: ``lnc()`` when its work splits, else 1."""
    from neuron_compile.codegen.render_conv import TEMPLATE_KERNELS

    if isinstance(kernel, (*FAMILY_KERNELS, *TEMPLATE_KERNELS)):
        return 1
    return _cached_body(replace(kernel, name=""), lnc(), _snapshot(), _renderers())[1]


def _snapshot() -> tuple[tuple[str, Any], ...]:
    from neuron_compile.config import codegen_snapshot

    return tuple(sorted(codegen_snapshot().items()))


def lnc() -> int:
    """Physical cores per logical core (config ``lnc``; 0 = the target's default: 2 on trn2/trn3)."""
    return config.lnc or (1 if config.target == "trn1" else 2)


def _renderers() -> tuple[Any, ...]:
    """The renderer entry points (part of the cache key: a test that patches one gets a fresh render)."""
    return (LoopRenderer.__init__, LoopRenderer.body, LoopRenderer.row_group_options)


@functools.lru_cache(maxsize=1024)
def _cached_body(kernel: Kernel, grid: int, snapshot: tuple[tuple[str, Any], ...],
                 renderers: tuple[Any, ...]) -> tuple[str, int]:
    """(body, launch grid) of a kernel with its name taken out: identical kernels (one per transformer layer) render,
    search row groups and choose their launch once per config ``snapshot`` (the codegen knobs)."""
    return _render(replace(kernel, name="k"), grid)


def _render(kernel: Kernel, grid: int) -> tuple[str, int]:
    """(body, launch grid) of a kernel on a logical core of ``grid`` physical cores."""
    if grid > 1 and isinstance(kernel, AttentionKernel):
        from neuron_compile.codegen.render_attention_u import unshifted_group

        if unshifted_group(kernel):
            # The unshifted kernel branches on an on-chip check; both cores of a logical core must take the same
            # runtime path (NKI 0.6 runtime loops), so it runs on one core. The exact kernel splits over both:
            # take whichever the cost model estimates faster.
            one = _body(kernel)
            with config.patch(attention_unshifted=False):
                two = _spmd(kernel, _body(kernel), grid)
            if two is None or _estimate(kernel, _wrap(kernel, one, 1)) <= _estimate(kernel, _wrap(kernel, two, grid)):
                return one, 1
            return two, grid
    body = _body(kernel)
    if grid > 1:
        split = _spmd(kernel, body, grid)
        if split is not None:
            return split, grid
    return body, 1


def _estimate(kernel: Kernel, source: str) -> float:
    from neuron_compile.costmodel import estimate
    from neuron_compile.instruction_stream import source_stream

    return estimate(source_stream(source, kernel.name, [(a.numel, a.dtype) for a in kernel.inputs]),
                    config.target).time_ns


def _body(kernel: Kernel) -> str:
    if isinstance(kernel, LoopKernel) and any(op.opcode == "matmul" for op in kernel.ops):
        from neuron_compile.codegen.render_matmul import render_body  # imports this module

        return render_body(kernel)
    if isinstance(kernel, LoopKernel):
        return _loop_body(kernel)
    if isinstance(kernel, CopyKernel):
        return _copy_body(kernel)
    if isinstance(kernel, (GatherKernel, IndexAddKernel)):
        return _index_body(kernel)
    if isinstance(kernel, AttentionKernel):
        from neuron_compile.codegen.render_attention import attention_body  # imports Lines from this module

        return attention_body(kernel)
    raise TypeError(kernel)  # pragma: no cover


def _split_loop(kernel: Kernel) -> str | None:
    """The loop variable whose iterations are independent (disjoint output rows, no state carried between them):
    row tiles (``p0``) or non-reduced outer dims of row kernels, M blocks (``m0``) of matmuls, row
    groups (``g0``) of gathers, batches (``b``) of the exact attention kernel."""
    if isinstance(kernel, LoopKernel) and any(op.opcode == "matmul" for op in kernel.ops):
        return "m0"
    if isinstance(kernel, LoopKernel):
        r = LoopRenderer(kernel)
        if r.red_outer:
            return None
        return "o0" if kernel.n_outer and 0 not in kernel.reduce_dims else "p0"
    if isinstance(kernel, GatherKernel):
        return "g0"
    if isinstance(kernel, AttentionKernel):
        return "b"
    return None  # copies (no loop), index_put (scatter-add: programs could add to the same row)


def _spmd(kernel: Kernel, body: str, grid: int) -> str | None:
    """The body with its independent top-level loop spread over ``grid`` programs (cyclically: program ``i`` runs
    iterations ``i, i + grid, ...``), or None when the kernel has no such loop with at least ``grid`` iterations.
    The one place the launch grid changes a kernel: every other line is the single-core kernel's."""
    var = _split_loop(kernel)
    if var is None:
        return None
    tree = ast.parse(body)
    loop = next((n for n in tree.body if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
                 and n.target.id == var and isinstance(n.iter, ast.Call) and isinstance(n.iter.func, ast.Name)
                 and n.iter.func.id == "range" and not n.iter.keywords), None)
    if loop is None:
        return None
    args = [ast.unparse(a) for a in loop.iter.args]  # type: ignore[attr-defined]
    start, stop, step = (["0", *args, "1"] if len(args) == 1 else [*args, "1"] if len(args) == 2 else args)[:3]
    try:
        trips = len(range(int(ast.literal_eval(start)), int(ast.literal_eval(stop)), int(ast.literal_eval(step))))
    except (ValueError, SyntaxError):
        trips = grid
    if trips < grid:
        return None
    lines = body.splitlines()
    head = lines[loop.lineno - 1]
    assert head.startswith(f"for {var} in range("), head
    lines[loop.lineno - 1] = (f"for {var} in range({start} + nl.program_id(0) * {step}, {stop}, "
                              f"{step} * nl.num_programs(0)):")
    return "\n".join(lines) + ("\n" if body.endswith("\n") else "")


def _wrap(kernel: Kernel, body: str, grid: int = 1, **context: Any) -> str:
    """The full kernel source around a rendered ``body`` (frame template), checked with ``ast.parse``.

    Family templates (``context`` given: the IR as ``k`` and the plan Python computed for it, plain data)
    override the frame's body block and render the whole kernel.
    """
    template_name = f"{kernel.family}.nki.j2"
    params = [f"in{i}" for i in range(len(kernel.inputs))]
    returns = ", ".join(f"out{i}" for i in range(len(kernel.outputs))) or "None"
    if len(kernel.outputs) > 1:
        returns = f"({returns})"
    doc = f"{kernel.family} kernel: " + ", ".join(dict.fromkeys(kernel.source_ops)) if kernel.source_ops else kernel.family
    try:
        source = environment().get_template(template_name).render(
            name=kernel.name, params=params, outputs=kernel.outputs, body=body, returns=returns, doc=doc, grid=grid,
            **context)
    except jinja2.TemplateError as exc:
        raise TemplateRenderError(f"template {template_name} failed for kernel {kernel.name}: {exc}") from exc
    try:
        ast.parse(source, filename=f"{kernel.name}.py")
    except SyntaxError as exc:
        line = source.splitlines()[exc.lineno - 1] if exc.lineno else ""
        raise TemplateRenderError(f"template {template_name} rendered invalid Python for kernel {kernel.name} "
                                  f"at line {exc.lineno}: {exc.msg}: {line.strip()!r}") from exc
    return source


def _loop_body(k: LoopKernel) -> str:
    """Body of a pointwise/reduction kernel: one row per partition, or R rows per partition per DMA.

    Row groups (:meth:`LoopRenderer.row_group_options`) amortize the ~1.3 us fixed cost of every DMA
    (REFERENCE 4.3 DMA) over R rows at the price of more SBUF; they are chosen only when the cost model
    estimates the kernel's analytic instruction stream faster than with one row per partition.
    """
    base = LoopRenderer(k)
    options = base.row_group_options()
    if not options:
        return base.body()
    from neuron_compile.costmodel import estimate
    from neuron_compile.instruction_stream import source_stream

    args = [(a.numel, a.dtype) for a in k.inputs]

    def cost(rows: int, split: bool = False, store_rows: int = 0) -> tuple[float, str]:
        body = base.body() if rows == 1 else LoopRenderer(k, rows, split, store_rows).body()
        ns = estimate(source_stream(_wrap(k, body), k.name, args), config.target).time_ns
        log.debug("kernel %s: %d rows per partition%s, %d per store -> %.1f us", k.name, rows,
                  " (split engines)" * split, store_rows or rows, ns / 1e3)
        return ns, body

    best = cost(1)
    for rows in options:
        ns, body, split = min((*cost(rows, s), s) for s in (False, True))
        # then fewer rows per store DMA (loads keep R rows): stores start before the whole group is done
        sub = rows // 2
        while sub >= 1:
            sub_ns, sub_body = cost(rows, split, sub)
            if sub_ns >= ns:
                break
            ns, body, sub = sub_ns, sub_body, sub // 2
        if ns < best[0]:
            best = (ns, body)
    return best[1]


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def add(self, text: str) -> None:
        for line in textwrap.dedent(text).strip("\n").splitlines():
            self.lines.append("    " * self.depth + line if line.strip() else "")

    def text(self) -> str:
        return "\n".join(self.lines)


def _offset(base: int, terms: list[tuple[str, int]]) -> str:
    from neuron_compile.lowering.index_algebra import offset_text  # sympy printer, cached per (base, terms)

    return offset_text(int(base), tuple((var, int(s)) for var, s in terms))


class LoopRenderer:
    """Loop nest of a LoopKernel: outer index loops, partition tiles, phases, free-dim chunks.

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
            hoist = self._hoistable()
            flat = self._flat(resident=True, hoisted={op.out for op in hoist})
            bufs = ls.assign_buffers(flat, self.kinds, self.dtypes, {op.out for op in hoist})
            hard = LIMITS[config.target].sbuf_partition_bytes * 0.9
            if (bufs.peak_bytes + self._bytes(op.out for op in hoist)) * nf <= budget \
                    and (bufs.alloc_bytes + self._bytes(op.out for op in hoist)) * nf <= hard:
                self.free_tile, self.resident, self.hoisted = nf, True, hoist
                return
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

    # -- rendering -----------------------------------------------------------------------------------
    def var_terms(self, strides: tuple[int, ...], with_free: bool = True, with_red: bool = True,
                  with_part: bool = True) -> list[tuple[str, int]]:
        terms = [(v, strides[i]) for i, v in enumerate(self.outer_vars)] if with_part else []
        if with_part:
            terms.append(("p0", strides[self.part_dim]))
        if with_red:
            terms += [(f"r{j}", strides[d]) for j, d in enumerate(self.red_outer)]
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
            conds = [f"{v} == 0" for v in [f"r{j}" for j in range(len(self.red_outer))] + ["f0"]]
            d["first"] = " and ".join(conds) if not self.resident else "True"
        return d

    def render(self, out: Lines, op: TileOp) -> None:
        self._emit(out, self.view(op))

    def _emit(self, out: Lines, view: dict[str, Any]) -> None:
        text = str(self.macros.render_op(view, self.kinds, config.target))
        out.add("\n".join(line for line in text.splitlines() if line.strip()))

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

    def body(self) -> str:
        k = self.k
        out = Lines()
        if k.family == "matmul":
            return self._body_plain(out)
        if self.rows > 1:
            return self._body_rows(out)
        hoisted = {op.out for op in self.hoisted}
        flat = self._flat(self.resident, hoisted)
        bufs = ls.assign_buffers(flat, self.kinds, self.dtypes, hoisted)
        ext = k.space[self.part_dim]
        if self.hoisted:
            out.add(f"P = {min(PMAX, ext)}")
            out.add(f"F = {k.space[self.free_dim]}")
            for op in self.hoisted:
                self._emit(out, self.view(op, hoisted=True))
        for i, v in enumerate(self.outer_vars):
            out.add(str(self.macros.index_loop(v, k.space[i])))
            out.depth += 1
        out.add(str(self.macros.tile_loop("p0", ext, k.part_tile, "P")))
        out.depth += 1
        done_row: set[str] = set()
        done_full = set(hoisted)
        rename: dict[str, str] = {}
        pos = 0
        engines = ls.assign_engines(flat, self.free_tile, config.target, self.kinds, dtypes=self.dtypes)
        for phase in range(k.n_phases):
            for op in k.ops:
                if op.kind == "row" and op.opcode not in ("reduce", "store") and op.phase <= phase \
                        and op.out not in done_row:
                    self._emit(out, self._named(op, rename))
                    done_row.add(op.out)
            body = self._phase_body(phase, done_full, self.resident)
            if not body:
                continue
            reds = [op for op in body if op.opcode == "reduce"]
            for op in reds:
                out.add(f"{op.out} = nl.ndarray((P, 1), dtype=nl.{op.dtype}, buffer=nl.sbuf)")
            depth0 = out.depth
            for j, d in enumerate(self.red_outer):
                out.add(str(self.macros.index_loop(f"r{j}", k.space[d])))
                out.depth += 1
            out.add(str(self.macros.tile_loop("f0", k.space[self.free_dim], self.free_tile, "F")))
            out.depth += 1
            fused = ls.fuse_act_reduce(body)
            act_res = {a: r for r, a in fused.items()}
            for op in body:
                view = self._named(op, rename)
                if bufs.inplace[pos]:
                    view["inplace"] = True
                    view["out"] = bufs.writes[pos]
                rename[op.out] = view["out"]
                view["engine"] = engines.get(op.out)
                if op.out in act_res:
                    r = act_res[op.out]
                    view["reduce_res"] = r if self.resident else f"{r}_part"
                    if not self.resident:
                        out.add(f"{r}_part = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)")
                if op.out in fused:
                    view["fused"] = True
                self._emit(out, view)
                pos += 1
            out.depth = depth0
            done_row.update(op.out for op in reds)
        for op in k.ops:
            if op.opcode == "store" and op.kind == "row":
                self.render(out, op)
        return out.text()

    def _body_rows(self, out: Lines) -> str:
        """Resident rows, R per partition: partition p of tile p0 holds rows ``p0 + p * R + q``, q < R.

        One DMA moves each ``[P, R, F]`` load/store tile; row values live in ``(P, R)`` tiles. Each
        phase's ops run once per row q on ``(P, F)`` / ``(P, 1)`` views of those tiles, so every
        instruction is the one-row instruction (same engines, same per-row results).
        """
        k, rows = self.k, self.rows
        hoisted, bodies, flat, invariant, bufs, wide = self._row_plan()
        assert wide is not None, "row groups requested for an unsupported kernel"
        if self.split_rows:
            engines = ls.assign_engines_rows(flat, self.free_tile, config.target, self.kinds, rows, dtypes=self.dtypes)
        else:
            engines = {name: (e,) for name, e in
                       ls.assign_engines(flat, self.free_tile, config.target, self.kinds, dtypes=self.dtypes).items()}
        row_tiles = {op.out: op.dtype for op in k.ops if op.kind == "row" and op.opcode not in ("load", "store")}
        out.add(f"P = {PMAX}")
        out.add(f"F = {k.space[self.free_dim]}")
        for op in self.hoisted:
            self._emit(out, self.view(op, hoisted=True))

        def pattern(op: TileOp) -> str:
            _, base, strides = op.attr("access")
            sp, sf = strides[self.part_dim], strides[self.free_dim]
            offset = _offset(base, self.var_terms(strides, with_free=False, with_red=False))
            return f"pattern=[[{sp * rows}, P], [{sp}, {rows}], [{sf}, F]], offset={offset}"

        def outer_loops() -> None:
            for i, v in enumerate(self.outer_vars):
                out.add(str(self.macros.index_loop(v, k.space[i])))
                out.depth += 1

        if not invariant:
            outer_loops()
        out.add(f"for p0 in range(0, {k.space[self.part_dim]}, {PMAX * rows}):")
        out.depth += 1
        for name, dt in row_tiles.items():
            out.add(f"{name}_rows = nl.ndarray((P, {rows}), dtype=nl.{dt}, buffer=nl.sbuf)")
        for name, dt in wide.items():
            out.add(f"{name}_rows = nl.ndarray((P, {rows}, F), dtype=nl.{dt}, buffer=nl.sbuf)")
        if invariant:
            for op in k.ops:
                if op.out in invariant:
                    out.add(f"nisa.dma_copy(dst={op.out}_rows, src=in{op.attr('access')[0]}.ap({pattern(op)}))")
            outer_loops()

        def row_body(views: list[dict[str, Any]]) -> None:
            """Inside an open ``for q`` loop: row q's (P, F) / (P, 1) views of the row tiles, then the ops."""
            out.depth += 1
            used = dict.fromkeys(n for v in views for n in [v["out"], v.get("reduce_res"), *v["args"]]
                                 if isinstance(n, str))
            for n in used:
                if n in wide:
                    out.add(f"{n} = {n}_rows[:, q, :]")
                elif n in row_tiles:
                    out.add(f"{n} = {n}_rows[:, q:q + 1]")
            for view in views:
                self._emit(out, view)
            out.depth -= 1

        done_row: set[str] = set()
        rename: dict[str, str] = {}
        pos = 0
        for phase, body in enumerate(bodies):
            views = []
            for op in k.ops:
                if op.kind == "row" and op.opcode not in ("reduce", "store") and op.phase <= phase \
                        and op.out not in done_row:
                    view = self._named(op, rename)
                    view["inplace"] = True  # writes its (P, 1) view of the (P, R) tile
                    views.append(view)
                    done_row.add(op.out)
            if views and all(_row_batchable(v, row_tiles) for v in views):
                # Element-wise on row values with only literal operands: one instruction over the whole
                # (P, R) tile instead of R over (P, 1) views (same values; R - 1 fewer fixed costs).
                for view in views:
                    view["out"] = f"{view['out']}_rows"
                    view["args"] = [f"{a}_rows" if isinstance(a, str) and a in row_tiles else a for a in view["args"]]
                    self._emit(out, view)
            elif views:
                out.add(f"for q in range({rows}):")
                row_body(views)
            if not body:
                continue
            fused = ls.fuse_act_reduce(body)
            act_res = {a: r for r, a in fused.items()}
            views, stores = [], []
            for op in body:
                if op.opcode == "load" and op.out in invariant:
                    rename[op.out] = bufs.writes[pos]
                elif op.opcode == "load":
                    rename[op.out] = bufs.writes[pos]
                    out.add(f"nisa.dma_copy(dst={bufs.writes[pos]}_rows, src=in{op.attr('access')[0]}.ap("
                            f"{pattern(op)}))")
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
                    elif per_row:  # rows of the group split between engines
                        view["engine_expr"] = "(" + ", ".join(f"nisa.engine.{e}" for e in per_row) + ")[q]"
                    if op.out in act_res:
                        view["reduce_res"] = act_res[op.out]
                    if op.out in fused:
                        view["fused"] = True
                    if op.opcode == "reduce":
                        view["first"] = "True"
                    views.append(view)
                pos += 1
            sub = self.store_rows if stores and self.store_rows < rows else rows
            if sub < rows:
                # Stores of `sub` rows each, issued as soon as their rows are done (finer pipeline drain).
                out.add(f"for q0 in range(0, {rows}, {sub}):")
                out.depth += 1
                out.add(f"for q in range(q0, q0 + {sub}):")
            else:
                out.add(f"for q in range({rows}):")
            row_body(views)
            for op in stores:
                src = f"{rename.get(op.args[0], op.args[0])}_rows"
                if sub < rows:
                    sp = op.attr("access")[2][self.part_dim]
                    dst_ap = pattern(op).replace(f"[{sp}, {rows}]", f"[{sp}, {sub}]", 1) + f" + q0 * {sp}"
                    src += f"[:, q0:q0 + {sub}, :]"
                else:
                    dst_ap = pattern(op)
                out.add(f"nisa.dma_copy(dst=out{op.attr('access')[0]}.ap({dst_ap}), src={src})")
            if sub < rows:
                out.depth -= 1
            done_row.update(op.out for op in body if op.opcode == "reduce")
        return out.text()

    def _named(self, op: TileOp, rename: dict[str, str]) -> dict[str, Any]:
        """The op's view with operand names mapped to the buffers holding them."""
        view = self.view(op)
        view["args"] = [rename.get(a, a) if isinstance(a, str) else a for a in view["args"]]
        return view

    def _body_plain(self, out: Lines) -> str:
        """Matmul kernels (until they route to their own renderer): the original loop nest."""
        k = self.k
        for i, v in enumerate(self.outer_vars):
            out.add(str(self.macros.index_loop(v, k.space[i])))
            out.depth += 1
        out.add(str(self.macros.tile_loop("p0", k.space[self.part_dim], k.part_tile, "P")))
        out.depth += 1
        for phase in range(k.n_phases):
            for op in k.ops:
                if op.kind == "row" and op.opcode not in ("reduce", "store") and op.phase <= phase:
                    self.render(out, op)
            sinks = [op for op in k.ops if op.phase == phase and op.kind == "full" and op.opcode == "store"]
            if not sinks:
                continue
            depth0 = out.depth
            out.add(str(self.macros.tile_loop("f0", k.space[self.free_dim], self.free_tile, "F")))
            out.depth += 1
            names = [str(a) for op in sinks for a in op.args if isinstance(a, str)]
            for op in self.deps(names, phase, set()) + sinks:
                self.render(out, op)
            out.depth = depth0
        return out.text()


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


def _dma_pattern(acc: Any, space: tuple[int, ...], loops: list[int], tail: list[int]) -> str:
    pairs = ", ".join(f"[{acc.strides[d]}, {space[d]}]" for d in tail)
    off = _offset(acc.offset, [(f"o{i}", acc.strides[i]) for i in loops])
    return f"pattern=[{pairs}], offset={off}"


def _copy_body(k: CopyKernel) -> str:
    out = Lines()
    for src_arg, src, dst_out, dst, space in k.copies:
        depth = out.depth
        n = len(space)
        # Loop every dim but the last two; those two form the DMA pattern.
        loops = list(range(max(n - 2, 0)))
        for i in loops:
            out.add(f"for o{i} in range({space[i]}):")
            out.depth += 1
        tail = list(range(max(n - 2, 0), n))
        out.add(f"nisa.dma_copy(dst=out{dst_out}.ap({_dma_pattern(dst, space, loops, tail)}), "
                f"src=in{src_arg}.ap({_dma_pattern(src, space, loops, tail)}))")
        out.depth = depth
    return out.text()


def _index_body(k: GatherKernel | IndexAddKernel) -> str:
    from neuron_compile.codegen import render_index  # imports Lines/_offset from this module

    if isinstance(k, GatherKernel):
        return render_index.gather_body(k, k.inputs[0].dtype)
    return render_index.index_add_body(k)
