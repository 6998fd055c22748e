"""Behaviour that AWS's NKI tutorial and deep-dive kernels (aws-neuron-sdk ``nki/examples``, ``nki/deep-dives``;
aws-neuron/nki-samples) rely on, each test written from the documented semantics and run from source text:
* kernel arguments are HBM tensors whose ``buffer`` is ``nl.hbm`` (the MX matmul deep dive asserts
  ``arg.buffer == nl.hbm``); both cores of an LNC2 launch still see one argument, so ``core_barrier`` accepts it,
  while a kernel's own ``nl.private_hbm`` allocation stays refused (the barrier wants shared data);
* kernel source is compiled with its own future flags, not the loader's: annotations are evaluated when the ``def``
  runs, as Python does for the real kernel module, so a removed name in one (``x: nki.tensor``, moved in NKI 0.2.0)
  is refused at load time and a current one (``nki.typing.tensor[...]``) is an object, not a string;
* MX scale packing: ``quantize_mx`` writes, and ``nc_matmul_mx`` reads, scales through a view that starts at
  partition 0, 4, 8 or 12, so up to four tensors' scales share one tile (the MX deep dive's "Packing Scale Values").
"""

from __future__ import annotations

import numpy as np
import pytest

from neuron_compile.errors import RemovedAPIError, SimulatorConstraintError
from neuron_compile.simulator import load_kernel_source, simulate, use_target
from neuron_compile.simulator.kernel import Kernel

HEADER = "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n"


def _env(source: str, name: str) -> dict[str, object]:
    return load_kernel_source(HEADER + source, filename=f"<{name}>")


def test_kernel_arguments_are_in_nl_hbm() -> None:
    env = _env('''
def k(a):
    assert a.buffer == nl.hbm and nl.is_hbm(a.buffer) and not nl.is_on_chip(a.buffer), a.buffer
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    assert out.buffer == nl.shared_hbm
    nisa.dma_copy(dst=out, src=t)
    return out
''', "args_hbm")
    a = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    np.testing.assert_array_equal(simulate(env["k"])(a), a)


def test_kernel_arguments_of_a_launch_grid_are_shared_hbm() -> None:
    """An SPMD/LNC launch's arguments are shared HBM (every program sees the caller's tensor)."""
    env = _env('''
@nki.jit
def k(a):
    assert a.buffer == nl.shared_hbm, a.buffer
    pid = nl.program_id(0)
    t = nl.ndarray((32, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[pid * 32:pid * 32 + 32, :])
    nisa.dma_copy(dst=a[pid * 32:pid * 32 + 32, :], src=t)
    return a
''', "args_grid")
    a = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    np.testing.assert_array_equal(simulate(env["k"][2])(a.copy()), a)


def test_annotations_are_evaluated_when_the_kernel_is_defined() -> None:
    env = _env("import nki.typing as nt\n\ndef k(a: nt.tensor[128, 64], n: int = 2):\n    return a\n", "annot_ok")
    assert repr(env["k"].__annotations__["a"]) == "nki.typing.tensor[128, 64]"
    with pytest.raises(RemovedAPIError, match="nki.tensor is gone: moved to nki.meta.tensor"):
        _env("def k(a: nki.tensor) -> nki.tensor:\n    return a\n", "annot_removed")


BARRIER = '''
def k(a, out):
    pid = nl.program_id(0)
    t = nl.ndarray((32, 8), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[pid * 32:(pid + 1) * 32, :])
    target = out if WHERE == "argument" else nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=target[pid * 32:(pid + 1) * 32, :], src=t)
    nisa.core_barrier(target, cores=(0, 1))
    return out
'''


@pytest.mark.parametrize("where", ["argument", "private_hbm"])
def test_core_barrier_takes_an_argument_but_not_a_private_allocation(where: str) -> None:
    env = _env(f"WHERE = {where!r}\n" + BARRIER, f"barrier_{where}")
    a = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    out = np.zeros_like(a)
    run = simulate(Kernel(env["k"])[2])
    with use_target("trn2"):
        if where == "argument":
            run(a, out)
            np.testing.assert_array_equal(out, a)
        else:
            with pytest.raises(SimulatorConstraintError, match="shared_hbm or a kernel argument"):
                run(a, out)


MX_PACKED = '''
def k(a, b, offset):
    P, FA = a.shape
    FB = b.shape[1]
    qa = nl.ndarray((P, FA // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    qb = nl.ndarray((P, FB // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    srcs = []
    for x in (a, b):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        srcs.append(t)
    # one tile for both operands' scales: a's at the top of every quadrant, b's `offset` partitions lower
    packed = nl.ndarray((P, FB // 4), dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
    nisa.quantize_mx(dst=qa, src=srcs[0], dst_scale=packed[0:P, 0:FA // 4])
    nisa.quantize_mx(dst=qb, src=srcs[1], dst_scale=packed[offset:P, :])
    # the same, each operand's scales in a tile of its own
    sa = nl.ndarray((P, FA // 4), dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
    sb = nl.ndarray((P, FB // 4), dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
    nisa.quantize_mx(dst=qa, src=srcs[0], dst_scale=sa)
    nisa.quantize_mx(dst=qb, src=srcs[1], dst_scale=sb)
    outs = []
    for s_a, s_b in ((packed[0:P, 0:FA // 4], packed[offset:P, :]), (sa, sb)):
        acc = nl.ndarray((FA // 4, FB // 4), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=qa, moving=qb, stationary_scale=s_a, moving_scale=s_b)
        r = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=acc)
        o = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=r)
        outs.append(o)
    return outs[0], outs[1]
'''


@pytest.mark.parametrize("offset", [4, 8, 12])
def test_mx_scales_packed_at_a_quadrant_offset(offset: int) -> None:
    import ml_dtypes

    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 4 * 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 4 * 24)).astype(ml_dtypes.bfloat16)
    run = simulate(_env(MX_PACKED, f"mx_packed_{offset}")["k"])
    with use_target("trn3"):
        packed, separate = run(a, b, offset)
    np.testing.assert_array_equal(packed, separate)
    # contraction over the partitions and the four values each packed element stands for
    exact = np.einsum("pmq,pnq->mn", a.astype(np.float32).reshape(64, 16, 4), b.astype(np.float32).reshape(64, 24, 4))
    assert np.abs(packed - exact).max() < 0.1 * np.abs(exact).max()


def test_mx_scale_view_must_start_at_a_supported_offset() -> None:
    import ml_dtypes

    a = np.ones((64, 64), dtype=ml_dtypes.bfloat16)
    b = np.ones((64, 96), dtype=ml_dtypes.bfloat16)
    run = simulate(_env(MX_PACKED, "mx_packed_bad")["k"])
    with use_target("trn3"), pytest.raises(SimulatorConstraintError, match=r"partition start in \(0, 4, 8, 12\)"):
        run(a, b, 2)
