"""The record the compile pipeline emits for each graph: what it cost and produced, and the hooks tools attach to.

The backend opens one :class:`GraphRecord` per ATen graph it compiles (:func:`graph`; a graph split
for eager fallback compiles its segments inside the same record), times the phases of the
pipeline with :func:`phase` (trace/AOT, lowering, codegen, cache lookup, load; nested phases are
exclusive, so a cache lookup that compiles does not count the compile twice) and hands the finished
runner to :func:`finish`, which fills in kernels and cache status, then passes the record and runner to
every hook registered with :func:`add_finish_hook`. This module is part of the core: the evaluation
tools above it (the debug dumps of :mod:`neuron_compile.debug`, the check mode of
:mod:`neuron_compile.check`) register hooks here; the core never imports them.

:func:`get_compile_metrics` returns one JSON-able dict per compiled graph; :func:`reset` clears them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from neuron_compile.config import config
from neuron_compile.errors import source_line

log = logging.getLogger(__name__)

PHASES = ("trace_aot", "lowering", "codegen", "cache_lookup", "load")


@dataclass
class Unit:
    """One lowered (sub)graph inside a record: the whole graph, or one segment of a fallback graph."""

    gm: fx.GraphModule
    example_inputs: list[Any]
    stats: dict[str, Any]


@dataclass
class GraphRecord:
    index: int
    kind: str
    compile_id: str
    location: str
    nodes: int
    input_shapes: list[list[int]]
    input_dtypes: list[str] = field(default_factory=list)
    dynamo_gm: fx.GraphModule | None = None
    times_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    total_ms: float = 0.0
    kernels: int = 0
    cache: str = "off"
    fallback_ops: int = 0
    fallback: list[dict[str, Any]] = field(default_factory=list)
    segments: int = 1
    est_device_us: float | None = None
    check: dict[str, Any] | None = None
    units: list[Unit] = field(default_factory=list)
    debug_dir: str | None = None
    whole_graph: bool = False
    _start: float = 0.0
    _depth: int = 0
    _estimated: bool = False

    @property
    def name(self) -> str:
        return f"g{self.index}_{self.kind}"

    def add_unit(self, gm: fx.GraphModule, example_inputs: Sequence[Any], stats: dict[str, Any]) -> None:
        self.units.append(Unit(gm, list(example_inputs), stats))

    def device_estimate(self) -> float | None:
        """Estimated device time (us) of one run, computed on first use (tracing kernels costs time)."""
        if self.est_device_us is None and not self._estimated:
            self._estimated = True
            self.est_device_us = estimate_device_us(self)
        return self.est_device_us

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "index": self.index, "kind": self.kind, "compile_id": self.compile_id,
            "location": self.location, "nodes": self.nodes, "input_shapes": self.input_shapes,
            "input_dtypes": self.input_dtypes,
            "kernels": self.kernels, "fallback_ops": self.fallback_ops, "fallback": self.fallback,
            "segments": self.segments, "cache": self.cache,
            "times_ms": {k: round(v, 3) for k, v in self.times_ms.items()}, "total_ms": round(self.total_ms, 3),
            "est_device_us": self.device_estimate(), "check": self.check, "debug_dir": self.debug_dir,
            "whole_graph": self.whole_graph,
        }


FinishHook = Callable[[GraphRecord, fx.GraphModule, Callable[..., Any]], Callable[..., Any]]

_RECORDS: list[GraphRecord] = []
_FINISH_HOOKS: dict[str, FinishHook] = {}
_LOCK = threading.Lock()
_local = threading.local()


def _state() -> threading.local:
    if not hasattr(_local, "stack"):
        _local.stack = []  # open records (a fallback graph's segments nest in their graph's record)
        _local.phases = []  # open phases: [name, start, child time]
        _local.dynamo = None  # (start, dynamo gm, compile id) of the Dynamo graph being compiled
    return _local


def records() -> list[GraphRecord]:
    with _LOCK:
        return list(_RECORDS)


def reset() -> None:
    with _LOCK:
        _RECORDS.clear()


def add_finish_hook(name: str, hook: FinishHook) -> None:
    """Run ``hook(record, gm, runner) -> runner`` on every finished top-level graph, in registration order; the
    runner it returns replaces the graph's runner (the check mode wraps it). Registering a name again replaces it."""
    _FINISH_HOOKS[name] = hook


def current_compile_id() -> str:
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        return str(cid) if cid is not None else "-"
    except Exception:  # torch internals moved: the id is informative only
        return "-"


def dynamo_graph(gm: fx.GraphModule, compile_id: str | None = None) -> None:
    """Called at the backend's entry with the Dynamo graph: starts the trace/AOT clock. A per-shape compile of a
    graph Dynamo made symbolic passes the compile id of that graph (it runs outside Dynamo's compile context)."""
    _state().dynamo = (time.perf_counter(), gm, compile_id or current_compile_id())


def _location(gm: fx.GraphModule) -> str:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.meta.get("stack_trace"):
            line = source_line(node)
            return line.split(": ", 1)[0]
    return "<unknown>"


@contextlib.contextmanager
def graph(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Iterator[GraphRecord]:
    """The record of the ATen graph being compiled (the enclosing one for a fallback segment)."""
    st = _state()
    if st.stack:
        rec = st.stack[-1]
        rec._depth += 1
        try:
            yield rec
        finally:
            rec._depth -= 1
        return
    now = time.perf_counter()
    dyn = st.dynamo
    with _LOCK:
        index = len(_RECORDS)
    rec = GraphRecord(
        index=index, kind=kind, compile_id=dyn[2] if dyn else current_compile_id(),
        location=_location(dyn[1] if dyn else gm),
        nodes=sum(1 for n in gm.graph.nodes if n.op == "call_function"),
        input_shapes=[list(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)],
        input_dtypes=[str(x.dtype).replace("torch.", "") for x in example_inputs if isinstance(x, torch.Tensor)],
        dynamo_gm=dyn[1] if dyn else None, _start=now)
    if dyn is not None:
        rec.times_ms["trace_aot"] = (now - dyn[0]) * 1000
        st.dynamo = None  # a backward graph compiled later was traced with its forward
    st.stack.append(rec)
    try:
        yield rec
    finally:
        st.stack.pop()
        rec.total_ms = (time.perf_counter() - now) * 1000 + rec.times_ms["trace_aot"]
        with _LOCK:
            _RECORDS.append(rec)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time a pipeline phase into the open record; time spent in nested phases is not counted twice."""
    st = _state()
    if not st.stack:
        yield
        return
    entry = [name, time.perf_counter(), 0.0]
    st.phases.append(entry)
    try:
        yield
    finally:
        st.phases.pop()
        elapsed = time.perf_counter() - entry[1]
        rec = st.stack[-1]
        rec.times_ms[name] = rec.times_ms.get(name, 0.0) + (elapsed - entry[2]) * 1000
        if st.phases:
            st.phases[-1][2] += elapsed


def current() -> GraphRecord | None:
    st = _state()
    return st.stack[-1] if st.stack else None


def finish(rec: GraphRecord, gm: fx.GraphModule, runner: Callable[..., Any]) -> Callable[..., Any]:
    """Complete a top-level record (kernels, cache status) and run the finish hooks (debug dump, check mode)."""
    if rec._depth > 0:
        return runner
    rec.kernels = sum(int(u.stats.get("kernels", 0)) for u in rec.units)
    hits = [bool(u.stats.get("cache_hit")) for u in rec.units]
    from neuron_compile.cache.store import cache_enabled

    if not cache_enabled():
        rec.cache = "off"
    elif hits and all(hits):
        rec.cache = "hit"
    elif any(hits):
        rec.cache = "partial"
    else:
        rec.cache = "miss"
    rec.segments = max(len(rec.units), 1) if not rec.fallback_ops else getattr(runner, "n_segments", 1)
    for hook in list(_FINISH_HOOKS.values()):
        runner = hook(rec, gm, runner)
    return runner


def record_whole_graph(stats: dict[str, Any], gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """A whole inference graph taken from the cache (no AOT, no lowering): a record of its own."""
    with graph(gm, example_inputs, stats.get("kind", "inference")) as rec:
        rec.whole_graph = True
        rec.times_ms["load"] = float(stats.get("ms", 0.0))
        rec.kernels = int(stats.get("kernels", 0))
        rec.cache = "hit"
        rec.add_unit(gm, example_inputs, stats)  # estimated lazily, like every other record


def estimate_device_us(rec: GraphRecord) -> float | None:
    """Sum of the cost model's estimates over the record's plans (None without a cost model)."""
    total = 0.0
    for u in rec.units:
        us = estimate_stats_us(u.stats)
        if us is None:
            return None
        total += us
    return round(total, 3) if rec.units else None


def estimate_stats_us(stats: dict[str, Any]) -> float | None:
    """Device time of one compiled graph (every kernel call, in order) from ``neuron_compile.costmodel``.

    Each call's rendered kernel is traced into an instruction stream for its argument sizes and
    costed; None when the cost model is not installed or cannot cost a kernel (informative only).
    """
    plan, sources = stats.get("plan"), stats.get("sources")
    if plan is None or not sources:
        return None
    try:
        from neuron_compile import costmodel
        from neuron_compile.instruction_stream import source_stream
    except ImportError:
        return None
    names = [name for name, _ in sources]
    by_name = dict(sources)
    total_ns = 0.0
    try:
        for call in plan.calls:
            name = names[call.kernel]
            args = [(plan.buffers[b].numel, plan.buffers[b].dtype) for b in call.args]
            total_ns += costmodel.estimate(source_stream(by_name[name], name, args), config.target).time_ns
    except Exception as exc:  # the estimate is informative: never fail a compile or a report for it
        log.debug("cost model could not estimate a graph: %s", exc)
        return None
    return total_ns / 1000
