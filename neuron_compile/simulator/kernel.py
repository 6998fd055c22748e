"""Running kernels: ``jit`` / ``simulate`` wrappers, argument conversion and result hand-back.

NumPy arrays and CPU torch tensors become ``nl.hbm`` tensors (``nl.shared_hbm`` for a launch grid; copies, one per
launch); other arguments pass through. The kernel body runs eagerly under a fresh :class:`SimState` (one per SPMD
program for ``kernel[n]``, run one after the other, or as two threads when an LNC2 kernel synchronises its cores:
simulator/lnc.py). Returned tensors must be in ``nl.shared_hbm`` or be an argument (an in-place kernel returning the
tensor it wrote); they come back as arrays of the caller's kind (an argument
comes back as the caller's own object). HBM arguments the kernel wrote are copied back into the
caller's arrays. On-chip capacity is strict (over-budget allocations raise) for the backend's own
kernels (``simulate(k, strict_capacity=True)``) and a warning otherwise, as in AWS's simulator.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from neuron_compile.errors import RemovedAPIError, SimulatorError
from neuron_compile.simulator import dtypes as _dt
from neuron_compile.simulator import lnc as _lnc
from neuron_compile.simulator import state as _state
from neuron_compile.simulator import trace as _trace
from neuron_compile.simulator.allocation import check_capacity
from neuron_compile.simulator.tensor import SHARED_HBM, NkiTensor, kernel_argument, to_numpy

log = logging.getLogger(__name__)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        raise SimulatorError(f"the simulator takes CPU tensors, got a tensor on {t.device}")
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_dt.low_precision_types()["bfloat16"])
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().view(_dt.low_precision_types()[str(t.dtype).removeprefix("torch.")])
    return t.numpy()


def _numpy_to_torch(a: np.ndarray) -> Any:
    import torch

    name = a.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(getattr(torch, name))
    if name == "float8_e4m3":
        return torch.from_numpy(a.astype(np.float32))
    return torch.from_numpy(np.ascontiguousarray(a))


class _Arg:
    __slots__ = ("orig", "tensor", "torch")

    def __init__(self, orig: Any, tensor: NkiTensor, is_torch: bool) -> None:
        self.orig = orig
        self.tensor = tensor
        self.torch = is_torch


def _convert(x: Any, i: int, args: list[_Arg], shared: bool = False) -> Any:
    is_t = _is_torch(x)
    if not (is_t or isinstance(x, np.ndarray)):
        if isinstance(x, (tuple, list)) and any(_is_torch(v) or isinstance(v, np.ndarray) for v in x):
            return type(x)(_convert(v, i, args, shared) for v in x)
        return x
    arr = _torch_to_numpy(x) if is_t else x
    if arr.dtype in (np.float64, np.int64, np.uint64):
        from neuron_compile.config import config

        narrow = {"float64": "float32", "int64": "int32", "uint64": "uint32"}[arr.dtype.name]
        if arr.dtype == np.float64 and config.float64 == "error":
            raise SimulatorError(f"argument {i} is float64, which Trainium does not support "
                                 "(NEURON_COMPILE_FLOAT64=error); pass float32")
        warnings.warn(f"argument {i} is {arr.dtype.name}: simulated as {narrow} (Trainium has no 64-bit dtypes)",
                      UserWarning, stacklevel=4)
    t = kernel_argument(arr, f"arg{i}", shared)
    args.append(_Arg(x, t, is_t))
    return t


def _write_back(a: _Arg) -> None:
    vals = to_numpy(a.tensor)
    if a.torch:
        import torch

        src = _numpy_to_torch(vals)
        with torch.no_grad():
            a.orig.copy_(src.to(a.orig.dtype).reshape(a.orig.shape))
    else:
        a.orig[...] = vals.astype(a.orig.dtype) if vals.dtype != a.orig.dtype else vals


def _result(r: Any, as_torch: bool, by_storage: dict[int, _Arg], resident: frozenset[int] | None = None) -> Any:
    if isinstance(r, NkiTensor):
        if resident is not None and (r.buffer is SHARED_HBM or id(r.storage) in resident):
            return r  # device-resident execution: an output, or a device argument, stays on the device
        arg = by_storage.get(id(r.storage))
        if arg is not None:
            if r.offset == 0 and r.shape == arg.tensor.shape and r.strides == arg.tensor.strides:
                return arg.orig  # an in-place kernel returning the argument it wrote (written back above)
            a = to_numpy(r)  # a view of an argument: its values
            return _numpy_to_torch(a) if as_torch else a
        if r.buffer is not SHARED_HBM:
            raise SimulatorError(f"kernel returned tensor '{r.name}' in nl.{r.buffer.value}: returned tensors must be "
                                 "allocated with buffer=nl.shared_hbm (copy SBUF/PSUM results there with "
                                 "nisa.dma_copy; nl.hbm/private_hbm outputs fail to compile since NKI 0.3.0) or be "
                                 "one of the kernel's arguments")
        a = to_numpy(r)
        return _numpy_to_torch(a) if as_torch else a
    if isinstance(r, (tuple, list)):
        return type(r)(_result(v, as_torch, by_storage, resident) for v in r)
    if isinstance(r, dict):
        return {k: _result(v, as_torch, by_storage, resident) for k, v in r.items()}
    return r


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    return ThreadpoolController()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Kernels issue many small (<= 128x128x512) GEMMs. On idle cores BLAS threads still help (2 cores:
    ~1.4x), but once every core is busy they only contend (measured 3x slower per GEMM under load), so
    BLAS runs single-threaded whenever the 1-minute load average already fills the machine."""
    try:
        busy = os.getloadavg()[0] >= (os.cpu_count() or 1) - 0.5
    except OSError:
        busy = False
    if not busy:
        yield
        return
    with _blas_controller().limit(limits=1, user_api="blas"):
        yield


def _run_sequential(fn: Callable[..., Any], cargs: list[Any], ckw: dict[str, Any], grid: tuple[int, ...],
                    programs: int, strict_capacity: bool) -> Any:
    """The programs one after the other (program 0's result); program i > 0 replays program 0's shared_hbm
    allocations (the same storages)."""
    result = None
    shared: list[Any] = []
    for pid in range(programs):
        st = _state.SimState(program_id=(pid,) if grid else (), grid=grid, strict_capacity=strict_capacity)
        st.shared_replay = shared if pid else None
        _state.push(st)
        try:
            with single_threaded_blas():
                out = fn(*cargs, **ckw)
            check_capacity(getattr(fn, "__name__", "kernel"))
        finally:
            _state.pop(st)
        if pid == 0:
            result = out
            shared = st.shared
    return result


def run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], grid: tuple[int, ...] = (),
        strict_capacity: bool = False, resident: bool = False) -> Any:
    """Simulate ``fn(*args, **kwargs)`` and return its results converted to the caller's array kind.

    HBM tensors (``NkiTensor``) passed as arguments are used in place: they are the simulated device's
    memory, which persists across kernel calls. With ``resident=True`` returned HBM tensors stay
    tensors too (no copy back to the host), so a runner can chain kernels on device memory."""
    conv: list[_Arg] = []
    programs = math.prod(grid) if grid else 1
    cargs = [_convert(a, i, conv, programs > 1) for i, a in enumerate(args)]
    ckw = {k: _convert(v, -1, conv, programs > 1) for k, v in kwargs.items()}
    as_torch = any(a.torch for a in conv)
    if _trace.ACTIVE is not None:
        _trace.mark_kernel(getattr(fn, "__name__", "kernel"))
    # The engines compute IEEE results (inf, NaN) without complaint: numpy's floating-point warnings about them
    # would reach the user's console from every kernel whose inputs hold an inf or NaN.
    if programs == 2 and _lnc.synchronises(fn):
        with single_threaded_blas():
            result = _lnc.run_programs(fn, cargs, ckw, grid, strict_capacity, check_capacity)
    else:
        with np.errstate(all="ignore"):
            result = _run_sequential(fn, cargs, ckw, grid, programs, strict_capacity)
    for a in conv:
        if a.tensor.storage.written:
            _write_back(a)
    device_args = frozenset(id(x.storage) for x in (*args, *kwargs.values()) if isinstance(x, NkiTensor))
    return _result(result, as_torch, {id(a.tensor.storage): a for a in conv}, device_args if resident else None)


class Kernel:
    """A ``@nki.jit`` kernel: calling it with arrays simulates it; inside a kernel it is inlined."""

    def __init__(self, fn: Callable[..., Any], grid: tuple[int, ...] = (), options: dict[str, Any] | None = None,
                 strict_capacity: bool = False):
        self.fn = fn
        self.grid = grid
        self.options = dict(options or {})
        self.strict_capacity = strict_capacity
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Kernel:
        g = tuple(int(x) for x in grid) if isinstance(grid, (tuple, list)) else (int(grid),)
        return Kernel(self.fn, g, self.options, self.strict_capacity)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _state.in_kernel():
            return self.fn(*args, **kwargs)
        return run(self.fn, args, kwargs, self.grid, self.strict_capacity)

    def with_schedule(self, edges: Any) -> Kernel:
        return self

    def __repr__(self) -> str:
        return f"<nki kernel {getattr(self.fn, '__name__', self.fn)!r}>"


def jit(fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """``@nki.jit`` / ``@nki.jit(**kwargs)``: wrap a kernel (``mode=`` ignored, ``platform_target=`` rejected)."""
    if "platform_target" in kwargs:
        raise RemovedAPIError("nki.jit(platform_target=...) raises since NKI 0.3.0; set the env var "
                              "NEURON_PLATFORM_TARGET_OVERRIDE=trn1|trn2|trn3 instead")
    if "mode" in kwargs:
        warnings.warn("nki.jit(mode=...) is deprecated and ignored since NKI 0.3.0 (the framework is detected from "
                      "the argument types)", DeprecationWarning, stacklevel=2)
        kwargs.pop("mode")
    if fn is None:
        return lambda f: Kernel(f.fn if isinstance(f, Kernel) else f, options=kwargs)
    return Kernel(fn.fn if isinstance(fn, Kernel) else fn, options=kwargs)


def simulate(kernel: Any, strict_capacity: bool = False, resident: bool = False) -> Callable[..., Any]:
    """``nki.simulate(kernel)(*args)``: run a kernel (jit-wrapped or plain function) on the CPU simulator.

    ``strict_capacity=True`` (the backend's own kernels) makes over-budget SBUF/PSUM allocations raise
    instead of warning; ``resident=True`` returns HBM tensors instead of host arrays (see :func:`run`)."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    @functools.wraps(k.fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return run(k.fn, args, kwargs, k.grid, strict_capacity or k.strict_capacity, resident)

    return call
