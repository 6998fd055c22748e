"""Compile one lowerable ATen graph: lower, render, cache, load (the core the backend and the tools build on).

:func:`compile_lowerable` turns an ATen graph every node of which has a lowering into a
:class:`~neuron_compile.runtime.CompiledGraph`: it computes the cache key, takes the entry from the cache
or builds it (:func:`build_artifacts`: :class:`~neuron_compile.lowering.graph.GraphLowering`, then each
kernel rendered by :mod:`neuron_compile.codegen`), loads it and records what it compiled
(:func:`compiled_graphs`). :func:`unsupported_nodes` / :func:`check_lowerable` say which nodes can't be
lowered, with their inputs, reasons and the user's source lines.

Layering: this module imports the lowering, codegen, cache and runtime packages and
:mod:`neuron_compile.compile_record`, never the Dynamo entry (:mod:`neuron_compile.backend`) nor the tools
above it (fallback, check, debug, metrics, explain).
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Container, Sequence
from typing import Any

import torch
from torch import fx

from neuron_compile.config import config
from neuron_compile.errors import UnsupportedOpError, source_line
from neuron_compile.lowering.dtypes import DTYPES
from neuron_compile.lowering.registry import qualified_name, unsupported_reason

log = logging.getLogger(__name__)

_SUPPORTED_INPUT_DTYPES = frozenset(DTYPES)

_E4M3FN_ADVICE = ("float8_e4m3fn is a NeuronCore-v4 (trn3) dtype: the Neuron compiler rejects it for trn1/trn2 "
                  "(NCC_EVRF051); compile for trn3 (neuron_compile.config.target = 'trn3'), keep the tensor as "
                  "float8_e5m2, or dequantize it to bfloat16 outside the compiled region")
_FP8_ADVICE = ("NeuronCores store float8_e5m2 and (trn3) float8_e4m3fn, not this format: convert it to one of "
               "those, or dequantize it to bfloat16 outside the compiled region")


def _is_fp8(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and dtype.itemsize == 1 or "float4" in str(dtype)


def _target_lacks(dtype: torch.dtype) -> bool:
    """A dtype the backend compiles that the configured target has not (float8_e4m3fn before trn3)."""
    return dtype == torch.float8_e4m3fn and config.target in ("trn1", "trn2")


def _dtype_advice(dtype: torch.dtype) -> str:
    """What to cast an input of an unsupported dtype to."""
    if dtype in (torch.uint16, torch.uint32, torch.uint64):
        return "NeuronCores have no unsigned integers wider than 8 bits; cast it to int32, or int64 for values of 2**31 and up"
    if dtype.is_complex:
        return "complex values compile as pairs of reals only when every op on them has a real form, and an op here has none"
    if dtype == torch.float8_e4m3fn:
        return _E4M3FN_ADVICE
    if _is_fp8(dtype):
        return _FP8_ADVICE
    if dtype.is_floating_point:
        return "cast it to bfloat16 or float32"
    return "cast it to int32, float32 or bfloat16"


def describe_inputs(node: fx.Node) -> str:
    parts = []
    for a in node.args:
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        if isinstance(val, torch.Tensor):
            parts.append(f"{str(val.dtype).replace('torch.', '')}{list(val.shape)}")
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], fx.Node):
            parts.append("[" + ", ".join(
                f"{str(x.meta['val'].dtype).replace('torch.', '')}{list(x.meta['val'].shape)}"
                for x in a if isinstance(x, fx.Node) and isinstance(x.meta.get("val"), torch.Tensor)) + "]")
        elif not isinstance(a, fx.Node):
            parts.append(repr(a))
    return ", ".join(parts)


_SIZE_CHECKS = {torch.ops.aten.sym_size.int, torch.ops.aten._assert_scalar.default,
                torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten.sym_constrain_range.default}


def _size_bookkeeping(node: fx.Node) -> bool:
    """A node Dynamo adds around a data-dependent size (its size, arithmetic and range asserts on it)."""
    if node.target in _SIZE_CHECKS:
        return True
    symbolic = isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))
    return symbolic and getattr(node.target, "__module__", None) in ("_operator", "operator", "torch")


def unsupported_nodes(gm: fx.GraphModule, rewritten: Container[fx.Node] = ()) -> list[str]:
    """One line per node the backend cannot lower (op, inputs, reason, user source line), except those a later
    rewrite compiles (``rewritten``). The size bookkeeping that comes with a data-dependent shape is summed up in
    one line after the op that made the shape."""
    from neuron_compile.lowering.complex_pairs import PAIRS_FAILURE

    problems = []
    bookkeeping: list[str] = []
    on_complex: list[str] = []  # refused only for taking complex values (left complex: the graph had no real-pair form)
    stuck = getattr(gm, "meta", {}).get(PAIRS_FAILURE)  # (the node the real-pair rewrite stopped at, why)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                if val.is_sparse or getattr(val, "is_nested", False):
                    problems.append(f"input {node.name}: sparse/nested tensors are not supported")
                elif val.dtype not in _SUPPORTED_INPUT_DTYPES or _target_lacks(val.dtype):
                    where = f" on {config.target}" if _target_lacks(val.dtype) else ""
                    line = f"input {node.name}: dtype {val.dtype} is not supported{where} ({_dtype_advice(val.dtype)})"
                    (on_complex if val.is_complex() else problems).append(line)
                elif node.meta.get("neuron_constant") and (why := _constant_beyond_int32(node, val)):
                    problems.append(why)
            continue
        if node.op != "call_function" or node in rewritten:
            continue
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) \
                and unsupported_reason(node.args[0]) is not None:
            continue  # the tuple-producing op is reported itself
        own = unsupported_reason(node)
        at_stuck = stuck is not None and node is stuck[0]
        if at_stuck and (own in (None, "no lowering rule") or any(f" {w} torch.complex" in own for w in ("on", "of"))):
            # (a rule's reason of its own, as a collective's, is kept; its generic dtype refusal is not the point)
            why = "" if stuck[1] == str(node.target) else f": {stuck[1]}"
            problems.append(f"{qualified_name(node.target)}({describe_inputs(node)}): not compiled on complex values "
                            f"(they compile as pairs of reals, op by op, and this op has no real form{why}) at "
                            f"{source_line(node)}")
            continue
        reason = own
        if reason is not None and _size_bookkeeping(node):
            bookkeeping.append(f"{qualified_name(node.target)}({describe_inputs(node)}): {reason} at {source_line(node)}")
            continue
        # refused for the complex values it takes or makes, not for a reason of its own
        complex_only = not at_stuck and (any(_is_complex(a) for a in node.all_input_nodes)
                                         or (_is_complex(node) and reason in (None, "no lowering rule")))
        if reason is None:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and (val.dtype not in _SUPPORTED_INPUT_DTYPES or _target_lacks(val.dtype)):
                reason = f"produces dtype {val.dtype}, " + (
                    f"which {config.target} cannot hold ({_dtype_advice(val.dtype)})" if _target_lacks(val.dtype)
                    else f"which NeuronCores cannot hold ({_dtype_advice(val.dtype)})" if _is_fp8(val.dtype)
                    else "which NeuronCores do not support")
        if reason is not None:
            line = f"{qualified_name(node.target)}({describe_inputs(node)}): {reason} at {source_line(node)}"
            (on_complex if complex_only else problems).append(line)
    if bookkeeping and problems:
        problems.append(f"{_AND} {len(bookkeeping)} size computation(s) and check(s) on the data-dependent size, which "
                        f"go away with the op that makes it")
    if on_complex and problems:  # the ops above make the complex values: everything on them follows
        problems.append(f"{_AND} {len(set(on_complex))} more op(s) and input(s) on complex values, which compile (as "
                        f"pairs of reals) once the op(s) above do")
    return problems or on_complex or bookkeeping


def _is_complex(node: fx.Node) -> bool:
    vals = node.meta.get("val")
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in (vals if isinstance(vals, (list, tuple)) else [vals]))


_AND = "and"  # the first word of unsupported_nodes' summary line (not an op)


_PASS_THROUGH = {torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.clone.default, torch.ops.aten.alias.default,
                 torch.ops.aten._to_copy.default, torch.ops.aten.view.default, torch.ops.aten.expand.default,
                 torch.ops.aten.unsqueeze.default, torch.ops.aten.reshape.default}


def _constant_beyond_int32(node: fx.Node, val: torch.Tensor) -> str | None:
    """A graph constant (a tensor literal, such as the iinfo(int64).min fill of a masked max) holding an integer
    that NeuronCores can't store as int32: refused here rather than failing at its upload on every call."""
    if val.dtype != torch.int64 or not val.numel():
        return None
    lo, hi = int(val.min()), int(val.max())
    if -(2**31) <= lo and hi < 2**31:
        return None
    bad = hi if hi >= 2**31 else lo
    seen, todo, users = set(), list(node.users), []
    while todo:  # through the copies and views of the literal to the ops that use its value
        u = todo.pop(0)
        if u in seen:
            continue
        seen.add(u)
        if u.target in _PASS_THROUGH:
            todo.extend(u.users)
        else:
            users.append(f"{qualified_name(u.target)} at {source_line(u)}")
    users = ", ".join(dict.fromkeys(users)) or "no op"
    return (f"an int64 graph constant ({list(val.shape)}) holds {bad}, outside the int32 range NeuronCores compute "
            f"integers in; used by {users}")


def check_lowerable(gm: fx.GraphModule, what: str, rewritten: Container[fx.Node] = ()) -> None:
    problems = unsupported_nodes(gm, rewritten)
    if problems:
        unique = list(dict.fromkeys(problems))
        ops = sum(1 for u in unique if not u.startswith(f"{_AND} "))
        raise UnsupportedOpError(
            f"neuron backend cannot compile this {what}: {ops} unsupported op(s):\n  - "
            + "\n  - ".join(unique)
            + "\nTo run anyway, let these ops run eagerly: torch.compile(..., backend='neuron', "
              "options={'fallback': 'eager'}); `neuron-compile check your_script.py` reports every such op "
              "and checks the numerics. Otherwise remove or replace these ops, compile a smaller region, or see "
              "`neuron-compile ops` for what is supported.", unique)


def compile_lowerable(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Callable[..., Any]:
    """Lower, render and load one ATen graph (or take it from the cache); returns the runner."""
    from neuron_compile import compile_record
    from neuron_compile.cache.key import compute_key
    from neuron_compile.cache.store import cache_enabled, get_or_compile
    from neuron_compile.runtime import CompiledGraph

    check_lowerable(gm, f"{kind} graph")
    start = time.perf_counter()
    built: dict[str, Any] = {}

    def build() -> tuple[dict[str, bytes], dict[str, Any]]:
        files, summary, plan = build_artifacts(gm, example_inputs)
        if key is not None:  # only cached entries carry the graph they can be verified from
            files.update(stored_graph(gm, example_inputs))
        built["plan"] = plan
        return files, summary

    key = None
    try:
        with compile_record.phase("cache_lookup"):
            key = compute_key(gm, list(example_inputs), kind=kind)
    except Exception as exc:  # a failing cache never fails a compile
        log.warning("neuron-compile cache: could not compute the cache key (%s); compiling without the cache", exc)
    lookup_start = time.perf_counter()
    if key is None or not cache_enabled():
        files, hit = build()[0], False
    else:
        with compile_record.phase("cache_lookup"):
            files, hit = get_or_compile(key, build)
    with compile_record.phase("load"):
        try:
            plan, sources = load_artifacts(files)
            compiled = CompiledGraph(plan, sources)  # loads the kernels: a cached source must compile too
        except Exception as exc:  # an entry that passed its hashes but can't be loaded: never fail the compile
            if not hit:
                raise
            _quarantine_unloadable(key, exc)
            files, hit = build()[0], False
            plan, sources = load_artifacts(files)
            compiled = CompiledGraph(plan, sources)
    cache_ms = (time.perf_counter() - lookup_start) * 1000 if hit else 0.0
    ms = (time.perf_counter() - start) * 1000
    log.info("neuron: %s graph: %d nodes -> %d kernels, cache %s, %.1f ms", kind,
             sum(1 for n in gm.graph.nodes if n.op == "call_function"), len(sources),
             "hit" if hit else "miss", ms)
    _STATS.append({"kind": kind, "kernels": len(sources), "plan": built.get("plan", plan), "sources": sources,
                   "cache_hit": hit, "ms": ms, "cache_load_ms": cache_ms, "files": files, "key": key.digest if key else None})
    return compiled


def stored_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[str, bytes]:
    """``{"graph.json": ...}``: the graph an entry is compiled from, so an importer can recompile and
    compare (``neuron_compile.rebuild``); empty when the graph can't be stored exactly."""
    from neuron_compile.cache.graph_codec import GRAPH_FILE, GraphCodecError, encode_graph

    try:
        return {GRAPH_FILE: encode_graph(gm, example_inputs)}
    except GraphCodecError as exc:
        log.debug("graph not stored in its cache entry (it can't be verified by recompiling): %s", exc)
    except Exception as exc:  # the stored graph is optional: never fail a compile over it
        log.warning("neuron-compile cache: graph not stored in its cache entry (%s: %s); it can't be verified by "
                    "recompiling", type(exc).__name__, exc)
    return {}


def _quarantine_unloadable(key: Any, exc: Exception) -> None:
    from neuron_compile.cache.store import CacheStore

    store = CacheStore.default()
    if store is not None and key is not None:
        store.quarantine(key.digest, f"its artifacts can't be loaded ({type(exc).__name__}: {exc})")


def build_artifacts(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[dict[str, bytes], dict[str, Any], Any]:
    """Lower and render: the files a cache entry holds (kernel sources + runner plan) and a summary."""
    import json

    from neuron_compile import compile_record
    from neuron_compile.codegen.render import render_kernel
    from neuron_compile.lowering.graph import GraphLowering
    from neuron_compile.progress import Progress
    from neuron_compile.runtime import plan_to_json

    with compile_record.phase("lowering"):
        plan = GraphLowering(gm, list(example_inputs)).run()
    files: dict[str, bytes] = {}
    names = []
    bar = Progress(len(plan.kernels), "neuron-compile: rendering kernels")
    with compile_record.phase("codegen"):
        for k in plan.kernels:
            src = render_kernel(k)
            log.debug("kernel %s:\n%s", k.name, src)
            files[f"kernels/{k.name}.py"] = src.encode()
            names.append(k.name)
            bar.tick(k.name)
    bar.close()
    # compact: json's C encoder only runs without ``indent`` (the Python one was ~0.5 ms per kernel);
    # the debug folder's copy is indented (neuron_compile/debug.py)
    files["plan.json"] = json.dumps(plan_to_json(plan, names), sort_keys=True, separators=(",", ":")).encode()
    summary = dict(plan.summary)
    summary["shapes"] = [list(i.shape) for i in plan.inputs if i.is_tensor]
    return files, summary, plan


def load_artifacts(files: dict[str, bytes]) -> tuple[Any, list[tuple[str, str]]]:
    import json

    from neuron_compile.runtime import plan_from_json

    data = json.loads(files["plan.json"])
    plan = plan_from_json(data)
    sources = [(name, files[f"kernels/{name}.py"].decode()) for name in data["kernel_names"]]
    return plan, sources


_STATS: list[dict[str, Any]] = []  # per compiled graph (read by examples/tests through compiled_graphs())


def compiled_graphs() -> list[dict[str, Any]]:
    return list(_STATS)


def last_compiled() -> dict[str, Any]:
    """The record of the graph compiled last (without copying the whole list)."""
    return _STATS[-1]


def record_stats(stats: dict[str, Any]) -> None:
    """Add a compiled graph's record (the warm start records the graphs it loads)."""
    _STATS.append(stats)


def reset() -> None:
    _STATS.clear()
