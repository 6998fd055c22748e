"""Small dense linear algebra as unrolled eliminations: LU with partial pivoting, triangular solves, Cholesky.

The direct methods of ``torch.linalg`` are short sequential loops over the columns of a matrix whose order is
static, so each is unrolled here into ordinary lowered ops, batched over any leading dims:

* LU (``getrf``): per column, the pivot is the first row of largest magnitude at or below the diagonal (argmax),
  the two rows swap (a gather and two selects), the multipliers are the column below the pivot divided by it, and
  the trailing block takes the rank-1 update. A zero pivot leaves its column as it is (all zeros: nothing to
  eliminate) and is reported in ``info`` (1-based, the first one), as LAPACK does. ``pivots`` are LAPACK's:
  1-based, row ``i`` was swapped with row ``pivots[i]``.
* Triangular solves (``trsm``): forward or back substitution, one row of the solution per step, reading only the
  triangle the call names (the other one may hold anything, e.g. the other factor of an LU).
* Cholesky (``potrf``): right-looking, one column per step, reading only the named triangle; ``info`` is the
  order of the first leading minor that is not positive definite.

Everything else is composed from these the way ATen composes it, including its conventions, because autograd's
formulas read the factors back: ``det`` and ``slogdet`` factor ``A^T`` when ``A`` is contiguous
(``linalg_det_backward`` solves with them accordingly), ``solve`` and ``inv`` factor ``A`` itself; ``lu_unpack``'s
``P`` satisfies ``A = P L U``. ``_linalg_check_errors`` becomes a device-side check that raises
:class:`torch.linalg.LinAlgError` with eager's message (without the failing index, which is data).

Complex matrices (complex64, and complex128 as complex64) take the same steps in complex arithmetic, with
LAPACK's complex conventions: the pivot search compares ``|Re| + |Im|`` (``icamax``), Cholesky is ``A = L L^H``
with a real diagonal (the diagonal's imaginary part is not read), "adjoint" solves are with ``A^H``, and
``det`` / ``slogdet`` factor ``A`` itself, never ``A^T`` (ATen transposes only real matrices).

Work is O(n) steps of O(n^2) elementwise ops on VectorE, in fp32 (float64 runs as float32, as everywhere), so the
matrices are limited to :data:`MAX_ORDER` rows and columns; larger ones and the iterative decompositions (general
eigendecompositions, LDL, lstsq) are refused with the reason. QR, Householder-based, is
:mod:`lowering.decomp_qr`; matrix_exp, scaling and squaring, :mod:`lowering.decomp_matrix_exp`; symmetric
eigenvalues, singular values and pinv, Jacobi rotations, :mod:`lowering.decomp_spectral`.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from neuron_compile.lowering.registry import register_declined
from torch import fx

aten = torch.ops.aten
MAX_ORDER = 64  # unrolled steps per factorization: each adds ~15 ops to the graph
FIELDS = (torch.float32, torch.float64, torch.complex64, torch.complex128)  # the matrices every decomposition takes


def _fits(*ts: Any) -> bool:
    """Float32/64 or complex64/128 matrices of at most MAX_ORDER rows and columns (the unrolled forms' domain)."""
    return all(isinstance(t, torch.Tensor) and t.dtype in FIELDS and t.dim() >= 1
               and max(t.shape[-2:], default=0) <= MAX_ORDER for t in ts)


def squared_magnitude(x: torch.Tensor) -> torch.Tensor:
    """``|x|^2``, real (without the square root of ``abs``)."""
    return x.real * x.real + x.imag * x.imag if x.is_complex() else x * x


def _magnitude(a: torch.Tensor) -> torch.Tensor:
    """What LAPACK's pivot search (``i?amax``) compares: ``|a|``, and ``|Re a| + |Im a|`` for complex ``a``."""
    return a.real.abs() + a.imag.abs() if a.is_complex() else a.abs()


def _index(n: int) -> torch.Tensor:
    return torch.arange(n)


# -- the three kernels -------------------------------------------------------------------------------------


def _lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``getrf`` of ``a [..., m, n]``: (LU, pivots int32 1-based, info int32)."""
    m, n = a.shape[-2:]
    rows, cols = _index(m).unsqueeze(-1), _index(n)
    piv = []
    for j in range(min(m, n)):
        p = _magnitude(a[..., j:, j]).argmax(-1) + j  # the first row of largest magnitude
        piv.append(p)
        pe = p[..., None, None]
        row_p = torch.gather(a, -2, pe.expand(*a.shape[:-2], 1, n))
        a = torch.where(rows == j, row_p, torch.where(rows == pe, a[..., j:j + 1, :], a))
        pivot = a[..., j:j + 1, j:j + 1]
        below = rows > j
        col = a[..., :, j:j + 1]
        mult = torch.where(below & (pivot != 0), col / pivot, torch.zeros_like(col))
        urow = torch.where(cols > j, a[..., j:j + 1, :], torch.zeros_like(a[..., j:j + 1, :]))
        a = torch.where(below & (cols == j), mult, a - mult * urow)
    k = min(m, n)
    if k == 0:
        pivots = torch.zeros((*a.shape[:-2], 0), dtype=torch.int32)
        return a.clone(), pivots, torch.zeros(a.shape[:-2], dtype=torch.int32)
    pivots = (torch.stack(piv, -1) + 1).to(torch.int32)
    zero = a.diagonal(dim1=-2, dim2=-1)[..., :k] == 0
    info = torch.where(zero.any(-1), zero.to(torch.int32).argmax(-1) + 1, 0).to(torch.int32)
    return a, pivots, info


def _trsm(a: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool) -> torch.Tensor:
    """``X`` with ``A X = B`` for triangular ``a [..., n, n]`` (only its ``upper`` or lower triangle is read, and not
    its diagonal when ``unit``) and ``b [..., n, k]``, batch dims broadcast."""
    n = a.shape[-1]
    rows = _index(n).unsqueeze(-1)
    x = b
    for j in (range(n - 1, -1, -1) if upper else range(n)):
        xj = x[..., j:j + 1, :]
        if not unit:
            xj = xj / a[..., j:j + 1, j:j + 1]
        rest = rows < j if upper else rows > j
        col = a[..., :, j:j + 1]
        x = torch.where(rows == j, xj, x - torch.where(rest, col, torch.zeros_like(col)) * xj)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return x.expand(*batch, *b.shape[-2:]).clone() if n == 0 else x


def _cholesky(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``potrf`` of the lower triangle of ``a [..., n, n]``: (L, info int32) with ``A = L L^H``. A complex
    diagonal's imaginary part is not read (the matrix is taken as Hermitian), and L's diagonal is real."""
    n = a.shape[-1]
    rows, cols = _index(n).unsqueeze(-1), _index(n)
    columns, fails = [], []
    for j in range(n):
        d = a[..., j:j + 1, j:j + 1].real
        fails.append(~(d > 0)[..., 0, 0])  # not positive, or NaN
        s = d.sqrt()
        col = a[..., :, j:j + 1]
        col = torch.where(rows > j, col / s, torch.where(rows == j, s.to(col.dtype), torch.zeros_like(col)))
        columns.append(col)
        trailing = torch.where(cols > j, col.mH, torch.zeros_like(col.mT))
        a = a - torch.where(rows > j, col, torch.zeros_like(col)) * trailing
    if n == 0:
        return a.clone(), torch.zeros(a.shape[:-2], dtype=torch.int32)
    bad = torch.stack(fails, -1)
    info = torch.where(bad.any(-1), bad.to(torch.int32).argmax(-1) + 1, 0).to(torch.int32)
    return torch.cat(columns, -1), info


# -- composed ops ------------------------------------------------------------------------------------------


def _permutation(pivots: torch.Tensor, m: int, inverse: bool) -> torch.Tensor:
    """Row ``r`` of ``P^T A`` is row ``idx[r]`` of ``A`` (``inverse``: the inverse permutation), from LAPACK's
    sequential swaps ``pivots [..., k]``."""
    k = pivots.shape[-1]
    pos = _index(m)
    idx = pos.expand(*pivots.shape[:-1], m)
    for i in (range(k - 1, -1, -1) if inverse else range(k)):
        j = pivots[..., i:i + 1].long() - 1
        v_i, v_j = idx[..., i:i + 1], torch.gather(idx, -1, j)
        idx = torch.where(pos == i, v_j, torch.where(pos == j, v_i, idx))
    return idx


def _lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, left: bool = True,
              adjoint: bool = False) -> torch.Tensor:
    """``getrs``: ``X`` with ``A X = B`` (``adjoint``: ``A^H X = B``; not ``left``: ``X A = B``), ``A = P L U``."""
    if not left:  # X A = B is A^H X^H = B^H
        return _lu_solve(lu, pivots, b.mH, True, not adjoint).mH
    n, k = b.shape[-2:]
    batch = torch.broadcast_shapes(lu.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    b = b.expand(*batch, n, k)
    pivots = pivots.expand(*batch, pivots.shape[-1])
    if not adjoint:
        idx = _permutation(pivots, n, inverse=False)
        y = torch.gather(b, -2, idx.unsqueeze(-1).expand(*batch, n, k))
        return _trsm(lu, _trsm(lu, y, upper=False, unit=True), upper=True, unit=False)
    lu_t = lu.mH
    z = _trsm(lu_t, _trsm(lu_t, b, upper=False, unit=False), upper=True, unit=True)
    idx = _permutation(pivots, n, inverse=True)
    return torch.gather(z, -2, idx.unsqueeze(-1).expand(*batch, n, k))


def _factor(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """ATen's factorization for det / slogdet: of ``A^T`` when ``A`` is real and contiguous (and whether it was)."""
    use_t = a.is_contiguous() and not a.is_complex()
    return (*_lu(a.mT if use_t else a), use_t)


def _unpack(lu: torch.Tensor, pivots: torch.Tensor, data: bool = True, perm: bool = True) -> tuple[Any, Any, Any]:
    """``lu_unpack``: (P, L, U) with ``A = P L U``; an empty tensor for a part not asked for."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    empty = lu.new_empty(0)
    p_mat = empty
    if perm:
        idx = _permutation(pivots, m, inverse=False)
        p_mat = (_index(m).unsqueeze(-1) == idx.unsqueeze(-2)).to(lu.dtype)
    if not data:
        return p_mat, empty, empty
    low = lu[..., :, :k].tril(-1) + torch.eye(m, k, dtype=lu.dtype)
    return p_mat, low, lu[..., :k, :].triu()


def lu_factor_ex(a: torch.Tensor, pivot: bool = True, check_errors: bool = False) -> Any:
    if not pivot or not _fits(a):
        return NotImplemented
    lu, pivots, info = _lu(a)
    if check_errors:
        check_errors_op(info, "torch.linalg.lu_factor_ex", a.dim() == 2)
    return lu, pivots, info


def linalg_lu(a: torch.Tensor, pivot: bool = True) -> Any:
    if not pivot or not _fits(a):
        return NotImplemented
    lu, pivots, _ = _lu(a)
    return _unpack(lu, pivots)


def lu_unpack(lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True) -> Any:
    if not _fits(lu):
        return NotImplemented
    return _unpack(lu, pivots, unpack_data, unpack_pivots)


def lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, left: bool = True,
             adjoint: bool = False) -> Any:
    if not _fits(lu, b):
        return NotImplemented
    return _lu_solve(lu, pivots, b, left, adjoint)


def solve_triangular(a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> Any:
    if not _fits(a, b):
        return NotImplemented
    if left:
        return _trsm(a, b, upper, unitriangular)
    return _trsm(a.mT, b.mT, not upper, unitriangular).mT


def triangular_solve(b: torch.Tensor, a: torch.Tensor, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> Any:
    if not _fits(a, b):
        return NotImplemented
    x = _trsm(a.mT, b, not upper, unitriangular) if transpose else _trsm(a, b, upper, unitriangular)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return x, a.expand(*batch, *a.shape[-2:]).clone()


def solve_ex(a: torch.Tensor, b: torch.Tensor, *, left: bool = True, check_errors: bool = False) -> Any:
    if not _fits(a, b):
        return NotImplemented
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    lu, pivots, info = _lu(a)
    if check_errors:
        check_errors_op(info, "torch.linalg.solve_ex", a.dim() == 2)
    x = _lu_solve(lu, pivots, b.unsqueeze(-1) if vector else b, left)
    return (x.squeeze(-1) if vector else x), lu, pivots, info


def inv_ex(a: torch.Tensor, *, check_errors: bool = False) -> Any:
    if not _fits(a):
        return NotImplemented
    lu, pivots, info = _lu(a)
    if check_errors:
        check_errors_op(info, "torch.linalg.inv_ex", a.dim() == 2)
    return _lu_solve(lu, pivots, torch.eye(a.shape[-1], dtype=a.dtype)), info


def _perm_sign(pivots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    swaps = (pivots != _index(pivots.shape[-1]) + 1).to(torch.int32).sum(-1)
    return 1.0 - 2.0 * (swaps % 2).to(dtype)


def det(a: torch.Tensor) -> Any:
    if not _fits(a):
        return NotImplemented
    lu, pivots, _, _ = _factor(a)
    return lu.diagonal(dim1=-2, dim2=-1).prod(-1) * _perm_sign(pivots, a.real.dtype), lu, pivots


def slogdet(a: torch.Tensor) -> Any:
    if not _fits(a):
        return NotImplemented
    lu, pivots, _, _ = _factor(a)
    diag = lu.diagonal(dim1=-2, dim2=-1)
    sign = diag.sgn().prod(-1) * _perm_sign(pivots, diag.real.dtype)
    return sign, diag.abs().log().sum(-1), lu, pivots


def cholesky_ex(a: torch.Tensor, *, upper: bool = False, check_errors: bool = False) -> Any:
    if not _fits(a):
        return NotImplemented
    low, info = _cholesky(a.mH if upper else a)  # the upper triangle, read as the lower one of A^H
    if check_errors:
        check_errors_op(info, "torch.linalg.cholesky_ex", a.dim() == 2)
    return (low.mH if upper else low), info


def cholesky(a: torch.Tensor, upper: bool = False) -> Any:
    if not _fits(a):
        return NotImplemented
    low, info = _cholesky(a.mH if upper else a)
    check_errors_op(info, "cholesky", a.dim() == 2)
    return low.mH if upper else low


def _cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool) -> torch.Tensor:
    low = factor.mH if upper else factor  # A = L L^H
    return _trsm(low.mH, _trsm(low, b, upper=False, unit=False), upper=True, unit=False)


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> Any:
    if not _fits(b, factor):
        return NotImplemented
    return _cholesky_solve(b, factor, upper)


def cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> Any:
    if not _fits(factor):
        return NotImplemented
    return _cholesky_solve(torch.eye(factor.shape[-1], dtype=factor.dtype), factor, upper)


_MESSAGES = {
    "inv": "A diagonal element of U is zero, the inversion could not be completed because the input matrix is "
           "singular.",
    "solve": "The solver failed because the input matrix is singular.",
    "cholesky": "The factorization could not be completed because the input is not positive-definite (a leading "
                "minor is not positive-definite; info > 0).",
    "lu_factor": "U has a zero on its diagonal and using it on lu_solve would result in a division by zero. If you "
                 "still want to perform the factorization, consider calling linalg.lu(A, pivot) or "
                 "linalg.lu_factor_ex(A, pivot)",
}


def _check_message(api_name: str, is_matrix: bool) -> str:
    kind = next((k for k in _MESSAGES if k in api_name), None)
    text = _MESSAGES[kind] if kind else "the LAPACK routine reported a failure (info != 0)."
    return f"{api_name}: {'' if is_matrix else '(in at least one batch element) '}{text}"


def check_errors_op(info: torch.Tensor, api_name: str, is_matrix: bool) -> None:
    """``_linalg_check_errors``: a device-side check raising LinAlgError with eager's message when info != 0."""
    aten._assert_async.msg((info == 0).all(), _check_message(api_name, is_matrix))


def effectful_checks_as_asserts(gm: fx.GraphModule) -> fx.GraphModule:
    """``with_effects(token, aten._linalg_check_errors, info, api, is_matrix)`` (AOTAutograd threads an effect
    token through this op, so no decomposition sees it) as ``_assert_async(all(info == 0), message)``; the new
    token is the old one (an input that the graph returns as it is)."""
    graph = gm.graph
    hits = [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.higher_order.with_effects
            and len(n.args) >= 2 and n.args[1] is aten._linalg_check_errors.default]
    for node in hits:
        names = ("info", "api_name", "is_matrix")[:len(node.args) - 2]
        token, params = node.args[0], dict(zip(names, node.args[2:], strict=True), **node.kwargs)
        info, api_name, is_matrix = params["info"], params["api_name"], params.get("is_matrix", True)
        trace = node.meta.get("stack_trace")
        shape = tuple(info.meta["val"].shape)
        with graph.inserting_before(node):
            ok = graph.call_function(aten.eq.Scalar, (info, 0))
            every = graph.call_function(aten.all.default, (ok,))
            check = graph.call_function(aten._assert_async.msg, (every, _check_message(str(api_name), bool(is_matrix))))
        ok.meta = {"val": torch.empty(shape, dtype=torch.bool, device="meta"), "stack_trace": trace}
        every.meta = {"val": torch.empty((), dtype=torch.bool, device="meta"), "stack_trace": trace}
        check.meta = {"stack_trace": trace}
        for user in list(node.users):
            if user.target is operator.getitem and user.args[1] == 0:
                user.replace_all_uses_with(token)
            graph.erase_node(user)
        graph.erase_node(node)
    if hits:
        graph.lint()
        gm.recompile()
    return gm


LINALG: dict[Any, Any] = {
    aten.linalg_lu_factor_ex.default: lu_factor_ex,
    aten.linalg_lu.default: linalg_lu,
    aten.lu_unpack.default: lu_unpack,
    aten.linalg_lu_solve.default: lu_solve,
    aten.linalg_solve_triangular.default: solve_triangular,
    aten.triangular_solve.default: triangular_solve,
    aten._linalg_solve_ex.default: solve_ex,
    aten.linalg_inv_ex.default: inv_ex,
    aten._linalg_det.default: det,
    aten._linalg_slogdet.default: slogdet,
    aten.linalg_cholesky_ex.default: cholesky_ex,
    aten.cholesky_solve.default: cholesky_solve,
    aten.cholesky_inverse.default: cholesky_inverse,
    aten._linalg_check_errors.default: check_errors_op,
}
if hasattr(aten, "cholesky"):  # the deprecated torch.cholesky; torch 2.14 removed its ATen op
    LINALG[aten.cholesky.default] = cholesky

# torch 2.14's polar decomposition, and what it is underneath
_BUILT_ON = {"linalg_polar": "an SVD"}
ITERATIVE = (aten.linalg_eig.default, aten.linalg_ldl_factor_ex.default, aten.linalg_ldl_solve.default,
             aten.linalg_lstsq.default, *(getattr(aten, name).default for name in _BUILT_ON if hasattr(aten, name)))


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def linalg_problem(node: fx.Node) -> str | None:
    """Why a direct linear-algebra op stayed in the graph (its decomposition declined it)."""
    shapes = [v for v in map(_val, node.args) if isinstance(v, torch.Tensor)]
    shapes = [v for v in shapes if v.is_floating_point() or v.is_complex()]  # not the int32 pivots
    if any(v.dtype not in FIELDS for v in shapes):
        if node.target == aten.linalg_matrix_exp.default and shapes[0].dtype in (torch.float16, torch.bfloat16):
            return ("matrix_exp of a 16-bit matrix: eager computes it in that dtype with float32's scaling thresholds, "
                    "and its result is unreliable (NaN or ~1e30 for 16-bit matrices of norm ~1), so there is "
                    "nothing to match; cast the matrix to float32")
        return ("LAPACK-style ops take float32/float64 and complex64/complex128 matrices (eager refuses other dtypes "
                "too)")
    big = max((max(v.shape[-2:], default=0) for v in shapes), default=0)
    if big > MAX_ORDER:
        return (f"a {big}-row matrix: factorizations and triangular solves are unrolled per column, up to "
                f"{MAX_ORDER} rows and columns; run larger ones eagerly (outside the compiled region)")
    if node.target in (aten.linalg_lu_factor_ex.default, aten.linalg_lu.default) and node.kwargs.get(
            "pivot", node.args[1] if len(node.args) > 1 else True) is False:
        return "LU without pivoting (eager supports it on CUDA only)"
    return None


def _iterative(node: fx.Node) -> str:
    name = node.target.name().split("::")[-1].split(".")[0]
    prefix = f"{name} is {_BUILT_ON[name]} underneath: " if name in _BUILT_ON else ""
    return (prefix + "general eigendecompositions, SVDs with their vectors, LDL and lstsq are iterative or pivot "
            "symmetrically and are not compiled; run them eagerly (outside the compiled region), e.g. under "
            "torch.compiler.disable")


register_declined(linalg_problem, *(op for op in LINALG if op != aten._linalg_check_errors.default))
register_declined(_iterative, *ITERATIVE)
