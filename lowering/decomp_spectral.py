"""Symmetric eigenvalues and singular values by Jacobi rotations, and what is built on them.

``eigvalsh``, ``svdvals`` (and so ``cond``, ``matrix_rank``, the spectral and nuclear norms), ``pinv`` and the
Hermitian matrix square root have unique results, so they compile here, in training too (their backward formulas
read the vectors in ways no sign changes); the eigen- and singular *vectors* are unique only up to sign (LAPACK's
choice, which differs between CPU and CUDA too), so an ``eigh`` / ``svd`` whose vectors the forward reads is
refused by name (:func:`spectral_ops`, :func:`spectral_problem`), and a result never differs from eager by a sign.

* Symmetric eigenvalues: the two-sided cyclic Jacobi method, in the round-robin (tournament) order that rotates
  n/2 disjoint pairs at once. A round is one rotation matrix ``J`` (one kernel: :func:`_round`) and
  ``A <- J^T A J``, two batched matmuls on TensorE.
* Singular values: the one-sided (Hestenes) Jacobi method on the columns of ``B = A`` (``A^T`` when it is wide):
  each round takes the pairs' norms and inner product from ``B^T B`` and rotates ``B <- B J`` until the columns
  are orthogonal; the singular values are the column norms (no ``A^T A``, whose squaring would lose the small
  ones).

Complex (Hermitian) matrices take the same sweeps in complex arithmetic: a pair's rotation is the real one of
``|a_pq|`` conjugated by the phase of ``a_pq`` (:func:`_round`), the transposes are conjugate transposes, and a
Hermitian matrix is read from its ``uplo`` triangle, the imaginary part of its diagonal ignored, as LAPACK does.
Their vectors are unique only up to a complex phase, so the same rule applies to them.

The sweeps are unrolled (:func:`sweeps`, enough for fp32 convergence at every size allowed, with margin), and a
device-side check raises :class:`torch.linalg.LinAlgError` if the off-diagonal part has not vanished, or the
matrix holds inf/NaN (eager's LAPACK returns NaN in some places then, or fails with the message used here).
"""

from __future__ import annotations

import math
import operator
from functools import cache
from typing import Any

import torch
from neuron_compile.lowering.decomp_linalg import FIELDS, squared_magnitude
from neuron_compile.lowering.decomp_linalg import MAX_ORDER as MAX_ROWS
from neuron_compile.lowering.registry import register_declined
from torch import fx

aten = torch.ops.aten
MAX_ORDER = 16  # a round is ~25 ops and a sweep n - 1 rounds: 16 x 16 unrolls to ~4500 ops
_NONFINITE = "The algorithm failed to converge because the input matrix contained non-finite values."


def sweeps(n: int) -> int:
    """Unrolled sweeps for an n x n problem. Jacobi converges quadratically once the off-diagonal part is small;
    the slowest inputs measured are graded ones (singular values spread over 1 .. 1e-12), which needed 3, 5, 7, 9
    and 10 sweeps at n = 4, 6, 8, 12 and 16 (random ones: 4 to 6). This gives 8, 10, 10, 12, 12."""
    return 4 + 2 * max(0, math.ceil(math.log2(max(n, 1))))


@cache
def _rounds(n: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The tournament order: n - 1 rounds (n rounds for odd n) of disjoint pairs covering every pair once."""
    m = n + n % 2
    others = list(range(1, m))
    rounds = []
    for _ in range(m - 1):
        order = [0, *others]
        pairs = tuple((min(order[i], order[m - 1 - i]), max(order[i], order[m - 1 - i])) for i in range(m // 2))
        others = others[-1:] + others[:-1]
        pairs = tuple(p for p in pairs if p[1] < n)  # odd n: the pair with the dummy index sits out
        if pairs:
            rounds.append(pairs)
    return tuple(rounds)


def _pair_masks(n: int) -> torch.Tensor:
    """``[2 + rounds, n, n]`` bool: the strict upper triangle, the diagonal, then per round ``(i, j)`` marking the
    pair ``{i, j}`` and ``(i, i)`` an index that sits the round out (odd n). One tensor literal for every round of
    every sweep (masks built in the kernel from iotas would each be a kernel of their own)."""
    return torch.tensor(_mask_lists(n), dtype=torch.bool)


@cache
def _mask_lists(n: int) -> list[list[list[bool]]]:
    masks = [[[i < j for j in range(n)] for i in range(n)], [[i == j for j in range(n)] for i in range(n)]]
    for pairs in _rounds(n):
        partner = {i: i for i in range(n)} | {p: q for p, q in pairs} | {q: p for p, q in pairs}
        masks.append([[partner[i] == j for j in range(n)] for i in range(n)])
    return masks


def _round(gram: torch.Tensor, pair: torch.Tensor, upper: torch.Tensor, diag: torch.Tensor) -> torch.Tensor:
    """The rotation ``J`` that zeroes the (p, q) entries of the symmetric (Hermitian) ``gram`` for every pair of the
    round (``pair``: its ``[n, n]`` mask; ``upper``, ``diag``: the layout masks), Rutishauser's formulas: t = tan of the angle, the smaller root, so that
    rotations stay near the identity. A complex ``a_pq = |a_pq| e^(i phi)`` takes the real rotation of ``|a_pq|``
    conjugated by the phase, ``J = [[c, s e^(i phi)], [-s e^(-i phi), c]]``.

    Every entry (i, j) computes the rotation of the pair ``(min(i, j), max(i, j))`` from ``gram``'s upper triangle
    and diagonal, and ``pair`` keeps the round's: elementwise work on n x n values and one row sum, so the whole
    round's ``J`` is one kernel (gathering the pairs' entries and scattering the result took five)."""
    apq = torch.where(upper, gram, gram.mT)  # the pair's a_pq, at (p, q) and at (q, p)
    d = gram.diagonal(dim1=-2, dim2=-1).real
    app = torch.where(upper, d.unsqueeze(-1), d.unsqueeze(-2))
    aqq = torch.where(upper, d.unsqueeze(-2), d.unsqueeze(-1))
    phase = None
    if gram.is_complex():
        phase, apq = apq, apq.abs()
    none = apq == 0  # nothing to rotate
    theta = ((aqq - app) / (2 * torch.where(none, torch.ones_like(apq), apq))).clamp(-1e17, 1e17)  # t ~ 1 / 2 theta
    t = torch.where(theta >= 0, 1.0, -1.0) / (theta.abs() + torch.sqrt(theta * theta + 1))
    t = torch.where(none, torch.zeros_like(t), t)
    c = torch.rsqrt(t * t + 1)
    s = t * c
    if phase is not None:
        phase = phase / torch.where(none, torch.ones_like(apq), apq)
        off = torch.where(upper, s * phase, -s * phase.conj())
    else:
        off = torch.where(upper, s, -s)
    # J_ii: the c of i's pair (the one marked entry of row i; 1 where i sits the round out)
    on = torch.where(pair, torch.where(diag, 1.0, c), 0.0).sum(-1, keepdim=True)
    return torch.where(diag, on.to(off.dtype), torch.where(pair, off, torch.zeros_like(off)))


def _check(ok: torch.Tensor, message: str) -> None:
    aten._assert_async.msg(ok.all(), message)


def _orthogonal(gram: torch.Tensor, tol: float) -> torch.Tensor:
    """Whether the columns behind ``gram = B^T B`` are orthogonal to ``tol``: every ``|g_pq|`` within
    ``tol * (sqrt(g_pp g_qq) + eps g_max)`` (the second term for columns that are rounding noise of a rank-deficient
    matrix, whose mutual angles mean nothing)."""
    d = gram.diagonal(dim1=-2, dim2=-1).abs()
    bound = torch.sqrt(d.unsqueeze(-1) * d.unsqueeze(-2)) + torch.finfo(torch.float32).eps * d.amax(-1)[..., None, None]
    off = gram.abs() * (1 - torch.eye(gram.shape[-1], dtype=d.dtype))
    return off <= tol * bound


def _unit_scale(a: torch.Tensor) -> torch.Tensor:
    """The largest ``|a_ij|`` of each matrix (1 for a zero matrix): dividing by it keeps every product of the
    iteration far from fp32's overflow and subnormal range."""
    big = a.abs().flatten(-2).amax(-1)[..., None, None]
    return torch.where(big > 0, big, torch.ones_like(big))


def _finite(a: torch.Tensor) -> torch.Tensor:
    """``isfinite``, of both parts of a complex ``a`` (ATen's complex isfinite traces to an in-place ``&=``)."""
    return torch.isfinite(a.real) & torch.isfinite(a.imag) if a.is_complex() else torch.isfinite(a)


def _columns(m: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The columns of ``m [..., r, c]`` in ``order [..., c]`` (the sorted values' order)."""
    return torch.gather(m, -1, order.unsqueeze(-2).expand(m.shape))


def symmetric_eig(a: torch.Tensor, uplo: str, vectors: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eigenvalues (ascending) of the symmetric (Hermitian) matrix held in ``a``'s ``uplo`` triangle, and, for
    internal use only, eigenvectors as columns (signs, or complex phases, arbitrary)."""
    n = a.shape[-1]
    lower = uplo.upper() == "L"
    if a.is_complex():  # the Hermitian matrix the triangle holds (LAPACK does not read Im of its diagonal)
        re, im = a.real, a.imag
        im = torch.tril(im, -1) if lower else torch.triu(im, 1)
        a = torch.complex(torch.tril(re) if lower else torch.triu(re), im)
    a = (torch.tril(a) if lower else torch.triu(a)) + (torch.tril(a, -1) if lower else torch.triu(a, 1)).mH
    _check(_finite(a), f"linalg.eigh: {_NONFINITE}")
    scale = _unit_scale(a)
    a = a / scale
    v = torch.eye(n, dtype=a.dtype).expand(a.shape).contiguous() if vectors else None
    upper, diag, *rounds = _pair_masks(n)
    for _ in range(sweeps(n)):
        for pair in rounds:
            j = _round(a, pair, upper, diag)
            a = j.mH @ a @ j
            v = v @ j if v is not None else None
    off = (a * (1 - torch.eye(n, dtype=a.dtype))).abs().flatten(-2).amax(-1)[..., None, None]
    _check(off <= 8 * n * torch.finfo(torch.float32).eps,
           "linalg.eigh: the Jacobi iteration did not converge (the off-diagonal part is not yet negligible)")
    w = a.diagonal(dim1=-2, dim2=-1)
    w = w.real * scale[..., 0]
    w, order = torch.sort(w, -1)
    if v is not None:
        v = _columns(v, order)
    return w, v


def one_sided_svd(a: torch.Tensor, vectors: bool) -> tuple[torch.Tensor, Any, Any, torch.Tensor]:
    """Singular values (descending) of ``a [..., m, n]`` with ``m >= n``, and, for internal use only, ``V`` and
    ``B = (A / scale) V`` (columns ``sigma_i u_i / scale``) in the same order, and that ``scale [..., 1, 1]``."""
    n = a.shape[-1]
    _check(_finite(a), f"linalg.svd: {_NONFINITE}")
    scale = _unit_scale(a)
    b = a / scale
    v = torch.eye(n, dtype=a.dtype).expand(*a.shape[:-2], n, n).contiguous() if vectors else None
    upper, diag, *rounds = _pair_masks(n)
    for _ in range(sweeps(n)):
        for pair in rounds:
            j = _round(b.mH @ b, pair, upper, diag)
            b = b @ j
            v = v @ j if v is not None else None
    _check(_orthogonal(b.mH @ b, 8 * n * torch.finfo(torch.float32).eps),
           "linalg.svd: the Jacobi iteration did not converge (the columns are not yet orthogonal)")
    s, order = torch.sort(torch.sqrt(squared_magnitude(b).sum(-2)), -1, descending=True)
    if vectors:
        v, b = _columns(v, order), _columns(b, order)
    return s * scale[..., 0], v, b if vectors else None, scale


def _fits(a: Any) -> bool:
    """Float32/64 and complex64/128 matrices whose shorter side (the Jacobi order) is at most MAX_ORDER, the longer
    at most decomp_linalg's MAX_ORDER."""
    return (isinstance(a, torch.Tensor) and a.dtype in FIELDS and a.dim() >= 2
            and min(a.shape[-2:]) <= MAX_ORDER and max(a.shape[-2:]) <= MAX_ROWS)


def _empty(a: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=a.dtype)


def _real(a: torch.Tensor) -> torch.dtype:
    """The dtype of ``a``'s eigen- and singular values."""
    return a.real.dtype


def linalg_eigh(a: torch.Tensor, uplo: str = "L", compute_v: bool = True) -> Any:
    """``_linalg_eigh``: the values, and with ``compute_v`` vectors of arbitrary signs (spectral_ops asks for them
    only when the backward alone reads them)."""
    if not _fits(a):
        return NotImplemented
    if a.numel() == 0:
        return torch.zeros(a.shape[:-1], dtype=_real(a)), torch.zeros_like(a) if compute_v else _empty(a)
    w, v = symmetric_eig(a, uplo, vectors=compute_v)
    return w, v if compute_v else _empty(a)


def linalg_svd(a: torch.Tensor, full_matrices: bool = False, compute_uv: bool = True, *,
               driver: str | None = None) -> Any:
    """``_linalg_svd``: the values, and with ``compute_uv`` thin ``U``, ``Vh`` of arbitrary (but paired) signs. A
    zero singular value's ``u`` is left 0 (its gradient is not unique there; spectral_ops asks for vectors only
    when the backward alone reads them)."""
    m, n = a.shape[-2:]
    if not _fits(a) or (compute_uv and full_matrices and m != n):
        return NotImplemented
    k = min(m, n)
    if a.numel() == 0:
        if not compute_uv:
            return _empty(a), torch.zeros((*a.shape[:-2], k), dtype=_real(a)), _empty(a)
        return (torch.zeros((*a.shape[:-2], m, k), dtype=a.dtype), torch.zeros((*a.shape[:-2], k), dtype=_real(a)),
                torch.zeros((*a.shape[:-2], k, n), dtype=a.dtype))
    s, v, b, scale = one_sided_svd(a if m >= n else a.mH, vectors=compute_uv)  # A^H = V S U^H
    if not compute_uv:
        return _empty(a), s, _empty(a)
    unit = s / scale[..., 0]  # the columns of b are unit * u
    u = b / torch.where(unit > 0, unit, torch.ones_like(unit)).unsqueeze(-2)
    return (u, s, v.mH) if m >= n else (v, s, u.mH)


def _tolerance(a: torch.Tensor, atol: Any, rtol: Any, largest: torch.Tensor) -> torch.Tensor:
    """eager's ``get_atol_rtol`` and ``max(atol, rtol * largest)`` (largest: the top singular value / |eigenvalue|)."""
    real = _real(a)
    default = torch.finfo(real).eps * max(a.shape[-2:])
    atol_t = torch.zeros((), dtype=real) if atol is None else torch.as_tensor(atol, dtype=real)
    if rtol is not None:
        rtol_t = torch.as_tensor(rtol, dtype=real)
    elif atol is not None:
        rtol_t = torch.where(atol_t > 0, 0.0, default)
    else:
        rtol_t = torch.full((), default, dtype=real)
    return torch.maximum(atol_t.unsqueeze(-1), rtol_t.unsqueeze(-1) * largest)


def linalg_pinv(a: torch.Tensor, *, atol: Any = None, rtol: Any = None, hermitian: bool = False) -> Any:
    if not _fits(a):
        return NotImplemented
    m, n = a.shape[-2:]
    if a.numel() == 0:
        return torch.zeros((*a.shape[:-2], n, m), dtype=a.dtype)
    if hermitian:
        w, q = symmetric_eig(a, "L", vectors=True)
        big = w.abs()
        keep = big > _tolerance(a, atol, rtol, big.amax(-1, keepdim=True))
        inv = torch.where(keep, 1 / torch.where(keep, w, torch.ones_like(w)), torch.zeros_like(w))
        return (q * inv.unsqueeze(-2)) @ q.mH
    tall = a if m >= n else a.mH
    s, v, b, scale = one_sided_svd(tall, vectors=True)
    keep = s > _tolerance(a, atol, rtol, s[..., :1])
    unit = s / scale[..., 0]
    inv2 = torch.where(keep, 1 / torch.where(keep, unit * unit, torch.ones_like(s)), torch.zeros_like(s))
    p = (v * inv2.unsqueeze(-2)) @ b.mH / scale  # V diag(1/s^2) (A V)^H = V diag(1/s) U^H, in units of scale
    return p if m >= n else p.mH


def matrix_sqrth(a: torch.Tensor) -> Any:
    """torch 2.14's ``linalg.matrix_sqrth``: ``Q sqrt(max(L, 0)) Q^H`` of the Hermitian (lower triangle) ``a``
    (eager clamps negative eigenvalues to 0 too)."""
    if not _fits(a) or a.shape[-1] != a.shape[-2]:
        return NotImplemented
    if a.numel() == 0:
        return a.clone()
    w, q = symmetric_eig(a, "L", vectors=True)
    return (q * torch.sqrt(w.clamp(min=0)).unsqueeze(-2)) @ q.mH


SPECTRAL: dict[Any, Any] = {
    aten._linalg_eigh.default: linalg_eigh,
    aten._linalg_svd.default: linalg_svd,
    aten.linalg_pinv.atol_rtol_tensor: linalg_pinv,
}
if hasattr(aten, "linalg_matrix_sqrth"):  # new in torch 2.14
    SPECTRAL[aten.linalg_matrix_sqrth.default] = matrix_sqrth


# -- the graph pass -------------------------------------------------------------------------------------------

_VECTORS = {aten._linalg_svd.default: (0, 2), aten._linalg_eigh.default: (1,)}  # the vector outputs


def spectral_ops(gm: fx.GraphModule, forward_outputs: int | None = None) -> fx.GraphModule:
    """Every eigenvalue / SVD / pinv op of the ATen graph replaced by its Jacobi decomposition, except an ``svd`` /
    ``eigh`` whose vectors the graph reads (refused by :func:`spectral_problem`).

    In a joint (training) graph, whose first ``forward_outputs`` outputs are the forward's, vectors that no forward
    output depends on are read by the backward alone: eigvalsh's, svdvals' (cond, the 2- and nuclear norms) backward
    formulas ``V diag(gL) V^T`` and ``U diag(gS) V^T``, which no sign choice changes. Those are decomposed with
    their vectors (U and V from the same rotations, so each pair's signs agree).

    A graph pass rather than an AOTAutograd decomposition, for two reasons: ``svdvals``, ``eigvalsh``, ``cond``,
    ``matrix_rank`` and the 2- and nuclear norms reach the ATen graph as an ``svd`` / ``eigh`` computing vectors
    (ATen asks for them whenever its input is a tensor subclass, as tracing's are), so only the whole graph shows
    whether they are used; and the decompositions' index tables are tensor literals, which a functional trace
    refuses. Each op is traced on its own (:func:`~neuron_compile.lowering.decomp_vjp.trace_apart`) and spliced in,
    its tables becoming graph constants."""
    forward = _forward_side(gm, forward_outputs) if forward_outputs is not None else None
    hits: list[tuple[fx.Node, bool]] = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in SPECTRAL or not _decomposable(n):
            continue
        read = [u for u in n.users if u.target is operator.getitem and u.args[1] in _VECTORS.get(n.target, ())
                and u.users]
        if not read:
            hits.append((n, False))
        elif forward is not None and not any(u in forward for u in read) and _vectors_fit(n):
            hits.append((n, True))
    for node, vectors in hits:
        _splice(gm, node, vectors)
    if hits:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return gm


def _forward_side(gm: fx.GraphModule, forward_outputs: int) -> set[fx.Node]:
    """The nodes the joint graph's first ``forward_outputs`` outputs depend on."""
    out = gm.graph.output_node().args[0]
    todo = [a for a in list(out)[:forward_outputs] if isinstance(a, fx.Node)]
    seen: set[fx.Node] = set()
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(node.all_input_nodes)
    return seen


def _vectors_fit(node: fx.Node) -> bool:
    """Vectors are built for eigh and for the thin (or square) SVD; a full SVD of a non-square matrix would need a
    completion of its basis."""
    if node.target is not aten._linalg_svd.default:
        return True
    a = node.args[0].meta.get("val")
    full = node.args[1] if len(node.args) > 1 else node.kwargs.get("full_matrices", False)  # the schema's default
    return not full or a.shape[-1] == a.shape[-2]


def _decomposable(node: fx.Node) -> bool:
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in (*node.args, *node.kwargs.values())]
    return _fits(vals[0]) and all(not isinstance(v, torch.Tensor) or v.dim() == 0 for v in vals[1:])


def _splice(gm: fx.GraphModule, node: fx.Node, vectors: bool) -> None:
    """``node`` replaced by the ops of its decomposition (an svd / eigh: values only unless ``vectors``), traced
    apart."""
    from neuron_compile.lowering.decomp_vjp import splice_traced
    from neuron_compile.lowering.decompositions import decompositions

    rule = SPECTRAL[node.target]

    def decomposed(*args: Any, **kwargs: Any) -> Any:
        if node.target in _VECTORS:  # (A, full_matrices / UPLO, compute_uv / compute_v)
            schema = node.target._schema.arguments
            args = tuple(args[i] if i < len(args) else kwargs.pop(schema[i].name, schema[i].default_value)
                         for i in range(2)) + (vectors,)
            kwargs.pop(schema[2].name, None)
        return rule(*args, **kwargs)

    splice_traced(gm, node, decomposed, decompositions())


def spectral_problem(node: fx.Node) -> str:
    """Why an eigenvalue / SVD / pinv op stayed in the graph (its decomposition declined it)."""
    a = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(a, torch.Tensor) and a.dtype not in FIELDS:
        return ("LAPACK-style ops take float32/float64 and complex64/complex128 matrices (eager refuses other dtypes "
                "too)")
    if isinstance(a, torch.Tensor) and a.dim() >= 2 and not _fits(a):
        return (f"a {a.shape[-2]} x {a.shape[-1]} matrix: eigenvalues and singular values are unrolled Jacobi "
                f"sweeps over at most {MAX_ORDER} columns (and {MAX_ROWS} rows); run larger ones eagerly (outside "
                "the compiled region)")
    what = "singular vectors" if node.target is aten._linalg_svd.default else "eigenvectors"
    hint = ""
    if node.target is aten._linalg_svd.default and a is not None and a.shape[-1] != a.shape[-2]:
        hint = " (in training, a non-square svd compiles with full_matrices=False when only its values are used)"
    sign = "sign (a complex phase, for complex matrices)" if a is not None and a.is_complex() else "sign"
    return (f"its {what} are read by the forward (returned or computed with), and they are unique only up to {sign} "
            "(LAPACK's choice, which a NeuronCore can't reproduce); eigenvalues, singular values, pinv and the "
            f"Hermitian square root compile, in training too{hint}. Run this one eagerly (outside the compiled "
            "region)")


register_declined(spectral_problem, *SPECTRAL)
