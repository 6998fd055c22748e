"""The simulator as permissive and as strict as NKI 0.6: each case is one documented rule (the nki.isa /
nki.language API reference pages, the NKI Migration Guide), checked with kernels written as NKI users
write them and compared with NumPy."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest
import torch

from neuron_compile.errors import RemovedAPIError, SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import load_kernel_source, nisa, nki, nl, simulate, use_target
from neuron_compile.simulator.checks import SimulatorWarning

log = logging.getLogger(__name__)

BF16 = ml_dtypes.bfloat16


# ------------------------------------------------------------------------ HW-DGE dma_transpose

def _hwdge_transpose(src_pattern: list[list[int]], dst_split: int):
    """x [rows, 128] bf16 -> SBUF [128, rows] through one 4-D HW-DGE transpose whose source is ``src_pattern``
    (16 rows x tiles x row groups x 128) and whose destination splits its rows into groups of ``dst_split``."""
    def kernel(x):
        rows = x.shape[0]
        out = nl.ndarray((128, rows), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 1, rows), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t[0:128, 0:1, 0:rows].reshape_dim(2, [rows // dst_split, dst_split]),
                           src=x.ap(pattern=src_pattern, offset=0), axes=(3, 1, 2, 0), dge_mode=nisa.dge_mode.hwdge)
        nisa.dma_copy(dst=out, src=t[0:128, 0, 0:rows])
        return out
    return kernel


def test_hwdge_4d_transpose_of_row_groups() -> None:
    """The matmul's A loads: src [16 rows, 1, rows / 16 groups, 128] -> dst [128, 1, rows / 16, 16] is x.T."""
    x = np.random.default_rng(2).standard_normal((96, 128)).astype(BF16)
    got = simulate(_hwdge_transpose([[128, 16], [128, 1], [16 * 128, 6], [1, 128]], 16))(x)
    np.testing.assert_array_equal(got.astype(np.float32), x.T.astype(np.float32))


def test_hwdge_transpose_documented_shapes() -> None:
    """HW-DGE: src.shape[0] in {1, 2, 4, 8, 16} and src.shape[0] * src.shape[-2] a multiple of 16."""
    x = np.zeros((96, 128), BF16)
    with pytest.raises(SimulatorConstraintError, match=r"src.shape\[0\] in \{1, 2, 4, 8, 16\}"):
        simulate(_hwdge_transpose([[128, 32], [128, 1], [32 * 128, 3], [1, 128]], 32))(x)
    with pytest.raises(SimulatorConstraintError, match="a multiple of 16"):
        simulate(_hwdge_transpose([[128, 8], [128, 1], [8 * 128, 1], [1, 128]], 8))(x[:8])
    with pytest.raises(SimulatorConstraintError, match="2-byte dtype"):
        simulate(_hwdge_transpose([[128, 16], [128, 1], [16 * 128, 6], [1, 128]], 16))(x.astype(np.float32))


def _queued_copy(dst_dtype, **kw):
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=dst_dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x, **kw)
        nisa.dma_copy(dst=out, src=t)
        return out
    return kernel


def test_dma_copy_names_its_queue_only_on_the_hardware_dge() -> None:
    """nki.isa.dma_copy: engine= (sync or scalar, the sequencers driving the hardware DGE) "only valid when
    dge_mode=nisa.dge_mode.hwdge"; the hardware DGE converts no dtype (NC-v3+)."""
    x = np.random.default_rng(3).standard_normal((128, 64)).astype(np.float32)
    hw = {"dge_mode": nisa.dge_mode.hwdge}
    for eng in (nisa.engine.sync, nisa.engine.scalar):
        np.testing.assert_array_equal(simulate(_queued_copy(nl.float32, engine=eng, **hw))(x), x)
        with pytest.raises(SimulatorConstraintError, match="engine= only with dge_mode=nisa.dge_mode.hwdge"):
            simulate(_queued_copy(nl.float32, engine=eng))(x)
    with pytest.raises(SimulatorConstraintError, match="nisa.engine.sync or nisa.engine.scalar"):
        simulate(_queued_copy(nl.float32, engine=nisa.engine.vector, **hw))(x)
    with pytest.raises(SimulatorConstraintError, match=r"dtype == src dtype \(float32\) with dge_mode=hwdge"):
        simulate(_queued_copy(nl.bfloat16, engine=nisa.engine.sync, **hw))(x)
    # a converting copy leaves queue and DGE to the compiler
    got = simulate(_queued_copy(nl.bfloat16))(x)
    np.testing.assert_array_equal(got, x.astype(BF16).astype(np.float32))
    with use_target("trn1"), pytest.raises(SimulatorConstraintError, match="needs NeuronCore-v3"):
        simulate(_queued_copy(nl.float32, engine=nisa.engine.sync, **hw))(x)


# ------------------------------------------------------------------------ indirect dma_transpose

def _gather_transpose(cols: int):
    def kernel(src_hbm, idx_hbm, oob=nisa.oob_mode.error):
        f = 128 * cols
        out = nl.ndarray((128, f), dtype=src_hbm.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((128, cols), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=idx_hbm)
        dst = nl.ndarray((128, f), dtype=src_hbm.dtype, buffer=nl.sbuf)
        nisa.memset(dst=dst, value=0.0)
        view = src_hbm.ap(pattern=[[128, f], [1, 128]], vector_offset=idx, indirect_dim=0)
        nisa.dma_transpose(dst=dst, src=view, axes=(1, 0), oob_mode=oob)
        nisa.dma_copy(dst=out, src=dst)
        return out
    return kernel


@pytest.mark.parametrize("cols", [1, 2])
def test_indirect_dma_transpose_gathers_then_transposes(cols: int) -> None:
    """dst = src[indices.T.flatten()].T (indices read column by column), the docstring's semantics."""
    rng = np.random.default_rng(0)
    src = rng.standard_normal((300, 128)).astype(BF16)
    idx = rng.integers(0, 300, size=(128, cols)).astype(np.uint32)
    got = simulate(_gather_transpose(cols))(src, idx)
    want = src[idx.T.reshape(-1)].T
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_indirect_dma_transpose_oob_skip_and_error() -> None:
    rng = np.random.default_rng(1)
    src = rng.standard_normal((64, 128)).astype(BF16)
    idx = rng.integers(0, 64, size=(128, 1)).astype(np.uint32)
    idx[[3, 77]] = 1000  # out of range rows
    got = simulate(_gather_transpose(1))(src, idx, nisa.oob_mode.skip)
    want = src[np.minimum(idx[:, 0], 63)].T.astype(np.float32)
    want[:, [3, 77]] = 0.0  # skipped: the memset value stays
    np.testing.assert_array_equal(got.astype(np.float32), want)
    with pytest.raises(SimulatorError, match="index 1000 out of bounds for 64 rows"):
        simulate(_gather_transpose(1))(src, idx)


def test_indirect_dma_transpose_documented_limits() -> None:
    idx = np.zeros((128, 1), np.uint32)
    with pytest.raises(SimulatorConstraintError, match="2-byte dtype"):
        simulate(_gather_transpose(1))(np.zeros((128, 128), np.float32), idx)
    with pytest.raises(SimulatorConstraintError, match="uint32 indices"):
        def k(src_hbm, idx_hbm):
            i = nl.ndarray((128, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=i, src=idx_hbm)
            dst = nl.ndarray((128, 128), dtype=src_hbm.dtype, buffer=nl.sbuf)
            nisa.dma_transpose(dst=dst, src=src_hbm.ap(pattern=[[128, 128], [1, 128]], vector_offset=i))
        simulate(k)(np.zeros((128, 128), BF16), idx.astype(np.int32))
    with use_target("trn1"), pytest.raises(SimulatorConstraintError, match="NeuronCore-v3"):
        simulate(_gather_transpose(1))(np.zeros((128, 128), BF16), idx)


# ------------------------------------------------------------------------ capacity and address=

def _many_psum_tiles(a):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    keep = []
    for bank in range(8):  # 8 full banks placed by hand, then 8 more in the same banks: no allocator budget
        keep.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, bank * 2048)))
        keep.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, bank * 2048)))
    t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.tensor_copy(dst=keep[-1], src=t)
    nisa.tensor_copy(dst=t, src=keep[-1])
    nisa.dma_copy(dst=out, src=t)
    return out


def test_address_placed_tiles_share_their_bank() -> None:
    a = np.random.default_rng(2).standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_array_equal(simulate(_many_psum_tiles, strict_capacity=True)(a), a)


@pytest.mark.parametrize(("address", "message"), [
    ((0, 1024), "bank boundary"),
    ((0, 16384), "byte_offset"),
    ((64, 0), "partition_offset"),
])
def test_bad_addresses_are_refused(address: tuple[int, int], message: str) -> None:
    def k(a):
        nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=address)
    with pytest.raises(SimulatorConstraintError, match=message):
        simulate(k)(np.zeros((1, 1), np.float32))


def _over_budget(a):
    keep = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]  # 9 banks of 8
    for t in keep:
        nisa.memset(dst=t, value=1.0)
    s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    for t in keep:  # every bank is still used here: all 9 are live at once
        nisa.tensor_copy(dst=s, src=t)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    return out, len(keep)


def test_capacity_warns_like_aws_and_raises_when_strict() -> None:
    a = np.ones((2, 2), np.float32)
    with pytest.warns(SimulatorWarning, match="exceed 16384 on trn3"):
        out, n = simulate(_over_budget)(a)
    assert n == 9 and (out == a).all()
    with pytest.raises(SimulatorConstraintError, match="live PSUM bytes per partition <= 16384") as info:
        simulate(_over_budget, strict_capacity=True)(a)
    assert "18432 B/partition live at once (9 tiles" in str(info.value)


def _tiles_per_iteration(a, hold):
    """Each iteration allocates 6 PSUM banks; the previous iteration's tiles are dead once it ends
    (a Python name may still refer to them) unless ``hold`` keeps using the first iteration's."""
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=a)
    first = None
    for _ in range(3):
        acc = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(6)]
        for t in acc:
            nisa.tensor_copy(dst=t, src=s)
        if first is None:
            first = acc
        for t in acc:
            nisa.tensor_copy(dst=s, src=t)
        if hold:
            for t in first:
                nisa.tensor_copy(dst=s, src=t)
    nisa.dma_copy(dst=out, src=s)
    return out


def test_tiles_are_freed_after_their_last_use_not_when_their_names_go() -> None:
    a = np.random.default_rng(5).standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_array_equal(simulate(_tiles_per_iteration, strict_capacity=True)(a, False), a)
    with pytest.raises(SimulatorConstraintError, match=r"24576 B/partition live at once \(12 tiles"):
        simulate(_tiles_per_iteration, strict_capacity=True)(a, True)


# ------------------------------------------------------------------------ loops, objects, returns, shapes

def test_dynamic_range_takes_register_bounds() -> None:
    def k(a):
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        acc = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0)
        n = nisa.register_alloc()
        nisa.register_load(n, a)
        for _ in nl.dynamic_range(n):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)
        for _ in nl.dynamic_range(2, n, 2):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=10.0)
        nisa.dma_copy(dst=out, src=acc)
        return out
    with pytest.warns(DeprecationWarning, match="nl.fori_loop"):
        got = simulate(k)(np.array([[7]], np.int32))
    assert int(got[0, 0]) == 7 + 10 * len(range(2, 7, 2))


def test_nkiobject_dataclasses_construct_as_dataclasses() -> None:
    @dataclass
    class Tiles(nl.NKIObject):
        sizes: list = field(default_factory=list)
        p: int = 128

    @dataclass(frozen=True)
    class Frozen(nl.NKIObject):
        skip: bool = False

    @dataclass
    class Derived(Tiles):
        extra: int = 0

        def __post_init__(self) -> None:
            self.sizes.append(self.extra)

    class Plain(nl.NKIObject):
        a: int
        b: int = 2

    class Bag(nl.NKIObject):
        pass

    assert Tiles().sizes == [] and Tiles().sizes is not Tiles().sizes and Tiles(p=64).p == 64
    assert Frozen().skip is False and Frozen(True).skip is True
    with pytest.raises(AttributeError):
        Frozen().skip = True  # type: ignore[misc]
    assert Derived(extra=3).sizes == [3]
    assert (Plain(1).a, Plain(1).b, Plain(1, b=5).b) == (1, 2, 5)
    assert Bag(x=4).x == 4  # type: ignore[attr-defined]
    unset = Plain(b=3)  # a field left out stays unset until assigned (NKIObject.__init__(**kwargs))
    with pytest.raises(AttributeError, match="'a'"):
        unset.a  # noqa: B018
    unset.a = 4
    assert (unset.a, unset.b) == (4, 3)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_in_place_kernel_may_return_its_argument(kind: str) -> None:
    def scale_in_place(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=x, src=t)
        return x

    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = torch.from_numpy(base.copy()) if kind == "torch" else base.copy()
    got = nki.jit(scale_in_place)(x)
    assert got is x
    np.testing.assert_array_equal(np.asarray(x), base * 3)


def test_one_dimensional_sbuf_tiles_of_the_register_examples() -> None:
    def k(a):
        bound = nl.ones([1], dtype=nl.int32, buffer=nl.sbuf)
        reg = nisa.register_alloc()
        nisa.register_load(reg, bound)
        nisa.register_move(reg, 41)
        res = nl.ndarray([1], dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(res, reg)
        out = nl.ndarray([1], dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out
    assert simulate(k)(np.zeros(1, np.int32)).tolist() == [41]
    with pytest.raises(SimulatorConstraintError, match="partition dim <= 128"):
        nl.ndarray([129], dtype=nl.int32)


def test_typing_constants_and_dtype_namespaces() -> None:
    src = """
import nki
import nki.language as nl
import nki.isa as nisa
import nki.typing as nt
from nki.typing import tensor
from nki.isa.constants import dge_mode, oob_mode


@nki.jit
def copy(a: nt.tensor[4, 8], b: tensor[4, 8], dt: nki.dtype = nl.float32):
    t = nl.ndarray(a.shape, dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a, dge_mode=dge_mode.swdge, oob_mode=oob_mode.error)
    out = nl.ndarray(a.shape, dtype=dt, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t, dge_mode=nisa.constants.dge_mode.none)
    return out
"""
    kernel = load_kernel_source(src, "typing_kernel.py")["copy"]
    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(kernel(a, a), a)
    assert nisa.constants.dge_mode is nisa.dge_mode and repr(nki.typing.tensor[128, 512]) == "nki.typing.tensor[128, 512]"


@pytest.mark.parametrize("mode", ["unknown", "swdge", "none", "hwdge"])
def test_dge_modes_of_aws_library_copies(mode: str) -> None:
    """Every dge_mode member is a valid dma_copy mode for a same-dtype copy (hwdge: NC-v3+)."""
    def k(a):
        t = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
        reg = nisa.register_alloc(1)
        nisa.dma_copy(dst=t, src=a.ap(pattern=[[8, 4], [1, 8]], scalar_offset=reg, indirect_dim=0),
                      dge_mode=getattr(nisa.dge_mode, mode))
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t, dge_mode=getattr(nisa.dge_mode, mode))
        return out
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    with use_target("trn2"):
        np.testing.assert_array_equal(simulate(k)(a), a[1:5])


# ------------------------------------------------------------------------ rules enforced

def test_select_reduce_reduces_with_maximum_only() -> None:
    def k(a, op):
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        pred = nl.ndarray((4, 8), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.memset(dst=pred, value=1)
        res = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=t, predicate=pred, on_true=t, on_false=0.0, reduce_res=res,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=op)
        out = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out
    a = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(simulate(k)(a, nl.maximum)[:, 0], a.max(axis=1))
    for op in (nl.add, nl.minimum):
        with pytest.raises(SimulatorConstraintError, match="nl.maximum, the only reduction"):
            simulate(k)(a, op)


def test_gpsimd_never_touches_psum() -> None:
    p = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.psum)
    s = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=s, value=2.0)
    with pytest.raises(SimulatorConstraintError, match="GpSimd cannot access PSUM"):
        nisa.tensor_tensor(dst=p, data1=s, data2=s, op=nl.add, engine=nisa.engine.gpsimd)
    with pytest.raises(SimulatorConstraintError, match="nl.power runs on GpSimd, which cannot access PSUM"):
        nisa.tensor_tensor(dst=p, data1=s, data2=s, op=nl.power)
    with pytest.raises(SimulatorConstraintError, match="GpSimd cannot access PSUM"):
        nisa.iota(dst=p, pattern=[[1, 8]])


# ------------------------------------------------------------------------ legacy call forms

@pytest.mark.parametrize("call", [
    lambda a: nisa.tensor_tensor(a, a, nl.add),
    lambda a: nisa.activation(op=nl.exp, data=a),
    lambda a: nisa.nc_transpose(a),
    lambda a: nisa.tensor_copy(a),
    lambda a: nisa.tensor_reduce(nl.add, a, axis=1),
    lambda a: nisa.iota(a, [[1, 8]], dtype=nl.float32),
])
def test_value_returning_isa_calls_get_the_migration_hint(call) -> None:  # type: ignore[no-untyped-def]
    a = nl.ndarray((4, 8), dtype=nl.float32)
    with pytest.raises(RemovedAPIError, match="stopped (returning their result|taking dtype=) .*NKI 0.2"):
        call(a)


def test_instruction_handles_depend_and_refuse_tensor_use() -> None:
    a = nl.ndarray((4, 8), dtype=nl.float32)
    first = nisa.memset(dst=a, value=1.0)
    second = nisa.tensor_scalar(dst=a, data=a, op0=nl.multiply, operand0=2.0, name="double")
    assert isinstance(second, nisa.NkiInstruction) and second.depends_on(first) is second
    assert second.producers == (first,) and repr(second) == "NkiInstruction(nisa.tensor_scalar, name='double')"
    with pytest.raises(RemovedAPIError, match="is not a tensor"):
        second.shape  # noqa: B018
    with pytest.raises(TypeError, match="instruction handles"):
        second.depends_on(a)


@pytest.mark.parametrize("call", [
    lambda a: nl.exp(a, mask=None),
    lambda a: nl.add(a, a, mask=None),
    lambda a: nl.sum(a, axis=1, mask=None),
    lambda a: nisa.tensor_copy(dst=a, src=a, mask=None),
])
def test_mask_keyword_gets_the_migration_hint(call) -> None:  # type: ignore[no-untyped-def]
    a = nl.ndarray((4, 8), dtype=nl.float32)
    with pytest.raises(RemovedAPIError, match="mask= .*removed in NKI 0.2.0|mask= is gone"):
        call(a)


def test_other_bad_calls_quote_the_documented_signature() -> None:
    a = nl.ndarray((4, 8), dtype=nl.float32)
    with pytest.raises(TypeError, match=r"the NKI 0.6 signature is nki.language.exp\(x, dtype=None\)"):
        nl.exp(a, a, a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nisa.memset(dst=a, value=0.0)  # a correct call raises and warns nothing


def test_ap_with_a_dtype_of_another_size_reinterprets_bytes() -> None:
    """``t.ap(pattern, dtype=...)`` counts strides in the new dtype: a (4, 1) fp32 tile read as 4 x 4 bytes."""
    def k(a):
        t = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = nl.ndarray((4, 4), dtype=nl.uint8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t.ap(pattern=[[4, 4], [1, 4]], dtype=nl.uint8))
        half = nl.ndarray((4, 2), dtype=nl.uint16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=half, src=t.ap(pattern=[[2, 4], [1, 2]], dtype=nl.uint16))
        return out, half
    a = np.array([[1.5], [-2.0], [3.25], [1e-3]], np.float32)
    out, half = simulate(k)(a)
    np.testing.assert_array_equal(out, a.view(np.uint8).reshape(4, 4))
    np.testing.assert_array_equal(half, a.view(np.uint16).reshape(4, 2))
    with pytest.raises(SimulatorConstraintError, match=r"partition stride == elements per partition \(4\)"):
        def bad(a):
            t = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
            t.ap(pattern=[[1, 4], [1, 4]], dtype=nl.uint8)
        simulate(bad)(a)


def test_hbm_ap_reinterprets_across_rows() -> None:
    """In HBM (no partitions) only the whole tensor's bytes must hold whole new elements: a flat (6,) bf16 tensor reads
    as three fp32 (AWS's MX loaders read bf16 pairs as fp32 this way); on chip each partition's bytes must."""
    def k(a):
        out = nl.ndarray((3,), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a.ap(pattern=[[1, 3]], dtype=nl.float32))
        return out
    import ml_dtypes

    a = np.array([1.5, -2.0, 3.25, 0.5, 7.0, -1e-3], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(simulate(k)(a), a.view(np.float32))
    with pytest.raises(SimulatorError, match=r"cannot be viewed as float32 \(its size in bytes is not a multiple of 4\)"):
        simulate(k)(a[:5].copy())
    with pytest.raises(SimulatorError, match=r"cannot be viewed as float32"):
        def on_chip(a):
            t = nl.ndarray((2, 3), dtype=nl.bfloat16, buffer=nl.sbuf)
            t.ap(pattern=[[1, 2], [1, 1]], dtype=nl.float32)
        simulate(on_chip)(a)
