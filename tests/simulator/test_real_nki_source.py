"""Kernels written as source text exactly as a user of real NKI 0.6 writes them, run on the simulator.

Covers ``load_kernel_source``: the standard ``import nki`` / ``import nki.language as nl`` /
``import nki.isa as nisa`` lines (and the ``from nki import ...`` forms) bind the simulator, nothing is
registered in ``sys.modules`` (a pre-existing ``nki`` module object stays untouched), legacy
``neuronxcc`` imports raise :class:`RemovedAPIError`, and tracebacks point at the kernel file's lines.
Also checks statically (:mod:`neuron_compile.nki_api.checker`) that the kernel source, and every kernel of
``test_kernels.py``, uses only public, non-removed, non-deprecated names of NKI 0.6, and that the
checker itself catches legacy code.
"""

from __future__ import annotations

import ast
import linecache
import logging
import sys
import textwrap
import traceback
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from neuron_compile.errors import RemovedAPIError
from neuron_compile.nki_api.checker import check_source_against_api
from neuron_compile.simulator import load_kernel_source, simulate
from neuron_compile.simulator import nki as sim_nki

log = logging.getLogger(__name__)


KERNEL_SOURCE = '''\
import nki
import nki.language as nl
import nki.isa as nisa


@nki.jit
def gelu_residual_kernel(x, residual, scale):
    """out = gelu_apprx_tanh(x * scale) + residual, rows tiled by 128 with a ragged last tile."""
    R, C = x.shape
    out = nl.ndarray((R, C), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, R, nl.tile_size.pmax):
        rs = min(nl.tile_size.pmax, R - r0)
        t = nl.ndarray((nl.tile_size.pmax, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:rs, :], src=x[nl.ds(r0, rs), :])
        res = nl.ndarray((nl.tile_size.pmax, C), dtype=residual.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=res[0:rs, :], src=residual[nl.ds(r0, rs), :])
        act = nl.ndarray((nl.tile_size.pmax, C), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=act[0:rs, :], op=nl.gelu_apprx_tanh, data=t[0:rs, :], scale=scale)
        y = nl.ndarray((nl.tile_size.pmax, C), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y[0:rs, :], data1=act[0:rs, :], data2=res[0:rs, :], op=nl.add,
                           engine=nisa.engine.vector)
        nisa.dma_copy(dst=out[nl.ds(r0, rs), :], src=y[0:rs, :])
    return out
'''


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _run(namespace: dict[str, Any]) -> None:
    kernel = namespace["gelu_residual_kernel"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 96)).astype(np.float32)
    residual = rng.standard_normal((200, 96)).astype(np.float32)
    ref = _gelu_tanh(x.astype(np.float64) * 0.5) + residual
    out = simulate(kernel)(x, residual, 0.5)
    np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3)
    # Calling the jit kernel directly with arrays simulates it too (NKI_SIMULATOR=1 behaviour).
    direct = kernel(torch.from_numpy(x), torch.from_numpy(residual), 0.5)
    assert isinstance(direct, torch.Tensor)
    np.testing.assert_allclose(direct.numpy(), ref, rtol=2e-3, atol=2e-3)


def test_real_nki_source_runs_without_touching_sys_modules() -> None:
    before = {name: mod for name, mod in sys.modules.items() if name == "nki" or name.startswith("nki.")}
    namespace = load_kernel_source(KERNEL_SOURCE, filename="gelu_residual_kernel.py")
    assert namespace["nki"] is sim_nki
    assert namespace["nl"] is sim_nki.language and namespace["nisa"] is sim_nki.isa
    _run(namespace)
    after = {name: mod for name, mod in sys.modules.items() if name == "nki" or name.startswith("nki.")}
    assert after == before
    if not before:
        assert "nki" not in sys.modules


def test_preexisting_nki_module_is_left_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("nki")
    fake.marker = "the user's own nki"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nki", fake)
    snapshot = dict(vars(fake))
    namespace = load_kernel_source(KERNEL_SOURCE, filename="gelu_residual_kernel.py")
    assert namespace["nki"] is sim_nki and namespace["nki"] is not fake
    _run(namespace)
    assert sys.modules["nki"] is fake
    assert vars(fake) == snapshot
    assert "nki.language" not in sys.modules or sys.modules["nki.language"] is not sim_nki.language


def test_from_import_forms_bind_the_simulator() -> None:
    source = KERNEL_SOURCE.replace(
        "import nki.language as nl\nimport nki.isa as nisa\n",
        "from nki import language as nl\nfrom nki import isa as nisa\n",
    )
    assert source != KERNEL_SOURCE
    namespace = load_kernel_source(source, filename="gelu_from_imports.py")
    assert namespace["nl"] is sim_nki.language and namespace["nisa"] is sim_nki.isa
    _run(namespace)


def test_legacy_neuronxcc_import_is_rejected() -> None:
    source = "import neuronxcc.nki as nki\nimport neuronxcc.nki.language as nl\n"
    with pytest.raises(RemovedAPIError, match="import nki"):
        load_kernel_source(source, filename="legacy_kernel.py")


def test_traceback_points_at_the_kernel_line() -> None:
    source = textwrap.dedent(
        """\
        import nki
        import nki.language as nl


        @nki.jit
        def broken_kernel(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            raise ValueError("deliberate failure on line 8")
            return out
        """
    )
    namespace = load_kernel_source(source, filename="broken_kernel.py")
    with pytest.raises(ValueError, match="deliberate") as info:
        simulate(namespace["broken_kernel"])(np.zeros((4, 4), np.float32))
    frames = [f for f in traceback.extract_tb(info.tb) if f.filename == "broken_kernel.py"]
    assert frames, "no traceback frame names the kernel file"
    assert frames[-1].lineno == 8
    assert "deliberate failure on line 8" in (frames[-1].line or "")
    assert "deliberate failure" in linecache.getline("broken_kernel.py", 8)


# ------------------------------------------------------------------------------------------------
# Static API checks
# ------------------------------------------------------------------------------------------------

_PRELUDE = "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n\n"


def test_kernel_source_uses_only_current_public_api() -> None:
    assert check_source_against_api(KERNEL_SOURCE) == []


def test_every_kernel_in_test_kernels_uses_only_current_public_api() -> None:
    path = Path(__file__).with_name("test_kernels.py")
    tree = ast.parse(path.read_text())
    kernels = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d) == "nki.jit" for d in node.decorator_list)
    ]
    assert len(kernels) >= 10
    problems: list[str] = []
    for node in kernels:
        source = _PRELUDE + (ast.get_source_segment(path.read_text(), node) or "")
        problems += [f"{node.name}: {p}" for p in check_source_against_api(source)]
    assert problems == []


LEGACY_SOURCE = textwrap.dedent(
    """\
    import nki
    import nki.language as nl
    import nki.isa as nisa


    @nki.jit(mode="simulation")
    def legacy(a):
        t = nl.ndarray((nl.par_dim(128), 512), dtype=a.dtype, buffer='sbuf')
        i_p = nl.arange(128)[:, None]
        nisa.dma_copy(dst=t, src=a, mask=(i_p < 64))
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, t, t, psumAccumulateFlag=True)
        for k in nl.affine_range(4):
            nisa.tensor_copy(dst=t, src=t, engine=nisa.vector_engine)
        w = nl.tile_size.psum_fmax
        nisa.tensor_copy_dynamic_src(t, t)
        v = t.ap(pattern=[[512, 128], [1, 512]], ofset=0)
        nisa.activation(t, nl.exp, t, bogus=1)
        return t
    """
)


@pytest.mark.parametrize(
    ("needle", "line"),
    [
        ("jit(mode=...)", 6),
        ("nki.language.par_dim", 8),
        ("buffer='sbuf'", 8),
        ("nki.language.arange", 9),
        ("keyword mask=", 10),
        ("keyword psumAccumulateFlag=", 12),
        ("nki.language.affine_range: deprecated", 13),
        ("nki.isa.vector_engine: deprecated", 14),
        ("tile_size.psum_fmax: deprecated", 15),
        ("nki.isa.tensor_copy_dynamic_src", 16),
        ("keyword ofset= is not a parameter of NkiTensor.ap", 17),
        ("keyword bogus= is not a parameter of activation", 18),
    ],
)
def test_checker_reports_legacy_and_unknown_names(needle: str, line: int) -> None:
    problems = check_source_against_api(LEGACY_SOURCE)
    hits = [p for p in problems if needle in p]
    assert hits, f"{needle!r} not reported; problems: {problems}"
    assert all(p.startswith(f"line {line}:") for p in hits), hits


def test_checker_reports_removed_replacement_hint() -> None:
    problems = check_source_against_api(LEGACY_SOURCE)
    (arange,) = [p for p in problems if "nki.language.arange" in p]
    assert "nl.ds" in arange
    (flag,) = [p for p in problems if "psumAccumulateFlag" in p]
    assert "accumulate=" in flag
