"""Inputs and usage patterns an adversarial probe of the backend found mishandled: each must match eager or be
refused with a clear error of the documented type, never crash inside the library or return a wrong number."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from neuron_compile.errors import RuntimeExecutionError, UnsupportedOpError


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


INPLACE = "one of the variables needed for gradient computation has been modified by an inplace operation"


@pytest.mark.parametrize("name", ["add_", "no_grad mul_"])
def test_inplace_change_of_an_output_autograd_saved_raises_as_eager(name: str) -> None:
    """sigmoid's and exp's backward read their own output: changing the returned tensor in place must make
    backward raise (before: the version counters differed and the gradient came from the changed values)."""
    def change(y: torch.Tensor) -> None:
        if name == "add_":
            y.add_(1)
        else:
            with torch.no_grad():
                y.mul_(2)

    for fn in (torch.sigmoid, torch.exp):
        torch._dynamo.reset()
        for f in (fn, _compile(fn)):
            x = torch.randn(3, 4, requires_grad=True)
            y = f(x)
            change(y)
            with pytest.raises(RuntimeError, match=INPLACE):
                y.sum().backward()


def test_outputs_that_are_one_value_are_one_tensor() -> None:
    def f(x):
        y = torch.tanh(x)
        return y, y

    a, b = _compile(f)(torch.randn(5))
    assert a is b
    x = torch.randn(3, requires_grad=True)
    y = _compile(torch.sigmoid)(x)
    grad, = torch.autograd.grad(y.sum(), x)  # unchanged outputs: gradients as before
    s = torch.sigmoid(x.detach())
    torch.testing.assert_close(grad, s * (1 - s))


@pytest.mark.parametrize("x", [torch.tensor(1.5), torch.tensor(3)], ids=["float", "int"])
def test_flip_of_a_0d_tensor(x: torch.Tensor) -> None:
    got = _compile(lambda t: (t.flip(0), t.flip(-1) + 1))(x)
    assert torch.equal(got[0], x) and torch.equal(got[1], x + 1)


EXPONENTS = [0.0, 1, 2, 3, -1, -2, 0.5, 2.5, -7, 1e30, -0.0, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("base", [-1.0, -2.0, -0.5, 0.0, -0.0, 1.0, math.inf, -math.inf, math.nan, 2.0, 0.5, -1, 0, 3])
def test_pow_of_a_python_number_base_follows_c_pow(base: float) -> None:
    """``base ** tensor``: 1 ** anything is 1, a negative base takes an odd integer exponent's sign and gives
    NaN for a finite non-integer one, 0 and inf bases by their limits (before: math domain error, or NaN)."""
    e = torch.tensor(EXPONENTS)
    want = torch.pow(base, e)
    got = _compile(lambda t: base ** t)(e)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=0)
    finite = ~want.isnan()
    assert torch.equal(got.signbit()[finite], want.signbit()[finite])


def test_pow_scalar_base_gradients_and_dtypes() -> None:
    x = torch.randn(6, requires_grad=True)
    f = lambda t: (0.5 ** t + (-2.0) ** t.round() + 1.0 ** t).sum()  # noqa: E731
    want, = torch.autograd.grad(f(x), x)
    got, = torch.autograd.grad(_compile(f)(x), x)
    torch.testing.assert_close(got, want, equal_nan=True)
    k = torch.arange(-3, 5)
    torch.testing.assert_close(_compile(lambda t: (-1.0) ** t * 2)(k), (-1.0) ** k * 2)
    h = torch.arange(-3, 5, dtype=torch.bfloat16)
    torch.testing.assert_close(_compile(lambda t: (-1.0) ** t)(h), (-1.0) ** h)


def test_nested_tensor_input_is_refused_by_name() -> None:
    nt = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], layout=torch.jagged)
    with pytest.raises(BackendCompilerFailed, match=r"is a nested \(jagged\) tensor.*torch\.nested\.to_padded_tensor") \
            as info:
        _compile(lambda t: t * 2)(nt)
    assert isinstance(info.value.inner_exception, UnsupportedOpError)


def test_index_select_of_a_0d_tensor() -> None:
    x = torch.tensor(1.5)
    assert torch.equal(_compile(lambda t, i: t.index_select(0, i))(x, torch.tensor([0])), x)
    torch._dynamo.reset()
    with pytest.raises(BackendCompilerFailed, match="index_select on a 0-d tensor takes exactly one index, got 2"):
        _compile(lambda t, i: t.index_select(0, i))(x, torch.tensor([0, 0]))


def test_unsigned_wide_input_message_says_what_to_cast_to() -> None:
    with pytest.raises(BackendCompilerFailed, match=r"dtype torch\.uint16 is not supported \(NeuronCores have no unsigned "
                                        r"integers wider than 8 bits; cast it to int32"):
        _compile(lambda t: t + 1)(torch.zeros(3, dtype=torch.uint16))


def test_detached_overlapping_slices_changed_in_place_match_eager_or_get_a_clear_error() -> None:
    """torch 2.13's AOTAutograd sizes the synthetic base of such inputs differently at run time than at compile
    time (16 elements against 12): the runner names the mismatch instead of crashing in AOTAutograd's write-back.
    torch 2.14 passes the base it compiled for: then the results and the mutation are eager's."""
    def f(a, b):
        a.add_(1)
        return b * 2

    base = torch.randn(4, 4)
    ref = base.clone()
    want = f(ref[:2].detach(), ref[1:3].detach())
    a, b = base[:2].detach(), base[1:3].detach()
    try:
        got = _compile(f)(a, b)
    except RuntimeExecutionError as exc:
        assert torch.__version__.startswith("2.13")
        assert "input 0 of the compiled graph has shape [16], but the graph was compiled for [12]" in str(exc)
        assert ".clone() them" in str(exc)
        return
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(base, ref)


def test_nan_and_inf_results_raise_no_host_warnings() -> None:
    """The engines compute IEEE inf/NaN silently; numpy's warnings must not reach the user's console."""
    x = torch.tensor([-1.0, 0.0, 1.0, math.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _compile(lambda t: (torch.log(t), t / 0, t * math.inf, t - t))(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = (torch.log(x), x / 0, x * math.inf, x - x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_outputs_keep_eager_memory_layout() -> None:
    """channels_last and permuted results come back in eager's strides (the values were always right; a model
    that checks or relies on its activations' memory format saw contiguous ones)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last)
    for f in (lambda t: t * 2 + 1, conv, lambda t: t.permute(0, 2, 3, 1) * 2):
        torch._dynamo.reset()
        want, got = f(x), _compile(f)(x)
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want)
    xg = x.clone().requires_grad_(True)
    torch._dynamo.reset()
    y = _compile(lambda t: conv(t) * 2)(xg)
    y.sum().backward()
    assert y.is_contiguous(memory_format=torch.channels_last) and xg.grad.stride() == x.stride()
