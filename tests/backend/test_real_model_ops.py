"""Ops real models emit: graph constants, casts, integer semantics, advanced indexing, device-side checks,
random ops, torch.nn fast paths. Every result is compared with eager; every bad input must raise."""

from __future__ import annotations

import math
import re

import pytest
import torch

from neuron_compile.errors import DeviceAssertionError, IndexOutOfRangeError, UnsupportedOpError


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def _same(fn, *args):
    out, ref = _compile(fn)(*args), fn(*args)
    torch.testing.assert_close(out, ref, equal_nan=True)
    return out


# -- graph constants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_tensor_literals_in_forward_are_graph_inputs(dtype):
    const = torch.tensor([1, 0, 3], dtype=dtype)

    def fn(x):
        return x * torch.tensor(2.0) + const.to(x.dtype) + torch.tensor([[0.5], [1.5]])

    _same(fn, torch.randn(2, 3))


def test_tensor_literal_in_an_eager_fallback_graph():
    def fn(x):
        return torch.special.zeta(x.abs() + 2, torch.tensor(2.0)) * torch.tensor(3.0)  # zeta runs eagerly

    x = torch.randn(4, 5)
    out = torch.compile(fn, backend="neuron", options={"fallback": "eager"})(x)
    torch.testing.assert_close(out, fn(x))


# -- casts and integer semantics ------------------------------------------------------------------------


@pytest.mark.parametrize("dst", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_float_to_int_casts_truncate_toward_zero(dst):
    x = torch.tensor([-3.7, -0.5, -0.0, 0.5, 2.5, 3.99, 100.7])
    if dst == torch.uint8:
        x = x.abs()
    out = _same(lambda t: t.to(dst), x)
    assert out.dtype == dst


@pytest.mark.parametrize("dst", [torch.int8, torch.uint8, torch.int16])
def test_narrow_integer_results_wrap_like_torch(dst):
    i = torch.tensor([-300, -129, -1, 0, 127, 128, 255, 256, 70000])
    _same(lambda t: t.to(dst), i)
    _same(lambda t: t.to(dst) * 3 + 100, i)


@pytest.mark.parametrize("fn, x", [
    (lambda t: t * 100000, torch.tensor([1, 2, 100000])),
    (lambda t: t.sum(), torch.full((8,), 2**30)),
    (lambda t: -t, torch.tensor([-(2**31), 5])),
    (lambda t: t + t, torch.tensor([2**30, 1])),
], ids=["mul", "sum", "neg", "add"])
def test_int64_results_beyond_int32_raise_instead_of_wrapping(fn, x):
    with pytest.raises(DeviceAssertionError, match=r"integer overflow in aten\.\w+\.\w+: an int64 result left the "
                                                   r"int32 range"):
        _compile(fn)(x)


def test_int64_arithmetic_within_int32_is_exact_and_int32_wraps_like_torch():
    _same(lambda t: (t * 3 - 7).sum(-1), torch.arange(12).view(3, 4))
    _same(lambda t: t * 100000, torch.tensor([100000], dtype=torch.int32))  # int32 wraps in torch too


@pytest.mark.parametrize("fn, op", [
    (lambda t: t + 2**31, r"aten\.add\.Tensor\(int64\[2\], 2147483648\): aten\.add\.Tensor on torch\.int64"),
    (lambda t: t == 2**40, r"aten\.eq\.Scalar\(int64\[2\], 1099511627776\): aten\.eq\.Scalar on torch\.int64"),
    (lambda t: t & (2**40 + 1), r"aten\.bitwise_and\.Scalar\(int64\[2\], 1099511627777\)"),
    (lambda t: torch.where(t > 1, t, 2**40), r"aten\.scalar_tensor\.default\(1099511627776\)"),
    (lambda t: t + torch.full((2,), 2**40), r"aten\.full\.default\(\[2\], 1099511627776\)"),
], ids=["add", "eq", "bitwise_and", "where", "full"])
def test_integer_scalar_beyond_int32_is_refused_by_name(fn, op):
    """Every integer op, and every integer constant, whose scalar NeuronCores can't hold as int32 is refused at
    compile time, in the one UnsupportedOpError format (the op, its inputs, the reason, the user's line)."""
    with pytest.raises(Exception, match=r"the integer scalar \d+ is outside int32") as info:
        _compile(fn)(torch.tensor([1, 2]))
    err = getattr(info.value, "inner_exception", None) or info.value  # Dynamo wraps it in BackendCompilerFailed
    assert isinstance(err, UnsupportedOpError), repr(info.value)
    assert len(err.unsupported) == 1 and re.search(op, err.unsupported[0]), err.unsupported
    assert "test_real_model_ops.py" in err.unsupported[0]


def test_integer_graph_constant_beyond_int32_is_refused_by_name():
    """A tensor literal NeuronCores can't hold as int32 (torch.masked's iinfo(int64).min fill for a max) is refused
    at compile time, naming the op that uses it, instead of failing its upload on every call."""
    x = torch.tensor([[3, -1, 2], [0, 5, -4]])
    mask = torch.tensor([[True, False, True], [False, False, True]])
    with pytest.raises(Exception, match="int64 graph constant") as info:
        _compile(lambda t, m: torch.masked.amax(t, 1, mask=m))(x, mask)
    err = getattr(info.value, "inner_exception", None) or info.value
    assert isinstance(err, UnsupportedOpError), repr(info.value)
    assert re.search(r"holds -9223372036854775808, outside the int32 range .* used by aten\.where\.self at "
                     r".*test_real_model_ops\.py:\d+", err.unsupported[0]), err.unsupported
    _same(lambda t, m: torch.masked.amax(t.float(), 1, mask=m), x, mask)  # a float max has an fp32 -inf fill


@pytest.mark.parametrize("fn", [lambda a, b: torch.div(a, b, rounding_mode="floor"),
                                lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                                lambda a, b: torch.remainder(a, b), lambda a, b: torch.fmod(a, b),
                                lambda a, b: a // b], ids=["floor", "trunc", "remainder", "fmod", "floordiv"])
def test_integer_division_is_exact(fn):
    a = torch.tensor([-(2**31) + 3, -17, -7, -1, 0, 1, 7, 17, 2**31 - 1, 123456789])
    b = torch.tensor([7, 5, -3, 4, 3, -2, 2, -5, 3, -9876])
    _same(fn, a, b)


@pytest.mark.parametrize("op", [torch.fmod, torch.remainder])
def test_float_fmod_and_remainder_exact_over_the_whole_range(op):
    """fmod / remainder of fp32 pairs of any magnitudes (quotients up to 2**277, subnormals) are exact, as eager's
    scalar path (std::fmod); e.g. fmod(-1e20, 501) = -41, not the residue of a rounded quotient."""
    gen = torch.Generator().manual_seed(0)
    def spread(n):
        exponent = torch.randint(-149, 128, (n,), generator=gen).double()
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
        return (sign * (torch.rand(n, generator=gen).double() + 0.5) * torch.pow(2.0, exponent)).float()
    a = torch.cat([spread(3000), torch.tensor([-1e20, 1e20, 5.0, -6.0, -0.0, 3.4e38, 1e-45, 7.5, float("inf")])])
    d = torch.cat([spread(3000), torch.tensor([501.0, -1001.25, float("inf"), 3.0, 2.0, 1e-45, 1e-45, -2.5, 2.0])])
    got = torch.compile(op, backend="neuron", dynamic=False)(a, d)
    want = torch.stack([op(x, y) for x, y in zip(a, d, strict=True)])  # element by element: eager's exact path
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


def test_sin_cos_of_large_arguments():
    """Rotary tables at long context take sin/cos of positions up to millions: the reduction by 2 pi stays exact to
    ~1e-7 up to |x| = 2**24 * 2 pi (1e8); a single-part quotient product was wrong beyond ~4e5."""
    gen = torch.Generator().manual_seed(3)
    x = torch.pow(10.0, torch.rand(20000, generator=gen).double() * 8).float()
    x = torch.cat([x, -x, torch.tensor([0.0, 1e-30, math.pi, 4.9884e6, 1.048575e8])])
    got = torch.compile(lambda t: (torch.sin(t), torch.cos(t)), backend="neuron", dynamic=False)(x)
    torch.testing.assert_close(got[0], torch.sin(x), atol=1e-6, rtol=0)
    torch.testing.assert_close(got[1], torch.cos(x), atol=1e-6, rtol=0)


def test_tan_of_large_arguments_and_near_its_poles_and_zeros():
    """tan magnifies the reduction's error by 1 + tan^2 near its poles, and near its zeros its value is that error's
    size: x - pi k is kept as an exact pair up to |x| = 1.05e8 (the old two-part reduction was exact below ~4e5)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.pow(10.0, torch.rand(20000, generator=gen).double() * 8).float()
    special = [0.0, 1e-30, math.pi, 2 * math.pi, 1.5707964, 4.9884e6, 1.048575e8]
    x = torch.cat([x, -x, torch.tensor(special)])
    got = torch.compile(torch.tan, backend="neuron", dynamic=False)(x)
    exact = torch.tan(x.double())
    torch.testing.assert_close(got.double(), exact, rtol=5e-6, atol=1e-12)
    edge = torch.tensor([float("inf"), -float("inf"), float("nan")])
    assert torch.compile(torch.tan, backend="neuron", dynamic=False)(edge).isnan().all()


@pytest.mark.parametrize("op", [torch.sin, torch.cos, torch.tan], ids=["sin", "cos", "tan"])
@pytest.mark.parametrize("big", [1.0542e8, -3e9, 1e20, 3.4e38])
def test_trig_of_an_argument_beyond_the_exact_reduction_raises(op, big):
    """Past 2**24 * 2 pi the reduction is O(1) wrong (sin(3e9) came back -1.8e-7 instead of 0.987): the kernels mark
    such arguments and the runner raises instead of returning those values; inf and NaN still give NaN."""
    x = torch.tensor([0.5, big, 2.0])
    with pytest.raises(DeviceAssertionError, match=rf"aten\.{op.__name__}\.default of an argument of magnitude "
                                                   r"1\.054e\+08 or more \(at .*test_real_model_ops\.py:\d+"):
        _compile(lambda t: op(t) * 2)(x)
    below = torch.tensor([1.0541e8, -1.0541e8, float("inf"), float("nan"), 0.25])
    torch.testing.assert_close(_compile(op)(below), op(below), atol=1e-6, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("fn", [lambda t: t.argmax(1), lambda t: t.argmin(1), lambda t: t.max(1),
                                lambda t: t.argmax(), lambda t: t.min(0).indices, lambda t: torch.sign(t)],
                         ids=["argmax", "argmin", "max_dim", "argmax_flat", "min_dim_indices", "sign"])
def test_nan_propagates_like_torch(fn):
    x = torch.randn(4, 6)
    x[1, 3] = x[2, 0] = x[2, 4] = float("nan")
    _same(fn, x)


def test_value_constant_along_a_reduction_is_stored_at_full_size():
    # eq is computed from a broadcast 0-d input (a row in the reduction kernel of any()), yet has 5 elements
    def fn(x, n):
        eq = n.expand(5) == 1
        return torch.where(eq, x, -x), eq.any()

    _same(fn, torch.randn(5), torch.tensor(1.0))
    _same(fn, torch.randn(5), torch.tensor(2.0))


# -- advanced indexing and device-side bounds checks ---------------------------------------------------------


def test_multi_tensor_advanced_indexing_places_dims_like_numpy():
    x = torch.randn(4, 5, 6)
    i0, i1 = torch.tensor([[0, 3], [1, -1]]), torch.tensor([2, 4])
    _same(lambda t: t[i0, i1], x)
    _same(lambda t: t[:, torch.tensor([0, 4]), torch.tensor([[1], [5]])], x)  # adjacent: stays in place
    _same(lambda t: t[i0, :, i1], x)  # not adjacent: broadcast dims first


def test_index_put_forms_match_eager():
    x = torch.randn(4, 5, 6)

    def setitem(t):
        y = t.clone()
        y[:, torch.tensor([1, 3])] = 7.0
        y[torch.tensor([0, 0]), 2, torch.tensor([5, 5])] = torch.tensor([-1.0, -2.0])  # duplicates: last wins
        y[y > 1.5] = 0.0
        return y

    _same(setitem, x)
    _same(lambda t: t.index_put((torch.tensor([0, 2, 0]), torch.tensor([1, 1, 1])), torch.ones(3, 6),
                                accumulate=True), x)


def test_hugging_face_style_mask_indexing():
    pad = torch.tensor([[True] * 8, [True] * 5 + [False] * 3])
    b = torch.arange(2).view(2, 1, 1, 1)
    kv = torch.arange(8).view(1, 1, 1, 8)
    _same(lambda m: m[b, kv], pad)


@pytest.mark.parametrize("fn, args", [
    (lambda w, i: torch.nn.functional.embedding(i, w), (torch.randn(10, 4), torch.tensor([1, 10]))),
    (lambda x, i: x[i], (torch.randn(5, 3), torch.tensor([0, -6]))),
    (lambda x, i: torch.index_select(x, 0, i), (torch.randn(5, 3), torch.tensor([5]))),
    (lambda x, i: torch.gather(x, 1, i), (torch.randn(3, 4), torch.tensor([[0, 4], [1, 1], [2, 3]]))),
    (lambda x, i: torch.nn.functional.cross_entropy(x, i), (torch.randn(3, 5), torch.tensor([1, 5, 0]))),
], ids=["embedding", "index", "index_select", "gather", "cross_entropy"])
def test_out_of_range_indices_raise_index_error(fn, args):
    with pytest.raises(IndexOutOfRangeError, match=r"index out of range in aten\.\w+") as info:
        _compile(fn)(*args)
    assert isinstance(info.value, IndexError)


# -- random ops ----------------------------------------------------------------------------------------------


def test_random_ops_follow_torch_generator_under_manual_seed():
    def fn(x):
        y = torch.randn_like(x) + torch.randn(3, 4) + torch.rand_like(x)
        z = torch.empty_like(x).normal_(2.0, 3.0) + torch.empty_like(x).uniform_(-1, 1)
        return y + z + torch.empty_like(x).bernoulli_(0.3) + torch.randint(0, 10, (3, 4)) + \
            torch.empty_like(x).exponential_()

    x = torch.randn(3, 4)
    compiled = _compile(fn)
    torch.manual_seed(7)
    a = compiled(x)
    torch.manual_seed(7)
    torch.testing.assert_close(a, fn(x))
    assert not torch.equal(compiled(x), a)  # a fresh draw on every call


# -- torch.nn fast paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_fast_path_with_padding_mask(norm_first):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                             norm_first=norm_first).eval()
    x = torch.randn(2, 5, 16)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad():
        _same(lambda t: layer(t, src_key_padding_mask=kpm), x)
        _same(lambda t: layer(t, src_mask=torch.nn.Transformer.generate_square_subsequent_mask(5),
                              is_causal=True), x)


def test_multihead_attention_fast_path_without_weights():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad():
        _same(lambda t: mha(t, t, t, key_padding_mask=kpm, need_weights=False)[0], x)


@pytest.mark.parametrize("shape", [(6,), (2, 5), ()], ids=["batch", "two_batch_dims", "unbatched"])
def test_bilinear_forward_and_gradients_match_eager(shape):
    """nn.Bilinear calls aten._trilinear (forward and backward), which torch has no decomposition for."""
    torch.manual_seed(0)
    ref = torch.nn.Bilinear(3, 4, 5)
    mod = torch.nn.Bilinear(3, 4, 5)
    mod.load_state_dict(ref.state_dict())
    x1, x2 = torch.randn(*shape, 3, requires_grad=True), torch.randn(*shape, 4, requires_grad=True)
    y1, y2 = (t.detach().clone().requires_grad_() for t in (x1, x2))
    out, expected = _compile(mod)(y1, y2), ref(x1, x2)
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for got, want in ((y1.grad, x1.grad), (y2.grad, x2.grad), (mod.weight.grad, ref.weight.grad),
                      (mod.bias.grad, ref.bias.grad)):
        torch.testing.assert_close(got, want)


def test_op_inside_torch_module_is_located_by_its_module(monkeypatch):
    """Dynamo records no stack trace for some functionals inside torch's own modules (boolean_dispatch ones, such
    as fractional max pooling); a refusal there names the module instead. The op lowers, so its decomposition is
    taken out of the table here to make it a refused op."""
    import neuron_compile.lowering.decompositions as D

    table = D.decompositions()
    del table[torch.ops.aten.fractional_max_pool3d.default]
    monkeypatch.setattr(D, "decompositions", lambda: table)
    with pytest.raises(Exception) as info:
        _compile(torch.nn.FractionalMaxPool3d(2, output_size=2))(torch.randn(1, 2, 4, 4, 4))
    msg = str(info.value)
    assert "UnsupportedOpError" in msg, msg
    assert "aten.fractional_max_pool3d" in msg and "module fn (torch.nn.modules.pooling.FractionalMaxPool3d" in msg, msg
    assert "<unknown source line>" not in msg


@pytest.mark.parametrize("make,shape", [
    (lambda: torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(8, 8, 5, padding=2, groups=2), dim=2),
     (2, 8, 12)),  # wav2vec2 / HuBERT's positional convolution
    (lambda: torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(6, 5)), (3, 6)),
    (lambda: torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(6, 5), dim=None), (3, 6)),
], ids=["conv1d_dim2", "linear_dim0", "linear_whole"])
def test_weight_norm_training_matches_eager(make, shape):
    """``_weight_norm_interface_backward`` (no PyTorch decomposition) as reductions and elementwise ops."""
    torch.manual_seed(0)
    mod, ref = make(), make()
    ref.load_state_dict(mod.state_dict())
    x = torch.randn(*shape)
    out, expected = _compile(mod)(x), ref(x)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    for (name, p), q in zip(mod.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("fn,shape", [
    (lambda x: (x * 2).permute(0, 1, 3, 2).repeat(1, 4, 1, 1).view(8, 5, 5), (2, 1, 5, 5)),  # WavLM's bias
    (lambda x: x.t().repeat(2, 1, 3), (4, 5)),
    (lambda x: x.repeat(3, 2), ()),
    (lambda x: x.repeat(0, 2), (3, 2)),
], ids=["permuted_then_view", "transposed_more_dims", "zero_dim", "zero_repeat"])
def test_repeat_is_contiguous_like_eager(fn, shape):
    """Eager's repeat always returns a contiguous tensor; PyTorch's decomposition kept a permuted input's layout
    (or a view of an expand), and a later ``view`` failed to trace."""
    x = torch.randn(shape)
    got, want = _compile(fn)(x), fn(x)
    assert torch.equal(got, want) and got.stride() == want.stride()


def test_angle_of_real_tensors():
    """angle of a real tensor: pi below zero, 0 at or above (-0.0 included), NaN kept; ints give floats."""
    x = torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), float("-inf"), float("inf")])
    got = torch.compile(torch.angle, backend="neuron", dynamic=False)(x)
    torch.testing.assert_close(got, torch.angle(x), equal_nan=True)
    i = torch.tensor([-3, 0, 4])
    torch._dynamo.reset()
    got = torch.compile(torch.angle, backend="neuron", dynamic=False)(i)
    torch.testing.assert_close(got, torch.angle(i))
