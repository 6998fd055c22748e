"""Run a compiled :class:`~neuron_compile.lowering.ir.Plan`: call its kernels in order on flat HBM buffers.

Executors (``config.executor`` / ``NEURON_COMPILE_EXECUTOR``):

- ``simulator``: the bundled NKI CPU simulator (default when the real ``nki`` is not installed);
- ``nki-simulate``: the real ``nki.simulate`` (``nki`` installed, no Neuron device);
- ``nki-jit``: ``nki.jit`` kernels on a Neuron device;
- ``auto``: the first that applies, in the order nki-jit, nki-simulate, simulator.

Graph inputs are passed as flat views of their storage (no copy for dense tensors); pure views
between kernels cost nothing; outputs are strided views of the result buffers.

Execution is device-resident (:mod:`neuron_compile.device`): per call, each graph input is copied to
the device once, kernels pass device buffers to each other (intermediates never return to the host)
and each graph output is copied back once; ``CompiledGraph.transfers`` counts the last call's copies.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import logging
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neuron_compile.codegen.render import kernel_identity
from neuron_compile.config import config
from neuron_compile.errors import (
    InputRangeError,
    NeuronCompileError,
    RuntimeExecutionError,
    device_check_error,
)
from neuron_compile.host_memory import numpy_view, torch_copy
from neuron_compile.lowering.dtypes import BY_NAME, numpy_type
from neuron_compile.lowering.ir import Plan
from neuron_compile.lowering.ops.random import draw

log = logging.getLogger(__name__)

_TRANSFERS: collections.deque[dict[str, Any]] = collections.deque(maxlen=1024)


def recent_transfers() -> list[dict[str, Any]]:
    """Per graph call (oldest first, last 1024): kernel calls, graph inputs/outputs and the host<->device
    copies it made (``host_to_device``, ``device_to_host`` and their bytes)."""
    return list(_TRANSFERS)


def clear_transfers() -> None:
    _TRANSFERS.clear()


def neuron_device_present() -> bool:
    return any(Path("/dev").glob("neuron[0-9]*"))


@functools.lru_cache(maxsize=1)
def real_nki() -> Any | None:
    """The real ``nki`` module when a working one is installed (PyPI's placeholder raises on import)."""
    if importlib.util.find_spec("nki") is None:
        return None
    try:
        import nki  # type: ignore[import-not-found]

        return nki if hasattr(nki, "simulate") and hasattr(nki, "jit") else None
    except Exception as exc:  # the PyPI placeholder raises on import
        log.info("the installed nki package is not usable (%s); using the bundled simulator", exc)
        return None


def select_executor() -> str:
    choice = config.executor
    if choice == "auto":
        if real_nki() is not None:
            return "nki-jit" if neuron_device_present() else "nki-simulate"
        return "simulator"
    if choice in ("nki-simulate", "nki-jit") and real_nki() is None:
        raise NeuronCompileError(
            f"NEURON_COMPILE_EXECUTOR={choice} needs the real `nki` package, which is not installed (or is PyPI's "
            f"placeholder). Install it from the Neuron package repository "
            f"(pip install --extra-index-url https://pip.repos.neuron.amazonaws.com 'neuron-compile[neuron]') "
            f"or use NEURON_COMPILE_EXECUTOR=simulator.")
    if choice == "nki-jit" and not neuron_device_present():
        raise NeuronCompileError("NEURON_COMPILE_EXECUTOR=nki-jit needs a Neuron device (/dev/neuron*); none found. "
                                 "Use nki-simulate or simulator.")
    return choice


def load_kernels(sources: Sequence[tuple[str, str]], executor: str) -> list[Callable[..., Any]]:
    """Turn rendered sources into callables that take and return NumPy arrays.

    Identical kernels (same source but for the name, e.g. one per transformer layer) are loaded
    (and, on the real toolchain, compiled) once and shared.
    """
    unique: dict[str, Callable[..., Any]] = {}
    fns = []
    for name, src in sources:
        ident = kernel_identity(name, src)
        if ident not in unique:
            unique[ident] = _load_one(name, src, executor)
        fns.append(unique[ident])
    if len(unique) < len(fns):
        log.debug("loaded %d unique kernels for %d kernel calls", len(unique), len(fns))
    return fns


def _load_one(name: str, src: str, executor: str) -> Callable[..., Any]:
    if executor == "simulator":
        from neuron_compile import simulator

        glb = simulator.load_kernel_source(src, filename=f"<nki:{name}>")
        grid = int(glb.get("LAUNCH_GRID", 1))  # SPMD kernels: one program per physical core
        return simulator.simulate(glb[name][grid] if grid > 1 else glb[name], strict_capacity=True, resident=True)
    nki = real_nki()
    assert nki is not None
    folder = Path(tempfile.mkdtemp(prefix="neuron_compile_kernels_"))
    path = folder / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"neuron_compile_kernels.{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    kernel = getattr(module, name)
    grid = int(getattr(module, "LAUNCH_GRID", 1))  # SPMD kernels: one program per physical core
    if grid > 1:
        kernel = kernel[grid]
    if executor == "nki-simulate":
        return nki.simulate(kernel)
    from neuron_compile.device import cached_jit_kernel

    # nki.jit kernels take and return device tensors (NeuronDevice); compilations persist per source.
    return cached_jit_kernel(kernel, kernel_identity(name, src), name, config.target,
                             str(getattr(nki, "__version__", "unknown")))


def to_numpy(t: torch.Tensor, nki_dtype: str, what: Callable[[], str] = lambda: "an input of the compiled graph"
             ) -> np.ndarray:
    """The host array a graph input (``what()`` describes it in errors) is uploaded from. Reads the tensor's memory
    without ``Tensor.numpy()``, which would make its storage non-resizable for good (FSDP2 resizes the storage
    of unsharded parameters; see :mod:`neuron_compile.host_memory`)."""
    if t.dtype == torch.int64:
        lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 0)
        if hi > 2**31 - 1 or lo < -(2**31):
            raise InputRangeError(f"{what()} holds values outside int32 (from {lo} to {hi}), which NeuronCores "
                                  "cannot represent (int64 runs as int32 there); keep its values within "
                                  "[-2**31, 2**31) or keep this computation on the host (outside the compiled region)")
        return numpy_view(t.to(torch.int32))
    if t.dtype == torch.float64:
        narrow = t.to(torch.float32)
        if t.numel() and bool((narrow.isinf() & t.isfinite()).any()):
            raise InputRangeError(f"{what()} holds finite values beyond float32's range (|x| > 3.4e38), "
                                  "which become inf in the float32 the NeuronCores compute in; scale them "
                                  "into range or keep this computation on the host (outside the compiled region)")
        return numpy_view(narrow)
    return numpy_view(t)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A graph output: a torch-owned tensor (resizable storage, as eager's) holding a copy of ``a``."""
    return torch_copy(a)


class CompiledGraph:
    """A callable that runs one compiled ATen graph."""

    def __init__(self, plan: Plan, sources: Sequence[tuple[str, str]], executor: str | None = None) -> None:
        self.plan = plan
        self.sources = list(sources)
        self.executor = executor or select_executor()
        self.target = config.target  # the generation the kernels were generated for (and must run under)
        self.kernels = load_kernels(self.sources, self.executor)
        self.transfers: Any = None  # the last call's host<->device copies (neuron_compile.device.Transfers)
        views: dict[int, set[tuple[Any, ...]]] = {}
        for spec in plan.outputs:
            if spec.buffer is not None:
                views.setdefault(spec.buffer, set()).add(_view_key(spec))
        self._shared = {buffer for buffer, keys in views.items() if len(keys) > 1}  # buffers of several output views

    def __call__(self, *args: Any) -> list[Any]:
        from neuron_compile.device import device_for

        device = device_for(self.executor)
        bufs = self._stage(args, device)
        with self._target():
            self._run_calls(bufs, device)
        flags = {check.buffer for check in self.plan.checks}
        host: list[Any] = [device.download(b) if i in flags and b is not None else None for i, b in enumerate(bufs)]
        self._check(host)  # device-side assertions: their flags come back first, before any output
        wanted = {spec.buffer for spec in self.plan.outputs if spec.buffer is not None}
        for i in wanted - flags:
            if bufs[i] is not None:
                host[i] = device.download(bufs[i])
        self.transfers = device.transfers
        staged = sum(1 for ref in self.plan.buffers if ref.kind in ("input", "random", "empty"))
        _TRANSFERS.append({"executor": self.executor, "kernel_calls": len(self.plan.calls), "graph_inputs": staged,
                           "graph_outputs": len(wanted), "check_flags": len(flags - wanted),
                           **device.transfers.as_dict()})
        log.debug("graph call: %d host->device and %d device->host copies", device.transfers.host_to_device,
                  device.transfers.device_to_host)
        return self.outputs(host)

    def run_buffers(self, *args: Any) -> list[np.ndarray | None]:
        """Run every kernel; returns all flat buffers (inputs, intermediates, results) by plan buffer index,
        each copied back to the host (for inspection: check mode compares every intermediate)."""
        from neuron_compile.device import device_for

        device = device_for(self.executor)
        bufs = self._stage(args, device)
        with self._target():
            self._run_calls(bufs, device)
        self.transfers = device.transfers
        host = [None if b is None else device.download(b) for b in bufs]
        self._check(host)
        return host

    def _stage(self, args: Sequence[Any], device: Any) -> list[Any]:
        """The plan's buffers with every graph input (and host-made buffer) copied to the device once."""
        plan = self.plan
        bufs: list[Any] = [None] * len(plan.buffers)
        for b, ref in enumerate(plan.buffers):
            if ref.kind == "empty":  # a zero-element value: no kernel computes it
                bufs[b] = device.upload(np.zeros(0, dtype=numpy_type(ref.dtype)))
                continue
            if ref.kind == "random":  # torch's CPU generator, in graph order (see lowering.ops.random)
                bufs[b] = device.upload(to_numpy(draw(plan.randoms[ref.index]), ref.dtype))
                continue
            if ref.kind != "input":
                continue
            spec = plan.inputs[ref.index]
            t = args[ref.index]
            if t is None and 0 in spec.shape:  # an effect token (AOTAutograd passes None; decomp_linalg)
                bufs[b] = device.upload(np.zeros(0, dtype=numpy_type(ref.dtype)))
                continue
            if not isinstance(t, torch.Tensor):
                raise RuntimeExecutionError(f"input {ref.index}: expected a tensor, got {type(t).__name__}")
            t = t.detach()
            if tuple(t.shape) != tuple(spec.shape):
                raise RuntimeExecutionError(
                    f"input {ref.index} of the compiled graph has shape {list(t.shape)}, but the graph was compiled "
                    f"for {list(spec.shape)}. AOTAutograd passes a tensor made at run time in place of overlapping "
                    f"inputs that are not views of one another (e.g. two .detach()ed overlapping slices of one "
                    f"tensor, one of them changed in place), and can size it differently than at compile time: pass "
                    f"the slices as views of their base (no .detach()) or .clone() them")
            if tuple(t.stride()) != spec.strides and t.numel() > 1:
                # Kernels address the buffer with the compiled strides (e.g. a saved activation AOTAutograd
                # expects column-major): lay the data out exactly that way, not merely contiguously.
                t = torch.empty_strided(spec.shape, spec.strides, dtype=t.dtype).copy_(t)
            flat = torch.as_strided(t, (ref.numel,), (1,), t.storage_offset()) if t.numel() else t.reshape(-1)
            try:
                bufs[b] = device.upload(to_numpy(flat, ref.dtype, lambda t=t, i=ref.index: (
                    f"the {str(t.dtype).removeprefix('torch.')}{list(t.shape)} input of the compiled graph "
                    f"(its input {i})")))
            except InputRangeError as exc:
                exc.tensor = args[ref.index]
                raise
        return bufs

    def _check(self, bufs: list[np.ndarray | None]) -> None:
        """Device-side assertions (index bounds, int32 overflow): raise before any output is returned."""
        for check in self.plan.checks:
            flag = bufs[check.buffer]
            if flag is None or not flag.size:
                continue
            if (check.whole and np.any(flag)) or (not check.whole and not flag.reshape(-1)[check.offset]):
                raise device_check_error(check.kind)(check.message)

    def _target(self) -> Any:
        if self.executor != "simulator":
            return contextlib.nullcontext()  # the real nki reads NEURON_PLATFORM_TARGET_OVERRIDE itself
        from neuron_compile.simulator import use_target

        return use_target(self.target)

    def _run_calls(self, bufs: list[Any], device: Any) -> None:
        for call in self.plan.calls:
            fn = self.kernels[call.kernel]
            outs = fn(*[bufs[a] for a in call.args])
            if not isinstance(outs, tuple):
                outs = (outs,)
            for slot, buf in enumerate(call.results):
                bufs[buf] = device.flat(outs[slot])

    def outputs(self, bufs: list[np.ndarray | None]) -> list[Any]:
        """The graph outputs: torch tensors over the result buffers (one torch-owned storage per buffer, so
        outputs of one buffer share memory as they do in eager). An output is a plain tensor placed on the storage
        with ``set_``, not an ``as_strided`` view: eager ops return non-views, and FSDP2 and autograd treat
        views differently (in-place ops on views rebase their grad_fn). Two exceptions keep autograd's in-place
        checks as eager has them (an in-place change of a user output that the backward also reads must bump the
        version counter autograd checks before it uses the saved value): outputs that are the same value (buffer,
        view, dtype) are one tensor object, and different views of one buffer are views of one tensor over it,
        which gives them one version counter, as views of one eager result have."""
        plan = self.plan
        results: list[Any] = []
        storages: dict[int, torch.Tensor] = {}
        made: dict[tuple[Any, ...], torch.Tensor] = {}
        for spec in plan.outputs:
            if spec.buffer is None:
                results.append(spec.literal)
                continue
            key = (spec.buffer, *_view_key(spec))
            if key in made:
                results.append(made[key])
                continue
            data = bufs[spec.buffer]
            assert data is not None
            if spec.buffer not in storages:
                storages[spec.buffer] = to_torch(data)
            flat = storages[spec.buffer]
            want = BY_NAME[spec.torch_dtype]
            if flat.numel() == 0 or math.prod(spec.shape) == 0:
                out = torch.empty(spec.shape, dtype=want)
            elif flat.dtype == want and spec.buffer in self._shared:
                out = flat.as_strided(spec.shape, spec.strides, spec.offset)
            else:
                placed = torch.bool if want == torch.bool and flat.dtype == torch.uint8 else flat.dtype
                out = torch.empty(0, dtype=placed).set_(flat.untyped_storage(), spec.offset, spec.shape, spec.strides)
                if want == torch.bool and out.dtype != torch.bool:
                    out = out != 0
                elif out.dtype != want:
                    out = out.to(want)
                if spec.layout is not None and spec.buffer not in self._shared:  # eager's layout (channels_last, ...)
                    out = torch.empty_strided(spec.shape, spec.layout, dtype=out.dtype).copy_(out)
            made[key] = out
            results.append(out)
        return results


def _view_key(spec: Any) -> tuple[Any, ...]:
    return (spec.offset, tuple(spec.shape), tuple(spec.strides), spec.torch_dtype)


def plan_to_json(plan: Plan, kernel_names: Sequence[str]) -> dict[str, Any]:
    """The runner's part of a plan (what a cache hit needs besides the kernel sources)."""
    from neuron_compile.lowering.ir import kernel_to_json
    from neuron_compile.lowering.ir_base import plain

    return {
        "kernel_names": list(kernel_names),
        "kernels": [kernel_to_json(k) for k in plan.kernels],
        "buffers": plain(plan.buffers),
        "calls": plain(plan.calls),
        "inputs": plain(plan.inputs),
        "outputs": plain(plan.outputs),
        "checks": plain(plan.checks),
        "randoms": plain(plan.randoms),
    }


def plan_from_json(data: dict[str, Any]) -> Plan:
    from neuron_compile.lowering.ir import (
        BufferRef,
        DeviceCheck,
        InputSpec,
        KernelCall,
        OutputSpec,
        RandomSpec,
        kernel_from_json,
    )

    def tup(d: dict[str, Any]) -> dict[str, Any]:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

    return Plan(
        kernels=tuple(kernel_from_json(k) for k in data.get("kernels", ())),
        buffers=tuple(BufferRef(**tup(b)) for b in data["buffers"]),
        calls=tuple(KernelCall(**tup(c)) for c in data["calls"]),
        inputs=tuple(InputSpec(**tup(i)) for i in data["inputs"]),
        outputs=tuple(OutputSpec(**tup(o)) for o in data["outputs"]),
        checks=tuple(DeviceCheck(**c) for c in data.get("checks", ())),
        randoms=tuple(RandomSpec(**tup(r)) for r in data.get("randoms", ())),
    )


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
