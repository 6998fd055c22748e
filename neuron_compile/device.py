"""Where a compiled graph's buffers live between kernel calls: the device side of the runtime.

A :class:`Device` uploads each graph input once (host -> device), hands device handles from kernel
to kernel (intermediates never come back to the host) and downloads each graph output once
(device -> host); :class:`Transfers` counts both per call.

- :class:`SimulatorDevice` (executor ``simulator``): device HBM is the bundled simulator's HBM;
  its tensors persist across kernel calls, kernels take and return them as they are.
- :class:`NeuronDevice` (executor ``nki-jit``): torch tensors on the ``neuron`` device; kernels are
  ``nki.jit`` kernels, compiled once per source into a folder of our artifact cache keyed like the
  kernel source (the compiler's persistent cache, ``--cache_dir``), so a warm process reuses them.
- :class:`HostDevice` (executor ``nki-simulate``): AWS's ``nki.simulate`` takes NumPy arrays, so
  the "device" is the host and nothing is transferred.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class Transfers:
    """Copies between host and device memory (counts and bytes)."""

    host_to_device: int = 0
    device_to_host: int = 0
    bytes_to_device: int = 0
    bytes_to_host: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"host_to_device": self.host_to_device, "device_to_host": self.device_to_host,
                "bytes_to_device": self.bytes_to_device, "bytes_to_host": self.bytes_to_host}


class Device:
    """A memory kernels run against. Subclasses move flat NumPy buffers in and out."""

    name = "host"

    def __init__(self) -> None:
        self.transfers = Transfers()

    def upload(self, array: np.ndarray) -> Any:
        return array

    def download(self, handle: Any) -> np.ndarray:
        return np.asarray(handle)

    def flat(self, handle: Any) -> Any:
        """A kernel result as the flat (1-D) buffer the plan addresses."""
        return np.asarray(handle).reshape(-1)

    def on_host(self, handle: Any) -> bool:
        return isinstance(handle, np.ndarray)


class HostDevice(Device):
    """No device: buffers stay NumPy arrays (AWS's ``nki.simulate`` executor)."""


class SimulatorDevice(Device):
    """The bundled simulator's HBM: tensors persist across kernel calls until nothing refers to them."""

    name = "simulator"

    def upload(self, array: np.ndarray) -> Any:
        from neuron_compile.simulator.tensor import SHARED_HBM, from_array

        self.transfers.host_to_device += 1
        self.transfers.bytes_to_device += array.nbytes
        return from_array(array, SHARED_HBM, "graph_input")  # kernel arguments: every program sees them

    def download(self, handle: Any) -> np.ndarray:
        from neuron_compile.simulator.tensor import NkiTensor, to_numpy

        if not isinstance(handle, NkiTensor):
            return np.asarray(handle)
        out = to_numpy(handle)
        self.transfers.device_to_host += 1
        self.transfers.bytes_to_host += out.nbytes
        return out

    def flat(self, handle: Any) -> Any:
        from neuron_compile.simulator.tensor import NkiTensor

        if isinstance(handle, NkiTensor):
            # A finished kernel's shared_hbm output is the next kernel's argument as it is (arguments are shared
            # HBM, like uploaded inputs).
            return handle if handle.ndim == 1 else handle.reshape((handle.size,))
        return super().flat(handle)

    def on_host(self, handle: Any) -> bool:
        from neuron_compile.simulator.tensor import NkiTensor

        return not isinstance(handle, NkiTensor)


class NeuronDevice(Device):  # pragma: no cover - needs a Neuron device and the real nki
    """Torch tensors on the ``neuron`` device (TorchNeuron); kernels are ``nki.jit`` kernels."""

    name = "neuron"

    def upload(self, array: np.ndarray) -> Any:
        import torch
        import torch_neuronx  # type: ignore[import-not-found]  # noqa: F401

        self.transfers.host_to_device += 1
        self.transfers.bytes_to_device += array.nbytes
        return _torch_from_numpy(np.ascontiguousarray(array)).to(torch.device("neuron"))

    def download(self, handle: Any) -> np.ndarray:
        if isinstance(handle, np.ndarray):
            return handle
        self.transfers.device_to_host += 1
        host = handle.cpu()
        self.transfers.bytes_to_host += host.numel() * host.element_size()
        return _numpy_from_torch(host)

    def flat(self, handle: Any) -> Any:
        return handle.reshape(-1) if not isinstance(handle, np.ndarray) else handle.reshape(-1)

    def on_host(self, handle: Any) -> bool:
        return isinstance(handle, np.ndarray)


def device_for(executor: str) -> Device:
    """A fresh device (with zeroed transfer counts) for ``executor``."""
    if executor == "simulator":
        return SimulatorDevice()
    if executor == "nki-jit":
        return NeuronDevice()
    return HostDevice()


def _torch_from_numpy(a: np.ndarray) -> Any:
    from neuron_compile.host_memory import torch_copy

    return torch_copy(a)  # a torch-owned copy, as runtime.to_torch


def _numpy_from_torch(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ------------------------------------------------------------------------------------ nki.jit cache

def kernel_cache_key(source: str, target: str, nki_version: str) -> str:
    """sha256 of what decides a compiled kernel: its source (name taken out), target and nki version."""
    h = hashlib.sha256()
    for part in ("nki-jit-kernel/1", source, target, nki_version):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def kernel_cache_dir(source: str, target: str, nki_version: str, root: Path | None = None) -> Path:
    """The folder of our artifact cache holding the compiler's persistent cache for one kernel."""
    if root is None:
        from neuron_compile.cache.store import default_root

        root = default_root()
    return root / "nki-jit" / kernel_cache_key(source, target, nki_version)


@contextlib.contextmanager
def compiler_cache(folder: Path) -> Iterator[None]:
    """``NEURON_CC_FLAGS`` extended with ``--cache_dir=folder`` for the block (restored after)."""
    folder.mkdir(parents=True, exist_ok=True)
    before = os.environ.get("NEURON_CC_FLAGS")
    flags = [f for f in (before or "").split() if not f.startswith("--cache_dir")]
    os.environ["NEURON_CC_FLAGS"] = " ".join([*flags, f"--cache_dir={folder}"])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("NEURON_CC_FLAGS", None)
        else:
            os.environ["NEURON_CC_FLAGS"] = before


def cached_jit_kernel(kernel: Any, source: str, name: str, target: str, nki_version: str,
                      root: Path | None = None) -> Callable[..., Any]:
    """``kernel`` (an ``nki.jit`` kernel) whose compilations go to its own folder of our cache.

    The first call in a process compiles (or, when the folder already holds this source's build,
    lets the compiler reuse it); a manifest records what the folder is for."""
    folder = kernel_cache_dir(source, target, nki_version, root)

    def call(*args: Any) -> Any:
        with compiler_cache(folder):
            out = kernel(*args)
        manifest = folder / "kernel.json"
        if not manifest.exists():
            tmp = folder / f".kernel.json.{os.getpid()}"
            tmp.write_text(json.dumps({"kernel": name, "target": target, "nki_version": nki_version,
                                       "source_sha256": hashlib.sha256(source.encode()).hexdigest()}, indent=1))
            os.replace(tmp, manifest)
        return out

    call.cache_dir = folder  # type: ignore[attr-defined]
    return call
