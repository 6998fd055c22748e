"""Opt-in eager fallback: run the ATen ops the backend cannot lower in PyTorch, between kernels.

With ``options={"fallback": "eager"}`` (or ``NEURON_COMPILE_FALLBACK=eager``) an ATen graph holding
unsupported ops is split into *segments* in graph order: maximal runs of lowerable nodes, each
extracted into its own ATen graph and compiled through the normal path
(:func:`neuron_compile.backend.compile_aten_graph`), and single unsupported nodes, which run their
ATen op on real tensors. A :class:`FallbackRunner` executes the segments in order.

Every fallen-back op is recorded (ATen name, count, shapes/dtypes, user source lines) for
:func:`get_fallback_ops`; :func:`clear_fallback_ops` resets. The default (``strict``) refuses such
graphs with :class:`~neuron_compile.errors.UnsupportedOpError`.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

log = logging.getLogger(__name__)


@dataclass
class Segment:
    """A run of nodes: compiled (lowerable) or one eager op (with its getitem users)."""

    nodes: list[fx.Node]
    eager: bool
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    gm: fx.GraphModule | None = None
    runner: Callable[..., Any] | None = None


@dataclass
class _OpStats:
    op: str
    count: int = 0
    calls: int = 0
    signatures: dict[str, None] = field(default_factory=dict)
    locations: dict[str, None] = field(default_factory=dict)
    reasons: dict[str, None] = field(default_factory=dict)
    graphs: dict[str, None] = field(default_factory=dict)


_OPS: dict[str, _OpStats] = {}
_LOCK = threading.Lock()


def get_fallback_ops() -> list[dict[str, Any]]:
    """Every op that fell back to eager: name, node count, calls run, shapes/dtypes, source lines, reasons."""
    with _LOCK:
        return [{"op": s.op, "count": s.count, "calls": s.calls, "signatures": list(s.signatures),
                 "locations": list(s.locations), "reasons": list(s.reasons), "graphs": list(s.graphs)}
                for s in sorted(_OPS.values(), key=lambda s: s.op)]


def clear_fallback_ops() -> None:
    with _LOCK:
        _OPS.clear()


def _needs_eager(node: fx.Node, eager: set[fx.Node]) -> str | None:
    """Why ``node`` must run eagerly (None when it lowers)."""
    from neuron_compile.lowering.registry import unsupported_reason
    from neuron_compile.pipeline import _SUPPORTED_INPUT_DTYPES

    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return "getitem of an eager op" if node.args[0] in eager else None
    for a in node.all_input_nodes:
        val = a.meta.get("val")
        if isinstance(val, torch.Tensor) and (val.dtype not in _SUPPORTED_INPUT_DTYPES or val.is_sparse):
            return f"takes a {val.dtype} tensor"
    reason = unsupported_reason(node)
    if reason is None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype not in _SUPPORTED_INPUT_DTYPES:
            reason = f"produces dtype {val.dtype}"
    return reason


def split(gm: fx.GraphModule) -> tuple[list[Segment], dict[fx.Node, str]]:
    """Segments in graph order and the reason of every eager node."""
    from neuron_compile.lowering.registry import qualified_name

    eager: dict[fx.Node, str] = {}
    segments: list[Segment] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        reason = _needs_eager(node, set(eager))
        is_eager = reason is not None
        log.debug("%s %s: %s", "eager" if is_eager else "lower", node.name,
                  reason if is_eager else qualified_name(node.target))
        if is_eager:
            eager[node] = reason or ""
        if node.target is operator.getitem and is_eager and segments and segments[-1].eager \
                and node.args[0] in segments[-1].nodes:
            segments[-1].nodes.append(node)
        elif is_eager or not segments or segments[-1].eager:
            segments.append(Segment([node], is_eager))
        else:
            segments[-1].nodes.append(node)
    for seg in segments:
        members = set(seg.nodes)
        for node in seg.nodes:
            for a in node.all_input_nodes:
                if a not in members and a not in seg.inputs:
                    seg.inputs.append(a)
            if any(u not in members for u in node.users):
                seg.outputs.append(node)
    return segments, eager


def _extract(seg: Segment) -> fx.GraphModule:
    """The segment as a standalone ATen graph: external values become placeholders, escaping ones outputs."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, node in enumerate(seg.inputs):
        ph = graph.placeholder(f"in{i}_{node.name}")
        ph.meta = dict(node.meta)
        env[node] = ph
    for node in seg.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in seg.outputs))
    return fx.GraphModule(torch.nn.Module(), graph)


class FallbackRunner:
    """Runs compiled segments and eager ops in graph order."""

    def __init__(self, gm: fx.GraphModule, segments: list[Segment]) -> None:
        self.gm = gm
        self.segments = segments
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.fallback_count = sum(1 for s in segments if s.eager for n in s.nodes
                                  if n.target is not operator.getitem)
        self.n_segments = len(segments)

    def __call__(self, *args: Any) -> list[Any]:
        return self.run(args)

    def run(self, args: Sequence[Any], capture: list[tuple[Segment, list[Any]]] | None = None) -> list[Any]:
        """Run the graph; ``capture`` receives (segment, its inputs) for every compiled segment."""
        from neuron_compile.lowering.registry import qualified_name

        env: dict[fx.Node, Any] = dict(zip(self.placeholders, args, strict=True))

        def value(a: Any) -> Any:
            return fx.node.map_arg(a, lambda n: env[n])

        for seg in self.segments:
            if seg.eager:
                for node in seg.nodes:
                    env[node] = node.target(*value(node.args), **value(node.kwargs))
                    if node.target is not operator.getitem:
                        with _LOCK:
                            stats = _OPS.get(qualified_name(node.target))
                            if stats is not None:
                                stats.calls += 1
                continue
            inputs = [env[n] for n in seg.inputs]
            if capture is not None:
                capture.append((seg, inputs))
            assert seg.runner is not None
            for node, out in zip(seg.outputs, seg.runner(*inputs), strict=True):
                env[node] = out
        return list(value(self.output.args[0]))


def describe(node: fx.Node) -> str:
    """Shapes/dtypes of a node's tensor arguments, e.g. ``float32[4, 8], -1``."""
    from neuron_compile.pipeline import describe_inputs

    return describe_inputs(node)


def compile_with_fallback(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> FallbackRunner:
    """Split ``gm`` around its unsupported ops, compile the lowerable segments, record the eager ones."""
    from neuron_compile import compile_record
    from neuron_compile.backend import compile_aten_graph, source_line
    from neuron_compile.lowering.registry import qualified_name

    segments, eager = split(gm)
    rec = compile_record.current()
    graph_name = rec.name if rec is not None else kind
    records = []
    for seg in segments:
        if seg.eager:
            continue
        seg.gm = _extract(seg)
        seg_inputs = [n.meta.get("val") for n in seg.inputs]
        seg.runner = compile_aten_graph(seg.gm, seg_inputs, kind)
    with _LOCK:
        for node, reason in eager.items():
            if node.target is operator.getitem:
                continue
            name = qualified_name(node.target)
            stats = _OPS.setdefault(name, _OpStats(name))
            stats.count += 1
            stats.signatures[describe(node)] = None
            stats.locations[source_line(node)] = None
            stats.reasons[reason] = None
            stats.graphs[graph_name] = None
            records.append({"op": name, "inputs": describe(node), "reason": reason, "location": source_line(node)})
    runner = FallbackRunner(gm, segments)
    if rec is not None:
        rec.fallback_ops = runner.fallback_count
        rec.fallback = records
    log.info("neuron: %s graph: %d op(s) fell back to eager (%s); %d compiled segment(s)", kind,
             runner.fallback_count, ", ".join(sorted({r["op"] for r in records})),
             sum(1 for s in segments if not s.eager))
    return runner


def _register() -> None:
    from neuron_compile.backend import set_partial_compiler

    set_partial_compiler(compile_with_fallback)


_register()
