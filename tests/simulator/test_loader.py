"""Kernel loading (import isolation), running (args, results, write-back), trace, targets, nl wrappers, docs."""

from __future__ import annotations

import sys
import traceback
import types
from pathlib import Path

import numpy as np
import numpy.testing  # noqa: F401 - imported before the sys.modules snapshot
import pytest
import torch

from neuron_compile.errors import RemovedAPIError, SimulatorError
from neuron_compile.simulator import (
    current_target,
    load_kernel_source,
    nisa,
    nki,
    nl,
    simulate,
    trace,
    use_target,
)

SRC = '''
import nki
import nki.language as nl
from nki import isa as nisa
import numpy as np


@nki.jit
def scale_rows(a, out_arg):
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out_arg, src=t)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def broken(a):
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[0:1])
    return t
'''


def test_loader_binds_simulator_without_touching_sys_modules() -> None:
    fake = types.ModuleType("nki")
    sys.modules["nki"] = fake
    try:
        before = dict(sys.modules)
        g = load_kernel_source(SRC, "scale.py")
        assert g["nl"] is nl and g["nisa"] is nisa and g["nki"] is nki
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        o = np.zeros_like(a)
        np.testing.assert_array_equal(g["scale_rows"](a, o), 2 * a)
        np.testing.assert_array_equal(o, 2 * a)  # in-place HBM write-back
        assert dict(sys.modules) == before and sys.modules["nki"] is fake
    finally:
        del sys.modules["nki"]


def test_loader_errors_point_at_kernel_lines() -> None:
    g = load_kernel_source(SRC, "scale.py")
    with pytest.raises(Exception) as e:
        g["broken"](np.ones((2, 4), np.float32))
    tb = "".join(traceback.format_exception(e.value))
    line = SRC.splitlines().index("    nisa.dma_copy(dst=t, src=a[0:1])") + 1
    assert f'File "scale.py", line {line}' in tb and "nisa.dma_copy(dst=t, src=a[0:1])" in tb
    with pytest.raises(RemovedAPIError, match="import nki"):
        load_kernel_source("import neuronxcc.nki.language as nl\n")
    with pytest.raises(NotImplementedError, match="nki.collectives.all_reduce"):
        load_kernel_source("import nki.collectives as cc\ncc.all_reduce\n")
    # a removed name: as an attribute, a RemovedAPIError; imported by name, an ImportError (as under real NKI, so
    # version checks in try/except ImportError still work), and both name the replacement
    with pytest.raises(RemovedAPIError, match=r"nki.language.par_dim is gone: removed \(block dimensions\)"):
        load_kernel_source("import nki.language as nl\nnl.par_dim\n")
    with pytest.raises(ImportError) as imp:
        load_kernel_source("from nki.language import ndarray, par_dim\n")
    assert type(imp.value) is ImportError and imp.value.name == "nki.language"
    assert str(imp.value) == ("cannot import name 'par_dim' from 'nki.language': nki.language.par_dim is gone: removed "
                              "(block dimensions); put the partition dim first and use Python lists of tiles")
    assert load_kernel_source("import nki.language as nl\nok = hasattr(nl, 'par_dim')\n")["ok"] is False


def test_torch_arguments_and_results() -> None:
    g = load_kernel_source(SRC, "scale.py")
    a = torch.arange(8, dtype=torch.bfloat16).reshape(2, 4)
    o = torch.zeros_like(a)
    r = simulate(g["scale_rows"])(a, o)
    assert isinstance(r, torch.Tensor) and r.dtype == torch.bfloat16
    assert torch.equal(r, 2 * a) and torch.equal(o, 2 * a)


def test_result_buffer_and_float64_rules() -> None:
    @nki.jit
    def bad(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        return t

    with pytest.raises(SimulatorError, match="shared_hbm"):
        bad(np.ones((2, 2), np.float32))

    @nki.jit
    def private(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    with pytest.raises(SimulatorError, match="shared_hbm"):
        private(np.ones((2, 2), np.float32))

    @nki.jit(mode="simulation") if False else nki.jit
    def ident(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    with pytest.warns(UserWarning, match="float64"):
        r = ident(np.ones((2, 2)))
    assert r.dtype == np.float32
    with pytest.warns(DeprecationWarning, match="mode"):
        nki.jit(mode="simulation")(ident.fn)
    with pytest.raises(RemovedAPIError, match="NEURON_PLATFORM_TARGET_OVERRIDE"):
        nki.jit(platform_target="trn2")


def test_spmd_programs_share_outputs() -> None:
    @nki.jit
    def halves(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        n = a.shape[0] // nl.num_programs()
        t = nl.ndarray((n, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[i * n:(i + 1) * n])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(i))
        nisa.dma_copy(dst=out[i * n:(i + 1) * n], src=t)
        return out

    a = np.zeros((4, 3), np.float32)
    np.testing.assert_array_equal(halves[2](a), [[0] * 3] * 2 + [[1] * 3] * 2)


def test_trace_records() -> None:
    a = np.ones((128, 64), np.float32)
    g = load_kernel_source(SRC, "scale.py")
    with trace() as t:
        g["scale_rows"](a, np.zeros_like(a))
        x = nl.ndarray((4, 8), nl.float32)
        nisa.memset(dst=x, value=1.0)
        nl.exp(x)
    assert t.instructions() == ["dma_copy", "tensor_scalar", "dma_copy", "dma_copy", "memset", "activation"]
    r = t.records[1]
    assert (r.engine, r.partitions, r.free_size, r.dtypes, r.bytes, r.buffers) == (
        "vector", 128, 64, ("float32", "float32"), 2 * 128 * 64 * 4, ("sbuf", "sbuf"))
    assert t.records[0].buffers == ("sbuf", "private_hbm")  # arguments are nl.hbm, the alias of private_hbm


def test_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    assert current_target() == "trn3" and nisa.get_nc_version() == nisa.nc_version.gen4
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen2")
    assert current_target() == "trn1"
    with use_target("trn2"):
        assert nisa.get_nc_version() == nisa.nc_version.gen3
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(SimulatorError, match="trn1, inf2, gen2"):
        current_target()


def test_nl_wrappers_against_numpy(rng: np.random.Generator) -> None:
    from sim_helpers import tile, val

    x = rng.standard_normal((8, 16)).astype(np.float32)
    y = rng.standard_normal((8, 16)).astype(np.float32)
    tx, ty = tile(x), tile(y)
    np.testing.assert_allclose(val(nl.add(tx, ty)), x + y)
    np.testing.assert_allclose(val(nl.subtract(1.0, tx)), 1 - x)
    np.testing.assert_allclose(val(nl.multiply(tx, tile(y[:, :1]))), x * y[:, :1])
    np.testing.assert_array_equal(val(nl.greater(tx, ty, dtype=nl.uint8)), (x > y).astype(np.uint8))
    np.testing.assert_allclose(val(nl.exp(tx)), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(val(nl.sin(tile(x * 5))), np.sin(x * 5), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(val(nl.negative(tx)), -x)
    np.testing.assert_allclose(val(nl.sum(tx, axis=1)), x.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(val(nl.mean(tx, axis=1, keepdims=True)), x.mean(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(val(nl.var(tx, axis=1)), x.var(1, keepdims=True), rtol=1e-5)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(val(nl.softmax(tx, axis=1)), e / e.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(val(nl.where(tile((x > 0).astype(np.float32)), tx, 0.0)), np.where(x > 0, x, 0))
    m = nl.matmul(tx, ty, transpose_x=True)
    assert m.buffer is nl.psum
    np.testing.assert_allclose(val(m), x.T @ y, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(val(nl.transpose(tx)), x.T)
    with pytest.warns(UserWarning, match="not supported on hardware"):
        np.testing.assert_allclose(val(nl.divide(tx, 2.0)), x / 2)
    with trace() as t:
        nl.softmax(tx, axis=1)
    # exp with the row sum into reduce_res is traced as activation_reduce (the extra accumulator read, REFERENCE 3.3)
    assert t.instructions() == ["tensor_reduce", "activation_reduce", "reciprocal", "tensor_scalar"]
    calls: list[int] = []
    nl.fori_loop(0, 3, lambda i: calls.append(i) and None)
    assert calls == [0, 1, 2]


def test_doc_name_list_is_current() -> None:
    from neuron_compile.simulator.__main__ import render_doc

    doc = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
    text = doc.read_text()
    assert render_doc(text) == text, "run: python -m neuron_compile.simulator --write-doc"
