"""More patterns AWS's NKI kernels (nki-library) use, run on the simulator from source text (see
``test_library_patterns.py``); each test is written from the documented semantics:
* a ``@dataclass`` ``nl.NKIObject`` subclass, like a plain one, may leave an annotated field without a default out of
  its constructor call (NKI's ``NKIObject.__init__(**kwargs)``; nki-library's mlp_tkg never passes one of its
  dimension fields); defaults, ``__post_init__`` and too many arguments behave as in a dataclass;
* importing a public NKI name the simulator lacks (``nki.collectives.ReplicaGroup``) inside ``try: ... except
  ImportError:`` takes the fallback, as under AWS's simulator (nki-library's attention_block_tkg); using one still
  raises NotImplementedError;
* an LNC2 launch scans the kernel's code for synchronising instructions without evaluating the names it reaches
  through modules: a collective named in a branch the kernel never takes neither raises nor warns there.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from neuron_compile.simulator import load_kernel_source, simulate

HEADER = "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n"


def kernel(source: str, name: str = "k"):  # type: ignore[no-untyped-def]
    return simulate(load_kernel_source(HEADER + source, filename=f"<{name}>")[name])


def test_a_dataclass_nkiobject_may_leave_a_field_without_default_out() -> None:
    env = load_kernel_source(HEADER + '''
from dataclasses import dataclass


@dataclass
class Dims(nl.NKIObject):
    P: int
    F: int
    spare: int
    scale: float = 2.0

    def __post_init__(self):
        self.half = self.F // 2


@nki.jit
def k(x):
    d = Dims(x.shape[0], F=x.shape[1])
    t = nl.ndarray((d.P, d.half), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[:, 0:d.half])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=d.scale)
    out = nl.ndarray((d.P, d.half), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
''', filename="<dims>")
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    np.testing.assert_array_equal(simulate(env["k"])(x), x[:, :4] * 2.0)
    dims = env["Dims"]
    d = dims(P=1, F=4)
    with pytest.raises(AttributeError, match="spare"):
        d.spare  # noqa: B018
    d.spare = 3
    assert (d.P, d.F, d.spare, d.scale, d.half) == (1, 4, 3, 2.0, 2)
    assert dims(1, 4, 5, 0.5).spare == 5
    with pytest.raises(TypeError):
        dims(1, 2, 3, 4.0, 5)
    with pytest.raises(TypeError):
        dims(P=1, bogus=2)


def test_a_missing_collectives_name_is_an_import_error_for_from_imports() -> None:
    env = load_kernel_source(HEADER + '''
try:
    from nki.collectives import ReplicaGroup
except ImportError:
    ReplicaGroup = None


@nki.jit
def k(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
''', filename="<collectives>")
    assert env["ReplicaGroup"] is None
    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(simulate(env["k"])(x), x)
    with pytest.raises(NotImplementedError, match="nki.collectives.all_reduce"):
        load_kernel_source("import nki.collectives as cc\ncc.all_reduce\n")


def test_an_lnc2_launch_does_not_evaluate_module_names_on_untaken_paths() -> None:
    env = load_kernel_source(HEADER + '''
import nki.collectives as ncc


@nki.jit
def k(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if nl.num_programs() > 2:
        ncc.all_reduce(out, x, engine=nisa.vector_engine)
    if nl.program_id(0) == 0:
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
    return out
''', filename="<untaken>")
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(simulate(env["k"][2])(x), x)
