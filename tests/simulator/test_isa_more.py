"""The nki.isa instructions added for full coverage, each against the NumPy statement of its API
reference page: randomness (rng, dropout, seeds and states, rand2), topk, local_gather,
sequence_bounds, nonzero_with_count, nc_match_replace8, activate2, quantize_mx / nc_matmul_mx, and
the LNC-only core_barrier / sendrecv (clear errors; their two-thread runs: test_lnc.py)."""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import pytest
from sim_helpers import tile, val

from neuron_compile import nki_api
from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import implemented_names, nisa, nki, nl, simulate, use_target
from neuron_compile.simulator import state as _state

log = logging.getLogger(__name__)

F32 = np.float32
BF16 = ml_dtypes.bfloat16


@pytest.fixture(autouse=True)
def fresh_state():  # type: ignore[no-untyped-def]
    st = _state.SimState()
    _state.push(st)
    yield st
    _state.pop(st)


def test_every_public_isa_name_is_implemented() -> None:
    public = nki_api.isa_instructions()
    assert len(public) == 67
    assert sorted(implemented_names()["nki.isa"]) == sorted(public)


def test_rng_fills_integer_tiles_with_random_bits() -> None:
    t = nl.ndarray((128, 256), dtype=nl.uint32)
    nisa.rng(dst=t)
    bits = val(t).astype(np.uint64)
    assert len(np.unique(bits)) > 0.99 * bits.size
    ones = np.unpackbits(bits.astype(np.uint32).view(np.uint8)).mean()
    assert abs(ones - 0.5) < 0.01  # each bit is a fair coin
    small = nl.ndarray((16, 64), dtype=nl.int8)
    nisa.rng(dst=small, engine=nisa.engine.gpsimd)
    assert val(small).min() < -100 and val(small).max() > 100
    with pytest.raises(SimulatorConstraintError, match="an integer dtype"):
        nisa.rng(dst=nl.ndarray((4, 4), dtype=nl.float32))
    with pytest.raises(SimulatorConstraintError, match="GpSimd cannot access PSUM"):
        nisa.rng(dst=nl.ndarray((4, 4), dtype=nl.uint32, buffer=nl.psum), engine=nisa.engine.gpsimd)
    with use_target("trn1"), pytest.raises(SimulatorConstraintError, match="NeuronCore-v3"):
        nisa.rng(dst=small, engine=nisa.engine.gpsimd)


def test_seeds_and_states_replay_the_same_numbers() -> None:
    seed = tile(np.array([[1234]], np.uint32))
    a, b = nl.ndarray((8, 32), dtype=nl.uint32), nl.ndarray((8, 32), dtype=nl.uint32)
    nisa.set_rng_seed(src_seeds=seed)
    nisa.rng(dst=a)
    nisa.set_rng_seed(src_seeds=seed)
    nisa.rng(dst=b)
    np.testing.assert_array_equal(val(a), val(b))
    saved = nl.ndarray((8, 6), dtype=nl.uint32)
    nisa.rand_get_state(dst=saved)
    nisa.rng(dst=a, engine=nisa.engine.gpsimd)
    nisa.rand_set_state(src_seeds=saved)
    nisa.rng(dst=b, engine=nisa.engine.gpsimd)
    np.testing.assert_array_equal(val(a), val(b))
    with pytest.raises(SimulatorConstraintError, match="6 elements per partition"):
        nisa.rand_set_state(src_seeds=nl.ndarray((8, 5), dtype=nl.uint32))
    with use_target("trn2"), pytest.raises(SimulatorConstraintError, match="NeuronCore-v4"):
        nisa.rand_get_state(dst=nl.ndarray((8, 24), dtype=nl.uint32), engine=nisa.engine.vector)


@pytest.mark.parametrize("prob", [0.0, 0.25, 1.0, "tile"])
def test_dropout_zeroes_with_the_given_probability(prob: object) -> None:
    x = np.random.default_rng(4).uniform(1, 2, (128, 512)).astype(F32)
    data = tile(x)
    dst = nl.ndarray(data.shape, dtype=nl.float32)
    rates = np.linspace(0, 1, 128, dtype=F32).reshape(128, 1)
    p = tile(rates) if prob == "tile" else prob
    nisa.dropout(dst=dst, data=data, prob=p)
    got = val(dst)
    kept = got != 0
    np.testing.assert_array_equal(got[kept], x[kept])  # kept elements are unchanged (no rescaling)
    want = (1 - rates[:, 0]) if prob == "tile" else np.full(128, 1 - float(prob))  # type: ignore[arg-type]
    np.testing.assert_allclose(kept.mean(axis=1).mean(), want.mean(), atol=0.01)
    if prob == "tile":
        assert kept[0].all() and not kept[-1].any()
    with pytest.raises(SimulatorConstraintError, match="dtype == data dtype"):
        nisa.dropout(dst=nl.ndarray((128, 512), dtype=nl.bfloat16), data=data, prob=0.5)


def test_rand2_is_uniform_in_its_range() -> None:
    t = nl.ndarray((128, 512), dtype=nl.float32)
    nisa.rand2(dst=t, min=-2.0, max=3.0)
    v = val(t)
    assert v.min() >= -2.0 and v.max() <= 3.0 and abs(v.mean() - 0.5) < 0.05
    with pytest.raises(SimulatorConstraintError, match="min < max"):
        nisa.rand2(dst=t, min=1.0, max=1.0)
    with use_target("trn2"), pytest.raises(SimulatorConstraintError, match="NeuronCore-v4"):
        nisa.rand2(dst=t, min=0.0, max=1.0)


def test_topk_of_a_16_partition_snake() -> None:
    n, k = 42, 8
    snake = np.random.default_rng(5).permutation(np.arange(n, dtype=F32) - 20)
    src_x = (n + 15) // 16
    cols = np.full(16 * src_x, -1e4, F32)
    cols[:n] = snake
    src = tile(cols.reshape(src_x, 16).T.astype(BF16), "bfloat16")  # element e at [e % 16, e // 16]
    vals = nl.ndarray((16, k), dtype=nl.bfloat16)
    idx = nl.ndarray((16, k), dtype=nl.uint32)
    nisa.topk(val_dst=vals, idx_dst=idx, src=src, n=n)
    order = np.argsort(snake)[-k:]
    np.testing.assert_array_equal(val(vals).astype(F32), np.tile(snake[order], (16, 1)))
    np.testing.assert_array_equal(val(idx), np.tile(order, (16, 1)))
    with pytest.raises(SimulatorConstraintError, match="K <= n"):
        nisa.topk(val_dst=nl.ndarray((16, 9), dtype=nl.bfloat16), idx_dst=nl.ndarray((16, 9), dtype=nl.uint32),
                  src=src, n=8)


def test_local_gather_matches_its_numpy_statement() -> None:
    rng = np.random.default_rng(6)
    src = rng.standard_normal((128, 512, 4)).astype(F32)
    per_core = rng.integers(0, 512, (16, 4)).astype(np.uint16)
    index = np.tile(per_core, (8, 1))
    m, valid = 4, 64
    dst = nl.ndarray((128, valid * m), dtype=nl.float32)
    nisa.local_gather(dst=dst, src_buffer=tile(src.reshape(128, -1)), index=tile(index * m, "uint16"),
                      num_elem_per_idx=m, num_valid_indices=valid)
    want = np.empty((128, valid, m), F32)
    for g in range(0, 128, 16):
        flat = index[g:g + 16].flatten(order="F")[:valid]
        want[g:g + 16] = np.take(src[g:g + 16], flat, axis=1)
    np.testing.assert_array_equal(val(dst).reshape(128, valid, m), want)
    with pytest.raises(SimulatorConstraintError, match="one of 1, 2, 4, 8, 16, 32"):
        nisa.local_gather(dst=dst, src_buffer=tile(src.reshape(128, -1)), index=tile(index, "uint16"),
                          num_elem_per_idx=3)


def test_sequence_bounds_of_segments() -> None:
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], F32)
    dst = nl.ndarray((1, 2, 9), dtype=nl.float32)
    nisa.sequence_bounds(dst=dst, segment_ids=tile(ids))
    np.testing.assert_array_equal(val(dst)[0], [[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]])


def test_nonzero_with_count_on_every_16th_partition() -> None:
    x = np.zeros((32, 8), np.int32)
    x[0] = [0, 1, 1, 0, 0, 1, 0, 0]
    x[16, 7] = 5
    dst = tile(np.full((32, 9), 77, np.int32))
    nisa.nonzero_with_count(dst=dst, src=tile(x), index_offset=16, padding_val=-1)
    got = val(dst)
    assert got[0].tolist() == [17, 18, 21, -1, -1, -1, -1, -1, 3]
    assert got[16].tolist() == [23] + [-1] * 7 + [1]
    assert (got[1:16] == 77).all() and (got[17:] == 77).all()


def test_nc_match_replace8_pairs_duplicates_from_the_last_slot() -> None:
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 9]], F32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], F32)
    dst = nl.ndarray((1, 12), dtype=nl.float32)
    idx = nl.ndarray((1, 8), dtype=nl.uint32)
    nisa.nc_match_replace8(dst=dst, data=tile(data), vals=tile(vals), imm=-1.0, dst_idx=idx)
    assert val(idx)[0].tolist() == [2, 10, 9, 8, 7, 6, 5, 4]
    assert val(dst)[0].tolist() == [1, 2, -1, 4, -1, -1, -1, -1, -1, -1, -1, 9]


def test_activate2_scale_bias_activation_and_reduction() -> None:
    x = np.random.default_rng(7).standard_normal((64, 96)).astype(F32)
    bias = np.random.default_rng(8).standard_normal((64, 1)).astype(F32)
    dst = nl.ndarray((64, 96), dtype=nl.float32)
    res = nl.ndarray((64, 1), dtype=nl.float32)
    nisa.activate2(dst=dst, op=nl.exp, data=tile(x), imm0=0.5, imm1=tile(bias), op0=nl.multiply, op1=nl.subtract,
                   reduce_op=nl.maximum, reduce_res=res, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    want = np.exp(x * 0.5 - bias)
    np.testing.assert_allclose(val(dst), want, rtol=1e-6)
    np.testing.assert_allclose(val(res)[:, 0], want.max(axis=1), rtol=1e-6)
    nisa.activate2(dst=dst, op=nl.prelu, data=tile(x), imm0=2.0, imm1=0.0, op0=nl.subtract, op1=nl.bypass,
                   relu_param=0.1, reverse0=True)
    y = 2.0 - x
    np.testing.assert_allclose(val(dst), np.where(y >= 0, y, 0.1 * y), rtol=1e-6)
    with pytest.raises(SimulatorConstraintError, match="one of \\(multiply, add\\)"):
        nisa.activate2(dst=dst, op=nl.exp, data=tile(x), imm0=1.0, imm1=1.0, op0=nl.add, op1=nl.add)
    with use_target("trn2"), pytest.raises(SimulatorConstraintError, match="NeuronCore-v4"):
        nisa.activate2(dst=dst, op=nl.exp, data=tile(x), imm0=1.0, imm1=1.0, op0=nl.multiply, op1=nl.add)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn_x4", "float8_e5m2_x4"])
def test_quantize_mx_then_matmul_mx_matches_numpy(fmt: str) -> None:
    """A bf16 matmul through MXFP8: quantize both operands (scales per 8 partitions x 4 values) and
    multiply; equals NumPy on the dequantized values exactly, and the bf16 product within fp8 error."""
    rng = np.random.default_rng(9)
    k, m, n = 64, 32, 48
    a = rng.standard_normal((k, 4 * m)).astype(BF16)  # stationary [K, 4M], contraction over K and the x4 dim
    b = rng.standard_normal((k, 4 * n)).astype(BF16)
    qa, qb = nl.ndarray((k, m), dtype=fmt), nl.ndarray((k, n), dtype=fmt)
    sa, sb = nl.ndarray((k, m), dtype=nl.float8_e8m0fnu), nl.ndarray((k, n), dtype=nl.float8_e8m0fnu)
    nisa.quantize_mx(dst=qa, src=tile(a, "bfloat16"), dst_scale=sa)
    nisa.quantize_mx(dst=qb, src=tile(b, "bfloat16"), dst_scale=sb)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=qa, moving=qb, stationary_scale=sa, moving_scale=sb)

    from neuron_compile.simulator.isa_mx import scale_rows, unpack

    def dequant(q, s, p, f):  # type: ignore[no-untyped-def]
        scales = val(s).astype(F32)[scale_rows(p)]  # (p/8, f)
        return (unpack(q).reshape(p // 8, 8, f, 4) * scales[:, None, :, None]).reshape(p, 4 * f)

    da, db = dequant(qa, sa, k, m), dequant(qb, sb, k, n)
    want = np.einsum("kmq,knq->mn", da.reshape(k, m, 4), db.reshape(k, n, 4))
    np.testing.assert_allclose(val(acc), want, rtol=1e-5, atol=1e-5)
    exact = np.einsum("kmq,knq->mn", a.astype(F32).reshape(k, m, 4), b.astype(F32).reshape(k, n, 4))
    tol = 0.1 if fmt == "float8_e4m3fn_x4" else 0.2
    assert np.abs(val(acc) - exact).max() < tol * np.abs(exact).max()
    assert np.abs(da - a.astype(F32)).max() <= 0.07 * np.abs(a.astype(F32)).max()


def test_mx_layout_rules() -> None:
    with pytest.raises(SimulatorConstraintError, match="multiple of 32"):
        nisa.quantize_mx(dst=nl.ndarray((16, 4), dtype=nl.float8_e4m3fn_x4), src=nl.ndarray((16, 16), nl.bfloat16),
                         dst_scale=nl.ndarray((16, 4), dtype=nl.float8_e8m0fnu))
    q = nl.ndarray((32, 4), dtype=nl.float8_e4m3fn_x4)
    s = nl.ndarray((32, 4), dtype=nl.float8_e8m0fnu)
    with pytest.raises(SimulatorConstraintError, match="dst in PSUM"):
        nisa.nc_matmul_mx(dst=nl.ndarray((4, 4), nl.float32), stationary=q, moving=q, stationary_scale=s,
                          moving_scale=s)
    with use_target("trn2"), pytest.raises(SimulatorConstraintError, match="NeuronCore-v4"):
        nisa.quantize_mx(dst=q, src=nl.ndarray((32, 16), nl.bfloat16), dst_scale=s)


def test_lnc_instructions_say_what_they_need() -> None:
    shared = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    with pytest.raises(SimulatorConstraintError, match=r"an LNC2 launch \(kernel\[2\]"):
        nisa.core_barrier(data=shared, cores=(0, 1))
    with pytest.raises(SimulatorConstraintError, match=r"\(0, 1\), the only supported core set"):
        nisa.core_barrier(data=shared, cores=(0, 2))
    s = nl.ndarray((4, 4), dtype=nl.float32)
    with pytest.raises(SimulatorConstraintError, match="0 or 1"):
        nisa.sendrecv(src=s, dst=s, send_to_rank=2, recv_from_rank=0, pipe_id=0)

    def hidden_exchange(a):  # names the instruction only at run time: the launch can't tell it synchronises
        t = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        other = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        rank = nl.program_id(0)
        getattr(nisa, "send" + "recv")(src=t, dst=other, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
    with pytest.raises(SimulatorError, match="one after the other because the kernel's code does not name"):
        simulate(nki.jit(hidden_exchange)[2])(np.zeros((4, 4), F32))
