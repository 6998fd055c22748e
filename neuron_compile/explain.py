"""``neuron_compile.explain``: where the time goes, per compiled graph and per kernel.

``explain(model_or_fn, *example_inputs)`` compiles with ``backend="neuron"`` (cache off, so every
graph is lowered here and its kernel IR is at hand), runs once on the simulator with the
instruction trace on, and reports per graph and per kernel: the ATen ops fused, the template,
the tile configuration, FLOPs, HBM bytes (actual, from the DMA records, and minimal), the
cost-model estimate (:mod:`neuron_compile.costmodel`), the roofline (:mod:`neuron_compile.roofline`),
efficiency, and why the partitioner started each kernel. Also the ``neuron-compile explain
SCRIPT.py`` sub-command (``add_arguments`` / ``run``), which reports every graph a script compiles.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import runpy
import sys
import types
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module to build its parser: keep that light
    from neuron_compile.costmodel import Estimate
    from neuron_compile.roofline import Roofline

log = logging.getLogger(__name__)


@dataclass
class KernelReport:
    name: str
    family: str
    template: str
    source_ops: list[str]
    tiles: dict[str, Any]
    calls: int
    estimate: Estimate
    roofline: Roofline
    reason: str = ""
    traced: bool = True  # False: the estimate comes from the analytic stream

    @property
    def efficiency(self) -> float:
        return self.roofline.time_ns / self.estimate.time_ns if self.estimate.time_ns else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "template": self.template, "ops": self.source_ops,
                "tiles": self.tiles, "calls": self.calls, "flops": self.roofline.flops,
                "hbm_bytes": self.estimate.hbm_bytes, "min_hbm_bytes": self.roofline.min_bytes,
                "estimated_ns": self.estimate.time_ns, "roofline_ns": self.roofline.time_ns,
                "efficiency": self.efficiency, "bottleneck": self.estimate.bottleneck, "bound": self.roofline.bound,
                "reason": self.reason, "traced": self.traced, "estimate": self.estimate.to_json(),
                "roofline": self.roofline.to_json()}


@dataclass
class GraphReport:
    index: int
    kind: str
    kernels: list[KernelReport]
    estimate: Estimate
    roofline: Roofline

    @property
    def efficiency(self) -> float:
        return self.roofline.time_ns / self.estimate.time_ns if self.estimate.time_ns else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "kernels": [k.to_json() for k in self.kernels],
                "estimated_ns": self.estimate.time_ns, "roofline_ns": self.roofline.time_ns,
                "efficiency": self.efficiency, "flops": self.roofline.flops, "hbm_bytes": self.estimate.hbm_bytes,
                "min_hbm_bytes": self.roofline.min_bytes}


@dataclass
class Report:
    target: str
    graphs: list[GraphReport] = field(default_factory=list)
    # per compiled graph with collectives: their costs and the estimated overlap (neuron_compile.comm_cost)
    collectives: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "graphs": [g.to_json() for g in self.graphs], "collectives": self.collectives}

    def __str__(self) -> str:
        lines = [f"neuron-compile explain (target {self.target}; times from the cost model, docs/cost_model.md)"]
        for g in self.graphs:
            lines.append(f"graph {g.index} ({g.kind}): {len(g.kernels)} kernels, est {_us(g.estimate.time_ns)}, "
                         f"roofline {_us(g.roofline.time_ns)} ({g.roofline.bound}), efficiency "
                         f"{g.efficiency:.1%}, HBM {_mb(g.estimate.hbm_bytes)} / min {_mb(g.roofline.min_bytes)}")
            lines.append(f"  {'kernel':<28} {'template':<18} {'tiles':<34} {'MFLOP':>9} {'HBM MB':>9} "
                         f"{'min MB':>8} {'est us':>9} {'roof us':>9} {'eff':>6} {'bound by':<8}")
            for k in g.kernels:
                lines.append(f"  {k.name[:28]:<28} {k.template:<18} {_tiles(k.tiles)[:34]:<34} "
                             f"{k.roofline.flops / 1e6:>9.2f} {k.estimate.hbm_bytes / 1e6:>9.3f} "
                             f"{k.roofline.min_bytes / 1e6:>8.3f} {k.estimate.time_ns / 1e3:>9.2f} "
                             f"{k.roofline.time_ns / 1e3:>9.2f} {k.efficiency:>6.1%} {k.estimate.bottleneck:<8}")
                lines.append(f"      ops: {', '.join(dict.fromkeys(k.source_ops)) or '-'}")
                lines.append(f"      new kernel because: {k.reason or '-'}")
        for c in self.collectives:
            if "error" in c:
                lines.append(f"{c['kind']} graph with collectives: {c['error']}")
                continue
            lines.append(f"{c['kind']} graph with {len(c['collectives'])} collective(s) (segments run on the "
                         f"NeuronCore, collectives on the collective engines): {c['describe']}")
            for est in c["collectives"]:
                lines.append(f"  {est['node']}: {est['describe']}")
        return "\n".join(lines)


def _us(ns: float) -> str:
    return f"{ns / 1e3:.2f} us"


def _mb(b: int) -> str:
    return f"{b / 1e6:.3f} MB"


def _tiles(t: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in t.items() if k in ("space", "tile", "k", "variant", "head_group"))


def tile_config(kernel: Any) -> dict[str, Any]:
    """The loop nest a kernel was rendered with (the free tile the renderer actually uses)."""
    from neuron_compile.codegen.render import LoopRenderer
    from neuron_compile.codegen.render_attention import attention_plan
    from neuron_compile.lowering.ir import AttentionKernel, LoopKernel

    if isinstance(kernel, AttentionKernel):
        return attention_plan(kernel)
    if isinstance(kernel, LoopKernel):
        out: dict[str, Any] = {"space": list(kernel.space), "outer": kernel.n_outer,
                               "reduce": list(kernel.reduce_dims),
                               "tile": [kernel.part_tile, LoopRenderer(kernel).free_tile], "phases": kernel.n_phases}
        for op in kernel.ops:
            if op.opcode == "matmul":
                out["k"] = op.attr("k")
        return out
    fields = {}
    for name in ("rows", "row_size", "tokens", "space", "free_tile"):
        if hasattr(kernel, name):
            v = getattr(kernel, name)
            fields[name] = list(v) if isinstance(v, tuple) else v
    if hasattr(kernel, "copies"):
        fields["copies"] = len(kernel.copies)
    return fields


def graph_report(index: int, stats: dict[str, Any], streams: dict[int, list[Counter[Any]]] | None,
                 target: str) -> GraphReport:
    """One graph from its compiled_graphs() entry; ``streams``: per kernel index, traced streams per call."""
    from neuron_compile.costmodel import estimate, total
    from neuron_compile.instruction_stream import kernel_stream
    from neuron_compile.roofline import Roofline, graph_roofline, kernel_roofline

    plan = stats["plan"]
    if not plan.kernels:
        raise ValueError("explain needs the kernel IR; this graph came from the cache (compile with cache=False)")
    reasons = {k["name"]: k.get("reason", "") for k in plan.summary.get("kernels", [])}
    calls = Counter(c.kernel for c in plan.calls)
    kernels = []
    for i, k in enumerate(plan.kernels):
        traced = bool(streams and streams.get(i))
        if traced:
            est = total([estimate(s, target) for s in streams[i]], target)  # type: ignore[index]
        else:
            one = estimate(kernel_stream(k), target)
            est = total([one] * max(calls[i], 1), target)
        roof = kernel_roofline(k, target)
        n = max(calls[i], 1)
        if n > 1:
            roof = Roofline(roof.pe_flops * n, roof.pe_dtype, roof.elementwise_flops * n, roof.elementwise_dtype,
                            roof.min_bytes * n, target)
        kernels.append(KernelReport(k.name, k.family, f"{k.family}.nki.j2", list(k.source_ops), tile_config(k),
                                    calls[i], est, roof, reasons.get(k.name, ""), traced))
    return GraphReport(index, stats.get("kind", "?"), kernels, total([k.estimate for k in kernels], target),
                       graph_roofline(plan, target))


def _split_trace(tr: Any, graphs: list[dict[str, Any]]) -> list[dict[int, list[Counter[Any]]] | None]:
    """Assign traced kernel runs to (graph, kernel) by matching each graph's call sequence in order."""
    runs = tr.by_kernel()
    out: list[dict[int, list[Counter[Any]]] | None] = []
    pos = 0
    for g in graphs:
        plan = g["plan"]
        names = [plan.kernels[c.kernel].name for c in plan.calls] if plan.kernels else []
        start = next((s for s in range(pos, len(runs) - len(names) + 1)
                      if [n for n, _ in runs[s:s + len(names)]] == names), None) if names else None
        if start is not None:
            per: dict[int, list[Counter[Any]]] = {}
            for c, (_, recs) in zip(plan.calls, runs[start:start + len(names)], strict=True):
                per.setdefault(c.kernel, []).append(Counter(recs))
            out.append(per)
            pos = start + len(names)
        else:
            log.info("explain: graph %d's kernels not found in order in the trace; using analytic streams",
                     len(out))
            out.append(None)
    return out


def report_graphs(graphs: list[dict[str, Any]], tr: Any | None, target: str,
                  collective_graphs: Sequence[Any] = ()) -> Report:
    split = _split_trace(tr, graphs) if tr is not None else [None] * len(graphs)
    rep = Report(target)
    for i, (g, s) in enumerate(zip(graphs, split, strict=True)):
        rep.graphs.append(graph_report(i, g, s, target))
    if collective_graphs:
        from neuron_compile.comm_cost import graph_overlap

        for cg in collective_graphs:
            try:
                rep.collectives.append(graph_overlap(cg, target))
            except ValueError as exc:  # a target without documented interconnect figures
                rep.collectives.append({"kind": cg.kind, "error": str(exc)})
    return rep


def explain(model_or_fn: Any, *example_inputs: Any, target: str | None = None, **compile_kwargs: Any) -> Report:
    """Compile ``model_or_fn`` with the neuron backend, run it once traced, and report per graph/kernel."""
    import torch

    from neuron_compile import backend
    from neuron_compile.collective_runner import collective_graphs
    from neuron_compile.config import config
    from neuron_compile.simulator import trace

    tgt = target or config.target
    compile_kwargs.setdefault("dynamic", False)
    first = len(backend.compiled_graphs())
    first_collective = len(collective_graphs())
    with config.patch(cache=False, target=tgt):
        compiled = torch.compile(model_or_fn, backend="neuron", **compile_kwargs)
        with trace() as tr, torch.no_grad():
            compiled(*example_inputs)
    graphs = backend.compiled_graphs()[first:]
    if not graphs:
        raise RuntimeError("explain: no graph was compiled by the neuron backend (was this function already "
                           "compiled in this process? call torch._dynamo.reset() first)")
    return report_graphs(graphs, tr, tgt, collective_graphs()[first_collective:])


# -- CLI ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", help="a Python script that calls torch.compile(..., backend='neuron')")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--target", default=None, help="trn1 | trn2 | trn3 (default: config.target)")


def run(args: argparse.Namespace) -> int:
    from neuron_compile import backend
    from neuron_compile.collective_runner import collective_graphs
    from neuron_compile.config import config
    from neuron_compile.simulator import trace

    script_args = list(args.script_args)
    as_json = args.json
    if "--json" in script_args:  # REMAINDER swallows flags given after the script
        script_args.remove("--json")
        as_json = True
    tgt = args.target or config.target
    first = len(backend.compiled_graphs())
    first_collective = len(collective_graphs())
    argv = sys.argv
    sys.argv = [args.script, *script_args]
    try:
        # with --json, stdout carries only the report: the script's own prints go to stderr (as in ``check``)
        quiet = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
        with config.patch(cache=False, target=tgt), trace() as tr, quiet:
            try:
                runpy.run_path(args.script, run_name="__main__")
            except SystemExit as exc:  # a script ending with sys.exit(main()) still gets its report
                if exc.code not in (None, 0):
                    print(f"neuron-compile explain: {args.script} exited with {exc.code}", file=sys.stderr)
    except FileNotFoundError as exc:
        print(f"neuron-compile explain: {exc}", file=sys.stderr)
        return 1
    finally:
        sys.argv = argv
    graphs = backend.compiled_graphs()[first:]
    if not graphs:
        print(f"neuron-compile explain: {args.script} compiled no graph with backend='neuron'", file=sys.stderr)
        return 1
    report = report_graphs(graphs, tr, tgt, collective_graphs()[first_collective:])
    print(json.dumps(report.to_json(), indent=1) if as_json else str(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neuron-compile explain")
    add_arguments(parser)
    return run(parser.parse_args(argv))


class _CallableModule(types.ModuleType):
    """``import neuron_compile.explain`` rebinds the package attribute ``explain`` to this module; calling
    the module keeps ``neuron_compile.explain(model, *inputs)`` working either way."""

    def __call__(self, model_or_fn: Any, *example_inputs: Any, **kwargs: Any) -> Report:
        return explain(model_or_fn, *example_inputs, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
