"""Numeric check mode: every compiled graph also runs eagerly, and a mismatch is traced to its kernel.

With ``options={"check": True}`` (or ``NEURON_COMPILE_CHECK=1``) the finish hook this module registers with
:mod:`neuron_compile.compile_record` wraps each compiled graph's runner in a :class:`CheckedRunner`. Each call runs the compiled graph,
then the ATen graph module itself on the same inputs (with the same RNG state, so dropout draws
match), and compares the outputs with dtype-aware tolerances (:data:`TOLERANCES`). The first
mismatch of a graph is diagnosed per kernel (:func:`first_divergence`): the plan runs kernel by
kernel and each kernel's results are compared with an eager evaluation of the graph nodes they hold
(``plan.summary["buffer_nodes"]``), naming the first kernel that diverges, its ATen ops and source
lines. Results go to the graph's metrics record (``check``) and :func:`get_check_results`.

Nothing here runs when the check mode is off.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import fx

from neuron_compile import compile_record

log = logging.getLogger(__name__)

# (atol, rtol) per output dtype; |got - want| <= atol + rtol * |want| elementwise. Kernels compute in
# fp32 with a reciprocal instead of a divide and table activations, and round bf16/fp16 less often
# than eager, so allow a few ulps of the dtype. Integers and bools must match exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-3),
    torch.float64: (1e-4, 1e-3),  # runs as fp32 on NeuronCores
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (3e-3, 3e-3),
}

_RESULTS: list[dict[str, Any]] = []
_LOCK = threading.Lock()


def get_check_results() -> list[dict[str, Any]]:
    """One entry per checked graph: calls, mismatching calls, per-output errors, the first diverging kernel."""
    with _LOCK:
        return [dict(r) for r in _RESULTS]


def clear_check_results() -> None:
    with _LOCK:
        _RESULTS.clear()


def compare(got: Any, want: Any) -> dict[str, Any]:
    """Compare one output: ``{"ok", "max_abs", "max_rel", "dtype", "shape"}`` (``note`` for non-tensors)."""
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        ok = (got == want) if not isinstance(got, torch.Tensor) and not isinstance(want, torch.Tensor) else False
        return {"ok": bool(ok), "max_abs": 0.0 if ok else math.inf, "max_rel": 0.0 if ok else math.inf,
                "dtype": type(want).__name__, "shape": [], "note": "non-tensor output"}
    info: dict[str, Any] = {"dtype": str(want.dtype).replace("torch.", ""), "shape": list(want.shape)}
    if tuple(got.shape) != tuple(want.shape):
        return {**info, "ok": False, "max_abs": math.inf, "max_rel": math.inf,
                "note": f"shape {list(got.shape)} != {list(want.shape)}"}
    if want.numel() == 0:
        return {**info, "ok": True, "max_abs": 0.0, "max_rel": 0.0}
    g = got.detach().to(torch.float64)
    w = want.detach().to(torch.float64)
    atol, rtol = TOLERANCES.get(want.dtype, (0.0, 0.0))
    both_nan = torch.isnan(g) & torch.isnan(w)
    same_inf = torch.isinf(w) & (g == w)
    diff = (g - w).abs()
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    bad = diff > atol + rtol * w.abs().nan_to_num(posinf=0.0, neginf=0.0)
    rel = diff / w.abs().clamp_min(1e-12)
    return {**info, "ok": not bool(bad.any()), "max_abs": float(diff.max()), "max_rel": float(rel.max()),
            "mismatched": int(bad.sum()), "numel": want.numel()}


def compare_outputs(got: Sequence[Any], want: Sequence[Any]) -> list[dict[str, Any]]:
    return [compare(g, w) for g, w in zip(got, want, strict=True)]


def eager_values(gm: fx.GraphModule, args: Sequence[Any]) -> dict[str, Any]:
    """Every node's eager value by node name (the reference for the per-kernel comparison)."""
    values: dict[str, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            values[n.name] = result
            return result

    with torch.no_grad():
        Recorder(gm).run(*args)
    return values


def _buffer_as(buf: np.ndarray, want: torch.Tensor) -> torch.Tensor:
    from neuron_compile.runtime import to_torch

    flat = to_torch(np.ascontiguousarray(buf))
    if want.dtype == torch.bool:
        flat = flat != 0
    return flat[: want.numel()].reshape(want.shape).to(want.dtype)


def _kernel_nodes(gm: fx.GraphModule, result_names: list[str], held: set[str], ops: Sequence[str]) -> list[fx.Node]:
    """Graph nodes a kernel implements: its results and their ancestors down to other kernels' buffers."""
    from neuron_compile.lowering.registry import qualified_name

    by_name = {n.name: n for n in gm.graph.nodes}
    todo = [by_name[r] for r in result_names if r in by_name]
    seen: list[fx.Node] = []
    while todo:
        node = todo.pop()
        if node in seen or node.op != "call_function":
            continue
        seen.append(node)
        for a in node.all_input_nodes:
            if a.name not in held:
                todo.append(a)
    wanted = set(ops)
    return sorted((n for n in seen if qualified_name(n.target) in wanted), key=lambda n: list(gm.graph.nodes).index(n))


def first_divergence(compiled: Any, gm: fx.GraphModule, args: Sequence[Any]) -> dict[str, Any] | None:
    """Run ``compiled`` (a CompiledGraph) kernel by kernel against eager; the first diverging kernel."""
    from neuron_compile.backend import build_artifacts, source_line
    from neuron_compile.runtime import CompiledGraph

    # The cached plan carries no IR; lowering again gives the same plan with its node mapping.
    files, _summary, plan = build_artifacts(gm, list(args))
    if len(plan.buffers) != len(compiled.plan.buffers) or len(plan.calls) != len(compiled.plan.calls):
        from neuron_compile.backend import load_artifacts

        compiled = CompiledGraph(*load_artifacts(files))
    buffer_nodes: dict[int, str] = {int(k): v for k, v in plan.summary.get("buffer_nodes", {}).items()}
    held = set(buffer_nodes.values())
    bufs = compiled.run_buffers(*args)
    ref = eager_values(gm, args)
    for call in plan.calls:
        kernel = plan.kernels[call.kernel]
        for buf in call.results:
            name = buffer_nodes.get(buf)
            want = ref.get(name) if name else None
            got = bufs[buf]
            if not isinstance(want, torch.Tensor) or got is None:
                continue
            cmp = compare(_buffer_as(got, want), want)
            if cmp["ok"]:
                continue
            results = [buffer_nodes[b] for b in call.results if b in buffer_nodes]
            nodes = _kernel_nodes(gm, results, held - set(results), getattr(kernel, "source_ops", ()))
            return {"kernel": kernel.name, "family": kernel.family, "ops": list(getattr(kernel, "source_ops", ())),
                    "node": name, "max_abs": cmp["max_abs"], "max_rel": cmp["max_rel"],
                    "source_lines": list(dict.fromkeys(source_line(n) for n in nodes)) or
                    [source_line(next(n for n in gm.graph.nodes if n.name == name))]}
    return None


class CheckedRunner:
    """A compiled graph's runner that also runs the ATen graph eagerly and compares (check mode)."""

    def __init__(self, runner: Callable[..., Any], gm: fx.GraphModule, rec: Any) -> None:
        self.runner = runner
        self.gm = gm
        self.rec = rec
        self.result: dict[str, Any] = {"graph": rec.name, "kind": rec.kind, "location": rec.location, "calls": 0,
                                       "mismatched_calls": 0, "outputs": [], "first_divergence": None}
        rec.check = self.result
        with _LOCK:
            _RESULTS.append(self.result)

    def __getattr__(self, name: str) -> Any:  # plan, sources, ... of the wrapped runner
        if name == "runner":
            raise AttributeError(name)
        return getattr(self.runner, name)

    def __call__(self, *args: Any) -> Any:
        state = torch.get_rng_state()
        outs = self.runner(*args)
        after = torch.get_rng_state()
        torch.set_rng_state(state)
        try:
            with torch.no_grad():
                want = self.gm(*args)
        finally:
            torch.set_rng_state(after)
        want = list(want) if isinstance(want, (list, tuple)) else [want]
        cmps = compare_outputs(list(outs), want)
        self._record(cmps, args)
        return outs

    def _record(self, cmps: list[dict[str, Any]], args: Sequence[Any]) -> None:
        res = self.result
        res["calls"] += 1
        if not res["outputs"]:
            res["outputs"] = [{"index": i, **c} for i, c in enumerate(cmps)]
        else:
            for worst, c in zip(res["outputs"], cmps, strict=True):
                worst["ok"] = worst["ok"] and c["ok"]
                worst["max_abs"] = max(worst["max_abs"], c["max_abs"])
                worst["max_rel"] = max(worst["max_rel"], c["max_rel"])
        if all(c["ok"] for c in cmps):
            return
        res["mismatched_calls"] += 1
        if res["mismatched_calls"] > 1:
            return
        try:
            res["first_divergence"] = self._diagnose(args)
        except Exception as exc:  # the diagnosis is best effort; the mismatch itself is already recorded
            log.warning("neuron check: per-kernel diagnosis of %s failed: %s", res["graph"], exc)
            res["first_divergence"] = {"error": f"{type(exc).__name__}: {exc}"}
        bad = [f"output {i}: max abs {c['max_abs']:.3g}, max rel {c['max_rel']:.3g}"
               for i, c in enumerate(cmps) if not c["ok"]]
        div = res["first_divergence"] or {}
        log.warning("neuron check: %s graph %s (%s) differs from eager: %s; first diverging kernel: %s %s at %s",
                    res["kind"], res["graph"], res["location"], "; ".join(bad), div.get("kernel", "?"),
                    div.get("ops", ""), "; ".join(div.get("source_lines", [])))

    def _diagnose(self, args: Sequence[Any]) -> dict[str, Any] | None:
        from neuron_compile.fallback import FallbackRunner

        runner = self.runner
        if isinstance(runner, FallbackRunner):
            captured: list[Any] = []
            runner.run(args, capture=captured)
            for seg, inputs in captured:
                assert seg.gm is not None
                div = first_divergence(_unwrap(seg.runner), seg.gm, inputs)
                if div is not None:
                    return div
            return None
        return first_divergence(_unwrap(runner), self.gm, args)


def _unwrap(runner: Any) -> Any:
    while isinstance(runner, CheckedRunner):
        runner = runner.runner
    return runner


def check_hook(rec: Any, gm: fx.GraphModule, runner: Callable[..., Any]) -> Callable[..., Any]:
    """Finish hook: wrap the runner for the numeric check mode when ``config.check`` is on."""
    from neuron_compile.config import config

    return CheckedRunner(runner, gm, rec) if config.check else runner


compile_record.add_finish_hook("check", check_hook)
