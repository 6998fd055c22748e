"""nc_matmul (limits, dtypes, PSUM accumulation semantics), nc_transpose and the DMA family."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from sim_helpers import tile, val

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import nisa, nl, use_target
from neuron_compile.simulator.checks import SimulatorWarning
from neuron_compile.simulator.tensor import from_array

F32 = np.float32
BF16 = ml_dtypes.bfloat16


def psum(shape: tuple[int, ...], dtype: str = "float32") -> object:
    return nl.ndarray(shape, dtype=dtype, buffer=nl.psum)


def test_matmul_accumulate_flag_cases(rng: np.random.Generator) -> None:
    a1, a2 = rng.standard_normal((2, 32, 16)).astype(F32)
    b1, b2 = rng.standard_normal((2, 32, 24)).astype(F32)
    p1, p2 = a1.T @ b1, a2.T @ b2
    acc = psum((16, 24))
    nisa.nc_matmul(dst=acc, stationary=tile(a1), moving=tile(b1))  # None: first write overwrites the NaN sentinel
    nisa.nc_matmul(dst=acc, stationary=tile(a2), moving=tile(b2))  # None: later writes accumulate
    np.testing.assert_allclose(val(acc), p1 + p2, rtol=1e-5, atol=1e-5)
    nisa.nc_matmul(dst=acc, stationary=tile(a1), moving=tile(b1), accumulate=False)
    np.testing.assert_allclose(val(acc), p1, rtol=1e-5, atol=1e-5)
    nisa.nc_matmul(dst=acc, stationary=tile(a2), moving=tile(b2), accumulate=True)
    np.testing.assert_allclose(val(acc), p1 + p2, rtol=1e-5, atol=1e-5)
    fresh = psum((16, 24))
    with pytest.warns(SimulatorWarning, match="never written"):
        nisa.nc_matmul(dst=fresh, stationary=tile(a1), moving=tile(b1), accumulate=True)
    assert np.isnan(val(fresh)).all()  # added onto the uninitialised sentinel
    z = psum((16, 24))
    nisa.memset(dst=z, value=0.0)
    nisa.nc_matmul(dst=z, stationary=tile(a1), moving=tile(b1))  # None after memset: overwrite (flag reset)
    nisa.nc_matmul(dst=z[:, 0:12], stationary=tile(a2), moving=tile(b2[:, 0:12]))  # per-element flags
    np.testing.assert_allclose(val(z)[:, :12], (p1 + p2)[:, :12], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(val(z)[:, 12:], p1[:, 12:], rtol=1e-5, atol=1e-5)
    with use_target("trn2"):
        nisa.memset(dst=z, value=0.0)
        with pytest.warns(SimulatorWarning, match="non-matmul"):
            nisa.nc_matmul(dst=z, stationary=tile(a1), moving=tile(b1), accumulate=True)


def test_matmul_bf16_inputs_accumulate_in_fp32(rng: np.random.Generator) -> None:
    a = rng.standard_normal((128, 64)).astype(BF16)
    b = rng.standard_normal((128, 512)).astype(BF16)
    acc = psum((64, 512))
    nisa.nc_matmul(dst=acc, stationary=tile(a), moving=tile(b))
    np.testing.assert_allclose(val(acc), a.astype(F32).T @ b.astype(F32), rtol=1e-4, atol=1e-4)


def test_matmul_constraints() -> None:
    a = tile(np.ones((128, 128), BF16))
    b = tile(np.ones((128, 1024), BF16))
    with use_target("trn2"), pytest.raises(SimulatorConstraintError) as e:
        nisa.nc_matmul(dst=psum((128, 1024)), stationary=a, moving=b)
    assert str(e.value) == ("nisa.nc_matmul: operand 'moving' = 1024 violates limit: free size <= 512 "
                            "(gemm_moving_fmax on trn2)")
    nisa.nc_matmul(dst=psum((128, 1024)), stationary=a, moving=b)  # trn3: up to 4096 fp32
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.nc_matmul(dst=nl.ndarray((128, 512), nl.float32), stationary=a, moving=b[:, :512])
    assert e.value.operand == "dst" and "PSUM" in str(e.value.limit)
    with pytest.raises(SimulatorConstraintError, match="fp32/tf32"):
        nisa.nc_matmul(dst=psum((128, 512)), stationary=tile(np.ones((128, 128), F32)), moving=b[:, :512])
    with pytest.raises(SimulatorConstraintError, match="contraction"):
        nisa.nc_matmul(dst=psum((128, 512)), stationary=a[0:64], moving=b[:, :512])
    with use_target("trn1"), pytest.raises(SimulatorConstraintError, match="float32 PSUM output"):
        nisa.nc_matmul(dst=psum((128, 512), "bfloat16"), stationary=a, moving=b[:, :512])
    wide = psum((128, 1024))
    with use_target("trn2"), pytest.raises(SimulatorConstraintError, match="PSUM bank"):
        nisa.nc_matmul(dst=wide[:, 256:768], stationary=a, moving=b[:, :512])


def test_transposes(rng: np.random.Generator) -> None:
    x = rng.standard_normal((64, 96)).astype(BF16)
    pt = psum((96, 64), "bfloat16")
    nisa.nc_transpose(dst=pt, data=tile(x))
    np.testing.assert_array_equal(val(pt).astype(F32), x.T.astype(F32))
    ident = nl.shared_identity_matrix(64, dtype=nl.bfloat16)
    inf = x.copy()
    inf[0, 0] = -np.inf
    nisa.nc_matmul(dst=pt, stationary=tile(inf), moving=ident, is_transpose=True)
    np.testing.assert_array_equal(val(pt).astype(F32), inf.T.astype(F32))  # bit-exact, no -inf*0 NaNs
    with pytest.raises(SimulatorConstraintError, match="32x32"):
        nisa.nc_transpose(dst=nl.ndarray((96, 64), nl.bfloat16), data=tile(x))
    with pytest.raises(SimulatorConstraintError, match="dtype"):
        nisa.nc_transpose(dst=psum((96, 64)), data=tile(x))
    d = nl.ndarray((96, 64), nl.bfloat16)
    nisa.dma_transpose(dst=d, src=from_array(x))
    np.testing.assert_array_equal(val(d).astype(F32), x.T.astype(F32))
    with pytest.raises(SimulatorConstraintError, match="permuted"):
        nisa.dma_transpose(dst=nl.ndarray((64, 96), nl.bfloat16), src=from_array(x))


def test_dma_copy_rules_and_casts(rng: np.random.Generator) -> None:
    a = rng.standard_normal((4, 6)).astype(F32)
    h = from_array(a)
    t = nl.ndarray((4, 6), nl.bfloat16)
    nisa.dma_copy(dst=t, src=h)
    np.testing.assert_array_equal(val(t), a.astype(BF16))
    flat = nl.ndarray((2, 12), nl.float32)
    nisa.dma_copy(dst=flat, src=h)  # equal element counts, different shapes
    np.testing.assert_array_equal(val(flat), a.reshape(2, 12))
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.dma_copy(dst=nl.ndarray((4, 5), nl.float32), src=h)
    assert e.value.operand == "src" and "24" in str(e.value.value)
    with pytest.raises(SimulatorConstraintError, match="PSUM"):
        nisa.dma_copy(dst=h, src=tile(a, buffer=nl.psum))
    with pytest.raises(SimulatorConstraintError, match="hwdge"):
        nisa.dma_copy(dst=t, src=h, dge_mode=nisa.dge_mode.hwdge)
    b = nl.ndarray((4, 6), nl.float32)
    nisa.dma_copy(dst=b, src=from_array(a[0:1]).ap([[0, 4], [1, 6]], offset=0))  # stride-0 broadcast on HBM
    np.testing.assert_array_equal(val(b), np.broadcast_to(a[0], (4, 6)))


def test_dma_gather_scatter_and_compute(rng: np.random.Generator) -> None:
    table = rng.standard_normal((10, 8)).astype(F32)
    idx = np.array([[3], [9], [3], [0]], np.int32)
    h = from_array(table)
    rows = nl.ndarray((4, 8), nl.float32)
    nisa.dma_copy(dst=rows, src=h.ap(pattern=[[8, 4], [1, 8]], offset=0, vector_offset=tile(idx), indirect_dim=0))
    np.testing.assert_array_equal(val(rows), table[idx[:, 0]])
    bad = tile(np.array([[1], [12], [2], [0]], np.int32))
    with pytest.raises(SimulatorError, match="out of bounds"):
        nisa.dma_copy(dst=rows, src=h.ap(pattern=[[8, 4], [1, 8]], vector_offset=bad))
    keep = val(rows)
    nisa.dma_copy(dst=rows, src=h.ap(pattern=[[8, 4], [1, 8]], vector_offset=bad), oob_mode=nisa.oob_mode.skip)
    np.testing.assert_array_equal(val(rows)[1], keep[1])
    upd = rng.standard_normal((4, 8)).astype(F32)
    acc = from_array(table)
    view = acc.ap(pattern=[[8, 4], [1, 8]], vector_offset=tile(idx))
    nisa.dma_compute(dst=view, srcs=[view, tile(upd)], reduce_op=nl.add, unique_indices=False)
    ref = table.copy()
    np.add.at(ref, idx[:, 0], upd)
    np.testing.assert_allclose(val(acc), ref, rtol=1e-6)
    out = from_array(np.zeros((10, 8), F32))
    nisa.dma_copy(dst=out.ap(pattern=[[8, 4], [1, 8]], vector_offset=tile(np.array([[1], [2], [5], [7]], np.int32))),
                  src=tile(upd))
    np.testing.assert_array_equal(val(out)[[1, 2, 5, 7]], upd)
    with pytest.raises(SimulatorConstraintError, match="nl.add"):
        nisa.dma_compute(dst=rows, srcs=[rows], reduce_op=nl.multiply)


def test_dma_compute_scatter_rmw_follows_the_documented_forms(rng: np.random.Generator) -> None:
    """A scatter-RMW takes exactly dst itself and one SBUF data tile, and with unique_indices=True (the default)
    its rows must be distinct: duplicates race in hardware, so the simulator refuses them rather than drop one."""
    table = rng.standard_normal((10, 8)).astype(F32)
    upd = tile(rng.standard_normal((4, 8)).astype(F32))
    acc = from_array(table)
    dup = acc.ap(pattern=[[8, 4], [1, 8]], vector_offset=tile(np.array([[3], [9], [3], [0]], np.int32)))
    with pytest.raises(SimulatorConstraintError, match="distinct row addresses"):
        nisa.dma_compute(dst=dup, srcs=[dup, upd], reduce_op=nl.add)
    view = acc.ap(pattern=[[8, 4], [1, 8]], vector_offset=tile(np.array([[3], [9], [-1], [0]], np.int32)))
    with pytest.raises(SimulatorConstraintError, match="exactly 2 sources"):
        nisa.dma_compute(dst=view, srcs=[view, upd, upd], reduce_op=nl.add)
    with pytest.raises(SimulatorConstraintError, match="dst itself"):
        nisa.dma_compute(dst=view, srcs=[upd, upd], reduce_op=nl.add)
    with pytest.raises(SimulatorConstraintError, match="data in SBUF"):
        nisa.dma_compute(dst=view, srcs=[view, from_array(table).ap(pattern=[[8, 4], [1, 8]])], reduce_op=nl.add)
    np.testing.assert_array_equal(val(acc), table)  # nothing was written by the refused forms
    nisa.dma_compute(dst=view, srcs=[view, upd], reduce_op=nl.add, oob_mode=nisa.oob_mode.skip)
    ref = table.copy()
    ref[[3, 9, 0]] += val(upd)[[0, 1, 3]]  # the row at -1 is skipped
    np.testing.assert_allclose(val(acc), ref, rtol=1e-6)


def test_iota_shuffle_gather() -> None:
    d = nl.ndarray((4, 6), nl.int32)
    nisa.iota(dst=d, pattern=[[2, 3], [1, 2]], offset=5, channel_multiplier=10)
    p, a, b = np.indices((4, 3, 2))
    np.testing.assert_array_equal(val(d), (5 + 10 * p + 2 * a + b).reshape(4, 6))
    f = nl.ndarray((4, 6), nl.float32)
    nisa.iota(dst=f, pattern=[[1, 6]], offset=0)
    np.testing.assert_array_equal(val(f), np.broadcast_to(np.arange(6, dtype=F32), (4, 6)))
    src = tile(np.arange(64, dtype=F32).reshape(32, 2))
    dst = tile(np.full((32, 2), -1, F32))
    mask = [31 - i for i in range(32)]
    mask[3] = 255
    nisa.nc_stream_shuffle(dst=dst, src=src, shuffle_mask=mask)
    ref = np.arange(64, dtype=F32).reshape(32, 2)[::-1].copy()
    ref[3] = -1
    np.testing.assert_array_equal(val(dst), ref)
    data = tile(np.arange(20, dtype=F32).reshape(2, 10))
    g = nl.ndarray((2, 3), nl.float32)
    nisa.nc_n_gather(dst=g, data=data, indices=tile(np.array([[9, 0, 4], [1, 1, 2]], np.uint32)))
    np.testing.assert_array_equal(val(g), [[9, 0, 4], [11, 11, 12]])


def test_dma_gather_checks_the_address_not_only_the_index(rng: np.random.Generator) -> None:
    """The DGE checks addresses: index 4 of rows [0, 5) plus the access's offset of 2 elements runs past the
    tensor's 40; with oob_mode.skip the row is left as it was, without it the copy raises (never a host crash)."""
    table = rng.standard_normal((5, 8)).astype(F32)
    h = from_array(table)
    idx = tile(np.array([[1], [4]], np.int32))
    rows = nl.ndarray((2, 8), nl.float32)
    nisa.dma_copy(dst=rows, src=from_array(np.zeros((2, 8), F32)))
    nisa.dma_copy(dst=rows, src=h.ap(pattern=[[8, 2], [1, 8]], offset=2, vector_offset=idx, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    np.testing.assert_array_equal(val(rows)[0], table.reshape(-1)[10:18])
    np.testing.assert_array_equal(val(rows)[1], np.zeros(8, F32))
    with pytest.raises(SimulatorError, match="vector_offset index 4 out of bounds"):
        nisa.dma_copy(dst=rows, src=h.ap(pattern=[[8, 2], [1, 8]], offset=2, vector_offset=idx, indirect_dim=0))
