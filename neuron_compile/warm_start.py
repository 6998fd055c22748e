"""Warm start: a whole Dynamo graph rebuilt from the cache without running AOTAutograd.

A warm first call used to spend ~96% of its time re-tracing (Dynamo capture, then AOTAutograd's
functionalization, joint tracing and partitioning) before it could take the kernels from the
cache. This module skips the AOTAutograd part for inference *and* training graphs, using torch's
own precompile machinery, which accepts a custom backend:

- our forward/backward/inference compilers are wrapped as
  ``SerializableAOTDispatchCompiler(NeuronOutputCode, ...)``: each returns a
  :class:`NeuronOutputCode`, an ``OutputCode`` that runs one compiled ATen graph and pickles as
  the *digest* of its cache entry (kernels are never pickled);
- on a miss, AOTAutograd runs with its cache switched on in bundled mode, but with our own
  ``try_load`` (never torch's cache directory: the key is ours) and ``save`` (the
  ``BundledAOTAutogradResult`` it builds is captured, not written to torch's folder). That result
  holds everything AOTAutograd's runtime wrappers need (ViewAndMutationMeta: input mutations,
  output aliasing, saved tensors, RNG; the dedupe/synthetic-base wrappers) and is published as a
  warm entry: ``aot_autograd.pkl`` plus ``children.json``, the digests of its ATen entries. The
  backward is compiled with the forward (``force_non_lazy_backward_lowering``), so the entry is
  complete after the first call;
- on a hit, the result is unpickled, each ``NeuronOutputCode`` gets its compiled graph from its
  (verified) ATen entry, and torch's ``deserialize_bundled_cache_entry`` rebuilds the callable.

The key (:func:`warm_key`) is the Dynamo graph's canonical text (real tensor constants hashed by
value), the input signature (shapes, strides, dtypes, ``requires_grad``), which inputs share
storage, grad mode, autocast state, the functorch knobs that shape the partition, and everything
an ATen key holds (versions, sources, target, codegen knobs).

Trust: ``aot_autograd.pkl`` is a pickle (AOTAutograd's own objects), i.e. code, like the kernels.
It is read only from the local cache (permission-checked), a signed remote entry, or
``cache import --trust``; an import or an unsigned remote never supplies one (only re-tracing
could verify it, and the first run does exactly that). A warm entry that fails to load is
quarantined and the graph compiled normally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import fx
from torch._inductor.output_code import OutputCode

log = logging.getLogger(__name__)

WARM_FILE = "aot_autograd.pkl"
CHILDREN_FILE = "children.json"
KEY_PREFIX = "neuron-compile:"


@dataclasses.dataclass
class NeuronOutputCode(OutputCode):
    """One compiled ATen graph as AOTAutograd's ``OutputCode``; pickles as its cache digest only."""

    kind: str = ""
    digest: str | None = None
    constants: list[Any] = dataclasses.field(default_factory=list, repr=False)  # lifted tensor constants
    complex_io: Any = None  # (complex inputs, complex outputs) of a graph compiled as real pairs
    uint64_outputs: Any = None  # outputs held as int32 word pairs (hash_tensor), viewed as uint64
    runner: Any = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._boxed_call = True  # AOTAutograd passes one list of inputs

    def __call__(self, inputs: Sequence[Any]) -> Any:
        if self.runner is None:
            raise RuntimeError(f"neuron-compile: the {self.kind} graph {self.digest} was not loaded")
        return self.runner(*inputs)

    def prepare_for_serialization(self) -> None:
        self.runner = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        return None

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        return None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["runner"] = None
        return state


def serializable_compiler(fn: Callable[[fx.GraphModule, Sequence[Any]], Any], kind: str) -> Any:
    """Wrap a backend compiler so AOTAutograd treats its result as cacheable ``OutputCode``."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    def compile_one(gm: fx.GraphModule, inputs: Sequence[Any]) -> NeuronOutputCode:
        from neuron_compile.pipeline import compiled_graphs

        before = len(compiled_graphs())
        runner = fn(gm, inputs)
        stats = compiled_graphs()[before:]
        digest = stats[-1].get("key") if len(stats) == 1 and not stats[-1].get("fallback") else None
        constants = list(getattr(runner, "neuron_constants", ()))
        return NeuronOutputCode(kind=kind, digest=digest, constants=constants, runner=runner,
                                complex_io=getattr(runner, "neuron_complex_io", None),
                                uint64_outputs=getattr(runner, "neuron_uint64", None))

    return SerializableAOTDispatchCompiler(NeuronOutputCode, compile_one)


# --------------------------------------------------------------------------------------------
# Keys


def _aliasing(example_inputs: Sequence[Any]) -> list[int | None]:
    """Per input, the index of the first earlier input sharing its storage (AOTAutograd dedupes
    and builds synthetic bases from that), else None."""
    seen: dict[int, int] = {}
    out: list[int | None] = []
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and not x.is_meta and type(x).__name__ != "FakeTensor":
            try:
                ptr = x.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):
                out.append(None)
                continue
            out.append(seen.get(ptr) if ptr else None)
            if ptr:
                seen.setdefault(ptr, i)
        else:
            out.append(None)
    return out


def _state() -> dict[str, Any]:
    import torch._functorch.config as fconfig

    return {
        "grad": torch.is_grad_enabled(),
        "autocast_cpu": [torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu"))],
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "functorch": {name: getattr(fconfig, name) for name in (
            "activation_memory_budget", "functionalize_rng_ops", "ban_recompute_reductions",
            "recompute_views", "treat_parameters_as_free_to_save") if hasattr(fconfig, name)},
    }


def warm_key(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The key of a whole Dynamo graph, or None (not eligible, cache off, or no key)."""
    from neuron_compile.cache.key import compute_key
    from neuron_compile.cache.store import cache_enabled
    from neuron_compile.config import config

    if not cache_enabled() or config.check or config.fallback == "eager" or config.debug_dir:
        return None  # these modes need the ATen graphs themselves (eager reference, segments, dumps)
    kind = "dynamo-train" if torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) else "dynamo-inference"
    try:
        return compute_key(gm, list(example_inputs), kind=kind,
                           extra={"aliasing": _aliasing(example_inputs), **_state()})
    except Exception as exc:  # a failing cache never fails a compile
        log.warning("neuron-compile cache: no warm-start key for this graph (%s: %s); it is traced every time",
                    type(exc).__name__, exc)
        return None


# --------------------------------------------------------------------------------------------
# Miss: trace, capture AOTAutograd's result, publish it


@contextlib.contextmanager
def capturing(key: Any, publish: Callable[[Any], None]) -> Iterator[None]:
    """Run AOTAutograd (inside) with its bundled cache on, keyed and stored by us."""
    import torch._functorch.config as fconfig
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._functorch._aot_autograd.schemas import AOTAutogradCacheInfo

    ours = KEY_PREFIX + key.digest
    real_save = AOTAutogradCache.save

    def try_load(mod: Any, args: Any, aot_config: Any, *rest: Any, **kw: Any) -> tuple[None, Any]:
        try:  # ask AOTAutograd to hand its result to `save` below (cache_info set), never to look anything up
            info = AOTAutogradCacheInfo(ours, time.time_ns(), forward_symints=[])
            return None, dataclasses.replace(aot_config, cache_info=info)
        except Exception as exc:  # another torch: compile without a warm entry rather than fail
            log.debug("warm start unavailable with this torch (%s: %s)", type(exc).__name__, exc)
            return None, aot_config

    def save(cache_key: str, entry: Any, remote: bool) -> None:
        if cache_key != ours:
            return real_save(cache_key, entry, remote)
        try:
            publish(entry)
        except Exception as exc:  # never fail a compile because of the cache
            log.warning("neuron-compile cache: warm-start entry %s not stored (%s: %s)", key.short,
                        type(exc).__name__, exc)
        return None

    knobs = {"enable_autograd_cache": True, "bundled_autograd_cache": True, "force_non_lazy_backward_lowering": True}
    if not all(hasattr(fconfig, k) for k in knobs) or not all(
            isinstance(AOTAutogradCache.__dict__.get(name), staticmethod) for name in ("try_load", "save")):
        log.debug("warm start unavailable with this torch (AOTAutograd cache hooks changed)")
        yield
        return
    with fconfig.patch(**knobs), _swap(AOTAutogradCache, "try_load", staticmethod(try_load)), \
            _swap(AOTAutogradCache, "save", staticmethod(save)):
        yield


@contextlib.contextmanager
def _swap(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def publish_entry(key: Any, entry: Any, seconds: float) -> bool:
    """Store AOTAutograd's bundled result under ``key`` (children must be cached ATen entries)."""
    from neuron_compile.cache.store import CacheStore

    store = CacheStore.default()
    if store is None:
        return False
    codes = [c.result for c in (entry.compiled_fw, entry.compiled_bw) if c is not None]
    if not all(isinstance(c, NeuronOutputCode) and c.digest for c in codes):
        log.debug("warm start: %s has a graph without a cache entry (eager fallback?): not stored", key.short)
        return False
    entry.pre_save()
    entry.serialized_bw_module = None  # compiled autograd only; a pickled GraphModule is code we don't need
    entry.aot_joint_graph_str = entry.aot_forward_graph_str = entry.aot_backward_graph_str = None
    entry.min_cut_info_str = None
    with torch.utils._python_dispatch._disable_current_modes():
        blob = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    children = [{"kind": c.kind, "digest": c.digest} for c in codes]
    files = {WARM_FILE: blob, CHILDREN_FILE: json.dumps(children, sort_keys=True).encode()}
    summary = {"kernels": [], "whole_graph": True, "children": children}
    return store.publish(key, files, summary, seconds) is not None


# --------------------------------------------------------------------------------------------
# Hit: rebuild the callable


def load(gm: fx.GraphModule, example_inputs: Sequence[Any], key: Any) -> Callable[..., Any] | None:
    """The compiled callable for a whole Dynamo graph straight from the cache, or None."""
    fn = _load(key, gm, example_inputs)
    if fn is not None:
        from neuron_compile import warm_frames

        warm_frames.record_graph(gm, key.digest)  # a Dynamo package being built points at this entry
    return fn


def load_entry(digest: str) -> Callable[..., Any] | None:
    """The compiled callable of the warm-start entry ``digest`` (a Dynamo package's graph), or None."""
    from neuron_compile.cache.key import CacheKey

    return _load(CacheKey(digest=digest, parts={}), None, None)


def _load(key: Any, gm: fx.GraphModule | None, example_inputs: Sequence[Any] | None) -> Callable[..., Any] | None:
    import neuron_compile.simulator  # noqa: F401  (a one-time module import, not part of the cache's load time)
    from neuron_compile import compile_record, pipeline
    from neuron_compile.cache.key import CacheKey
    from neuron_compile.cache.store import CacheStore
    from neuron_compile.precompile import capture_dir

    if capture_dir() is not None:
        return None  # precompile's capture phase runs no kernel: it traces (and records) every graph
    start = time.perf_counter()
    store = CacheStore.default()
    entry = store.lookup(key) if store is not None else None
    if entry is None:
        return None
    try:
        children = json.loads(entry.read(CHILDREN_FILE))
        loaded: dict[str, tuple[str, Any, Any, dict[str, bytes]]] = {}
        for child in children:
            digest = str(child["digest"])
            sub = store.lookup(CacheKey(digest=digest, parts={}))
            if sub is None:
                log.info("neuron: warm-start entry %s needs graph %s, which is not cached: tracing", key.short,
                         digest[:12])
                return None
            files = sub.files()
            plan, sources = pipeline.load_artifacts(files)
            loaded[digest] = (str(child["kind"]), plan, sources, files)
        with torch.utils._python_dispatch._disable_current_modes():
            result = pickle.loads(entry.read(WARM_FILE))
        from neuron_compile.runtime import CompiledGraph

        for holder in (result.compiled_fw, result.compiled_bw):
            if holder is None:
                continue
            code = holder.result
            if not isinstance(code, NeuronOutputCode) or code.digest not in loaded:
                raise ValueError(f"its AOTAutograd result refers to a graph it does not list ({code!r})")
            _kind, plan, sources, _files = loaded[code.digest]
            graph: Any = CompiledGraph(plan, sources)
            if getattr(code, "complex_io", None):
                from neuron_compile.lowering.complex_pairs import with_complex_io

                graph = with_complex_io(graph, *code.complex_io)
            code.runner = _with_constants(graph, code.constants)
            if getattr(code, "uint64_outputs", None):
                from neuron_compile.lowering.decomp_hash import with_uint64_outputs

                code.runner = with_uint64_outputs(code.runner, code.uint64_outputs)
            if gm is not None and code.kind != "backward":  # its inputs are Dynamo's: errors name them as traced
                from neuron_compile.input_names import input_names, naming_inputs

                code.runner = naming_inputs(code.runner, input_names(gm))
        fn = _rebuild(result)
    except Exception as exc:  # never fail a compile because of the cache
        store.quarantine(key.digest, f"its warm-start state can't be loaded ({type(exc).__name__}: {exc})")
        return None
    ms = (time.perf_counter() - start) * 1000
    store.record_hit(entry, start, whole_graph=True)
    log.info("neuron: whole graph from the cache without tracing (%d graphs, %d kernels, %.1f ms)", len(loaded),
             sum(len(s) for _k, _p, s, _f in loaded.values()), ms)
    for digest, (kind, plan, sources, files) in loaded.items():
        stats = {"kind": kind, "kernels": len(sources), "plan": plan, "sources": sources, "cache_hit": True,
                 "ms": ms / len(loaded), "cache_load_ms": ms / len(loaded), "key": digest, "whole_graph": True,
                 "files": files}
        pipeline.record_stats(stats)
        if gm is not None and example_inputs is not None:
            compile_record.record_whole_graph(stats, gm, example_inputs)
    return fn


def _with_constants(graph: Any, constants: list[Any]) -> Callable[..., Any]:
    """The compiled graph, fed the graph's lifted tensor constants after the real inputs."""
    if not constants:
        return graph

    def run(*args: Any) -> Any:
        return graph(*args, *constants)

    return run


def _rebuild(result: Any) -> Callable[..., Any]:
    """torch's own reconstruction of AOTAutograd's runtime wrappers around the compiled graphs."""
    from torch._functorch._aot_autograd.aot_autograd_result import deserialize_bundled_cache_entry

    fn = deserialize_bundled_cache_entry(result)
    return torch._dynamo.disable(fn, reason="neuron-compile: AOT-compiled graph from the cache")
