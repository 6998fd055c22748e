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
from typing import Any

import jinja2
from neuron_compile.lowering.ir import (
    AttentionKernel,
    CopyKernel,
    GatherKernel,
    IndexAddKernel,
    Kernel,
    LoopKernel,
    ScanKernel,
    TileOp,
)

from neuron_compile.config import config
from neuron_compile.errors import TemplateRenderError
from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)


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
    if isinstance(kernel, LoopKernel) and any(op.opcode == "matmul" for op in kernel.ops):
        from neuron_compile.codegen.render_matmul import render_body  # imports this module

        body = render_body(kernel)
    elif isinstance(kernel, LoopKernel):
        body = LoopRenderer(kernel).body()
    elif isinstance(kernel, CopyKernel):
        body = _copy_body(kernel)
    elif isinstance(kernel, (GatherKernel, IndexAddKernel, ScanKernel)):
        body = _index_body(kernel)
    elif isinstance(kernel, AttentionKernel):
        from neuron_compile.codegen.render_attention import attention_body  # imports Lines from this module

        body = attention_body(kernel)
    else:  # pragma: no cover
        raise TypeError(kernel)
    template_name = f"{kernel.family}.nki.j2"
    params = [f"in{i}" for i in range(len(kernel.inputs))]
    returns = ", ".join(f"out{i}" for i in range(len(kernel.outputs))) or "None"
    if len(kernel.outputs) > 1:
        returns = f"({returns})"
    doc = f"{kernel.family} kernel: " + ", ".join(dict.fromkeys(kernel.source_ops)) if kernel.source_ops else kernel.family
    try:
        source = environment().get_template(template_name).render(
            name=kernel.name, params=params, outputs=kernel.outputs, body=body, returns=returns, doc=doc)
    except jinja2.TemplateError as exc:
        raise TemplateRenderError(f"template {template_name} failed for kernel {kernel.name}: {exc}") from exc
    try:
        ast.parse(source, filename=f"{kernel.name}.py")
    except SyntaxError as exc:
        line = source.splitlines()[exc.lineno - 1] if exc.lineno else ""
        raise TemplateRenderError(f"template {template_name} rendered invalid Python for kernel {kernel.name} "
                                  f"at line {exc.lineno}: {exc.msg}: {line.strip()!r}") from exc
    return source


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
    parts = [str(base)] if base else []
    parts += [f"{var} * {s}" if s != 1 else var for var, s in terms if s]
    return " + ".join(parts) or "0"


class LoopRenderer:
    """Loop nest of a LoopKernel: outer index loops, partition tiles, phases, free-dim chunks."""

    def __init__(self, k: LoopKernel) -> None:
        self.k = k
        self.macros = _macros()
        n = len(k.space)
        self.outer_vars = [f"o{i}" for i in range(k.n_outer)]
        self.part_dim = k.n_outer
        self.free_dim = n - 1
        self.red_outer = [d for d in k.reduce_dims if d != self.free_dim]
        self.ops = {op.out: op for op in k.ops}
        self.kinds = {op.out: op.kind for op in k.ops}
        n_full = sum(1 for op in k.ops if op.kind == "full") + 2
        budget = config.row_resident_bytes
        nf = k.space[self.free_dim]
        tile = k.free_tile
        if k.family != "matmul":
            tile = max(64, min(tile, budget // (4 * n_full)))
            if k.n_phases > 1 and nf * 4 * n_full <= budget:
                tile = nf  # the whole row stays resident in SBUF across phases
        self.free_tile = min(tile, nf)
        self.resident = self.free_tile >= nf and not self.red_outer

    def var_terms(self, strides: tuple[int, ...], with_free: bool = True, with_red: bool = True) -> list[tuple[str, int]]:
        terms = [(v, strides[i]) for i, v in enumerate(self.outer_vars)]
        terms.append(("p0", strides[self.part_dim]))
        if with_red:
            terms += [(f"r{j}", strides[d]) for j, d in enumerate(self.red_outer)]
        if with_free:
            terms.append(("f0", strides[self.free_dim]))
        return terms

    def view(self, op: TileOp) -> dict[str, Any]:
        """Template-facing dict of an op: its attrs plus resolved access patterns."""
        attrs = dict(op.attrs)
        d: dict[str, Any] = {"out": op.out, "opcode": op.opcode, "kind": op.kind, "dtype": op.dtype,
                             "args": [_literal(a) for a in op.args], "attrs": attrs, "bias_tile": False}
        row = op.kind == "row"
        for key in ("access", "a", "b"):
            if key in attrs:
                arg, base, strides = attrs[key]
                d[key] = {"arg": arg, "sp": strides[self.part_dim], "sf": strides[self.free_dim] if not row else 1,
                          "offset": _offset(base, self.var_terms(strides, with_free=not row, with_red=not row))}
        if op.opcode == "iota":
            base, coeffs = attrs["coeffs"]
            d["iota"] = {"sp": coeffs[self.part_dim], "sf": coeffs[self.free_dim],
                         "offset": _offset(base, self.var_terms(coeffs))}
        if op.opcode == "activation" and config.target == "trn1" and op.args[2] != 0.0 \
                and not isinstance(op.args[2], str):
            d["bias_tile"] = True  # NC-v2 takes activation bias only as a (P, 1) tile
        if op.opcode == "reduce":
            conds = [f"{v} == 0" for v in [f"r{j}" for j in range(len(self.red_outer))] + ["f0"]]
            d["first"] = " and ".join(conds)
        if op.opcode == "matmul":
            d["attrs"]["k"] = attrs["k"]
        return d

    def render(self, out: Lines, op: TileOp) -> None:
        out.add(str(self.macros.render_op(self.view(op), self.kinds, config.target)))

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
        for i, v in enumerate(self.outer_vars):
            out.add(str(self.macros.index_loop(v, k.space[i])))
            out.depth += 1
        out.add(str(self.macros.tile_loop("p0", k.space[self.part_dim], k.part_tile, "P")))
        out.depth += 1
        done_full: set[str] = set()
        done_row: set[str] = set()
        for phase in range(k.n_phases):
            # Row values (per-partition scalars) available in this phase, in program order.
            for op in k.ops:
                if op.kind == "row" and op.opcode not in ("reduce", "store") and op.phase <= phase \
                        and op.out not in done_row:
                    self.render(out, op)
                    done_row.add(op.out)
            sinks = [op for op in k.ops if op.phase == phase and op.kind == "full" and op.opcode == "store"]
            reds = [op for op in k.ops if op.opcode == "reduce" and op.phase == phase]
            if not sinks and not reds:
                continue
            for op in reds:
                out.add(f"{op.out} = nl.ndarray((P, 1), dtype=nl.{op.dtype}, buffer=nl.sbuf)")
            depth0 = out.depth
            for j, d in enumerate(self.red_outer):
                out.add(str(self.macros.index_loop(f"r{j}", k.space[d])))
                out.depth += 1
            out.add(str(self.macros.tile_loop("f0", k.space[self.free_dim], self.free_tile, "F")))
            out.depth += 1
            names = [str(a) for op in sinks + reds for a in op.args if isinstance(a, str)]
            for op in self.deps(names, phase, done_full if self.resident else set()):
                self.render(out, op)
                if self.resident:
                    done_full.add(op.out)
            for op in reds + sinks:
                self.render(out, op)
            out.depth = depth0
            done_row.update(op.out for op in reds)
        for op in k.ops:
            if op.opcode == "store" and op.kind == "row":
                self.render(out, op)
        return out.text()


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


def _index_body(k: GatherKernel | IndexAddKernel | ScanKernel) -> str:
    from neuron_compile.codegen import render_index  # imports Lines/_offset from this module

    if isinstance(k, GatherKernel):
        return render_index.gather_body(k, k.inputs[0].dtype)
    if isinstance(k, IndexAddKernel):
        return render_index.index_add_body(k)
    return render_index.scan_body(k)
