"""QR as unrolled Householder reflections, in LAPACK's representation (``geqrf`` / ``orgqr`` / ``ormqr``).

``geqrf`` (unblocked ``geqr2``): per column ``i``, ``dlarfg`` makes the reflector ``H_i = I - tau_i v_i v_i^T``
that zeroes the column below the diagonal: ``beta = -sign(alpha) * ||(alpha, x)||``, ``tau = (beta - alpha) /
beta``, ``v = (1, x / (alpha - beta))``, and ``tau = 0`` (``H = I``) when ``x`` is already zero; ``beta`` lands
on the diagonal, ``v``'s tail below it, and the trailing columns take ``H_i``. ``Q = H_0 H_1 ... H_{k-1}``:
``householder_product`` (``orgqr``) applies the reflectors to the identity's leading columns, ``ormqr`` to any
matrix from either side, transposed or not; ``linalg_qr`` is ``geqrf`` plus those, with ``R`` the upper triangle.

Each reflection is a column sum and a rank-1 update of elementwise ops (VectorE, fp32), so the signs, ``R`` and
``Q`` are LAPACK's up to rounding, and autograd's formulas (``linalg_qr_backward``) apply unchanged. Complex
matrices follow ``zlarfg``: ``beta = -sign(Re alpha) * ||(alpha, x)||`` is real, ``H_i = I - tau_i v_i v_i^H``, ``geqrf``
applies ``H_i^H`` to the trailing columns, and ``H = I`` only when ``x`` is zero and ``alpha`` real. Same domain as
:mod:`lowering.decomp_linalg`: float32/64 and complex64/128 matrices up to ``MAX_ORDER`` rows and columns.
"""

from __future__ import annotations

from typing import Any

import torch
from neuron_compile.lowering.decomp_linalg import _fits, _index, linalg_problem, squared_magnitude
from neuron_compile.lowering.registry import register_declined

aten = torch.ops.aten


def _geqrf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(reflectors below the diagonal with R on and above it, tau [..., min(m, n)])."""
    m, n = a.shape[-2:]
    rows, cols = _index(m).unsqueeze(-1), _index(n)
    taus = []
    for i in range(min(m, n)):
        col = a[..., :, i:i + 1]
        alpha = a[..., i:i + 1, i:i + 1]
        below = rows > i
        x = torch.where(below, col, torch.zeros_like(col))
        xnorm = squared_magnitude(x).sum(-2, keepdim=True).sqrt()
        norm = (squared_magnitude(alpha) + xnorm * xnorm).sqrt()
        beta = torch.where(alpha.real >= 0, -norm, norm)  # real (.real and .conj() of a real tensor are itself)
        keep = xnorm == 0  # nothing to zero: H = I (a complex alpha must be real as well)
        if alpha.is_complex():
            keep = keep & (alpha.imag == 0)
            beta = beta.to(a.dtype)
        tau = torch.where(keep, torch.zeros_like(beta), (beta - alpha) / beta)
        v = torch.where(rows == i, torch.ones_like(col), torch.where(keep, x, x / (alpha - beta)))
        w = (v.conj() * a).sum(-2, keepdim=True)  # v^H A
        updated = a - tau.conj() * v * torch.where(cols > i, w, torch.zeros_like(w))  # H^H A (geqr2)
        diag = torch.where(keep, alpha, beta)
        column = torch.where(rows == i, diag, torch.where(below, v, col))
        a = torch.where(cols == i, column, updated)
        taus.append(tau[..., 0, 0])
    tau = torch.stack(taus, -1) if taus else a.new_zeros((*a.shape[:-2], 0))
    return a, tau


def _reflector(v_mat: torch.Tensor, i: int) -> torch.Tensor:
    """``v_i`` [..., m, 1]: 1 at row i, the stored tail below it, zeros above."""
    m = v_mat.shape[-2]
    rows = _index(m).unsqueeze(-1)
    col = v_mat[..., :, i:i + 1]
    return torch.where(rows == i, torch.ones_like(col), torch.where(rows > i, col, torch.zeros_like(col)))


def _apply(v_mat: torch.Tensor, tau: torch.Tensor, c: torch.Tensor, left: bool, transpose: bool) -> torch.Tensor:
    """``Q C``, ``Q^H C``, ``C Q`` or ``C Q^H`` with ``Q = H_0 ... H_{k-1}``, ``H_i = I - tau_i v_i v_i^H``
    (``ormqr``; ``transpose`` is the conjugate transpose)."""
    k = tau.shape[-1]
    order = range(k) if left == transpose else range(k - 1, -1, -1)
    for i in order:
        v = _reflector(v_mat, i)
        t = tau[..., i:i + 1].unsqueeze(-1)
        t = t.conj() if transpose else t  # H_i^H = I - conj(tau_i) v v^H
        if left:  # C - tau v (v^H C)
            c = c - t * v * (v.conj() * c).sum(-2, keepdim=True)
        else:  # C - tau (C v) v^H
            c = c - t * (c * v.mT).sum(-1, keepdim=True) * v.mH
    return c


def _orgqr(v_mat: torch.Tensor, tau: torch.Tensor, cols: int) -> torch.Tensor:
    m = v_mat.shape[-2]
    eye = torch.eye(m, cols, dtype=v_mat.dtype).expand(*v_mat.shape[:-2], m, cols)
    return _apply(v_mat, tau, eye, left=True, transpose=False)


def geqrf(a: torch.Tensor) -> Any:
    if not _fits(a):
        return NotImplemented
    return _geqrf(a)


def householder_product(v_mat: torch.Tensor, tau: torch.Tensor) -> Any:
    if not _fits(v_mat):
        return NotImplemented
    return _orgqr(v_mat, tau, v_mat.shape[-1])


def ormqr(v_mat: torch.Tensor, tau: torch.Tensor, c: torch.Tensor, left: bool = True, transpose: bool = False) -> Any:
    if not _fits(v_mat, c):
        return NotImplemented
    return _apply(v_mat, tau, c, left, transpose)


def linalg_qr(a: torch.Tensor, mode: str = "reduced") -> Any:
    if not _fits(a) or mode not in ("reduced", "complete", "r"):
        return NotImplemented
    m, n = a.shape[-2:]
    k = min(m, n)
    v_mat, tau = _geqrf(a)
    if mode == "r":
        return a.new_empty(0), v_mat[..., :k, :].triu()
    if mode == "complete":
        return _orgqr(v_mat, tau, m), v_mat.triu()
    return _orgqr(v_mat, tau, k), v_mat[..., :k, :].triu()


QR: dict[Any, Any] = {
    aten.geqrf.default: geqrf,
    aten.linalg_householder_product.default: householder_product,
    aten.ormqr.default: ormqr,
    aten.linalg_qr.default: linalg_qr,
}
register_declined(linalg_problem, *QR)
