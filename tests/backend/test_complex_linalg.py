"""Complex linear algebra through the backend (lowering/decomp_linalg.py, decomp_qr.py, decomp_matrix_exp.py and
decomp_spectral.py in complex arithmetic): every op against eager with LAPACK's complex conventions (the |Re| + |Im|
pivot search, A = L L^H, adjoint solves with A^H, Householder reflectors I - tau v v^H with a real beta, Hermitian
matrices read from one triangle), the factors equal to eager's (autograd's formulas read them back), gradients,
and the failures and refusals."""

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

C64 = torch.complex64


def _rand(*shape: int, seed: int = 0, dtype: torch.dtype = C64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _mat(*shape: int, seed: int = 0, dtype: torch.dtype = C64) -> torch.Tensor:
    """Well-conditioned square matrices: random plus a dominant diagonal."""
    return _rand(*shape, seed=seed, dtype=dtype) + shape[-1] * 0.5 * torch.eye(shape[-1], dtype=dtype)


def _hpd(*shape: int, seed: int = 0) -> torch.Tensor:
    """Hermitian positive definite."""
    a = _rand(*shape, seed=seed)
    return a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=C64)


def _geqrf(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.geqrf(_rand(*shape))


CASES: list[tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = [
    ("lu_factor_batched", torch.linalg.lu_factor_ex, lambda: (_rand(3, 6, 6),)),
    # |3| > |2.2 + 0.9i| but 3 < 2.2 + 0.9: LAPACK's icamax picks the second row, as eager does
    ("lu_pivot_by_abs_re_plus_abs_im", torch.linalg.lu_factor,
     lambda: (torch.tensor([[3.0 + 0.0j, 1.0], [2.2 + 0.9j, 1.0]], dtype=C64),)),
    ("lu_wide_unpacked", torch.linalg.lu, lambda: (_rand(2, 3, 5),)),
    ("lu_solve_adjoint_right", lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=False, adjoint=True),
     lambda: (*torch.linalg.lu_factor(_mat(4, 4)), _rand(3, 4, seed=1))),
    ("lu_solve_adjoint", lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, adjoint=True),
     lambda: (*torch.linalg.lu_factor(_mat(2, 4, 4)), _rand(2, 4, 2, seed=1))),
    ("solve_right_broadcast", lambda a, b: torch.linalg.solve(a, b, left=False), lambda: (_mat(2, 4, 4), _rand(3, 4))),
    ("inv", torch.linalg.inv_ex, lambda: (_mat(2, 5, 5),)),
    ("det", torch.linalg.det, lambda: (_rand(3, 5, 5),)),
    ("slogdet", torch.linalg.slogdet, lambda: (_rand(2, 6, 6),)),
    ("cholesky", torch.linalg.cholesky_ex, lambda: (_hpd(2, 5, 5),)),
    ("cholesky_upper", lambda a: torch.linalg.cholesky(a, upper=True), lambda: (_hpd(4, 4),)),
    ("cholesky_solve_upper", lambda b, u: torch.cholesky_solve(b, u, upper=True),
     lambda: (_rand(4, 2, seed=1), torch.linalg.cholesky(_hpd(4, 4), upper=True))),
    ("cholesky_inverse", torch.cholesky_inverse, lambda: (torch.linalg.cholesky(_hpd(5, 5)),)),
    ("solve_triangular_right_unit",
     lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False, unitriangular=True),
     lambda: (_mat(4, 4), _rand(3, 4, seed=1))),
    ("triangular_solve_transpose", lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True),
     lambda: (_rand(2, 4, 3, seed=1), _mat(2, 4, 4))),
    ("qr_tall_batched", torch.linalg.qr, lambda: (_rand(2, 6, 4),)),
    ("qr_complete_wide", lambda a: torch.linalg.qr(a, mode="complete"), lambda: (_rand(3, 5),)),
    # a column already zero below a non-real diagonal still reflects (H = I needs a real alpha as well)
    ("qr_zero_tail", torch.geqrf, lambda: (torch.tensor([[1.0 + 2.0j, 1.0], [0.0, 2.0], [0.0, 3.0j]], dtype=C64),)),
    ("householder_product", torch.linalg.householder_product, lambda: _geqrf(5, 4)),
    *[(f"ormqr_{'left' if left else 'right'}{'_adjoint' if transpose else ''}",
       lambda a, t, c, left=left, transpose=transpose: torch.ormqr(a, t, c, left=left, transpose=transpose),
       lambda left=left: (*_geqrf(5, 4), _rand(*((5, 3) if left else (3, 5)), seed=1)))
      for left in (True, False) for transpose in (True, False)],
    ("matrix_exp", torch.linalg.matrix_exp, lambda: (_rand(3, 3) * 3.0,)),
    ("solve_complex128", torch.linalg.solve, lambda: (_mat(4, 4, dtype=torch.complex128),
                                                      _rand(4, 2, seed=1, dtype=torch.complex128))),
    # eigenvalues and singular values (lowering/decomp_spectral.py): Jacobi rotations with complex phases
    # not Hermitian: only the named triangle is read, and not Im of its diagonal
    ("eigvalsh_upper", lambda a: torch.linalg.eigvalsh(a, UPLO="U"), lambda: (_rand(3, 3),)),
    ("svdvals_wide", torch.linalg.svdvals, lambda: (_rand(2, 3, 5),)),
    ("pinv_tall", torch.linalg.pinv, lambda: (_rand(5, 3),)),
    # singular values 1, 1, 0: a doubled value whose vectors any unitary mix of two serves
    ("pinv_rank_deficient", torch.linalg.pinv,
     lambda: (torch.linalg.qr(_rand(3, 2))[0] @ torch.linalg.qr(_rand(3, 2, seed=1))[0].mH,)),
    ("pinv_hermitian", lambda a: torch.linalg.pinv(a, hermitian=True), lambda: (_hpd(3, 3) - 5.0 * torch.eye(3),)),
    ("matrix_rank", torch.linalg.matrix_rank, lambda: (_rand(4, 2) @ _rand(2, 5, seed=1),)),
    ("cond", torch.linalg.cond, lambda: (_mat(3, 3),)),
]


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_matches_eager(name: str, fn: Callable[..., Any], make: Callable[[], tuple[torch.Tensor, ...]]) -> None:
    args = make()
    _check(_compile(fn)(*args), fn(*args))


GRAD_CASES = ["solve_right_broadcast", "inv", "det", "slogdet", "cholesky_upper", "lu_factor_batched",
              "qr_tall_batched", "ormqr_right_adjoint", "eigvalsh_upper", "svdvals_wide"]


@pytest.mark.parametrize("name", GRAD_CASES)
def test_gradients_match_eager(name: str) -> None:
    """Complex gradients (conjugate Wirtinger) through autograd's formulas, which read the forward's factors back."""
    _, fn, make = next(c for c in CASES if c[0] == name)
    check_gradients(fn, make())


def test_cholesky_reads_only_its_triangle_and_not_the_diagonals_imaginary_part() -> None:
    """LAPACK takes the matrix as Hermitian: the other triangle and Im(diagonal) are never read."""
    a = _hpd(4, 4)
    junk = a.tril() + torch.triu(torch.full((4, 4), 9.0 - 5.0j), 1) + 3.0j * torch.eye(4)
    _check(_compile(torch.linalg.cholesky)(junk), torch.linalg.cholesky(junk))
    junk_up = a.triu() + torch.tril(torch.full((4, 4), -7.0j), -1) - 2.0j * torch.eye(4)
    up = lambda t: torch.linalg.cholesky(t, upper=True)  # noqa: E731
    _check(_compile(up)(junk_up), up(junk_up))


def test_failures_raise_linalg_error_on_device() -> None:
    """A complex Hermitian matrix that is not positive definite, and a singular one, fail as in eager."""
    cases = [(torch.linalg.cholesky, torch.tensor([[1.0, 2.0j], [-2.0j, 1.0]], dtype=C64),
              "linalg.cholesky: The factorization could not be completed because the input is not positive-definite"),
             (torch.linalg.inv, torch.tensor([[1.0, 1.0j], [1.0j, -1.0]], dtype=C64),
              "linalg.inv: A diagonal element of U is zero")]
    for fn, arg, message in cases:
        with pytest.raises(torch.linalg.LinAlgError):
            fn(arg)
        with pytest.raises(torch.linalg.LinAlgError, match=message) as err:
            _compile(fn)(arg)
        assert isinstance(err.value, DeviceAssertionError)


def test_singular_complex_factor_reports_info_and_zero_determinant() -> None:
    sing = torch.tensor([[1.0 + 1.0j, 2.0], [2.0 - 2.0j, 4.0 - 4.0j]], dtype=C64)  # row 2 = (2 - 2i) row 1
    _check(_compile(torch.linalg.lu_factor_ex)(sing), torch.linalg.lu_factor_ex(sing))
    _check(_compile(torch.linalg.det)(sing), torch.linalg.det(sing))


def test_larger_complex_matrices_and_vectors_are_refused_for_their_reason() -> None:
    n = MAX_ORDER + 1
    assert (f"aten.linalg_inv_ex.default(complex64[{n}, {n}]): a {n}-row matrix: factorizations and triangular "
            f"solves are unrolled per column, up to {MAX_ORDER} rows and columns") in _refusal(torch.linalg.inv,
                                                                                            _mat(n, n))
    assert ("aten._linalg_svd.default(complex64[17, 17]): a 17 x 17 matrix: eigenvalues and singular values are "
            "unrolled Jacobi sweeps over at most 16 columns") in _refusal(torch.linalg.svdvals, _rand(17, 17))
    assert ("aten._linalg_eigh.default(complex64[4, 4]): its eigenvectors are read by the forward (returned or "
            "computed with), and they are unique only up to sign (a complex phase, for complex matrices)"
            in _refusal(lambda a: torch.linalg.eigh(a)[1], _hpd(4, 4)))
