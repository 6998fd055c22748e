"""Element-wise, reduction and selection instructions against NumPy references."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from sim_helpers import tile, val

from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.simulator import nisa, nl, use_target
from neuron_compile.simulator.checks import SimulatorWarning

F32 = np.float32


def out(shape: tuple[int, ...], dtype: str = "float32", buffer: object = None) -> object:
    return nl.ndarray(shape, dtype=dtype, buffer=buffer or nl.sbuf)


@pytest.mark.parametrize(("op", "ref"), [
    (nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply), (nl.maximum, np.maximum),
    (nl.minimum, np.minimum), (nl.greater, lambda a, b: (a > b).astype(F32)),
    (nl.less_equal, lambda a, b: (a <= b).astype(F32)), (nl.not_equal, lambda a, b: (a != b).astype(F32)),
    (nl.power, lambda a, b: np.power(np.abs(a), b))])
def test_tensor_tensor_ops(op: object, ref: object, rng: np.random.Generator) -> None:
    a = rng.standard_normal((16, 32)).astype(F32)
    b = np.round(rng.standard_normal((16, 32)).astype(F32))
    if op is nl.power:
        a = np.abs(a)
    d = out((16, 32))
    nisa.tensor_tensor(dst=d, data1=tile(a), data2=tile(b), op=op)
    np.testing.assert_allclose(val(d), ref(a, b), rtol=1e-6)


def test_tensor_tensor_broadcast_view_and_psum_and_bitwise(rng: np.random.Generator) -> None:
    a = rng.standard_normal((8, 4, 6)).astype(F32)
    r = rng.standard_normal((8, 4)).astype(F32)
    d = out((8, 4, 6))
    nisa.tensor_tensor(dst=d, data1=tile(a), data2=tile(r).expand_dim(2).broadcast(2, 6), op=nl.multiply)
    np.testing.assert_allclose(val(d), a * r[:, :, None])
    p1 = tile(a.reshape(8, 24), buffer=nl.psum)
    p2 = tile(a.reshape(8, 24), buffer=nl.psum)
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.tensor_tensor(dst=out((8, 24)), data1=p1, data2=p2, op=nl.add)
    assert e.value.instruction == "nisa.tensor_tensor" and e.value.operand == "data2"
    x = np.array([[0b1100, 7, -8]], dtype=np.int32)
    y = np.array([[0b1010, 1, 1]], dtype=np.int32)
    for op, ref in ((nl.bitwise_and, x & y), (nl.bitwise_xor, x ^ y), (nl.left_shift, x << y),
                    (nl.right_shift, (x.view(np.uint32) >> y.view(np.uint32)).view(np.int32))):
        d = out((1, 3), "int32")
        nisa.tensor_tensor(dst=d, data1=tile(x), data2=tile(y), op=op)
        np.testing.assert_array_equal(val(d), ref)
    with pytest.raises(SimulatorConstraintError, match="integer dtype"):
        nisa.tensor_tensor(dst=out((1, 3)), data1=tile(x.astype(F32)), data2=tile(y), op=nl.bitwise_and)
    with pytest.raises(SimulatorConstraintError, match="GpSimd cannot access PSUM"):
        nisa.tensor_tensor(dst=out((8, 24)), data1=p1, data2=tile(a.reshape(8, 24)), op=nl.add,
                           engine=nisa.engine.gpsimd)


def test_int32_gpsimd_math_is_exact_and_wraps() -> None:
    big = np.array([[2**30, 2**31 - 5, -(2**31), 2**24 + 1]], dtype=np.int32)
    one = np.array([[1, 10, -1, 2**24]], np.int32)
    d = out((1, 4), "int32")
    nisa.tensor_tensor(dst=d, data1=tile(big), data2=tile(one), op=nl.add)
    # native 32-bit integer ALU: exact, wrapping modulo 2**32 like torch int32
    np.testing.assert_array_equal(val(d), [[2**30 + 1, -(2**31) + 5, 2**31 - 1, 2**25 + 1]])
    nisa.tensor_tensor(dst=d, data1=tile(big), data2=tile(one), op=nl.subtract)
    np.testing.assert_array_equal(val(d), [[2**30 - 1, 2**31 - 15, -(2**31) + 1, 1]])
    nisa.tensor_tensor(dst=d, data1=tile(big), data2=tile(one), op=nl.greater)
    np.testing.assert_array_equal(val(d), [[1, 1, 0, 1]])


def test_int32_tensor_tensor_with_non_int_dst_or_vector_engine_is_fp32() -> None:
    """Only all-int32/uint32 tiles (dst included) get exact GpSimd math; otherwise fp32 (NKI tensor_tensor doc)."""
    a = tile(np.array([[2**24 + 1, 2**30 + 1]], np.int32))
    b = tile(np.array([[2**24, 2**30]], np.int32))
    d = out((1, 2), "float32")
    nisa.tensor_tensor(dst=d, data1=a, data2=b, op=nl.subtract)
    np.testing.assert_array_equal(val(d), [[0.0, 0.0]])  # both operands rounded to fp32 first
    e = out((1, 2), "int32")
    nisa.tensor_tensor(dst=e, data1=a, data2=b, op=nl.subtract, engine=nisa.engine.vector)
    np.testing.assert_array_equal(val(e), [[0, 0]])
    nisa.tensor_tensor(dst=e, data1=a, data2=b, op=nl.subtract)
    np.testing.assert_array_equal(val(e), [[1, 1]])


@pytest.mark.parametrize(("dtype", "values", "expect"), [
    ("int8", [2.5, 3.5, -2.5, 200.0, -300.0, np.nan], [2, 4, -2, 127, -128, 0]),
    ("uint8", [0.5, 1.5, -3.0, 255.5, 1e9, 254.4], [0, 2, 0, 255, 255, 254]),
    ("int32", [2.5, -3.5, 3e9, -3e9, 1.49, 7.0], [2, -4, 2**31 - 1, -(2**31), 1, 7]),
])
def test_cast_rne_and_saturation(dtype: str, values: list[float], expect: list[int]) -> None:
    d = out((1, 6), dtype)
    nisa.tensor_copy(dst=d, src=tile(np.array([values], F32)))
    np.testing.assert_array_equal(val(d), [expect])


def test_cast_to_bf16_and_fp8_rounds_to_nearest_even() -> None:
    x = np.array([[1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, 3.3e38]], F32)
    for dt, np_t in (("bfloat16", ml_dtypes.bfloat16), ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
                     ("float8_e5m2", ml_dtypes.float8_e5m2), ("float16", np.float16)):
        d = out((1, 4), dt)
        nisa.tensor_copy(dst=d, src=tile(x))
        assert val(d).dtype == np.dtype(np_t)
        np.testing.assert_array_equal(val(d).astype(F32), x.astype(np_t).astype(F32))
    b = out((1, 4), "bfloat16")
    nisa.tensor_copy(dst=b, src=tile(x))
    assert float(val(b)[0, 0]) == 1.0 and float(val(b)[0, 1]) == 1 + 2**-6  # ties to even


def test_tensor_scalar_forms(rng: np.random.Generator) -> None:
    a = rng.standard_normal((8, 16)).astype(F32)
    v = rng.standard_normal((8, 1)).astype(F32)
    d = out((8, 16))
    nisa.tensor_scalar(dst=d, data=tile(a), op0=nl.subtract, operand0=tile(v), op1=nl.multiply, operand1=3.0)
    np.testing.assert_allclose(val(d), (a - v) * 3.0, rtol=1e-6)
    nisa.tensor_scalar(dst=d, data=tile(a), op0=nl.subtract, operand0=1.0, reverse0=True, op1=nl.maximum,
                       operand1=tile(v), reverse1=True)
    np.testing.assert_allclose(val(d), np.maximum(v, 1.0 - a))
    nisa.tensor_scalar(dst=d, data=tile(np.abs(a) + 1), op0=nl.rsqrt, operand0=None)
    np.testing.assert_allclose(val(d), 1 / np.sqrt(np.abs(a) + 1), rtol=1e-6)
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.tensor_scalar(dst=d, data=tile(a), op0=nl.add, operand0=tile(a[:, :2]))
    assert e.value.operand == "operand0" and "(8, 1)" in str(e.value.limit)
    with pytest.raises(SimulatorConstraintError, match="float32"):
        nisa.tensor_scalar(dst=d, data=tile(a), op0=nl.add, operand0=tile(v, "bfloat16"))


def test_scalar_tensor_tensor(rng: np.random.Generator) -> None:
    a, b = rng.standard_normal((2, 4, 8)).astype(F32)
    d = out((4, 8))
    nisa.scalar_tensor_tensor(dst=d, data=tile(a), op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=tile(b))
    np.testing.assert_allclose(val(d), a * 2 + b, rtol=1e-6)


_ACTS = {"exp": np.exp, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
         "square": np.square, "abs": np.abs, "sign": np.sign, "copy": lambda x: x,
         "silu": lambda x: x / (1 + np.exp(-x)), "softplus": lambda x: np.log1p(np.exp(x)),
         "gelu_apprx_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
         "gelu": lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
         "erf": np.vectorize(__import__("math").erf), "mish": lambda x: x * np.tanh(np.log1p(np.exp(x)))}


@pytest.mark.parametrize("name", sorted(_ACTS))
def test_activation_functions_with_scale_and_bias(name: str, rng: np.random.Generator) -> None:
    x = rng.uniform(-2, 2, (8, 16)).astype(F32)
    s = rng.uniform(0.5, 1.5, (8, 1)).astype(F32)
    b = rng.uniform(-0.5, 0.5, (8, 1)).astype(F32)
    d = out((8, 16))
    nisa.activation(dst=d, op=getattr(nl, name), data=tile(x), scale=tile(s), bias=tile(b))
    np.testing.assert_allclose(val(d), _ACTS[name](x.astype(np.float64) * s + b), rtol=2e-6, atol=2e-6)


def test_activation_accumulators_and_reduce_res(rng: np.random.Generator) -> None:
    x1 = rng.standard_normal((4, 8)).astype(F32)
    x2 = rng.standard_normal((4, 8)).astype(F32)
    r = out((4, 1))
    d = out((4, 8))
    nisa.activation(dst=d, op=nl.exp, data=tile(x1), reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(dst=d, op=nl.exp, data=tile(x2), reduce_op=nl.add, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reduce)
    np.testing.assert_allclose(val(r)[:, 0], np.exp(x1).sum(1) + np.exp(x2).sum(1), rtol=1e-5)
    nisa.activation(dst=d, op=nl.copy, data=tile(x1), reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset)
    np.testing.assert_array_equal(val(r), 0)
    nisa.activation_reduce(dst=d, op=nl.square, data=tile(x1), reduce_op=nl.add, reduce_res=r)
    np.testing.assert_allclose(val(r)[:, 0], np.square(x1).sum(1), rtol=1e-5)
    with pytest.raises(SimulatorConstraintError, match="nl.add"):
        nisa.activation(dst=d, op=nl.exp, data=tile(x1), reduce_op=nl.maximum, reduce_res=r,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
    with pytest.raises(SimulatorConstraintError, match="activation table"):
        nisa.activation(dst=d, op=nl.cos, data=tile(x1))


def test_one_instruction_reads_up_to_4k_psum_elements(rng: np.random.Generator) -> None:
    """A Vector/Scalar instruction may read several PSUM banks at once (up to 4K elements per partition: all eight
    banks of fp32), e.g. one exp over the scores of two banks; more is refused (bf16 PSUM holds 8K)."""
    x = rng.standard_normal((128, 1024)).astype(F32)
    d = out((128, 1024))
    nisa.activation(dst=d, op=nl.exp, data=tile(x, buffer=nl.psum))
    np.testing.assert_allclose(val(d), np.exp(x), rtol=2e-6)
    whole = tile(rng.standard_normal((128, 4096)).astype(F32), buffer=nl.psum)
    nisa.tensor_copy(dst=out((128, 4096)), src=whole)
    wide = nl.ndarray((128, 4160), dtype="bfloat16", buffer=nl.psum)
    nisa.memset(dst=wide[:, 0:4096], value=1.0)
    with pytest.raises(SimulatorConstraintError, match="4096 elements per partition in one PSUM access") as e:
        nisa.activation(dst=out((128, 4160)), op=nl.exp, data=wide)
    assert e.value.instruction == "nisa.activation" and e.value.operand == "data"


def test_activation_range_warnings_and_unreduced_sin() -> None:
    d = out((1, 2))
    with pytest.warns(SimulatorWarning, match="valid range"):
        nisa.activation(dst=d, op=nl.sin, data=tile(np.array([[9.0, 1.0]], F32)))
    assert abs(float(val(d)[0, 0]) - np.sin(9.0)) > 1.0  # no range reduction outside [-pi, pi]
    assert abs(float(val(d)[0, 1]) - np.sin(1.0)) < 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nisa.activation(dst=d, op=nl.log, data=tile(np.array([[1.0, 2.0]], F32)))
    with pytest.warns(SimulatorWarning):
        nisa.activation(dst=d, op=nl.log, data=tile(np.array([[0.0, 2.0]], F32)))


def test_reciprocal_and_exponential_target_gate(rng: np.random.Generator) -> None:
    x = rng.uniform(1, 2, (4, 8)).astype(F32)
    d = out((4, 8))
    nisa.reciprocal(dst=d, data=tile(x))
    np.testing.assert_allclose(val(d), 1 / x, rtol=1e-7)
    r = out((4, 1))
    m = x.max(1, keepdims=True)
    nisa.exponential(dst=d, src=tile(x), max_value=tile(m), reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    np.testing.assert_allclose(val(d), np.exp(x - m), rtol=1e-6)
    np.testing.assert_allclose(val(r)[:, 0], np.exp(x - m).sum(1), rtol=1e-6)
    with use_target("trn2"), pytest.raises(SimulatorConstraintError) as e:
        nisa.exponential(dst=d, src=tile(x))
    assert e.value.operand == "target" and e.value.value == "trn2"


def test_tensor_reduce_axes_negate_keepdims(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 3, 5)).astype(F32)
    d = out((4, 3))
    nisa.tensor_reduce(dst=d, op=nl.maximum, data=tile(x), axis=2, negate=True)
    np.testing.assert_array_equal(val(d), -x.max(2))
    d2 = out((4, 1, 1))
    nisa.tensor_reduce(dst=d2, op=nl.add, data=tile(x), axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(val(d2), x.sum((1, 2), keepdims=True), rtol=1e-5)
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.tensor_reduce(dst=d, op=nl.add, data=tile(x), axis=0)
    assert e.value.operand == "axis" and "partition" in str(e.value.limit)
    with pytest.raises(SimulatorConstraintError, match="trailing"):
        nisa.tensor_reduce(dst=out((4, 5)), op=nl.add, data=tile(x), axis=1)


def test_partition_reduce_scalar_reduce_cumulative_scan(rng: np.random.Generator) -> None:
    x = rng.standard_normal((6, 5)).astype(F32)
    d = out((1, 5))
    nisa.tensor_partition_reduce(dst=d, op=nl.add, data=tile(x))
    np.testing.assert_allclose(val(d)[0], x.sum(0), rtol=1e-5)
    y = out((6, 5))
    r = out((6, 1))
    nisa.tensor_scalar_reduce(dst=y, data=tile(x), op0=nl.multiply, operand0=2.0, reduce_op=nl.max, reduce_res=r)
    np.testing.assert_allclose(val(r)[:, 0], (2 * x).max(1))
    nisa.tensor_scalar_cumulative(dst=y, src=tile(x), op0=nl.multiply, op1=nl.add, imm0=1.0)
    np.testing.assert_allclose(val(y), np.cumsum(x, 1), rtol=1e-5, atol=1e-6)
    a = rng.uniform(0.5, 1, (6, 5)).astype(F32)
    nisa.tensor_tensor_scan(dst=y, data0=tile(a), data1=tile(x), initial=0.5, op0=nl.multiply, op1=nl.add)
    h = np.full(6, 0.5, F32)
    ref = np.empty_like(x)
    for i in range(5):
        h = a[:, i] * h + x[:, i]
        ref[:, i] = h
    np.testing.assert_allclose(val(y), ref, rtol=1e-5)


def test_bn_stats_record_layout_and_aggr(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 1000)).astype(F32)
    stats = out((4, 12))
    for j in range(2):
        nisa.bn_stats(dst=stats[:, 6 * j:6 * j + 6], data=tile(x[:, 500 * j:500 * (j + 1)]))
    s = val(stats)
    ev = x[:, 0:500:2]
    np.testing.assert_allclose(s[:, 0:3], np.stack([np.full(4, 250), ev.mean(1), ev.var(1) * 250], 1), rtol=1e-4)
    mv = out((4, 2))
    nisa.bn_aggr(dst=mv, data=stats)
    np.testing.assert_allclose(val(mv), np.stack([x.mean(1), x.var(1)], 1), rtol=1e-4, atol=1e-6)
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.bn_stats(dst=out((4, 6)), data=tile(x[:, :513]))
    assert e.value.value == 513 and "512" in str(e.value.limit)


def test_selects(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 6)).astype(F32)
    d = out((4, 6))
    nisa.affine_select(dst=d, pattern=[[-1, 6]], channel_multiplier=1, on_true_tile=tile(x), on_false_value=-9.0,
                       cmp_op=nl.greater_equal, offset=1)
    i, j = np.indices((4, 6))
    np.testing.assert_array_equal(val(d), np.where(1 + i - j >= 0, x, -9.0))
    pred = (rng.random((4, 6)) > 0.5).astype(np.uint8)
    r = out((4, 1))
    nisa.select_reduce(dst=d, predicate=tile(pred), on_true=tile(x), on_false=-5.0, reduce_res=r,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
    np.testing.assert_array_equal(val(d), np.where(pred, x, -5.0))
    np.testing.assert_array_equal(val(r)[:, 0], np.where(pred, x, -5.0).max(1))
    base = tile(np.zeros((4, 6), F32))
    nisa.tensor_copy_predicated(dst=base, src=tile(x), predicate=tile(pred), reverse_pred=True)
    np.testing.assert_array_equal(val(base), np.where(pred, 0, x))
    lo, hi = np.array([[1.0], [0], [2], [3]], F32), np.array([[4.0], [6], [3], [3]], F32)
    nisa.range_select(dst=d, on_true_tile=tile(x), comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=tile(lo),
                      bound1=tile(hi), reduce_res=r)
    keep = (j >= lo) & (j < hi)
    np.testing.assert_array_equal(val(d), np.where(keep, x, np.float32(-3.4028235e38)))


def test_max8_and_find_index8(rng: np.random.Generator) -> None:
    x = rng.permutation(64).astype(F32).reshape(2, 32)
    m = out((2, 8))
    nisa.max8(dst=m, src=tile(x))
    np.testing.assert_array_equal(val(m), -np.sort(-x, 1)[:, :8])
    idx = out((2, 8), "uint32")
    nisa.nc_find_index8(dst=idx, data=tile(x), vals=m)
    np.testing.assert_array_equal(val(idx), np.argsort(-x, 1)[:, :8])


def test_alignment_and_engine_checks() -> None:
    t = tile(np.ones((128, 4), F32))
    with pytest.raises(SimulatorConstraintError) as e:
        nisa.tensor_copy(dst=out((8, 4)), src=t[5:13])
    assert e.value.operand == "src" and e.value.value == (5, 8)
    nisa.tensor_copy(dst=out((32, 4)), src=t[64:96])
    with use_target("trn1"), pytest.raises(SimulatorConstraintError, match="NC-v3"):
        nisa.tensor_copy(dst=out((8, 4)), src=t[0:8], engine=nisa.engine.scalar)
    with pytest.raises(SimulatorConstraintError, match="int literal"):
        nisa.memset(dst=out((2, 2), "int32"), value=1.5)
    z = out((2, 2), "int32")
    nisa.memset(dst=z, value=-3)
    np.testing.assert_array_equal(val(z), -3)
    nisa.memset(dst=z, value=0.0)  # an integral float (nki-library's cross-partition copy fills uint32 tiles so)
    np.testing.assert_array_equal(val(z), 0)
