"""Device-resident execution: per call, one host->device copy per graph input and one device->host copy per
graph output; intermediates stay in (simulated) device HBM between kernels. The nki.jit path keeps its
compilations in our artifact cache, keyed like the kernel source."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import neuron_compile.backend
from neuron_compile import runtime
from neuron_compile.device import (
    SimulatorDevice,
    cached_jit_kernel,
    compiler_cache,
    kernel_cache_dir,
    kernel_cache_key,
)
from neuron_compile.simulator import nisa, nl, simulate
from neuron_compile.simulator.tensor import NkiTensor

log = logging.getLogger(__name__)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.norm = torch.nn.LayerNorm(64)
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return torch.softmax(h + x, dim=-1)


def test_one_copy_per_graph_input_and_output_per_call() -> None:
    neuron_compile.backend.reset()
    model = _Block().eval()
    x = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    with torch.no_grad():
        compiled(x)  # compile
        runtime.clear_transfers()
        got = compiled(x)
        got2 = compiled(x * 2)
    torch.testing.assert_close(got, model(x), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got2, model(x * 2), atol=2e-5, rtol=2e-5)
    records = runtime.recent_transfers()
    assert len(records) == 2
    plan = neuron_compile.backend.compiled_graphs()[-1]["plan"]
    per_kernel_args = sum(len(call.args) for call in plan.calls)
    for rec in records:
        assert rec["executor"] == "simulator" and rec["kernel_calls"] == len(plan.calls) >= 3
        assert rec["host_to_device"] == rec["graph_inputs"]
        assert rec["device_to_host"] == rec["graph_outputs"] == 1
        # copying every kernel's arguments in and results out (the old runner) would move far more:
        assert rec["host_to_device"] < per_kernel_args
        assert rec["bytes_to_host"] == got.numel() * got.element_size()


def test_simulated_hbm_persists_between_kernels() -> None:
    """Two kernels chained on a simulated device: the intermediate is an HBM tensor, never a host copy."""
    def scale(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    dev = SimulatorDevice()
    k = simulate(scale, strict_capacity=True, resident=True)
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    h = dev.upload(a)
    mid = dev.flat(k(h))
    assert isinstance(mid, NkiTensor) and mid.shape == (24,)
    end = k(mid.reshape((4, 6)))
    assert isinstance(end, NkiTensor)
    np.testing.assert_array_equal(dev.download(end), a * 9)
    assert (dev.transfers.host_to_device, dev.transfers.device_to_host) == (1, 1)
    assert isinstance(simulate(scale)(a), np.ndarray)  # without resident=True results come back as arrays


def test_kernel_cache_key_is_stable_and_sensitive(tmp_path: Path) -> None:
    src = "@nki.jit\ndef _kernel_(a):\n    return a\n"
    key = kernel_cache_key(src, "trn2", "0.6.0")
    assert key == kernel_cache_key(src, "trn2", "0.6.0") and len(key) == 64
    assert len({key, kernel_cache_key(src + " ", "trn2", "0.6.0"), kernel_cache_key(src, "trn3", "0.6.0"),
                kernel_cache_key(src, "trn2", "0.6.1")}) == 4
    assert kernel_cache_dir(src, "trn2", "0.6.0", tmp_path) == tmp_path / "nki-jit" / key


def test_compiler_cache_points_the_compiler_at_our_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real child process sees NEURON_CC_FLAGS with --cache_dir inside the block; it is restored after."""
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type=transformer --cache_dir=/elsewhere")
    folder = tmp_path / "k"
    with compiler_cache(folder):
        seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ['NEURON_CC_FLAGS'])"],
                              capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert seen == f"--model-type=transformer --cache_dir={folder}" and folder.is_dir()
    assert os.environ["NEURON_CC_FLAGS"] == "--model-type=transformer --cache_dir=/elsewhere"


def test_cached_jit_kernel_records_its_folder(tmp_path: Path) -> None:
    flags: list[str] = []

    def kernel(a: np.ndarray) -> np.ndarray:  # stands for a compiled nki.jit kernel: reads the flags it runs with
        flags.append(os.environ.get("NEURON_CC_FLAGS", ""))
        return a * 2

    call = cached_jit_kernel(kernel, "def _kernel_(a): ...", "k0_scale", "trn2", "0.6.0", root=tmp_path)
    np.testing.assert_array_equal(call(np.ones(3)), np.full(3, 2.0))
    folder = call.cache_dir  # type: ignore[attr-defined]
    assert flags == [f"--cache_dir={folder}"] and (folder / "kernel.json").is_file()
    assert '"kernel": "k0_scale"' in (folder / "kernel.json").read_text()


@pytest.mark.neuron_device
def test_nki_jit_kernels_compile_once_per_source_across_processes(tmp_path: Path) -> None:  # pragma: no cover
    """On a Trainium host: the second process finds the first one's compilation in our cache."""
    if not runtime.neuron_device_present() or runtime.real_nki() is None:
        pytest.skip("needs a Neuron device and the real nki package (Neuron package repository)")
    script = ("import torch, neuron_compile\n"
              "f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend='neuron')\n"
              "print(float(f(torch.ones(128, 512)).sum()))\n")
    env = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(tmp_path), "NEURON_COMPILE_EXECUTOR": "nki-jit"}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stderr
    folders = sorted((tmp_path / "nki-jit").iterdir())
    assert folders and all((f / "kernel.json").is_file() for f in folders)
    stamps = {p: p.stat().st_mtime for f in folders for p in f.rglob("*") if p.is_file()}
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1800)
    assert second.returncode == 0 and second.stdout == first.stdout
    assert sorted((tmp_path / "nki-jit").iterdir()) == folders  # no new kernel folder: nothing recompiled
    assert all(p.stat().st_mtime == t for p, t in stamps.items())
