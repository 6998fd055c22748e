"""Complex values as real pairs (lowering/complex_pairs.py): complex rotary embeddings compile and match eager;
complex ops without a real form are still refused by name."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from neuron_compile.errors import UnsupportedOpError


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


BATCH, SEQ, HEADS, HEAD_DIM = 2, 8, 4, 16


def _freqs_cis() -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(SEQ).float(), inv)
    return torch.polar(torch.ones_like(freqs), freqs)


def _rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis.view(1, SEQ, 1, HEAD_DIM // 2)).flatten(3).type_as(x)


def _x(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_with_a_complex_input_matches_eager(dtype):
    x, fc = _x(dtype=dtype), _freqs_cis()
    got = _compile(_rope)(x, fc)
    assert got.dtype == dtype
    torch.testing.assert_close(got, _rope(x, fc), rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)


def test_rope_with_freqs_computed_in_the_graph_matches_eager():
    f = lambda x: _rope(x, _freqs_cis())  # noqa: E731
    x = _x(1)
    torch.testing.assert_close(_compile(f)(x), f(x), rtol=1e-5, atol=1e-5)


def test_complex_outputs_and_arithmetic_match_eager():
    def f(x, z):
        c = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        w = (c * z.view(1, SEQ, 1, -1) + c.conj() * 0.5 - z.view(1, SEQ, 1, -1)) * 2.0
        return w, w.abs(), torch.view_as_real(w - c).sum(-1)

    x, z = _x(2), _freqs_cis() * 1.5
    got, want = _compile(f)(x, z), f(x, z)
    assert got[0].dtype == torch.complex64 and got[0].shape == want[0].shape
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_rope_gradients_match_eager():
    fc = _freqs_cis()
    weights = torch.linspace(-1, 1, HEAD_DIM)

    def loss(q, k):
        return (_rope(q, fc) * weights).sum() + (_rope(k, fc) ** 2).sum()

    grads = []
    for fn in (loss, _compile(loss)):
        q, k = _x(3).requires_grad_(), _x(4).requires_grad_()
        fn(q, k).backward()
        grads.append((q.grad, k.grad))
    for g, w in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


_REAL_MEETS_COMPLEX = {
    "real_plus_complex_scalar": lambda r, i, z: r + (1 + 2j),
    "complex_scalar_minus_real": lambda r, i, z: 2j - r,
    "int_plus_imaginary": lambda r, i, z: i + 2j,
    "double_plus_imaginary": lambda r, i, z: r.double() + 1j,
    "add_with_complex_alpha": lambda r, i, z: torch.add(r, 1j, alpha=2),
    "complex_plus_alpha_real": lambda r, i, z: torch.add(z, r, alpha=2),
    "complex_minus_alpha_complex": lambda r, i, z: torch.sub(z, z * 1j, alpha=-1.5),
    "real_plus_complex_alpha_complex": lambda r, i, z: torch.add(r, z, alpha=2 + 1j),
    "imag_of_conj": lambda r, i, z: z.conj().imag,  # a negated view (aten._neg_view)
    "neg_view_real": lambda r, i, z: torch._neg_view(r) * 2,
    "resolved_views": lambda r, i, z: r.resolve_neg() + z.conj().imag.resolve_conj(),
    "neg_view_complex": lambda r, i, z: torch.view_as_real(z.conj().imag * 1 + 0j),
}


@pytest.mark.parametrize("name", list(_REAL_MEETS_COMPLEX))
def test_real_tensors_meet_complex_scalars_and_negated_views(name):
    fn = _REAL_MEETS_COMPLEX[name]
    g = torch.Generator().manual_seed(5)
    r = torch.randn(4, 3, generator=g)
    r[0, 0], r[1, 1] = float("inf"), float("nan")  # eager's NaN parts from 0 * inf in the promoted operand
    i, z = torch.randint(-5, 5, (4, 3), generator=g), torch.randn(4, 3, dtype=torch.complex64, generator=g)
    got, want = _compile(fn)(r, i, z), fn(r, i, z)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True)


def test_a_complex_op_without_a_real_form_is_refused_by_name():
    f = lambda x: torch.view_as_real(torch.logcumsumexp(torch.view_as_complex(x.reshape(4, -1, 2)), 0))  # noqa: E731
    with pytest.raises(Exception) as info:
        _compile(f)(torch.randn(4, 8))
    exc = info.value
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None
    lines = [ln for ln in str(exc).splitlines() if ln.startswith("  - ")]
    assert lines[0].startswith("  - aten.logcumsumexp.default(complex64[4, 4], 0): not compiled on complex values (they "
                               "compile as "
                               "pairs of reals, op by op, and this op has no real form) at ")
    assert re.fullmatch(r"  - and \d+ more op\(s\) and input\(s\) on complex values, which compile \(as pairs of "
                        r"reals\) once the op\(s\) above do", lines[1])


def test_abs_of_extreme_complex_values_neither_overflows_nor_underflows():
    z = torch.tensor([1e-30 + 1e-30j, 1e30 + 1e30j, 1e-30 + 1e30j, 0j, complex(float("inf"), 1.0),
                      complex(3.0, -4.0), complex(-0.0, 2.0), complex(float("nan"), 1.0)], dtype=torch.complex64)
    got = _compile(lambda t: (t * 1.0).abs())(z)
    torch.testing.assert_close(got, z.abs(), rtol=1e-6, atol=0.0, equal_nan=True)


@pytest.mark.parametrize("fn", [
    lambda a, b: torch.dot(a[0], b[0]),
    lambda a, b: torch.vdot(a[0], b[0]),
    lambda a, b: (a * b).sum(),
    lambda a, b: a.mean(),
    lambda a, b: a[0, 0].sum() + b.sum(dim=1),
], ids=["dot", "vdot", "sum_all", "mean_all", "sum_0d"])
def test_reductions_over_every_dim_keep_the_pair(fn):
    """A sum / mean with no dims reduces every dim of the complex value, never its real-imaginary pair (a 0-d
    complex result stays a pair); a 0-d value is its own sum."""
    g = torch.Generator().manual_seed(5)
    a, b = (torch.randn(3, 5, dtype=torch.complex64, generator=g) for _ in range(2))
    got = _compile(fn)(a, b)
    torch.testing.assert_close(got, fn(a, b), rtol=1e-5, atol=1e-5)


def test_index_fill_with_a_complex_value_matches_eager():
    a, idx = torch.randn(4, 3, dtype=torch.complex64), torch.tensor([0, 2])
    f = lambda a, i: torch.index_fill(a, 0, i, -8.5 - 1.7j)  # noqa: E731
    torch.testing.assert_close(_compile(f)(a, idx), f(a, idx), rtol=0, atol=0)


def test_the_complex_values_of_a_refused_op_are_one_line_after_it():
    """linalg.eig (refused: a general eigendecomposition) makes complex values, and its backward works on them: the refusal names eig
    and sums up everything on its complex values in one line, instead of listing each view, product and complex
    tangent (a complex input's advice was "cast it to complex64", which it already was)."""
    x = torch.randn(4, 4, requires_grad=True)
    with pytest.raises(Exception) as info:
        _compile(lambda x: torch.linalg.eig(x))(x)
    exc = info.value
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None
    lines = [ln for ln in str(exc).splitlines() if ln.startswith("  - ")]
    assert str(exc).startswith("neuron backend cannot compile this training graph (forward + backward): 1 unsupported")
    assert len(lines) == 2 and lines[0].startswith("  - aten.linalg_eig.default(float32[4, 4]): general eigendecomp")
    assert re.fullmatch(r"  - and \d+ more op\(s\) and input\(s\) on complex values, which compile \(as pairs of "
                        r"reals\) once the op\(s\) above do", lines[1])
    assert "cast it to complex64" not in str(exc)


_EDGES = [0.0, 1.0, -1.0, 0.5, 3.0, 1e-30, 1e30, float("inf"), float("nan"), -2.5]
_GRID = torch.tensor([complex(r, i) for r in _EDGES for i in _EDGES], dtype=torch.complex64)
_LHS, _RHS = _GRID.repeat_interleave(len(_GRID)), _GRID.repeat(len(_GRID))  # every pair of edge values


@pytest.mark.parametrize("fn", [
    lambda a, b: a / b, lambda a, b: b.real / a, lambda a, b: a / (2 - 3j), lambda a, b: a / 0j,
    lambda a, b: 2.0 / b, lambda a, b: b.reciprocal(), lambda a, b: a / 2.0, lambda a, b: a / b.real,
    lambda a, b: a / a.abs(), lambda a, b: a * 0.5, lambda a, b: a * b.real, lambda a, b: b.real * a,
    lambda a, b: a * b, lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a + b.real, lambda a, b: b.real - a,
    lambda a, b: a + float("inf"), lambda a, b: a - 1j, lambda a, b: 2 - a,
    lambda a, b: torch.addcmul(a, a, b, value=0.5),
], ids=["c/c", "r/c", "c/scalar_c", "c/0j", "scalar/c", "reciprocal", "c/scalar", "c/r", "c/abs", "c*scalar", "c*r",
        "r*c", "c*c", "c+c", "c-c", "c+r", "r-c", "c+inf", "c-1j", "scalar-c", "addcmul"])
def test_complex_arithmetic_matches_eager_on_every_pair_of_edge_values(fn):
    """Division (Smith's algorithm, as c10::complex: no overflow in |b|^2, x / 0 as each part over |0|), reciprocal,
    and the products and sums with a real or scalar side give eager's values for every pair of parts from
    {0, +-1, 0.5, 3, -2.5, 1e-30, 1e30, inf, NaN}, including where eager's complex product by r + 0i (and add's by
    alpha = 1 + 0i) turns an inf part's partner into NaN."""
    got = _compile(fn)(_LHS, _RHS)
    torch.testing.assert_close(got, fn(_LHS, _RHS), rtol=2e-6, atol=0, equal_nan=True)


def test_complex_division_gradients():
    x, y = (torch.randn(5, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    grads = []
    for fn in ((lambda a, b: (a / b).abs().sum() + (2.0 / b).real.sum()), None):
        a, b = x.clone().requires_grad_(), y.clone().requires_grad_()
        (fn or _compile(lambda a, b: (a / b).abs().sum() + (2.0 / b).real.sum()))(a, b).backward()
        grads.append((a.grad, b.grad))
    for g, w in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _cz(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.complex64, generator=torch.Generator().manual_seed(seed))


_Z, _W = _cz(4, 6), _cz(6, 5, seed=1)
_HOLES = _Z.index_fill(1, torch.tensor([1, 4]), 0)
_SPECIAL = torch.tensor([complex(float("nan"), 0), complex(0, float("inf")), 1j, 0j, complex(-float("inf"), 2)])

MORE_CASES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "flip": (lambda z: z.flip(-1, 0) * 1, (_Z,)),
    "roll_dims": (lambda z: z.roll(2, 1) * 1, (_Z,)),
    "roll_flat": (lambda z: z.roll(3) * 1, (_Z,)),
    "split": (lambda z: [t * 1 for t in z.split(2, dim=-1)], (_Z,)),
    "chunk_of_transposed": (lambda z: [t * 1 for t in z.t().split(2, dim=-1)], (_Z,)),
    "split_of_a_slice": (lambda z: [t * 1 for t in z.split(2, dim=0)], (_Z[1:, 2:],)),
    "unbind": (lambda z: [t * 1 for t in z.unbind(1)], (_Z,)),
    "diagonal": (lambda z: z.diagonal(1) * 1, (_Z,)),
    "diagonal_batched": (lambda z: torch.diagonal(z, 0, -2, -1) * 1, (_cz(2, 3, 3),)),
    "as_strided": (lambda z: torch.as_strided(z, (2, 3), (1, 2), 1) * 1, (_Z,)),
    "index_select": (lambda z: z.index_select(1, torch.tensor([0, 3, 3])) * 1, (_Z,)),
    "gather": (lambda z, i: z.gather(1, i) * 1, (_Z, torch.tensor([[0, 5], [1, 1], [2, 0], [4, 3]]))),
    "advanced_index": (lambda z, i: z[i, 1:] * 1, (_Z, torch.tensor([0, 2, 2]))),
    "constant_pad": (lambda z: torch.nn.functional.pad(z, (1, 2)) * 1, (_Z,)),
    "unfold": (lambda z: z.unfold(1, 3, 2) * 1, (_Z,)),
    "cumsum": (lambda z: z.cumsum(1), (_Z,)),
    "eq_ne": (lambda z, w: (z == w, z != w, z == z), (_Z, _HOLES)),
    "eq_scalar": (lambda z: (z == 0, z != 1j), (_HOLES,)),
    "eq_real_promoted_as_r_plus_0i": (lambda z, r: (z == r, z != r),
                                      (torch.tensor([complex(float("inf"), 0), 1 + 1j, complex(float("nan"), 0)]),
                                       torch.tensor([float("inf"), 1.0, 0.0]))),
    "nan_inf_tests": (lambda z: (z.isnan(), z.isinf(), z.isfinite()), (_SPECIAL,)),
    "logical": (lambda z, w: (torch.logical_not(z), torch.logical_and(z, w), torch.logical_or(z, w),
                              torch.logical_xor(z, w)), (torch.tensor([0j, 1j, 1, 0j]), torch.tensor([0j, 0j, 2j, 3]))),
    "mm": (lambda a, b: a @ b, (_Z, _W)),
    "bmm": (lambda a, b: a @ b, (_cz(3, 4, 6), _cz(3, 6, 2, seed=2))),
    "matmul_broadcast": (lambda a, b: a @ b, (_cz(2, 3, 4, 6), _cz(6, 2, seed=3))),
    "matvec": (lambda a, b: a @ b, (_Z, _cz(6, seed=4))),
    "casts_keep_the_real_part": (lambda z: (z.float(), z.to(torch.bfloat16), z.int(), z.bool()), (_HOLES,)),
    "any_all": (lambda z: (z.any(), z.all(), z.any(1), z.all(dim=0)), (_HOLES,)),
    "zero_d_dims": (lambda z, i: (z.sum(0), z.mean([0], True), z.flip(0) * 1, z.cumsum(0), z.index_select(0, i) * 1,
                                  z.unfold(0, 1, 1) * 1), (torch.tensor(1.5 - 2j), torch.tensor([0]))),
    "elementary_functions": (lambda z: (z.sin(), z.cos(), z.sinh(), z.cosh(), z.tanh(), z.sqrt(), z.rsqrt(),
                                        z.sigmoid(), z.square(), z.log2(), z.log10()),
                             (torch.cat([_Z.flatten() * 2, torch.tensor([0j, -4 + 0j, 1e-20j, -1e-3 + 1e-8j, 30 + 1j,
                                                                           -30 + 2j])]),)),
    "tan_exp2_angle": (lambda z: (z.tan(), (z * 30).tan(), z.exp2(), z.angle()), (_Z,)),
    "var_std": (lambda z: (z.var(), torch.var(z, 1, correction=0, keepdim=True), z.std(0), *torch.var_mean(z, 1)),
                (_Z,)),
    "add_scalar_rms_norm": (lambda z: (z + 0.5, torch.nn.functional.rms_norm(z, (6,))), (_Z,)),
    "sum_with_its_dtype": (lambda z: (z.sum(dtype=torch.complex64), z.mean(), torch.tensordot(z, z.t(), dims=1)),
                           (_Z,)),
    "exp": (lambda z: z.exp(), (_Z,)),
    "log": (lambda z: z.log(), (_Z,)),
}


@pytest.mark.parametrize("name", list(MORE_CASES))
def test_more_complex_ops_match_eager(name: str) -> None:
    """Data movement (the pair dim rides along), comparisons and tests (both parts), cumulative sums, matrix
    products (four real ones) and exp/log on complex values compile as real pairs and match eager."""
    fn, args = MORE_CASES[name]
    got, want = _compile(fn)(*args), fn(*args)
    for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, (list, tuple)) else [want],
                    strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_gradients_through_complex_exp_and_matmul():
    x, w = _Z.clone().requires_grad_(), _W.clone()
    want = torch.autograd.grad((x.exp() @ w).abs().sum(), x)[0]
    y = _Z.clone().requires_grad_()
    got = torch.autograd.grad(_compile(lambda z: (z.exp() @ w).abs().sum())(y), y)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _S4DLike(torch.nn.Module):
    """A diagonal state-space layer as S4D writes it: a complex kernel exp(dt A l) contracted with complex C (einsum,
    complex division by A), its real part convolved with the input by rfft / irfft."""

    def __init__(self, h: int = 8, n: int = 8) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.log_dt = torch.nn.Parameter(torch.rand(h, generator=g) * -4.6 - 2.3)
        self.c = torch.nn.Parameter(torch.randn(h, n, 2, generator=g))
        self.log_a_real = torch.nn.Parameter(torch.full((h, n), -0.69))
        self.a_imag = torch.nn.Parameter(3.14159 * torch.arange(n).repeat(h, 1).float())
        self.d = torch.nn.Parameter(torch.randn(h, generator=g))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        length = u.size(-1)
        a = -torch.exp(self.log_a_real) + 1j * self.a_imag
        dta = a * torch.exp(self.log_dt).unsqueeze(-1)
        c = torch.view_as_complex(self.c) * (torch.exp(dta) - 1.0) / a
        k = 2 * torch.einsum("hn,hnl->hl", c, torch.exp(dta.unsqueeze(-1) * torch.arange(length))).real
        y = torch.fft.irfft(torch.fft.rfft(u, n=2 * length) * torch.fft.rfft(k, n=2 * length), n=2 * length)
        return y[..., :length] + u * self.d.unsqueeze(-1)


def test_an_s4d_layer_trains_like_eager():
    """Its backward graph lifts a complex constant after the forward's were lifted (the lifted names once collided:
    a SyntaxError out of FX)."""
    eager, compiled = _S4DLike(), _S4DLike()
    u = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(4))
    want = eager(u)
    want.square().sum().backward()
    got = _compile(compiled)(u)
    got.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=name)
