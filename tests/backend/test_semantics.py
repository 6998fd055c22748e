"""Eager semantics the backend must keep: input mutations, buffers, aliasing, dtypes, transforms, executors."""

from __future__ import annotations

import warnings

import pytest
import torch

from neuron_compile import backend as B
from neuron_compile import runtime
from neuron_compile.config import patch
from neuron_compile.errors import NeuronCompileError, UnsupportedOpError


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    B.reset()


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def test_inplace_op_on_input_mutates_like_eager():
    def f(x):
        x.mul_(3).add_(1)
        return x.sum(-1)

    a = torch.randn(4, 5)
    b = a.clone()
    torch.testing.assert_close(_compile(f)(a), f(b))
    torch.testing.assert_close(a, b)


def test_batchnorm_training_updates_running_stats():
    torch.manual_seed(0)
    m = torch.nn.BatchNorm1d(6)
    ref = torch.nn.BatchNorm1d(6)
    ref.load_state_dict(m.state_dict())
    compiled = _compile(m)
    for _ in range(2):
        x = torch.randn(8, 6)
        torch.testing.assert_close(compiled(x), ref(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)
    assert int(m.num_batches_tracked) == int(ref.num_batches_tracked) == 2


def test_batchnorm_gradients_of_a_transposed_input_match_float64():
    """CLAP's audio encoder normalises mel bins with BatchNorm2d on ``x.transpose(1, 3)`` ([B, mels, T, 1]): that
    input is channels-last strided while the gradient reaching it is contiguous. The weight and bias gradients are
    checked against float64 autograd of the formula, not eager: torch 2.13's and 2.14's CPU batch_norm backward
    mixes the two layouts there (its gradients are off by more than their own size; the same values laid out
    contiguously give the right ones). The compiled graph's decomposition computes them on the logical values."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(16)
    torch.nn.init.uniform_(bn.weight, 0.5, 1.5)
    x, probe = torch.randn(2, 1, 16, 16), torch.randn(2, 16, 16, 1)
    y = _compile(lambda t: bn(t.transpose(1, 3)))(x)
    got = torch.autograd.grad((y * probe).sum(), [bn.weight, bn.bias])
    xd = x.double().transpose(1, 3)
    mean, var = xd.mean((0, 2, 3), keepdim=True), xd.var((0, 2, 3), unbiased=False, keepdim=True)
    w, b = bn.weight.detach().double().requires_grad_(True), bn.bias.detach().double().requires_grad_(True)
    yd = (xd - mean) / (var + bn.eps).sqrt() * w[:, None, None] + b[:, None, None]
    want = torch.autograd.grad((yd * probe.double()).sum(), [w, b])
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), e, atol=1e-4, rtol=1e-5)


def test_batchnorm_eval_uses_running_stats():
    m = torch.nn.BatchNorm1d(6).eval()
    m.running_mean.uniform_(-1, 1)
    m.running_var.uniform_(0.5, 2)
    x = torch.randn(8, 6)
    with torch.no_grad():
        torch.testing.assert_close(_compile(m)(x), m(x), atol=1e-5, rtol=1e-5)


def test_output_aliasing_an_input_is_a_view_of_it():
    x = torch.randn(3, 4)
    t, doubled = _compile(lambda v: (v.t(), v * 2))(x)
    assert t.data_ptr() == x.data_ptr()
    x.add_(1)
    torch.testing.assert_close(t, x.t())
    assert not torch.allclose(doubled, x * 2)


def test_autocast_bf16_graph():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _compile(lin)(x)
        ref = lin(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_float16_and_int64_and_bool():
    x = torch.randn(4, 70, dtype=torch.float16)
    f = lambda t: torch.softmax(t, -1) * 2 + t  # noqa: E731
    torch.testing.assert_close(_compile(f)(x), f(x), atol=2e-3, rtol=2e-3)
    idx = torch.tensor([[3, -2, 7]], dtype=torch.int64)
    g = lambda i: ((i * 2 + 1) > 3, (i + 5).argmax(-1))  # noqa: E731
    mask, amax = _compile(g)(idx)
    assert mask.dtype == torch.bool and amax.dtype == torch.int64
    assert torch.equal(mask, g(idx)[0]) and torch.equal(amax, g(idx)[1])


@pytest.mark.parametrize("affine", [None, torch.bfloat16, torch.float32], ids=["plain", "bf16_affine", "fp32_affine"])
def test_native_layer_norm_statistics_come_back_in_eagers_dtypes(affine):
    # on CPU, eager gives mean / rstd in the input's dtype, or fp32 for a bf16 input with fp32 affine parameters
    x = torch.randn(3, 5, 40, dtype=torch.bfloat16)
    w, b = (None, None) if affine is None else (torch.randn(40, dtype=affine), torch.randn(40, dtype=affine))
    f = lambda t: torch.native_layer_norm(t, [40], w, b, 1e-5)  # noqa: E731
    got, want = _compile(f)(x), f(x)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, atol=2e-2, rtol=2e-2)


class _TransposedNormHead(torch.nn.Module):
    """SigLIP's attention-pooling head as PaliGemma returns it: LayerNorm of a transposed attention output, a
    projection, and the projection returned twice (``.to`` of its own dtype is the same tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.proj = torch.nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.norm(x.transpose(0, 1))
        y = self.proj(h)
        return y.to(torch.float32), y, h


def test_layer_norm_output_is_contiguous_as_eagers_so_training_graphs_alias_as_in_eager():
    """A strided LayerNorm result sent linear down its matmul + in-place bias path, and AOTAutograd lost the base
    of the aliased outputs (a TypeError in its output wrapper while training)."""
    torch.manual_seed(0)
    model = _TransposedNormHead()
    x = torch.randn(4, 2, 8)
    got, want = [], []
    for fn, results in ((torch.compile(model, backend="neuron", dynamic=False), got), (model, want)):
        leaf = x.clone().requires_grad_(True)
        outs = fn(leaf)
        grads = torch.autograd.grad(sum(o.square().sum() for o in outs), [leaf, *model.parameters()])
        results.extend([*(o.detach() for o in outs), *grads])
    assert got[2].stride() == want[2].stride() == (32, 8, 1)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (3, 1, 2, 0), (0, 1, 2, 3)], ids=["swap", "reverse", "same"])
def test_copy_into_a_buffer_keeps_the_buffers_layout_for_later_views(perm):
    # copy_ into a fresh buffer (functionalized into aten.copy) must come out laid out like the buffer, not like the
    # permuted source: the view after it (and autograd's views of its gradient) depend on those strides
    shape = (2, 4, 6, 5)
    src_shape = [0] * 4
    for i, p in enumerate(perm):
        src_shape[p] = shape[i]

    def f(x):
        y = torch.zeros(shape)
        y.copy_(x.permute(*perm))
        return y.view(8, 6, 5) * 2

    x = torch.randn(*src_shape, requires_grad=True)
    got = _compile(f)(x)
    x2 = x.detach().clone().requires_grad_()
    want = f(x2)
    torch.testing.assert_close(got, want)
    (got * torch.linspace(-1, 1, 240).view(8, 6, 5)).sum().backward()
    (want * torch.linspace(-1, 1, 240).view(8, 6, 5)).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_torch_func_transforms_inlined_by_dynamo_match_eager():
    x = torch.randn(3, 4)
    vm = _compile(lambda v: torch.func.vmap(lambda r: (r * r).sum())(v))
    torch.testing.assert_close(vm(x), (x * x).sum(-1))
    gr = _compile(lambda v: torch.func.grad(lambda r: (r * r).sum())(v))
    torch.testing.assert_close(gr(x), 2 * x)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float8_e4m3fn])
def test_unsupported_input_dtypes_rejected(dtype):
    x = torch.randn(3).to(dtype)
    with pytest.raises(Exception) as info:
        # complex: an op outside the real-pair subset (lowering/complex_pairs.py; complex * 2 compiles)
        _compile(lambda v: torch.logcumsumexp(v, 0) if dtype.is_complex else v.float() * 2)(x)
    exc = info.value
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None
    if dtype.is_complex:  # the op the real-pair rewrite stopped at, then everything on complex values in one line
        assert "aten.logcumsumexp.default(complex64[3], 0): not compiled on complex values" in str(exc)
        assert "and 1 more op(s) and input(s) on complex values" in str(exc)
    else:
        assert f"dtype {dtype} is not supported" in str(exc)


def test_executor_selection_without_nki():
    if runtime.real_nki() is not None:
        pytest.skip("a working nki is installed: the default executor is not the bundled simulator")
    assert runtime.select_executor() == "simulator"
    with patch(executor="nki-simulate"), pytest.raises(NeuronCompileError, match="needs the real `nki` package"):
        runtime.select_executor()
    with patch(executor="nki-jit"), pytest.raises(NeuronCompileError, match="needs the real `nki` package"):
        runtime.select_executor()


@pytest.mark.neuron_sdk
def test_real_nki_simulate_executor_matches_eager():
    if runtime.real_nki() is None:
        pytest.skip("needs the real `nki` package from the Neuron package repository (not installable here)")
    with patch(executor="nki-simulate"):
        x = torch.randn(130, 300)
        torch.testing.assert_close(_compile(lambda t: torch.softmax(t, -1))(x), torch.softmax(x, -1))


@pytest.mark.neuron_device
def test_nki_jit_on_device_matches_eager():
    if runtime.real_nki() is None or not runtime.neuron_device_present():
        pytest.skip("needs the real `nki` package and a Neuron device (/dev/neuron*); neither is available here")
    with patch(executor="nki-jit"):
        x = torch.randn(130, 300)
        torch.testing.assert_close(_compile(lambda t: torch.softmax(t, -1))(x), torch.softmax(x, -1))


def test_plan_json_round_trip_is_lossless():
    import json

    from neuron_compile.runtime import plan_from_json, plan_to_json

    with patch(cache=False):
        f = _compile(lambda x, w: torch.nn.functional.gelu(x @ w).masked_fill(x[:, :1] > 0, float("-inf")).softmax(-1))
        f(torch.randn(5, 7), torch.randn(7, 9))
    plan = B.compiled_graphs()[-1]["plan"]
    back = plan_from_json(json.loads(json.dumps(plan_to_json(plan, [k.name for k in plan.kernels]))))
    assert back.kernels == plan.kernels and back.kernels
    assert (back.buffers, back.calls, back.inputs, back.outputs) == (plan.buffers, plan.calls, plan.inputs,
                                                                     plan.outputs)


def test_identical_kernels_of_different_layers_load_once():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from models import GPT, GPTConfig

    from neuron_compile.runtime import kernel_identity, load_kernels

    model = GPT(GPTConfig(vocab=64, seq=16, d_model=32, n_heads=2, n_layers=3)).eval()
    idx = torch.randint(0, 64, (2, 16))
    with patch(cache=False), torch.no_grad():
        torch.testing.assert_close(_compile(model)(idx), model(idx), atol=1e-5, rtol=1e-5)
    sources = B.compiled_graphs()[-1]["sources"]
    unique = {kernel_identity(n, s) for n, s in sources}
    assert len(unique) < len(sources) * 2 // 3  # per-layer kernels are shared across the 3 layers
    fns = load_kernels(sources, "simulator")
    assert len({id(f) for f in fns}) == len(unique)


@pytest.mark.parametrize("pads", [(1, 2), (0, 3, 2, 0), (-1, 2), (2, -1, 1, 1)])
def test_constant_pad(pads):
    x = torch.randn(3, 4, 5)
    f = lambda t: torch.nn.functional.pad(t, pads, value=0.5) * 2  # noqa: E731
    torch.testing.assert_close(_compile(f)(x), f(x))


def test_vector_norm_and_repeat():
    x = torch.randn(4, 7)
    torch.testing.assert_close(_compile(lambda t: t.norm(dim=-1))(x), x.norm(dim=-1))
    torch.testing.assert_close(_compile(lambda t: t.repeat(2, 3) + 1)(x), x.repeat(2, 3) + 1)


def test_zero_element_tensors():
    x = torch.randn(0, 4)
    out = _compile(lambda t: torch.softmax(t * 2 + 1, -1))(x)
    assert out.shape == (0, 4)



@pytest.mark.parametrize("fn", [lambda t: t.sum(0), lambda t: t.prod(0), lambda t: t.mean(0),
                                lambda t: t.var(0), lambda t: t.any(0), lambda t: t.all(0),
                                lambda t: (t.sum(0) + 1) * 2],
                         ids=["sum", "prod", "mean", "var", "any", "all", "sum_then_pointwise"])
def test_reductions_over_an_empty_dim_give_the_identity_like_eager(fn):
    x = torch.randn(0, 4)
    torch.testing.assert_close(_compile(fn)(x), fn(x), equal_nan=True)


@pytest.mark.parametrize("fn", [lambda t: t.sum(0), lambda t: t.amax(0), lambda t: t.max(0).indices,
                                lambda t: t.var(0), lambda t: t.var(0, correction=0), lambda t: torch.softmax(t, 0),
                                lambda t: t.argmax(), lambda t: t.logsumexp(0), lambda t: t.view(1) * 2,
                                lambda t: t.any(), lambda t: t.transpose(0, 0) + 1, lambda t: t.t() * 2,
                                lambda t: t.permute(()) - 1],
                         ids=["sum", "amax", "max_indices", "var", "var_c0", "softmax", "argmax", "logsumexp",
                              "view", "any", "transpose", "t", "permute"])
def test_reductions_and_views_of_0d_tensors_match_eager(fn):
    x = torch.tensor(3.5)
    torch.testing.assert_close(_compile(fn)(x), fn(x), equal_nan=True)


@pytest.mark.parametrize("fn", [lambda t: t.argmax(), lambda t: t.argmin(keepdim=True), lambda t: t.t().argmax()],
                         ids=["argmax", "argmin_keepdim", "argmax_transposed"])
def test_argmax_without_dim_flattens(fn):
    x = torch.randn(5, 7)
    torch.testing.assert_close(_compile(fn)(x), fn(x))


@pytest.mark.parametrize("shape", [(2, 0), (3, 0), (0, 3), (0, 0)])
def test_empty_results_whose_fused_shapes_differ(shape):
    """Empty values fused with views of another layout ([2, 0] next to [0, 2]): the kernel has nothing to visit
    (the iteration-space algebra divided by the zero size before)."""
    n, m = shape

    def fn(t):
        return torch.eye(n, m) + (t.reshape(m, n) * 2).exp().t()

    x = torch.zeros(n, m)
    got = _compile(fn)(x)
    assert got.shape == fn(x).shape


def test_empty_contraction_matmul_is_zeros():
    a, b = torch.randn(3, 0), torch.randn(0, 4)
    torch.testing.assert_close(_compile(lambda x, y: x @ y)(a, b), torch.zeros(3, 4))


@pytest.mark.parametrize("fn", [lambda t: torch.logspace(2, 3, 1) * t, lambda t: torch.logspace(1, 3, 1, base=2.0) + t,
                                lambda t: t * torch.full((4,), 0.5).sigmoid(), lambda t: torch.ones(4).exp() - t,
                                lambda t: torch.signal.windows.cosine(1) * t, lambda t: torch.full((4,), 0.3).cos() + t],
                         ids=["logspace_one_step", "logspace_base2", "sigmoid_of_full", "exp_of_ones",
                              "cosine_window_one_point", "cos_of_full"])
def test_activation_of_a_constant_matches_eager(fn):
    """A ScalarE function of a value folded to a constant (one-step logspace, a fill) is computed, not refused."""
    x = torch.randn(4)
    torch.testing.assert_close(_compile(fn)(x), fn(x))


@pytest.mark.parametrize("p", [0, 1, 2, 3.5, float("inf"), float("-inf")])
def test_dist_matches_eager(p):
    a, b = torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(_compile(lambda x, y: torch.dist(x, y, p))(a, b), torch.dist(a, b, p))


@pytest.mark.parametrize("with_update", [True, False])
def test_batch_norm_with_update_called_directly(with_update):
    """``aten._batch_norm_with_update`` (the op BatchNorm's training step dispatches to) updates the running
    statistics in place as eager does; ``_batch_norm_no_update`` leaves them alone."""
    aten = torch.ops.aten

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor):
        if with_update:
            return aten._batch_norm_with_update(x, w, b, rm, rv, 0.3, 1e-5)[:3]
        return aten._batch_norm_no_update(x, w, b, rm, rv, 0.3, 1e-5)[:3]

    x, w, b = torch.randn(4, 3, 5) * 2 + 1, torch.randn(3), torch.randn(3)
    ours = [torch.randn(3), torch.rand(3) + 0.5]
    eager = [t.clone() for t in ours]
    got = torch.compile(fn, backend="neuron", dynamic=False)(x, w, b, *ours)
    want = fn(x, w, b, *eager)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
    for g, e in zip(ours, eager, strict=True):
        torch.testing.assert_close(g, e)


def test_batch_norm_with_update_backward_called_directly():
    """The backward of a direct ``_batch_norm_with_update`` call is ``aten.batch_norm_backward`` (nn.BatchNorm's
    own path goes through the functional op instead): its gradients match eager's."""
    aten = torch.ops.aten

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor):
        return aten._batch_norm_with_update(x, w, b, rm, rv, 0.6, 1e-5)[0]

    gen = torch.Generator().manual_seed(0)
    leaves = [torch.randn(4, 3, 5, generator=gen) * 2 + 1, torch.randn(3, generator=gen), torch.randn(3, generator=gen)]
    grad = torch.randn(4, 3, 5, generator=gen)
    grads = []
    for run in (fn, torch.compile(fn, backend="neuron", dynamic=False)):
        xs = [t.clone().requires_grad_() for t in leaves]
        run(*xs, torch.zeros(3), torch.ones(3)).backward(grad)
        grads.append([t.grad for t in xs])
    for want, got in zip(*grads, strict=True):
        torch.testing.assert_close(got, want)


def test_sqrt_of_a_provably_positive_argument_stays_in_scalare_range_at_the_top():
    """sqrt(x * x + 1) is provably >= 1, so the lowering skips the small-value fix-ups; values past ScalarE's valid
    range (2^118) must still reach it in range (scaled by its own scale operand), not as they are."""
    from neuron_compile.simulator.checks import SimulatorWarning

    x = torch.tensor([0.0, 3.0, -2.0, 1e-3, 1e17, 3e18, 1.8e19, float("nan")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        got = _compile(lambda t: torch.sqrt(t * t + 1))(x)
        ln = torch.nn.LayerNorm(16).eval()
        big = torch.randn(4, 16) * 1e18  # variances past 2^118
        with torch.no_grad():
            got_ln, want_ln = _compile(ln)(big), ln(big)
    torch.testing.assert_close(got, torch.sqrt(x * x + 1), equal_nan=True)
    torch.testing.assert_close(got_ln, want_ln, atol=1e-5, rtol=1e-5)
