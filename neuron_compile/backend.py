"""The ``neuron`` Dynamo backend: AOTAutograd -> lowering -> codegen -> runner.

``torch.compile(model, backend="neuron")`` calls :func:`neuron_backend` with each captured FX
graph. AOTAutograd (with our decomposition table) produces forward/backward ATen graphs; the joint
graph is checked for unsupported ops before anything runs, so a refusal names forward *and*
backward ops at the first call. Each ATen graph is compiled by :func:`compile_aten_graph` into a
:class:`~neuron_compile.runtime.CompiledGraph`.
"""

from __future__ import annotations

import logging
import operator
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from neuron_compile.config import config
from neuron_compile.errors import ConfigError, DynamicShapeError, UnsupportedOpError, source_line
from neuron_compile.lowering.registry import qualified_name, unsupported_reason

log = logging.getLogger(__name__)

OPTIONS = {
    "target": "target",
    "executor": "executor",
    "fuse": "fuse",
    "free_tile": "free_tile",
    "cache": "cache",
    "debug_dir": "debug_dir",
    "fallback": "fallback",
    "check": "check",
}
_SUPPORTED_INPUT_DTYPES = {torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
                           torch.int16, torch.int8, torch.uint8, torch.bool}


def _validate_options(options: dict[str, Any] | None) -> dict[str, Any]:
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"torch.compile(backend='neuron', options=...): unknown option(s) {', '.join(unknown)}; "
                          f"valid options: {', '.join(sorted(OPTIONS))}")
    return {OPTIONS[k]: v for k, v in options.items()}


def _describe_inputs(node: fx.Node) -> str:
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


def unsupported_nodes(gm: fx.GraphModule) -> list[str]:
    """One line per node the backend cannot lower (op, inputs, reason, user source line)."""
    problems = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                if val.is_sparse or getattr(val, "is_nested", False):
                    problems.append(f"input {node.name}: sparse/nested tensors are not supported")
                elif val.dtype not in _SUPPORTED_INPUT_DTYPES:
                    problems.append(f"input {node.name}: dtype {val.dtype} is not supported (complex and float8 "
                                    f"inputs cannot be lowered; cast to float32/bfloat16)")
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) \
                and unsupported_reason(node.args[0]) is not None:
            continue  # the tuple-producing op is reported itself
        reason = unsupported_reason(node)
        if reason is None:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dtype not in _SUPPORTED_INPUT_DTYPES:
                reason = f"produces dtype {val.dtype}, which NeuronCores do not support"
        if reason is not None:
            problems.append(f"{qualified_name(node.target)}({_describe_inputs(node)}): {reason} "
                            f"at {source_line(node)}")
    return problems


def check_lowerable(gm: fx.GraphModule, what: str) -> None:
    problems = unsupported_nodes(gm)
    if problems:
        unique = list(dict.fromkeys(problems))
        raise UnsupportedOpError(
            f"neuron backend cannot compile this {what}: {len(unique)} unsupported op(s):\n  - "
            + "\n  - ".join(unique)
            + "\nTo run anyway, let these ops run eagerly: torch.compile(..., backend='neuron', "
              "options={'fallback': 'eager'}); `neuron-compile check your_script.py` reports every such op "
              "and checks the numerics. Otherwise remove or replace these ops, compile a smaller region, or see "
              "`neuron-compile ops` for what is supported.", unique)


def symbolic_dims(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """Placeholders with symbolic sizes, described with their source line."""
    dims = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.SymInt) or (isinstance(val, torch.Tensor) and any(
                not isinstance(s, int) for s in val.shape)):
            shape = list(val.shape) if isinstance(val, torch.Tensor) else [val]
            dims.append(f"{node.name} {shape} ({source_line(node)})")
    if not dims and any(isinstance(x, torch.SymInt) for x in example_inputs):
        dims.append("SymInt inputs")
    return dims


def dynamic_requested(gm: fx.GraphModule) -> bool:
    """True for dynamic=True or torch._dynamo.mark_dynamic (not for Dynamo's automatic dynamic shapes)."""
    import torch._dynamo.config as dynamo_config

    if not dynamo_config.assume_static_by_default:
        return True
    for node in gm.graph.nodes:
        example = getattr(node.meta.get("grapharg"), "example", None) if node.op == "placeholder" else None
        if isinstance(example, torch.Tensor) and getattr(example, "_dynamo_dynamic_indices", None):
            return True
    return False


def refuse_dynamic(dims: list[str]) -> DynamicShapeError:
    return DynamicShapeError(
        "neuron backend compiles static shapes only, but dynamic shapes were requested (dynamic=True or "
        "torch._dynamo.mark_dynamic); symbolic dims: " + "; ".join(dims)
        + ". Fix: call torch.compile(..., dynamic=False) and do not mark dims dynamic; to limit recompiles, "
          "pad or bucket input shapes to a few sizes.")


class StaticShapeDispatcher:
    """Runs a graph Dynamo made symbolic on its own (automatic dynamic shapes) as one static compile per shape."""

    def __init__(self, gm: fx.GraphModule, make_backend: Callable[[], Callable[..., Any]],
                 distributed: bool = False) -> None:
        from neuron_compile import metrics

        self.gm = gm
        self.make_backend = make_backend
        self.distributed = distributed
        self.compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.compile_id = metrics._compile_id()  # later per-shape compiles run outside Dynamo's context

    @staticmethod
    def signature(args: Sequence[Any]) -> tuple[Any, ...]:
        return tuple((tuple(a.shape), a.dtype, tuple(a.stride()), a.requires_grad) if isinstance(a, torch.Tensor)
                     else ("value", a) for a in args)

    def __call__(self, *args: Any) -> Any:
        key = self.signature(args)
        fn = self.compiled.get(key)
        if fn is None:
            from neuron_compile import metrics

            log.info("neuron: new input shapes %s: compiling a static graph", [k[0] for k in key])
            from neuron_compile.rank_agreement import maybe_agree

            metrics.dynamo_graph(self.gm, self.compile_id)
            with maybe_agree(self.distributed, "a graph for new input shapes"):
                fn = self.make_backend()(self.gm, list(args))
            self.compiled[key] = fn
        return fn(*args)


def compile_aten_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Callable[..., Any]:
    """Compile one ATen graph into a runner (with eager fallback / check mode / metrics when enabled)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # AOTAutograd calls its compilers with its FakeTensorMode active; graph constants are real tensors.
    with unset_fake_temporarily():
        return _compile_aten_graph(gm, example_inputs, kind)


def _compile_aten_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Callable[..., Any]:
    from neuron_compile import metrics, precompile
    from neuron_compile.lowering.graph_passes import lift_constants

    gm, constants = lift_constants(gm)
    if constants:  # tensor literals of the graph: passed after the real inputs on every call
        inner = _compile_aten_graph(gm, [*example_inputs, *constants], kind)

        def with_constants(*args: Any) -> Any:
            return inner(*args, *constants)

        with_constants.neuron_constants = constants  # type: ignore[attr-defined]  (a warm start needs them)
        return with_constants

    from neuron_compile.collective_runner import compile_with_collectives, has_collectives, opaque_outputs

    gm, passthrough = opaque_outputs(gm)
    if passthrough:  # opaque inputs returned as they are (a process group DTensor threads through)
        compiled = _compile_aten_graph(gm, example_inputs, kind)

        def with_passthrough(*args: Any) -> Any:
            outs = list(compiled(*args))
            for o, i in passthrough:
                outs[o] = args[i]
            return outs

        return with_passthrough

    if precompile.capture_dir() is not None:  # `neuron-compile precompile`: record the graph, run nothing
        return precompile.capture(gm, list(example_inputs), kind)
    with metrics.graph(gm, example_inputs, kind) as rec:
        if has_collectives(gm):  # cut at each collective; the segments come back here one by one
            runner: Callable[..., Any] = compile_with_collectives(gm, example_inputs, kind)
        elif config.fallback == "eager" and unsupported_nodes(gm):
            from neuron_compile.fallback import compile_with_fallback

            runner = compile_with_fallback(gm, example_inputs, kind)
        else:
            runner = _compile_lowerable(gm, example_inputs, kind)
            rec.add_unit(gm, example_inputs, _STATS[-1])
        return metrics.finish(rec, gm, runner)


def _compile_lowerable(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Callable[..., Any]:
    """Lower, render and load one ATen graph (or take it from the cache); returns the runner."""
    from neuron_compile import metrics
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
        with metrics.phase("cache_lookup"):
            key = compute_key(gm, list(example_inputs), kind=kind)
    except Exception as exc:  # a failing cache never fails a compile
        log.warning("neuron-compile cache: could not compute the cache key (%s); compiling without the cache", exc)
    lookup_start = time.perf_counter()
    if key is None or not cache_enabled():
        files, hit = build()[0], False
    else:
        with metrics.phase("cache_lookup"):
            files, hit = get_or_compile(key, build)
    with metrics.phase("load"):
        try:
            plan, sources = load_artifacts(files)
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

    from neuron_compile import metrics
    from neuron_compile.codegen.render import render_kernel
    from neuron_compile.debug import Progress
    from neuron_compile.lowering.graph import GraphLowering
    from neuron_compile.runtime import plan_to_json

    with metrics.phase("lowering"):
        plan = GraphLowering(gm, list(example_inputs)).run()
    files: dict[str, bytes] = {}
    names = []
    bar = Progress(len(plan.kernels), "neuron-compile: rendering kernels")
    with metrics.phase("codegen"):
        for k in plan.kernels:
            src = render_kernel(k)
            log.debug("kernel %s:\n%s", k.name, src)
            files[f"kernels/{k.name}.py"] = src.encode()
            names.append(k.name)
            bar.tick(k.name)
    bar.close()
    files["plan.json"] = json.dumps(plan_to_json(plan, names), sort_keys=True, indent=1).encode()
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


def verify_entry_by_recompiling(manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Recompile an untrusted entry's stored graph and compare bytes (raises ``VerificationFailed``)."""
    from neuron_compile.rebuild import verify_by_recompiling

    verify_by_recompiling(manifest, files)


def _register_cache_hooks() -> None:
    from neuron_compile.cache import remote

    remote.set_verifier(verify_entry_by_recompiling)  # unsigned remote entries are verified this way


_register_cache_hooks()

_STATS: list[dict[str, Any]] = []  # per compiled graph (read by examples/tests through compiled_graphs())


def compiled_graphs() -> list[dict[str, Any]]:
    return list(_STATS)


def record_stats(stats: dict[str, Any]) -> None:
    """Add a compiled graph's record (the warm start records the graphs it loads)."""
    _STATS.append(stats)


def reset() -> None:
    _STATS.clear()


def _warn_float64(example_inputs: Sequence[Any]) -> None:
    if any(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in example_inputs):
        if config.float64 == "error":
            raise ConfigError("float64 inputs are not supported by NeuronCores (NEURON_COMPILE_FLOAT64=error)")
        warnings.warn("neuron backend: float64 tensors run as float32 on NeuronCores (results are float32-accurate)",
                      stacklevel=3)


def neuron_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any] | None = None,
                   mode: str | None = None) -> Callable[..., Any]:
    """The Dynamo backend registered as ``"neuron"``."""
    from neuron_compile import rank_agreement

    # In a distributed job every rank compiles, or every rank raises the same error (no rank left hanging
    # on a collective the failed one never joins): neuron_compile.rank_agreement.
    distributed = rank_agreement.is_distributed_graph(gm, example_inputs)
    with rank_agreement.maybe_agree(distributed, "a graph Dynamo captured"):
        return _neuron_backend(gm, example_inputs, options, mode, distributed)


def _neuron_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None,
                    mode: str | None, distributed: bool) -> Callable[..., Any]:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from neuron_compile import rank_agreement
    from neuron_compile.lowering.decompositions import decomposition_table

    overrides = _validate_options(options)
    from neuron_compile import metrics

    metrics.dynamo_graph(gm)
    from neuron_compile.lowering.decomp_conv import rewrite_interpolate

    gm = rewrite_interpolate(gm)  # PyTorch decomposes upsample ops above autograd: replace them before AOT
    if mode not in (None, "default"):
        raise ConfigError(f"torch.compile(backend='neuron', mode={mode!r}): modes are not supported; use options=")
    _warn_float64(example_inputs)

    def with_config(fn: Callable[..., Any], boxed: bool = True) -> Callable[..., Any]:
        from torch._functorch.aot_autograd import make_boxed_func

        def inner(*args: Any, **kwargs: Any) -> Any:
            with config.patch(**overrides):
                compiled = fn(*args, **kwargs)
            return make_boxed_func(compiled) if boxed else compiled  # AOT's calling convention: f(list_of_args)

        return inner

    def fw_compiler(fgm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        return compile_aten_graph(fgm, inputs, "forward")

    def bw_compiler(bgm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        with rank_agreement.maybe_agree(distributed, "a backward graph"):  # compiled at the first .backward()
            return compile_aten_graph(bgm, inputs, "backward")

    def inference_compiler(igm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        return compile_aten_graph(igm, inputs, "inference")

    def partition_fn(joint: fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any) -> Any:
        # The joint graph holds forward and backward ops: refuse now, not at the first .backward().
        with config.patch(**overrides):
            strict = config.fallback != "eager"  # eager fallback: each graph is split when compiled
        if strict:
            check_lowerable(joint, "training graph (forward + backward)")
        return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)

    def make_backend(serializable: bool = False) -> Callable[..., Any]:
        compilers = {"fw_compiler": (fw_compiler, "forward"), "bw_compiler": (bw_compiler, "backward"),
                     "inference_compiler": (inference_compiler, "inference")}
        if serializable:  # results AOTAutograd can bundle into a warm-start entry (neuron_compile.warm_start)
            from neuron_compile.warm_start import serializable_compiler

            wrapped = {name: serializable_compiler(with_config(fn, boxed=False), kind)
                       for name, (fn, kind) in compilers.items()}
        else:
            wrapped = {name: with_config(fn) for name, (fn, _kind) in compilers.items()}
        return aot_autograd(
            **wrapped,
            partition_fn=partition_fn,
            decompositions=decomposition_table(),
            keep_inference_input_mutations=False,
        )

    dims = symbolic_dims(gm, example_inputs)
    if dims:
        if dynamic_requested(gm):
            raise refuse_dynamic(dims)
        # Dynamo's automatic dynamic shapes: stay static, one compile per concrete shape.
        return StaticShapeDispatcher(gm, make_backend, distributed)
    from neuron_compile import warm_start

    with config.patch(**overrides):
        key = warm_start.warm_key(gm, example_inputs)
        if key is None:
            return make_backend()(gm, example_inputs)
        cached = warm_start.load(gm, example_inputs, key)
        if cached is not None:
            return cached
        start = time.perf_counter()
        with warm_start.capturing(key, lambda entry: warm_start.publish_entry(key, entry, time.perf_counter() - start)):
            return make_backend(serializable=True)(gm, example_inputs)
