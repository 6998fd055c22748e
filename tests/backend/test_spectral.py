"""Symmetric eigenvalues, singular values and pinv by Jacobi sweeps (lowering/decomp_spectral.py), against eager."""

from __future__ import annotations

import pytest
import torch
from cnn_helpers import unsupported
from neuron_compile.lowering import decomp_spectral as S

from neuron_compile.errors import LinAlgDeviceError


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def _graded(n: int, spread: float, seed: int, rows: int | None = None) -> torch.Tensor:
    """A matrix with singular values 1 .. 10^-spread (Jacobi's slowest case)."""
    g = _gen(seed)
    q, _ = torch.linalg.qr(torch.randn(rows or n, rows or n, generator=g, dtype=torch.float64))
    p, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return ((q[:, :n] * torch.logspace(0, -spread, n, dtype=torch.float64)) @ p.T).float()


_A = torch.randn(3, 5, 4, generator=_gen(0))
_SYM = torch.randn(2, 5, 5, generator=_gen(1))
_LOWRANK = torch.randn(5, 2, generator=_gen(2)) @ torch.randn(2, 6, generator=_gen(3))

CASES = {
    "svdvals": (torch.linalg.svdvals, (_A,)),
    "svdvals_wide": (torch.linalg.svdvals, (_A.mT,)),
    "eigvalsh_lower": (torch.linalg.eigvalsh, (_SYM,)),  # not symmetric: only the lower triangle counts
    "eigvalsh_upper": (lambda s: torch.linalg.eigvalsh(s, UPLO="U"), (_SYM,)),
    "cond": (torch.linalg.cond, (_A[:, :4],)),
    "nuclear_norm": (lambda a: torch.linalg.matrix_norm(a, "nuc"), (_A,)),
    "spectral_norm": (lambda a: torch.linalg.matrix_norm(a, 2), (_A,)),
    "matrix_rank": (torch.linalg.matrix_rank, (_LOWRANK,)),
    "matrix_rank_hermitian": (lambda a: torch.linalg.matrix_rank(a @ a.mT, hermitian=True), (_LOWRANK,)),
    "pinv": (torch.linalg.pinv, (_A,)),
    "pinv_wide": (torch.linalg.pinv, (_A.mT,)),
    "pinv_hermitian": (lambda a: torch.linalg.pinv(a + a.mT, hermitian=True), (_SYM,)),
    "pinverse_rcond": (lambda a: torch.pinverse(a, rcond=1e-2), (_LOWRANK,)),
    "pinv_atol": (lambda a: torch.linalg.pinv(a, atol=0.5), (_A.mT,)),
    "graded_16": (torch.linalg.svdvals, (_graded(16, 6, 0, rows=20),)),
    "empty_batch": (torch.linalg.svdvals, (torch.zeros(2, 0, 3),)),
    "one_by_one": (torch.linalg.eigvalsh, (torch.full((1, 1), -3.0),)),
    "zero_matrix": (torch.linalg.svdvals, (torch.zeros(3, 3),)),
    "huge_and_tiny": (torch.linalg.svdvals, (torch.stack([_A[0] * 1e30, _A[1] * 1e-30]),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager(name: str) -> None:
    fn, args = CASES[name]
    got, want = _compile(fn)(*args), fn(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = want.abs().amax().clamp(min=1e-30) if want.numel() else 1.0
    torch.testing.assert_close(got / scale, want / scale, atol=3e-6, rtol=0)


@pytest.mark.skipif(not hasattr(torch.linalg, "matrix_sqrth"), reason="linalg.matrix_sqrth is new in torch 2.14")
def test_hermitian_square_root_clamps_negative_eigenvalues_as_eager() -> None:
    s = _SYM + _SYM.mT  # indefinite: eager's square root uses max(eigenvalue, 0)
    torch.testing.assert_close(_compile(torch.linalg.matrix_sqrth)(s), torch.linalg.matrix_sqrth(s), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("n", [2, 5, 8, 12, 16])
def test_sweeps_converge_on_graded_matrices_with_margin(n: int) -> None:
    """Fewer sweeps than :func:`sweeps` still converge on the slowest inputs measured (singular values over 12
    decades): the unrolled count has room, and the device check passes with it."""
    a = _graded(n, 12, n, rows=n + 3)
    fewer = S.sweeps(n) - 2
    b, v = a / a.abs().amax(), torch.eye(n)
    upper, diag, *rounds = S._pair_masks(n)
    for _ in range(fewer):
        for pair in rounds:
            j = S._round(b.mT @ b, pair, upper, diag)
            b, v = b @ j, v @ j
    assert bool(S._orthogonal(b.mT @ b, 8 * n * torch.finfo(torch.float32).eps).all())


def test_tournament_rounds_cover_every_pair_once() -> None:
    for n in range(1, 18):
        pairs = [p for r in S._rounds(n) for p in r]
        assert sorted(pairs) == [(p, q) for p in range(n) for q in range(p + 1, n)]
        assert all(len({i for p in r for i in p}) == 2 * len(r) for r in S._rounds(n))  # disjoint in a round
        upper, diag, *masks = S._pair_masks(n)
        assert torch.equal(upper, torch.ones(n, n).triu(1).bool()) and torch.equal(diag, torch.eye(n).bool())
        for mask, pairs in zip(masks, S._rounds(n), strict=True):  # one mark per row: the partner, or itself
            assert torch.equal(mask, mask.T) and bool((mask.sum(-1) == 1).all())
            assert all(mask[p, q] for p, q in pairs) and int(mask.sum()) == n


@pytest.mark.parametrize("fn", [torch.linalg.svdvals, torch.linalg.pinv, torch.linalg.eigvalsh])
def test_non_finite_input_raises_linalg_error(fn) -> None:
    a = torch.eye(3)
    a[2, 0] = float("nan")
    with pytest.raises(torch.linalg.LinAlgError, match="The algorithm failed to converge because the input matrix "
                                                       "contained non-finite values") as info:
        _compile(fn)(a)
    assert isinstance(info.value, LinAlgDeviceError)


def _refusal(fn, *args) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 (Dynamo wraps it: the UnsupportedOpError is its cause)
        _compile(fn)(*args)
    return str(unsupported(info.value))


def test_used_vectors_and_large_matrices_are_refused_by_name() -> None:
    """Vectors are unique only up to sign (LAPACK's choice): a graph that reads them is refused, values compile."""
    msg = _refusal(lambda a: torch.linalg.svd(a).U, torch.randn(4, 3))
    assert "aten._linalg_svd.default(float32[4, 3]" in msg and "its singular vectors are read by the forward" in msg
    msg = _refusal(lambda a: torch.linalg.eigh(a).eigenvectors, torch.randn(4, 4))
    assert "aten._linalg_eigh.default(float32[4, 4]" in msg and "its eigenvectors are read by the forward" in msg
    n = S.MAX_ORDER + 1
    msg = _refusal(torch.linalg.svdvals, torch.randn(n, n))
    assert (f"a {n} x {n} matrix: eigenvalues and singular values are unrolled Jacobi sweeps over at most "
            f"{S.MAX_ORDER} columns (and {S.MAX_ROWS} rows)") in msg


TRAINED = {  # name: (function, input shape)
    "eigvalsh": (lambda a: torch.linalg.eigvalsh(a @ a.mT + a.mT), (5, 5)),
    "eigh_values": (lambda a: torch.linalg.eigh(a + a.mT, UPLO="U").eigenvalues.square(), (2, 4, 4)),
    "svdvals": (torch.linalg.svdvals, (2, 6, 4)),
    "svdvals_wide": (lambda a: torch.linalg.svdvals(a.mT), (6, 4)),
    "svd_values": (lambda a: torch.linalg.svd(a, full_matrices=False).S.exp(), (5, 5)),
    "cond": (torch.linalg.cond, (2, 6, 4)),
    "spectral_norm": (lambda a: torch.linalg.matrix_norm(a, 2), (5, 5)),
    "nuclear_norm": (lambda a: torch.linalg.matrix_norm(a, "nuc"), (2, 6, 4)),
    "pinv": (lambda a: torch.linalg.pinv(a).square(), (5, 3)),
}


@pytest.mark.parametrize("name", list(TRAINED))
def test_training_through_values_matches_eager(name: str) -> None:
    """The vectors these backward formulas read (``V diag(g) V^T``, ``U diag(g) V^T``) are decomposed with the
    values, since no forward output depends on them: gradients equal eager's, whatever the vectors' signs."""
    fn, shape = TRAINED[name]
    a = torch.randn(*shape)
    x, y = a.clone().requires_grad_(), a.clone().requires_grad_()
    ref = fn(x)
    (want,) = torch.autograd.grad(ref.sum(), x)
    out = _compile(fn)(y)
    (got,) = torch.autograd.grad(out.sum(), y)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)


def test_training_refuses_vectors_the_forward_reads_and_full_non_square_svds() -> None:
    x = torch.randn(4, 4, requires_grad=True)
    msg = _refusal(lambda a: torch.linalg.eigh(a + a.mT).eigenvectors.abs().sum(), x)
    assert "aten._linalg_eigh.default(float32[4, 4]): its eigenvectors are read by the forward (returned or computed "\
           "with), and they are unique only up to sign" in msg
    torch._dynamo.reset()
    msg = _refusal(lambda a: torch.linalg.svd(a).S.sum(), torch.randn(4, 3, requires_grad=True))
    assert ("its singular vectors are read by the forward (returned or computed with), and they are unique only up to "
            "sign (LAPACK's choice, which a NeuronCore can't reproduce); eigenvalues, singular values, pinv and the "
            "Hermitian square root compile, in training too (in training, a non-square svd compiles with "
            "full_matrices=False when only its values are used)") in msg
