"""Direct linear algebra through the backend (lowering/decomp_linalg.py: unrolled LU with partial pivoting,
triangular solves, Cholesky; lowering/decomp_qr.py: Householder QR): every op against eager, batched and broadcast, forward and gradients; the factors
themselves (LU, pivots, info) equal eager's, as autograd's formulas read them back; singular and indefinite inputs
raise torch.linalg.LinAlgError on device as eager does; what is not compiled is refused with its reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from linalg_helpers import check_gradients
from linalg_helpers import check_outputs as _check
from linalg_helpers import compiled as _compile
from linalg_helpers import refusal as _refusal
from neuron_compile.lowering.decomp_linalg import MAX_ORDER

from neuron_compile.errors import DeviceAssertionError


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mat(*shape: int, seed: int = 0) -> torch.Tensor:
    """Well-conditioned square matrices (random plus a dominant diagonal, so every comparison is meaningful)."""
    a = torch.randn(*shape, generator=_gen(seed))
    return a + shape[-1] * 0.5 * torch.eye(shape[-1])


def _spd(*shape: int, seed: int = 0) -> torch.Tensor:
    a = torch.randn(*shape, generator=_gen(seed))
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def _rhs(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def _lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.lu_factor(a)


CASES: list[tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = [
    ("lu_factor", torch.linalg.lu_factor, lambda: (torch.randn(3, 6, 6, generator=_gen(0)),)),
    ("lu_factor_ex_wide", torch.linalg.lu_factor_ex, lambda: (torch.randn(2, 3, 5, generator=_gen(0)),)),
    ("lu_tall", torch.linalg.lu, lambda: (torch.randn(5, 3, generator=_gen(0)),)),
    ("lu_unpack", torch.lu_unpack, lambda: _lu(torch.randn(2, 4, 4, generator=_gen(0)))),
    ("lu_solve", torch.linalg.lu_solve, lambda: (*_lu(_mat(2, 5, 5)), _rhs(2, 5, 3))),
    ("lu_solve_adjoint_right", lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=False, adjoint=True),
     lambda: (*_lu(_mat(4, 4)), _rhs(3, 4))),
    ("solve_batched_broadcast", torch.linalg.solve, lambda: (_mat(3, 5, 5), _rhs(5, 2))),
    ("solve_vector", torch.linalg.solve, lambda: (_mat(6, 6), _rhs(6))),
    ("solve_right", lambda a, b: torch.linalg.solve(a, b, left=False), lambda: (_mat(2, 4, 4), _rhs(2, 3, 4))),
    ("solve_ex", torch.linalg.solve_ex, lambda: (_mat(4, 4), _rhs(4, 2))),
    ("inv", torch.linalg.inv, lambda: (_mat(2, 3, 5, 5),)),
    ("inv_ex", torch.linalg.inv_ex, lambda: (_mat(7, 7),)),
    ("det", torch.linalg.det, lambda: (torch.randn(4, 5, 5, generator=_gen(0)),)),
    ("det_transposed", lambda a: torch.linalg.det(a.mT), lambda: (torch.randn(5, 5, generator=_gen(2)),)),
    ("slogdet", torch.linalg.slogdet, lambda: (torch.randn(3, 6, 6, generator=_gen(0)),)),
    ("logdet", torch.logdet, lambda: (_spd(2, 4, 4),)),
    ("cholesky", torch.linalg.cholesky, lambda: (_spd(3, 6, 6),)),
    ("cholesky_upper", lambda a: torch.linalg.cholesky(a, upper=True), lambda: (_spd(5, 5),)),
    ("cholesky_ex", torch.linalg.cholesky_ex, lambda: (_spd(2, 4, 4),)),
    *([("cholesky_legacy", torch.cholesky, lambda: (_spd(4, 4),))]  # torch 2.14 removed the deprecated torch.cholesky
      if hasattr(torch.ops.aten, "cholesky") else []),
    ("cholesky_solve", torch.cholesky_solve, lambda: (_rhs(2, 5, 3), torch.linalg.cholesky(_spd(2, 5, 5)))),
    ("cholesky_solve_upper", lambda b, u: torch.cholesky_solve(b, u, upper=True),
     lambda: (_rhs(4, 2), torch.linalg.cholesky(_spd(4, 4), upper=True))),
    ("cholesky_inverse", torch.cholesky_inverse, lambda: (torch.linalg.cholesky(_spd(5, 5)),)),
    ("solve_triangular_upper", lambda a, b: torch.linalg.solve_triangular(a, b, upper=True),
     lambda: (_mat(2, 5, 5), _rhs(2, 5, 3))),
    ("solve_triangular_lower_right_unit",
     lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=False, unitriangular=True),
     lambda: (_mat(4, 4), _rhs(3, 3, 4))),
    ("triangular_solve_transpose", lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True),
     lambda: (_rhs(2, 4, 3), _mat(2, 4, 4))),
    ("tensorsolve", torch.linalg.tensorsolve, lambda: (_mat(6, 6).reshape(2, 3, 6), _rhs(2, 3))),
    # QR (lowering/decomp_qr.py): LAPACK's reflectors, so Q and R carry its signs
    ("qr_tall_batched", torch.linalg.qr, lambda: (torch.randn(2, 6, 4, generator=_gen(0)),)),
    ("qr_wide", torch.linalg.qr, lambda: (torch.randn(3, 5, generator=_gen(0)),)),
    ("qr_complete", lambda a: torch.linalg.qr(a, mode="complete"), lambda: (torch.randn(5, 3, generator=_gen(0)),)),
    ("qr_r", lambda a: torch.linalg.qr(a, mode="r"), lambda: (torch.randn(4, 4, generator=_gen(0)),)),
    ("qr_zero_column", torch.linalg.qr, lambda: (torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0]]),)),
    ("geqrf", torch.geqrf, lambda: (torch.randn(6, 4, generator=_gen(0)),)),
    ("householder_product", torch.linalg.householder_product, lambda: torch.geqrf(torch.randn(5, 4, generator=_gen(0)))),
    ("ormqr_left_transposed", lambda a, t, c: torch.ormqr(a, t, c, left=True, transpose=True),
     lambda: (*torch.geqrf(torch.randn(5, 4, generator=_gen(0))), _rhs(5, 3))),
    ("ormqr_right", lambda a, t, c: torch.ormqr(a, t, c, left=False, transpose=False),
     lambda: (*torch.geqrf(torch.randn(5, 4, generator=_gen(0))), _rhs(3, 5))),
]


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_matches_eager(name: str, fn: Callable[..., Any], make: Callable[[], tuple[torch.Tensor, ...]]) -> None:
    args = make()
    _check(_compile(fn)(*args), fn(*args))


GRAD_CASES = ["solve_batched_broadcast", "solve_right", "inv", "det", "det_transposed", "slogdet", "cholesky",
              "cholesky_upper", "cholesky_solve", "solve_triangular_upper", "lu_factor", "lu_solve", "logdet",
              "qr_tall_batched", "householder_product", "ormqr_right"]


@pytest.mark.parametrize("name", GRAD_CASES)
def test_gradients_match_eager(name: str) -> None:
    """Autograd's formulas read the forward's factors (LU, pivots) back: wrong conventions give wrong gradients."""
    _, fn, make = next(c for c in CASES if c[0] == name)
    check_gradients(fn, make())


def test_singular_and_zero_pivot_factors_are_eagers() -> None:
    """A zero pivot is skipped and reported in info (1-based), the determinant is 0 and logabsdet -inf."""
    sing = torch.tensor([[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0],
                                                                              [0.0, 0.0, 1.0]]])
    _check(_compile(torch.linalg.lu_factor_ex)(sing), torch.linalg.lu_factor_ex(sing))
    _check(_compile(torch.linalg.det)(sing), torch.linalg.det(sing))
    _check(_compile(torch.linalg.slogdet)(sing), torch.linalg.slogdet(sing))
    assert _compile(torch.linalg.inv_ex)(sing)[1].tolist() == torch.linalg.inv_ex(sing)[1].tolist()


@pytest.mark.parametrize("fn,arg,message", [
    (torch.linalg.inv, torch.tensor([[1.0, 2.0], [2.0, 4.0]]), "linalg.inv: A diagonal element of U is zero"),
    (lambda a: torch.linalg.solve(a, torch.ones(2)), torch.tensor([[1.0, 2.0], [2.0, 4.0]]),
     "torch.linalg.solve: The solver failed because the input matrix is singular."),
    (torch.linalg.cholesky, -torch.eye(3).expand(2, 3, 3),
     "linalg.cholesky: (in at least one batch element) The factorization could not be completed because the input "
     "is not positive-definite"),
])
def test_failures_raise_linalg_error_on_device(fn: Callable[..., Any], arg: torch.Tensor, message: str) -> None:
    """Eager raises torch.linalg.LinAlgError from the data; so does the compiled graph, after its kernels ran."""
    with pytest.raises(torch.linalg.LinAlgError):
        fn(arg)
    compiled = _compile(fn)
    with pytest.raises(torch.linalg.LinAlgError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        compiled(arg)
    assert isinstance(err.value, DeviceAssertionError)
    ok = torch.eye(arg.shape[-1]).expand(arg.shape).clone() * 2.0  # the same graph on good data returns eager's
    _check(compiled(ok), fn(ok))


def test_cholesky_reads_only_its_triangle() -> None:
    """LAPACK reads the lower (or upper) triangle only: garbage in the other one changes nothing."""
    a = _spd(5, 5)
    junk = a.tril() + torch.triu(torch.full((5, 5), 99.0), 1)
    _check(_compile(torch.linalg.cholesky)(junk), torch.linalg.cholesky(junk))
    junk_up = a.triu() + torch.tril(torch.full((5, 5), -7.0), -1)
    up = lambda t: torch.linalg.cholesky(t, upper=True)  # noqa: E731
    _check(_compile(up)(junk_up), up(junk_up))


def test_larger_matrices_and_iterative_decompositions_are_refused_with_their_reason() -> None:
    n = MAX_ORDER + 1
    assert (f"aten.linalg_inv_ex.default(float32[{n}, {n}]): a {n}-row matrix: factorizations and triangular "
            f"solves are unrolled per column, up to {MAX_ORDER} rows and columns") in _refusal(torch.linalg.inv,
                                                                                            _mat(n, n))
    assert "aten.linalg_eig.default(float32[4, 4]): general eigendecompositions, SVDs with their vectors, LDL" in \
        _refusal(torch.linalg.eigvals, _mat(4, 4))


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_matrix_exp_matches_eager_at_every_scaling(scale: float) -> None:
    """Small norms need no squaring, large ones several (s is data: the unrolled squarings apply where k < s)."""
    a = torch.randn(3, 4, 4, generator=_gen(0)) * scale
    got, want = _compile(torch.linalg.matrix_exp)(a), torch.linalg.matrix_exp(a)
    exact = torch.linalg.matrix_exp(a.double())
    # squaring amplifies rounding: no fp32 algorithm reproduces eager's digits, so the bound is eager's own error
    assert (got.double() - exact).abs().max() <= 2 * (want.double() - exact).abs().max() + 1e-6 * exact.abs().max()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_matrix_exp_gradient_and_decay() -> None:
    a = _rhs(5, 5, seed=3)
    leaf = a.clone().requires_grad_()
    want = torch.autograd.grad(torch.linalg.matrix_exp(leaf).sin().sum(), leaf)[0]
    leaf2 = a.clone().requires_grad_()
    got = torch.autograd.grad(_compile(lambda t: torch.linalg.matrix_exp(t).sin().sum())(leaf2), leaf2)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    decay = -200.0 * torch.eye(3)  # exp underflows to exactly 0, as eager's
    assert torch.equal(_compile(torch.linalg.matrix_exp)(decay), torch.linalg.matrix_exp(decay))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matrix_exp_of_a_16_bit_matrix_is_refused_with_the_reason(dtype: torch.dtype) -> None:
    a = (torch.randn(5, 5, generator=_gen(0)) * 0.1).to(dtype)
    assert not torch.linalg.matrix_exp(a).double().sub(torch.linalg.matrix_exp(a.double())).abs().max() < 1
    exc = _refusal(torch.linalg.matrix_exp, a)
    assert (f"aten.linalg_matrix_exp.default({str(dtype).removeprefix('torch.')}[5, 5]): matrix_exp of a 16-bit "
            "matrix: eager computes it in that dtype with float32's scaling thresholds") in exc
    assert "cast the matrix to float32" in exc


@pytest.mark.parametrize("shape", [(6, 6), (8, 5)])
def test_orthogonal_parametrization_compiles(shape: tuple[int, int]) -> None:
    """torch.nn.utils.parametrizations.orthogonal: matrix_exp for square weights, Householder products otherwise;
    forward and the weight's gradient against eager."""
    torch.manual_seed(0)
    layer = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(shape[1], shape[0]))
    x = torch.randn(4, shape[1])
    want = layer(x)
    want_grad = torch.autograd.grad(want.square().sum(), layer.parametrizations.weight.original)[0]
    got = _compile(layer)(x)
    got_grad = torch.autograd.grad(got.square().sum(), layer.parametrizations.weight.original)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-4, rtol=1e-4)
