"""Run an ATen graph that holds collectives: kernel segments and collectives, overlapped.

A graph with ``_c10d_functional`` collectives (see :mod:`neuron_compile.lowering.ops.collectives`) is
handled in three steps:

1. **Schedule** (:func:`schedule`): a topological order of the graph's nodes that issues each
   collective as soon as its input exists and waits for it as late as possible (just before the first
   node that reads its result), so that compute not depending on it runs while it is in flight.
   Collectives keep their relative order from the graph: every rank issues them in the same order,
   which the process group needs to match them up.
2. **Cut** (:func:`cut`): the ordered nodes become :class:`Step` s: maximal runs of compute between two
   collective boundaries are compiled like any ATen graph (NKI kernels, cache, eager fallback when
   enabled); runs made only of views stay torch views; each collective is an ``issue`` step and each
   ``wait_tensor`` a ``wait`` step.
3. **Run** (:class:`CollectiveGraphRunner`): steps in order; an ``issue`` starts the collective with
   ``torch.distributed`` (``async_op=True``) on the user's process group and returns at once, the
   matching ``wait`` blocks on its ``Work``. Every collective still in flight is waited for before the
   graph returns (a later graph cannot find our ``Work`` handles).

Per call the runner records a timeline (seconds spent in compute steps, in waits, and per collective
from issue to completion) in :attr:`CollectiveGraphRunner.last_timeline`; :func:`collective_graphs`
lists every such graph compiled in this process (its steps, collectives and the compiled segments'
stats) for ``explain`` and :mod:`neuron_compile.comm_cost`.
"""

from __future__ import annotations

import heapq
import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from neuron_compile.config import config

log = logging.getLogger(__name__)

_c10d = torch.ops._c10d_functional


@dataclass
class Step:
    """One step of a collective graph: ``compute`` (compiled kernels), ``views`` (torch views run as they
    are), ``issue`` (start a collective) or ``wait`` (block until a collective finished)."""

    kind: str
    nodes: list[fx.Node]
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    runner: Callable[..., Any] | None = None
    spec: Any = None  # CollectiveSpec of an issue step
    stats: list[dict[str, Any]] = field(default_factory=list)  # compiled graphs of a compute step

    def describe(self) -> str:
        if self.kind == "issue":
            return f"issue {self.nodes[0].name}" + (f": {self.spec.describe()}" if self.spec is not None else "")
        if self.kind == "wait":
            return f"wait {self.nodes[0].name}"
        kernels = sum(int(s.get("kernels", 0)) for s in self.stats)
        return f"{self.kind} [{len(self.nodes)} nodes, {kernels} kernels]"


@dataclass
class CollectiveGraph:
    """What :func:`collective_graphs` reports for one compiled graph with collectives."""

    kind: str
    steps: list[Step]
    runner: CollectiveGraphRunner | None = None

    @property
    def collectives(self) -> list[Any]:
        return [s.spec for s in self.steps if s.kind == "issue"]

    @property
    def segments(self) -> int:
        return sum(1 for s in self.steps if s.kind == "compute")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "segments": self.segments, "collectives": len(self.collectives),
                "steps": [s.describe() for s in self.steps],
                "timeline": self.runner.last_timeline if self.runner is not None else None}


_GRAPHS: list[CollectiveGraph] = []
_LOCK = threading.Lock()


def collective_graphs() -> list[CollectiveGraph]:
    """Every graph with collectives compiled in this process, in compile order."""
    with _LOCK:
        return list(_GRAPHS)


def clear_collective_graphs() -> None:
    with _LOCK:
        _GRAPHS.clear()


# ----------------------------------------------------------------------------------------- classify

def _rule(node: fx.Node) -> Any:
    from neuron_compile.lowering.registry import lookup

    return lookup(node.target) if node.op == "call_function" else None


def is_collective(node: fx.Node) -> bool:
    """A collective (or wait) the runner executes itself: registered and not refused by its check."""
    rule = _rule(node)
    return rule is not None and rule.kind == "collective" and (rule.check is None or rule.check(node) is None)


def _role(node: fx.Node) -> str:
    """issue | wait | compute for one call_function node."""
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and _role(node.args[0]) == "issue":
        return "issue"  # one output of a coalesced collective: taken when it is issued
    if not is_collective(node):
        return "compute"
    return "wait" if node.target is _c10d.wait_tensor.default else "issue"


def has_collectives(gm: fx.GraphModule) -> bool:
    """Does the graph hold a collective the runner executes (``_c10d_functional`` with a lowering rule)?"""
    return any(n.op == "call_function" and is_collective(n) for n in gm.graph.nodes)


def _opaque(val: Any) -> bool:
    return val is not None and not isinstance(val, (torch.Tensor, int, float, bool, torch.SymInt, torch.SymFloat))


def opaque_outputs(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[tuple[int, int]]]:
    """Graph outputs that are opaque inputs passed straight through (DTensor threads a process group's
    script object through AOT graphs): they become ``None`` in the compiled graph and the runner hands
    back the argument itself. Returns the graph and (output position, input position) pairs."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0]
    if not isinstance(results, (list, tuple)):
        return gm, []
    pairs = [(o, phs.index(a)) for o, a in enumerate(results)
             if isinstance(a, fx.Node) and a.op == "placeholder" and _opaque(a.meta.get("val"))]
    if not pairs:
        return gm, []
    moved = {o for o, _ in pairs}
    out.args = (type(results)(None if o in moved else a for o, a in enumerate(results)),)
    gm.recompile()
    return gm, pairs


# ----------------------------------------------------------------------------------------- schedule

def schedule(gm: fx.GraphModule) -> list[fx.Node]:
    """The call_function nodes in an order that issues collectives early and waits late.

    List scheduling over the data dependencies: among ready nodes, a collective issue goes first, then
    compute in graph order; a wait is taken only when nothing else is ready. Issues also depend on the
    previous issue, so collectives keep the graph's order (all ranks must issue them identically).
    """
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    index = {n: i for i, n in enumerate(nodes)}
    role = {n: _role(n) for n in nodes}
    deps: dict[fx.Node, set[fx.Node]] = {n: {a for a in n.all_input_nodes if a in index} for n in nodes}
    previous_issue = None
    for n in nodes:
        if role[n] == "issue" and n.target is not operator.getitem:
            if previous_issue is not None:
                deps[n].add(previous_issue)
            previous_issue = n
    users: dict[fx.Node, list[fx.Node]] = {n: [] for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    waiting = {n: len(ds) for n, ds in deps.items()}
    rank = {"issue": 0, "compute": 1, "wait": 2}
    ready = [(rank[role[n]], index[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        _, _, n = heapq.heappop(ready)
        order.append(n)
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (rank[role[u]], index[u], u))
    assert len(order) == len(nodes), "the graph has a cycle"
    return order


def cut(gm: fx.GraphModule, order: Sequence[fx.Node] | None = None) -> list[Step]:
    """The scheduled nodes as steps; compute runs are split off at every issue/wait."""
    from neuron_compile.lowering.registry import lookup

    order = list(order if order is not None else schedule(gm))
    steps: list[Step] = []
    issued: dict[fx.Node, Step] = {}
    for n in order:
        role = _role(n)
        if role == "issue" and n.target is operator.getitem:
            issued[n.args[0]].nodes.append(n)  # one output of a coalesced collective: part of its issue
        elif role in ("issue", "wait"):
            steps.append(Step(role, [n]))
            issued[n] = steps[-1]
        elif steps and steps[-1].kind == "compute":
            steps[-1].nodes.append(n)
        else:
            steps.append(Step("compute", [n]))
    for step in steps:
        members = set(step.nodes)
        for n in step.nodes:
            for a in n.all_input_nodes:
                if a not in members and a not in step.inputs:
                    step.inputs.append(a)
            if any(u not in members for u in n.users):
                step.outputs.append(n)
        if step.kind == "compute" and all(
                (r := lookup(n.target)) is not None and r.kind in ("view", "alias") for n in step.nodes):
            step.kind = "views"  # free on the host: run the torch views themselves
    return steps


def _extract(step: Step) -> fx.GraphModule:
    """A compute step as its own ATen graph: outside values become placeholders, escaping ones outputs."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, node in enumerate(step.inputs):
        ph = graph.placeholder(f"in{i}_{node.name}")
        ph.meta = dict(node.meta)
        env[node] = ph
    for node in step.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in step.outputs))
    return fx.GraphModule(torch.nn.Module(), graph)


# ------------------------------------------------------------------------------------------ issue

_REDUCE_OPS = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}
# torch 2.13 renamed the flat-tensor forms (*_single) and deprecated the old names; older builds only have those.
_ALL_GATHER = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
_REDUCE_SCATTER = getattr(torch.distributed, "reduce_scatter_single", None) or torch.distributed.reduce_scatter_tensor


@dataclass
class Pending:
    """A collective in flight: its result tensors (valid once ``works`` finished)."""

    outputs: list[torch.Tensor]
    works: list[Any]
    issued: float
    done: float | None = None

    def wait(self) -> None:
        if self.done is None:
            for w in self.works:
                w.wait()
            self.done = time.perf_counter()


def issue(spec: Any, node: fx.Node, inputs: list[torch.Tensor]) -> Pending:
    """Start ``node``'s collective on the process group it names (``async_op=True``), return at once."""
    import torch.distributed as dist

    from neuron_compile.lowering.ops.collectives import resolve_group

    pg, _ = resolve_group(spec.group_name)
    vals = node.meta.get("val")
    metas = list(vals) if isinstance(vals, (list, tuple)) else [vals]
    outputs: list[torch.Tensor] = []
    works: list[Any] = []
    start = time.perf_counter()
    for x, meta in zip(inputs, metas, strict=True):
        x = x.detach().contiguous()
        if spec.op in ("all_reduce", "broadcast"):
            out = x.clone()
        else:
            out = torch.empty(tuple(meta.shape), dtype=meta.dtype)
        if spec.op == "all_reduce":
            op = getattr(dist.ReduceOp, _REDUCE_OPS[spec.reduce_op.lower()])
            works.append(dist.all_reduce(out, op=op, group=pg, async_op=True))
        elif spec.op == "all_gather":
            works.append(_ALL_GATHER(out, x, group=pg, async_op=True))
        elif spec.op == "reduce_scatter":
            op = getattr(dist.ReduceOp, _REDUCE_OPS[spec.reduce_op.lower()])
            works.append(_REDUCE_SCATTER(out, x, op=op, group=pg, async_op=True))
        elif spec.op == "all_to_all":
            works.append(dist.all_to_all_single(out, x, list(spec.output_splits) or None,
                                                list(spec.input_splits) or None, group=pg, async_op=True))
        elif spec.op == "broadcast":
            works.append(dist.broadcast(out, group_src=spec.src, group=pg, async_op=True))
        else:  # pragma: no cover - every registered collective is handled above
            raise NotImplementedError(spec.op)
        outputs.append(out)
    return Pending(outputs, [w for w in works if w is not None], start)


# ------------------------------------------------------------------------------------------- run

class CollectiveGraphRunner:
    """Runs a graph's steps in order: compiled segments, torch views, collective issues and waits."""

    def __init__(self, gm: fx.GraphModule, steps: list[Step]) -> None:
        self.gm = gm
        self.steps = steps
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.n_segments = sum(1 for s in steps if s.kind == "compute")
        self.n_collectives = sum(1 for s in steps if s.kind == "issue")
        self.last_timeline: dict[str, Any] | None = None

    def __call__(self, *args: Any) -> list[Any]:
        env: dict[fx.Node, Any] = dict(zip(self.placeholders, args, strict=True))
        pending: dict[fx.Node, Pending] = {}
        compute_s = wait_s = 0.0
        start = time.perf_counter()

        def value(a: Any) -> Any:
            return fx.node.map_arg(a, lambda n: env[n])

        try:
            for step in self.steps:
                t0 = time.perf_counter()
                if step.kind == "compute":
                    assert step.runner is not None
                    outs = step.runner(*[env[n] for n in step.inputs])
                    env.update(zip(step.outputs, outs, strict=True))
                    compute_s += time.perf_counter() - t0
                elif step.kind == "views":
                    for n in step.nodes:
                        env[n] = n.target(*value(n.args), **value(n.kwargs))
                elif step.kind == "issue":
                    head = step.nodes[0]
                    arg = head.args[0]
                    tensors = [env[a] for a in arg] if isinstance(arg, (list, tuple)) else [env[arg]]
                    p = issue(step.spec, head, tensors)
                    pending[head] = p
                    env[head] = p.outputs if isinstance(arg, (list, tuple)) else p.outputs[0]
                    for n in step.nodes[1:]:  # getitem of a coalesced collective
                        env[n] = env[head][n.args[1]]
                else:  # wait
                    node = step.nodes[0]
                    src = node.args[0]
                    producer = src.args[0] if src.target is operator.getitem else src
                    if producer in pending:
                        pending[producer].wait()
                        env[node] = env[src]
                    else:  # a collective run outside this runner (eager fallback, an earlier graph)
                        env[node] = _c10d.wait_tensor.default(env[src])
                    wait_s += time.perf_counter() - t0
        finally:
            for p in pending.values():  # nothing may stay in flight once the graph returned (or raised)
                p.wait()
        total = time.perf_counter() - start
        self.last_timeline = {
            "total_s": total, "compute_s": compute_s, "wait_s": wait_s,
            "collectives": [{"node": n.name, "in_flight_s": (p.done or p.issued) - p.issued}
                            for n, p in pending.items()],
        }
        return list(value(self.output.args[0]))


def compile_with_collectives(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                             compile_graph: Callable[[fx.GraphModule, Sequence[Any], str], Callable[..., Any]],
                             ) -> CollectiveGraphRunner:
    """Schedule and cut ``gm``, compile its compute steps with ``compile_graph`` (the backend's compile of any ATen
    graph: a step may itself need the eager fallback), return the runner."""
    from neuron_compile.pipeline import _STATS, check_lowerable

    if config.fallback != "eager":
        check_lowerable(gm, f"{kind} graph")  # names every collective (and op) that cannot be lowered
    steps = cut(gm)
    for step in steps:
        if step.kind == "issue":
            rule = _rule(step.nodes[0])
            step.spec = rule.fn(step.nodes[0])
        elif step.kind == "compute":
            first = len(_STATS)
            sub = _extract(step)
            step.runner = compile_graph(sub, [n.meta.get("val") for n in step.inputs], kind)
            step.stats = list(_STATS[first:])
    runner = CollectiveGraphRunner(gm, steps)
    with _LOCK:
        _GRAPHS.append(CollectiveGraph(kind, steps, runner))
    log.info("neuron: %s graph with %d collective(s): %d compiled segment(s), %d step(s): %s", kind,
             runner.n_collectives, runner.n_segments, len(steps), " | ".join(s.describe() for s in steps))
    return runner
