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
    traced: bool = True  # the simulator ran it (its trace matched the graph's calls)
    tripped: Estimate | None = None  # a guarded kernel (runtime branch) when every guard trips
    worst: Estimate | None = None  # ... with an earlier check (attention's first unit): when only the final one trips
    timelines: list[Any] = field(default_factory=list)  # per program: (queue, start, end, instruction, line)
    source: list[str] = field(default_factory=list)  # the rendered kernel's lines (trace labels)

    @property
    def efficiency(self) -> float:
        return self.roofline.time_ns / self.estimate.time_ns if self.estimate.time_ns else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "template": self.template, "ops": self.source_ops,
                "tiles": self.tiles, "calls": self.calls, "flops": self.roofline.flops,
                "hbm_bytes": self.estimate.hbm_bytes, "min_hbm_bytes": self.roofline.min_bytes,
                "estimated_ns": self.estimate.time_ns, "first_order_ns": self.estimate.first_order_ns,
                "roofline_ns": self.roofline.time_ns, "efficiency": self.efficiency,
                "bottleneck": self.estimate.bottleneck, "occupancy": self.estimate.occupancy(),
                "bound": self.roofline.bound, "reason": self.reason, "traced": self.traced,
                "tripped_ns": self.tripped.time_ns if self.tripped else None,
                "worst_ns": self.worst.time_ns if self.worst else None, "estimate": self.estimate.to_json(),
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
        lines = [f"neuron-compile explain (target {self.target}; est = the scheduling cost model, 1st = the old "
                 f"first-order figure; docs/cost_model.md)"]
        for g in self.graphs:
            lines.append(f"graph {g.index} ({g.kind}): {len(g.kernels)} kernels, est {_us(g.estimate.time_ns)} "
                         f"(1st-order {_us(g.estimate.first_order_ns)}), roofline {_us(g.roofline.time_ns)} "
                         f"({g.roofline.bound}), efficiency {g.efficiency:.1%}, HBM {_mb(g.estimate.hbm_bytes)} / min "
                         f"{_mb(g.roofline.min_bytes)}")
            lines.append(f"  {'kernel':<28} {'template':<18} {'tiles':<34} {'MFLOP':>9} {'HBM MB':>9} "
                         f"{'min MB':>8} {'est us':>9} {'1st us':>9} {'roof us':>9} {'eff':>6} {'busiest':<16}")
            for k in g.kernels:
                occ = k.estimate.occupancy()
                top = max(occ, key=lambda e: occ[e]) if occ else "-"
                lines.append(f"  {k.name[:28]:<28} {k.template:<18} {_tiles(k.tiles)[:34]:<34} "
                             f"{k.roofline.flops / 1e6:>9.2f} {k.estimate.hbm_bytes / 1e6:>9.3f} "
                             f"{k.roofline.min_bytes / 1e6:>8.3f} {k.estimate.time_ns / 1e3:>9.2f} "
                             f"{k.estimate.first_order_ns / 1e3:>9.2f} {k.roofline.time_ns / 1e3:>9.2f} "
                             f"{k.efficiency:>6.1%} {top + f' {occ.get(top, 0):.0%}':<16}")
                lines.append(f"      ops: {', '.join(dict.fromkeys(k.source_ops)) or '-'}")
                lines.append("      occupancy: " + " ".join(f"{e} {v:.0%}" for e, v in occ.items()))
                if k.tripped is not None:
                    lines.append(f"      guarded: {_us(k.tripped.time_ns)} if every runtime guard trips "
                                 f"(efficiency {k.roofline.time_ns / k.tripped.time_ns:.1%})"
                                 + (f"; {_us(k.worst.time_ns)} if only the final one does (efficiency "
                                    f"{k.roofline.time_ns / k.worst.time_ns:.1%})" if k.worst is not None else ""))
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

    def trace_events(self) -> dict[str, Any]:
        """The scheduled engine timelines as Chrome trace-event JSON (Perfetto, chrome://tracing): one process per
        kernel call, one track per engine / DMA queue (per core of a launch grid), each instruction labelled with
        its kernel source line; calls one after the other."""
        events: list[dict[str, Any]] = []
        t0 = 0.0
        pid = 0
        for g in self.graphs:
            for k in g.kernels:
                for _ in range(max(k.calls, 1)):
                    pid += 1
                    events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                   "args": {"name": f"graph {g.index} {k.name}"}})
                    tids: dict[str, int] = {}
                    for core, tl in enumerate(k.timelines):
                        for queue, start, end, instr, line in tl:
                            track = f"core{core} {queue}" if len(k.timelines) > 1 else queue
                            if track not in tids:
                                tids[track] = len(tids) + 1
                                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[track],
                                               "args": {"name": track}})
                            text = k.source[line - 1].strip() if 0 < line <= len(k.source) else ""
                            events.append({"ph": "X", "name": f"{instr} L{line}", "cat": queue, "pid": pid,
                                           "tid": tids[track], "ts": (t0 + start) / 1e3, "dur": (end - start) / 1e3,
                                           "args": {"line": line, "source": text}})
                    t0 += k.estimate.time_ns / max(k.calls, 1)
        return {"traceEvents": events, "displayTimeUnit": "ns",
                "otherData": {"target": self.target, "generator": "neuron-compile explain --trace"}}


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


def guarded_streams(kernels: Sequence[Any], streams: Sequence[Any], target: str | None = None
                    ) -> dict[int, tuple[Any, Any]]:
    """Per kernel with a runtime guard (a ``register_load`` in its stream ``streams[i]``: attention's checked
    softmax), its stream when every check trips (``loaded_flag=1``) and, when it checks more than once (the first
    unit on its own), when only the final check trips (every earlier one passes); None without an earlier check."""
    from neuron_compile.instruction_stream import kernel_streams

    checked = [i for i, s in enumerate(streams) if any(r.instruction == "register_load" for r in s)]
    trips = kernel_streams([kernels[i] for i in checked], loaded_flag=1, target=target)
    out: dict[int, tuple[Any, Any]] = {i: (t, None) for i, t in zip(checked, trips, strict=True)}
    by_loads: dict[int, list[int]] = {}  # checks per program -> kernels (identical ones are streamed once)
    for i in checked:
        loads = sum(n for r, n in streams[i].items() if r.instruction == "register_load")
        loads //= max(len(streams[i].schedules), 1)
        if loads > 1:
            by_loads.setdefault(loads, []).append(i)
    for loads, idx in by_loads.items():
        lasts = kernel_streams([kernels[i] for i in idx], loaded_flag=(0,) * (loads - 1) + (1,), target=target)
        for i, last in zip(idx, lasts, strict=True):
            out[i] = (out[i][0], last)
    return out


def graph_report(index: int, stats: dict[str, Any], streams: dict[int, list[Counter[Any]]] | None,
                 target: str, timeline: bool = False) -> GraphReport:
    """One graph from its compiled_graphs() entry; ``streams``: per kernel index, traced streams per call (only
    recorded as ``traced``: estimates come from the scheduled analytic stream of each kernel, which the perf tests
    check against the simulator trace record for record)."""
    from neuron_compile.codegen.render import render_kernel
    from neuron_compile.costmodel import estimate, total
    from neuron_compile.instruction_stream import kernel_streams
    from neuron_compile.roofline import graph_roofline, kernel_roofline

    plan = stats["plan"]
    if not plan.kernels:
        raise ValueError("explain needs the kernel IR; this graph came from the cache (compile with cache=False)")
    reasons = {k["name"]: k.get("reason", "") for k in plan.summary.get("kernels", [])}
    calls = Counter(c.kernel for c in plan.calls)
    kernels = []
    cores = 1
    analytic = kernel_streams(plan.kernels, target=target, timeline=timeline)  # identical layers costed once
    guards = guarded_streams(plan.kernels, analytic, target)
    for i, k in enumerate(plan.kernels):
        traced = bool(streams and streams.get(i))
        stream = analytic[i]
        one = estimate(stream, target)
        n = max(calls[i], 1)
        est = total([one] * n, target)
        tripped = worst = None
        if i in guards:
            trip, last = guards[i]
            tripped = total([estimate(trip, target)] * n, target)
            worst = total([estimate(last, target)] * n, target) if last is not None else None
        grid = max(len(stream.schedules), 1)
        cores = max(cores, grid)
        roof = kernel_roofline(k, target, grid).scaled(n)
        kernels.append(KernelReport(k.name, k.family, f"{k.family}.nki.j2", list(k.source_ops), tile_config(k),
                                    calls[i], est, roof, reasons.get(k.name, ""), traced, tripped, worst,
                                    [s.timeline for s in stream.schedules if s.timeline is not None],
                                    render_kernel(k).splitlines() if timeline else []))
    return GraphReport(index, stats.get("kind", "?"), kernels, total([k.estimate for k in kernels], target),
                       graph_roofline(plan, target, cores))


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


def report_graphs(graphs: list[dict[str, Any]], tr: Any | None, target: str, timeline: bool = False,
                  collective_graphs: Sequence[Any] = ()) -> Report:
    split = _split_trace(tr, graphs) if tr is not None else [None] * len(graphs)
    rep = Report(target)
    for i, (g, s) in enumerate(zip(graphs, split, strict=True)):
        rep.graphs.append(graph_report(i, g, s, target, timeline))
    if collective_graphs:
        from neuron_compile.comm_cost import graph_overlap

        for cg in collective_graphs:
            try:
                rep.collectives.append(graph_overlap(cg, target))
            except ValueError as exc:  # a target without documented interconnect figures
                rep.collectives.append({"kind": cg.kind, "error": str(exc)})
    return rep


def explain(model_or_fn: Any, *example_inputs: Any, target: str | None = None, timeline: bool = False,
            **compile_kwargs: Any) -> Report:
    """Compile ``model_or_fn`` with the neuron backend, run it once traced, and report per graph/kernel
    (``timeline``: keep every kernel's scheduled timeline, for :meth:`Report.trace_events`)."""
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
    return report_graphs(graphs, tr, tgt, timeline, collective_graphs()[first_collective:])


# -- CLI ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", help="a Python script that calls torch.compile(..., backend='neuron')")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    from neuron_compile.config import TARGETS

    parser.add_argument("--target", default=None, choices=TARGETS,
                        help=f"{' | '.join(TARGETS)} (default: config.target)")
    parser.add_argument("--trace", default=None, metavar="OUT.json",
                        help="write the scheduled engine timeline as Chrome trace-event JSON (Perfetto, chrome://tracing)")


def run(args: argparse.Namespace) -> int:
    from neuron_compile import backend
    from neuron_compile.collective_runner import collective_graphs
    from neuron_compile.config import config
    from neuron_compile.errors import ConfigError
    from neuron_compile.simulator import trace

    script_args = list(args.script_args)
    as_json = args.json
    if "--json" in script_args:  # REMAINDER swallows flags given after the script
        script_args.remove("--json")
        as_json = True
    trace_path = args.trace
    if "--trace" in script_args:
        at = script_args.index("--trace")
        if at + 1 >= len(script_args):
            print("neuron-compile explain: --trace needs a file name (--trace out.json)", file=sys.stderr)
            return 2
        trace_path = script_args[at + 1]
        del script_args[at:at + 2]
    try:
        tgt = args.target or config.target
    except ConfigError as exc:  # NEURON_COMPILE_TARGET=bogus
        print(f"neuron-compile explain: error: {exc}", file=sys.stderr)
        return 2
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
    report = report_graphs(graphs, tr, tgt, timeline=trace_path is not None,
                           collective_graphs=collective_graphs()[first_collective:])
    if trace_path is not None:
        try:
            with open(trace_path, "w") as f:
                json.dump(report.trace_events(), f)
        except OSError as exc:
            print(f"neuron-compile explain: cannot write the trace to {trace_path}: {exc}", file=sys.stderr)
            return 1
        print(f"neuron-compile explain: wrote the scheduled timeline to {trace_path}", file=sys.stderr)
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
