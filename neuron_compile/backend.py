"""The ``neuron`` Dynamo backend: AOTAutograd -> lowering -> codegen -> runner.

``torch.compile(model, backend="neuron")`` calls :func:`neuron_backend` with each captured FX
graph. AOTAutograd (with our decomposition table) produces forward/backward ATen graphs; the joint
graph is checked for unsupported ops before anything runs, so a refusal names forward *and*
backward ops at the first call. Each ATen graph is compiled by :func:`compile_aten_graph` into a
:class:`~neuron_compile.runtime.CompiledGraph`.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from neuron_compile import torch_fixes
from neuron_compile.config import config
from neuron_compile.errors import ConfigError, DynamicShapeError, source_line
from neuron_compile.input_names import input_names, naming_inputs
from neuron_compile.pipeline import (  # noqa: F401  (the pipeline's names, also reachable from here)
    build_artifacts,
    check_lowerable,
    compile_lowerable,
    compiled_graphs,
    describe_inputs,
    last_compiled,
    load_artifacts,
    record_stats,
    reset,
    stored_graph,
    unsupported_nodes,
)

log = logging.getLogger(__name__)
torch_fixes.install()  # PyTorch's tracing kernels that disagree with eager, corrected before any trace

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



def _validate_options(options: dict[str, Any] | None) -> dict[str, Any]:
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"torch.compile(backend='neuron', options=...): unknown option(s) {', '.join(unknown)}; "
                          f"valid options: {', '.join(sorted(OPTIONS))}")
    return {OPTIONS[k]: v for k, v in options.items()}


# torch.compile's modes, as a model written for another backend passes them. They name Inductor's trade-offs, which
# this backend has no switch for: kernel configurations are always chosen by the cost model (what max-autotune
# searches for by timing), and reduce-overhead's CUDA graphs have no counterpart here. So each compiles as the
# default, with one warning saying so; a mode torch does not know is refused.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_modes_warned: set[str] = set()


def _check_mode(mode: str | None) -> None:
    if mode in (None, "default"):
        return
    if mode not in MODES:
        raise ConfigError(f"torch.compile(backend='neuron', mode={mode!r}): unknown mode; torch.compile's modes are "
                          f"{', '.join(repr(m) for m in MODES)} (backend settings go in options=...)")
    if mode not in _modes_warned:
        _modes_warned.add(mode)
        warnings.warn(f"torch.compile(backend='neuron', mode={mode!r}) compiles as mode='default': the neuron "
                      "backend always picks kernel configurations with its cost model and has no CUDA graphs, so the "
                      "mode changes nothing", stacklevel=2)


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
        from neuron_compile import compile_record

        self.gm = gm
        self.make_backend = make_backend
        self.distributed = distributed
        self.compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.compile_id = compile_record.current_compile_id()  # later per-shape compiles run outside Dynamo's context

    @staticmethod
    def signature(args: Sequence[Any]) -> tuple[Any, ...]:
        return tuple((tuple(a.shape), a.dtype, tuple(a.stride()), a.requires_grad) if isinstance(a, torch.Tensor)
                     else ("value", a) for a in args)

    def __call__(self, *args: Any) -> Any:
        key = self.signature(args)
        fn = self.compiled.get(key)
        if fn is None:
            from neuron_compile import compile_record

            log.info("neuron: new input shapes %s: compiling a static graph", [k[0] for k in key])
            from neuron_compile.rank_agreement import maybe_agree

            compile_record.dynamo_graph(self.gm, self.compile_id)
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


def _normalized(gm: fx.GraphModule, forward_outputs: int | None = None) -> fx.GraphModule:
    """``gm`` (changed in place) as every ATen graph is lowered: conds inlined, effectful checks as assertions,
    scalar ops folded, eigenvalues / SVDs / pinv as Jacobi sweeps. The joint graph goes through it too (with the
    number of its outputs that are the forward's), so a training graph is refused as it will compile, and an
    eigh / svd whose vectors only the backward reads is decomposed there."""
    from neuron_compile.lowering.decomp_cond import inline_cond
    from neuron_compile.lowering.decomp_linalg import effectful_checks_as_asserts
    from neuron_compile.lowering.decomp_spectral import spectral_ops
    from neuron_compile.lowering.graph_passes import fold_scalar_ops

    return spectral_ops(fold_scalar_ops(effectful_checks_as_asserts(inline_cond(gm))), forward_outputs)


def _compile_aten_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Callable[..., Any]:
    from neuron_compile import compile_record, precompile
    from neuron_compile.lowering.graph_passes import lift_constants

    gm, constants = lift_constants(_normalized(gm))
    if constants:  # tensor literals of the graph: passed after the real inputs on every call
        inner = _compile_aten_graph(gm, [*example_inputs, *constants], kind)

        def with_constants(*args: Any) -> Any:
            return inner(*args, *constants)

        with_constants.neuron_constants = constants  # type: ignore[attr-defined]  (a warm start needs them)
        if hasattr(inner, "neuron_complex_io"):
            with_constants.neuron_complex_io = inner.neuron_complex_io  # type: ignore[attr-defined]
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

    from neuron_compile.lowering.decomp_hash import rewrite_hashes

    hashes = rewrite_hashes(gm)
    if hashes is not None:  # hash_tensor's uint64 results as int32 word pairs, viewed as uint64 on the way out
        return hashes.wrap(_compile_aten_graph(hashes.gm, example_inputs, kind))

    from neuron_compile.lowering.complex_pairs import as_real_pairs

    pairs = as_real_pairs(gm)
    if pairs is not None:  # complex values as real pairs; complex inputs / outputs converted at the boundary
        real = [torch.view_as_real(x.resolve_conj()) if i in pairs.complex_inputs else x
                for i, x in enumerate(example_inputs)]
        return pairs.wrap(_compile_aten_graph(pairs.gm, real, kind))

    if precompile.capture_dir() is not None:  # `neuron-compile precompile`: record the graph, run nothing
        return precompile.capture(gm, list(example_inputs), kind)
    with compile_record.graph(gm, example_inputs, kind) as rec:
        if has_collectives(gm):  # cut at each collective; the segments come back here one by one
            runner: Callable[..., Any] = compile_with_collectives(gm, example_inputs, kind, compile_aten_graph)
        elif config.fallback == "eager" and unsupported_nodes(gm):
            runner = _partial_compiler()(gm, example_inputs, kind)
        else:
            runner = compile_lowerable(gm, example_inputs, kind)
            rec.add_unit(gm, example_inputs, last_compiled())
        return compile_record.finish(rec, gm, runner)


PartialCompiler = Callable[[fx.GraphModule, Sequence[Any], str], Callable[..., Any]]
_PARTIAL: list[PartialCompiler] = []


def set_partial_compiler(compiler: PartialCompiler) -> None:
    """Who compiles a graph with unsupported ops under ``fallback="eager"``: :mod:`neuron_compile.fallback`
    registers itself here when imported (the package imports it with the backend); the core never imports it."""
    _PARTIAL[:] = [compiler]


def _partial_compiler() -> PartialCompiler:
    if not _PARTIAL:
        raise ConfigError("fallback='eager' needs neuron_compile.fallback, which was never imported: use "
                          "torch.compile(..., backend='neuron') (the package wires it in), or import "
                          "neuron_compile.fallback before compiling")
    return _PARTIAL[0]


def verify_entry_by_recompiling(manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Recompile an untrusted entry's stored graph and compare bytes (raises ``VerificationFailed``)."""
    from neuron_compile.rebuild import verify_by_recompiling

    verify_by_recompiling(manifest, files)


def _register_cache_hooks() -> None:
    from neuron_compile.cache import remote

    remote.set_verifier(verify_entry_by_recompiling)  # unsigned remote entries are verified this way
    try:
        enabled = config.warm_frames
    except ConfigError as exc:  # a malformed cache setting: one warning, the feature off (docs/cache.md)
        log.warning("neuron-compile cache: %s; warm frames are off in this process", exc)
        enabled = False
    if enabled:  # on by default: warm starts skip Dynamo's capture too (NEURON_COMPILE_WARM_FRAMES=0: off)
        from neuron_compile import warm_frames

        # hooks into torch.compile (knob off: torch untouched)
        warm_frames.install(lambda: neuron_backend)


_register_cache_hooks()


def _check_devices(example_inputs: Sequence[Any], names: Sequence[str] = ()) -> None:
    """Refuse, naming it, an input on a device other than the CPU (a ``meta`` tensor has no values to compute), or
    a nested or sparse one."""
    from neuron_compile.errors import InputDeviceError, UnsupportedOpError

    for i, x in enumerate(example_inputs):
        name = names[i] if i < len(names) else ""
        if isinstance(x, torch.Tensor) and (x.is_nested or x.is_sparse):
            kind = "nested (jagged)" if x.is_nested else "sparse"
            fix = ("pad it into a dense tensor (torch.nested.to_padded_tensor(x, 0.0)) with a mask, and compile the "
                   "code that takes the padded tensor" if x.is_nested else "make it dense with .to_dense()")
            raise UnsupportedOpError(f"input {name}({i}) of the compiled graph is a {kind} tensor, which the neuron backend "
                                     f"does not compile (NeuronCore kernels take dense tensors of static shape): {fix}")
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            what = f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
            hint = (" (a meta tensor has no values: infer shapes by running the model eagerly on meta tensors, "
                    "outside torch.compile)" if x.device.type == "meta" else "")
            raise InputDeviceError(f"the {what} input {name}of the compiled graph (its input {i}) is on device "
                                   f"'{x.device}'; compiled graphs take CPU tensors, which the runner moves to the "
                                   f"NeuronCore: move it with .cpu(){hint}")


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
    from neuron_compile.lowering.decompositions import decompositions

    overrides = _validate_options(options)
    from neuron_compile import compile_record

    compile_record.dynamo_graph(gm)
    from neuron_compile.lowering.decomp_conv import rewrite_interpolate
    from neuron_compile.lowering.decomp_flex import rewrite_flex_attention
    from neuron_compile.lowering.torchvision_ops import rewrite_torchvision_ops

    backend_id = getattr(gm, "_backend_id", None)  # names the graph in a Dynamo package (neuron_compile.warm_frames)
    names = input_names(gm)  # Dynamo's sources of the inputs, for messages (the rewrites below drop them)
    gm = rewrite_interpolate(gm)  # PyTorch decomposes upsample ops above autograd: replace them before AOT
    gm = rewrite_flex_attention(gm)  # a higher-order op with no ATen decomposition: its dense math, before AOT
    gm = rewrite_torchvision_ops(gm)  # roi_align, deform_conv2d: C++ ops (own autograd): tensor math, before AOT
    if backend_id is not None:
        gm._backend_id = backend_id
    _check_mode(mode)
    _check_devices(example_inputs, names)
    _warn_float64(example_inputs)

    def with_config(fn: Callable[..., Any], boxed: bool = True) -> Callable[..., Any]:
        from torch._functorch.aot_autograd import make_boxed_func

        def inner(*args: Any, **kwargs: Any) -> Any:
            with config.patch(**overrides):
                compiled = fn(*args, **kwargs)
            return make_boxed_func(compiled) if boxed else compiled  # AOT's calling convention: f(list_of_args)

        return inner

    def fw_compiler(fgm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        return naming_inputs(compile_aten_graph(fgm, inputs, "forward"), names)

    def bw_compiler(bgm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        with rank_agreement.maybe_agree(distributed, "a backward graph"):  # compiled at the first .backward()
            return compile_aten_graph(bgm, inputs, "backward")

    def inference_compiler(igm: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        return naming_inputs(compile_aten_graph(igm, inputs, "inference"), names)

    def partition_fn(joint: fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any) -> Any:
        # The joint graph holds forward and backward ops: refuse now, not at the first .backward().
        with config.patch(**overrides):
            strict = config.fallback != "eager"  # eager fallback: each graph is split when compiled
        # as the forward and backward compilers will (the partition keeps the constants and the checks)
        _normalized(joint, kwargs.get("num_fwd_outputs"))
        if strict:
            from neuron_compile.lowering.complex_pairs import as_real_pairs
            from neuron_compile.lowering.decomp_hash import returned_hashes

            pairs = as_real_pairs(joint)  # what the forward and backward compilers will lower
            checked = pairs.gm if pairs is not None else joint
            check_lowerable(checked, "training graph (forward + backward)", returned_hashes(checked))
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
            decompositions=decompositions(),
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

        def publish(entry: Any) -> None:
            if warm_start.publish_entry(key, entry, time.perf_counter() - start):
                from neuron_compile import warm_frames

                warm_frames.record_graph(gm, key.digest)

        with warm_start.capturing(key, publish):
            return make_backend(serializable=True)(gm, example_inputs)
