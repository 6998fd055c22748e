"""NkiTensor views, indexing rules, allocation, sentinels and capacity accounting."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from sim_helpers import tile, val

from neuron_compile.errors import RemovedAPIError, SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import nisa, nl, simulate, use_target
from neuron_compile.simulator.tensor import from_array


def test_sentinel_fill_and_attributes() -> None:
    f = nl.ndarray((4, 8), dtype=nl.float32)
    i = nl.ndarray((4, 8), dtype=nl.int32, buffer=nl.psum, name="acc")
    assert np.isnan(val(f)).all() and (val(i) == 4).all()
    assert (f.shape, f.strides, f.offset, f.dtype, f.buffer, f.ndim, f.size) == ((4, 8), (8, 1), 0, "float32",
                                                                                nl.sbuf, 2, 32)
    assert i.name == "acc" and i.buffer is nl.psum
    assert val(nl.zeros((2, 3), nl.bfloat16)).dtype == ml_dtypes.bfloat16
    assert (val(nl.full((2, 3), 7, nl.int16)) == 7).all()


def test_onchip_indexing_rules() -> None:
    t = nl.ndarray((128, 4, 8), nl.float32)
    assert t[0].shape == (1, 4, 8)
    assert t[:, 1].shape == (128, 8)
    assert t[:, 1, 2].shape == (128, 1)
    assert t[0, 0, 5].shape == (1, 1)
    assert t[..., 3].shape == (128, 4)
    assert t[nl.ds(32, 32), :, -1].shape == (32, 4)
    v = t[:, ::2, 1:7:3]
    assert v.shape == (128, 2, 2) and v.strides == (32, 16, 3) and v.offset == 1


def test_hbm_indexing_follows_numpy() -> None:
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    h = from_array(a)
    for key in [(1,), (1, 2), (slice(None), -1), (Ellipsis, 2), (slice(None, None, -1), slice(1, 4, 2))]:
        np.testing.assert_array_equal(val(h[key]), a[key])
    with pytest.raises(SimulatorError, match="out of bounds"):
        h[0:4]


def test_view_methods_against_numpy() -> None:
    a = np.arange(2 * 6 * 4, dtype=np.float32).reshape(2, 6, 4)
    h = from_array(a)
    np.testing.assert_array_equal(val(h.permute((2, 0, 1))), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(val(h.slice(1, 1, 5, 2)), a[:, 1:5:2])
    np.testing.assert_array_equal(val(h.select(2, 3)), a[:, :, 3])
    np.testing.assert_array_equal(val(h.reshape_dim(1, (3, -1))), a.reshape(2, 3, 2, 4))
    np.testing.assert_array_equal(val(h.flatten_dims(1, 2)), a.reshape(2, 24))
    np.testing.assert_array_equal(val(h.reshape((4, 12))), a.reshape(4, 12))
    np.testing.assert_array_equal(val(h.expand_dim(1)), a[:, None])
    np.testing.assert_array_equal(val(h[:, 0:1].broadcast(1, 3)), np.broadcast_to(a[:, 0:1], (2, 3, 4)))
    np.testing.assert_array_equal(val(h.expand_dim(0).squeeze_dim(0)), a)
    r = h.rearrange("p (a b) c", "p b a c", fixed_sizes={"a": 2})
    np.testing.assert_array_equal(val(r), a.reshape(2, 2, 3, 4).transpose(0, 2, 1, 3))
    r = h.rearrange("p (a b) c", "p a (b c)", fixed_sizes={"b": 3})
    np.testing.assert_array_equal(val(r), a.reshape(2, 2, 12))
    assert h.is_contiguous() and not h.permute((0, 2, 1)).is_contiguous()
    assert h.get_pattern() == [[24, 2], [4, 6], [1, 4]]
    with pytest.raises(SimulatorError, match="without a copy"):
        h.permute((0, 2, 1)).reshape((2, 24))


def test_view_reinterprets_bits() -> None:
    a = np.array([[1.0, -2.0]], dtype=np.float32)
    v = from_array(a).view(nl.int32)
    np.testing.assert_array_equal(val(v), a.view(np.int32))
    assert from_array(a).reinterpret_cast(nl.bfloat16).shape == (1, 4)


def test_onchip_view_restrictions() -> None:
    t = nl.ndarray((8, 4), nl.float32)
    with pytest.raises(SimulatorError, match="partition dim"):
        t.permute((1, 0))
    with pytest.raises(SimulatorError, match="partition dim"):
        t.broadcast(0, 4)
    with pytest.raises(SimulatorError, match="partition dim"):
        t.reshape((4, 8))


def test_ap_addresses_the_storage() -> None:
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    h = from_array(a)
    np.testing.assert_array_equal(val(h[2:4].ap([[8, 2], [2, 3]], offset=9)), [[9, 11, 13], [17, 19, 21]])
    np.testing.assert_array_equal(val(h.ap([[0, 3], [1, 8]], offset=8)), np.broadcast_to(a[1], (3, 8)))
    t = nl.ndarray((4, 8), nl.float32)
    with pytest.raises(SimulatorConstraintError) as e:
        t.ap([[4, 4], [1, 4]])
    assert e.value.instruction == "NkiTensor.ap" and e.value.operand == "pattern"
    past = h.ap([[8, 7], [1, 8]])  # a descriptor past the tensor: an error only once something uses it
    with pytest.raises(SimulatorError, match="outside tensor"):
        val(past)


def test_no_operator_overloads_and_setitem() -> None:
    t = tile(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="does not overload"):
        t + t  # noqa: B018
    with pytest.raises(TypeError):
        np.float32(2) * t  # noqa: B018
    t[:, 1] = 5.0
    np.testing.assert_array_equal(val(t), [[1, 5, 1], [1, 5, 1]])
    u = nl.ndarray((2, 3), nl.float32)
    u[...] = t
    np.testing.assert_array_equal(val(u), val(t))


def test_allocation_errors() -> None:
    with pytest.raises(RemovedAPIError, match="nl.sbuf"):
        nl.ndarray((2, 2), nl.float32, buffer="sbuf")
    with pytest.raises(SimulatorConstraintError) as e:
        nl.ndarray((256, 2), nl.float32)
    assert e.value.operand == "shape" and "<= 128" in str(e.value.limit)
    with pytest.raises(SimulatorConstraintError, match="at least one dim"):
        nl.ndarray((), nl.float32)
    vec = nl.ndarray((128,), nl.float32)  # 1-D on-chip: the partition dim alone (one element per partition)
    assert vec.shape == (128,) and vec.pinfo() == (0, 128, 1)


@pytest.mark.parametrize(("target", "budget"), [("trn1", 192 * 1024), ("trn2", 208 * 1024), ("trn3", 240 * 1024)])
def test_sbuf_capacity_per_target(target: str, budget: int) -> None:
    def fill(extra: int) -> None:
        big = nl.ndarray((128, budget // 4), nl.float32, name="big")
        more = nl.ndarray((128, extra), nl.float32, name="one_more")
        nisa.memset(dst=big, value=0.0)
        nisa.memset(dst=more, value=0.0)
        nisa.tensor_copy(dst=big[:, 0:1], src=more[:, 0:1])  # both live at once

    with use_target(target):
        with pytest.raises(SimulatorConstraintError) as e:
            simulate(fill, strict_capacity=True)(1)
        assert "'one_more'" in str(e.value) and str(budget) in str(e.value.limit)
        with pytest.raises(SimulatorConstraintError, match="alone needs"):
            nl.ndarray((128, budget // 4 + 1), nl.float32)

        def sequential() -> None:
            for _ in range(20):  # loop-local tiles: each dies after its iteration
                t = nl.ndarray((128, budget // 8), nl.float32)
                nisa.memset(dst=t, value=1.0)
            big = nl.ndarray((128, budget // 4), nl.float32)
            nisa.memset(dst=big, value=0.0)

        simulate(sequential, strict_capacity=True)()
        with pytest.raises(SimulatorConstraintError, match="PSUM"):
            nl.ndarray((128, 4097), nl.float32, buffer=nl.psum)


def test_removed_and_unimplemented_names() -> None:
    from neuron_compile.simulator import nki

    with pytest.raises(RemovedAPIError, match="nl.ds"):
        nl.arange  # noqa: B018
    with pytest.raises(RemovedAPIError, match="partition dim first"):
        nl.par_dim  # noqa: B018
    with pytest.raises(RemovedAPIError, match="scalar_offset"):
        nisa.tensor_copy_dynamic_src  # noqa: B018
    with pytest.raises(NotImplementedError, match="nki.collectives.all_reduce"):
        nki.collectives.all_reduce  # noqa: B018
    with pytest.warns(DeprecationWarning, match="nisa.engine.vector"):
        assert nisa.vector_engine is nisa.engine.vector
    with pytest.warns(DeprecationWarning):
        assert list(nl.affine_range(3)) == [0, 1, 2]
    with pytest.raises(RemovedAPIError, match="accumulate="):
        nisa.nc_matmul(dst=None, stationary=None, moving=None, psumAccumulateFlag=1)
    with pytest.raises(RemovedAPIError, match="min"):
        nisa.tensor_copy(dst=None, src=None, mask=None)
    with pytest.raises(RemovedAPIError, match="dge_mode.hwdge"):
        a = tile(np.ones((2, 2), np.float32))
        nisa.dma_copy(dst=a, src=a, dge_mode=2)
