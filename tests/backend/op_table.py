"""The op table driving tests/backend/test_ops.py (JAX ``op_record`` / Inductor ``OpInfo`` style).

Each :class:`OpCase` names a function of tensors, how to build its inputs (shape, value domain,
layout: contiguous, transposed or sliced), the dtypes it runs in, whether its backward is tested
and per-dtype tolerances. Shapes are deliberately not multiples of 128/512 and include size-1
dims and broadcasting operands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
FLOAT_DTYPES = (f32, bf16, f16)

# (atol, rtol) per dtype: fp32 compares against eager fp32; bf16/fp16 against eager bf16/fp16 (one ulp is 2**-8 /
# 2**-11 relative, and fused kernels round less often than eager, so allow a few ulps). fp16 tolerances are the bf16
# ones / 8 (its 3 more mantissa bits), at least 2e-3.
F16_SHARE = 8
DEFAULT_TOL: dict[torch.dtype, tuple[float, float]] = {f32: (2e-5, 2e-5), bf16: (2e-2, 2e-2), f16: (2e-3, 2e-3)}
REDUCE_TOL: dict[torch.dtype, tuple[float, float]] = {f32: (1e-4, 1e-4), bf16: (6e-2, 4e-2), f16: (8e-3, 5e-3)}


@dataclass(frozen=True)
class Arg:
    """One tensor input: its logical shape, value domain and memory layout.

    domain: 'randn' | 'pos' (in [0.5, 2.5]) | 'unit' (in (-0.9, 0.9)) | 'bool' | 'int' (0..9, int64)
    | 'small' (randn * 0.5, for exp/pow chains) | 'distinct' (a random permutation, no ties).
    layout: 'contig' | 't' (a transposed view of a contiguous tensor) | 'slice' (every other column of
    a wider tensor, offset 1).
    """

    shape: tuple[int, ...]
    domain: str = "randn"
    layout: str = "contig"


@dataclass(frozen=True)
class OpCase:
    name: str
    fn: Callable[..., Any]
    args: tuple[Arg, ...]
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    grad: bool = True
    tol: dict[torch.dtype, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOL))

    @property
    def id(self) -> str:
        return self.name


def A(*shape: int, domain: str = "randn", layout: str = "contig") -> Arg:
    return Arg(tuple(shape), domain, layout)


def make_input(arg: Arg, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Build the input tensor for ``arg`` (float domains take ``dtype``)."""
    shape = arg.shape
    if arg.layout == "t":
        base_shape = shape[:-2] + (shape[-1], shape[-2])
    elif arg.layout == "slice":
        base_shape = shape[:-1] + (2 * shape[-1] + 1,)
    else:
        base_shape = shape
    if arg.domain == "bool":
        base = torch.rand(base_shape, generator=gen) > 0.5
    elif arg.domain == "int":
        base = torch.randint(0, 10, base_shape, generator=gen)
    elif arg.domain == "distinct":
        n = 1
        for s in base_shape:
            n *= s
        base = (torch.randperm(n, generator=gen).reshape(base_shape).float() / n * 4 - 2).to(dtype)
    else:
        x = torch.randn(base_shape, generator=gen)
        if arg.domain == "pos":
            x = torch.rand(base_shape, generator=gen) * 2 + 0.5
        elif arg.domain == "unit":
            x = torch.rand(base_shape, generator=gen) * 1.8 - 0.9
        elif arg.domain == "small":
            x = x * 0.5
        base = x.to(dtype)
    if arg.layout == "t":
        out = base.transpose(-1, -2)
    elif arg.layout == "slice":
        out = base[..., 1::2]
    else:
        out = base
    assert tuple(out.shape) == shape, (out.shape, shape)
    return out


def _tol(fp32: tuple[float, float], bf: tuple[float, float]) -> dict[torch.dtype, tuple[float, float]]:
    return {f32: fp32, bf16: bf, f16: (max(bf[0] / F16_SHARE, 2e-3), max(bf[1] / F16_SHARE, 2e-3))}


def rms_norm_manual(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _cases() -> list[OpCase]:
    c: list[OpCase] = []

    def add(name: str, fn: Callable[..., Any], *args: Arg, **kw: Any) -> None:
        c.append(OpCase(name, fn, tuple(args), **kw))

    R = REDUCE_TOL
    # -- elementwise binary, broadcasting, scalars -------------------------------------------------
    add("add", torch.add, A(3, 130), A(3, 130))
    add("add_bcast_row", torch.add, A(2, 5, 129), A(129))
    add("add_bcast_col", lambda x, y: x + y, A(2, 5, 129), A(5, 1))
    add("add_bcast_both", lambda x, y: x + y, A(3, 1, 7), A(1, 6, 7))
    add("add_alpha", lambda x, y: torch.add(x, y, alpha=0.5), A(3, 130), A(3, 130))
    add("add_scalar", lambda x: x + 2.5, A(3, 130))
    add("sub", torch.sub, A(3, 130), A(1, 130))
    add("rsub_scalar", lambda x: 1.5 - x, A(3, 130))
    add("mul", torch.mul, A(2, 5, 129), A(2, 1, 129))
    add("mul_scalar", lambda x: x * -3.0, A(3, 130))
    add("div", torch.div, A(3, 130), A(3, 130, domain="pos"))
    add("div_scalar", lambda x: x / 7.0, A(3, 130))
    add("rdiv_scalar", lambda x: 2.0 / x, A(3, 130, domain="pos"))
    add("add_transposed", torch.add, A(130, 3, layout="t"), A(130, 3))
    add("mul_sliced", torch.mul, A(3, 65, layout="slice"), A(3, 65))
    add("add_size1", torch.add, A(1, 130), A(1, 1))
    # -- unary ---------------------------------------------------------------------------------------
    add("neg", torch.neg, A(3, 130))
    add("abs", torch.abs, A(3, 130))
    add("exp", torch.exp, A(2, 5, 129))
    add("log", torch.log, A(3, 130, domain="pos"))
    add("sqrt", torch.sqrt, A(3, 130, domain="pos"))
    add("rsqrt", torch.rsqrt, A(3, 130, domain="pos"), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("reciprocal", torch.reciprocal, A(3, 130, domain="pos"))
    add("pow_2", lambda x: x ** 2, A(3, 130))
    add("pow_3", lambda x: x.pow(3), A(3, 130))
    add("pow_half", lambda x: x ** 0.5, A(3, 130, domain="pos"))
    add("pow_frac", lambda x: x ** 1.7, A(3, 130, domain="pos"), tol=_tol((1e-4, 1e-4), (3e-2, 3e-2)))
    add("pow_tensor", torch.pow, A(3, 130, domain="pos"), A(3, 130, domain="unit"),
        tol=_tol((1e-4, 1e-4), (3e-2, 3e-2)))
    add("pow_scalar_base", lambda x: torch.pow(2.0, x), A(3, 130), tol=_tol((1e-4, 1e-4), (3e-2, 3e-2)))
    add("relu", torch.relu, A(3, 130))
    add("gelu", F.gelu, A(2, 5, 129), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), A(2, 5, 129), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("silu", F.silu, A(3, 130), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("sigmoid", torch.sigmoid, A(3, 130), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("tanh", torch.tanh, A(3, 130), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("erf", torch.erf, A(3, 130), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("softplus", F.softplus, A(3, 130), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("softplus_beta", lambda x: F.softplus(x * 8, beta=2.0, threshold=5.0), A(3, 130),
        tol=_tol((1e-4, 1e-4), (3e-2, 3e-2)))
    add("sin", torch.sin, A(3, 130), tol=_tol((1e-4, 1e-4), (2e-2, 2e-2)))
    add("cos", lambda x: torch.cos(x * 4), A(3, 130), tol=_tol((1e-4, 1e-4), (3e-2, 3e-2)))
    add("maximum", torch.maximum, A(3, 130), A(1, 130))
    add("minimum", torch.minimum, A(3, 130), A(3, 130))
    add("clamp", lambda x: torch.clamp(x, -0.5, 0.7), A(3, 130))
    add("clamp_max_only", lambda x: x.clamp(max=0.3), A(3, 130, layout="t"))
    add("clamp_min", lambda x: x.clamp(min=0.1), A(3, 130))
    add("clamp_tensor", lambda x, lo: torch.clamp(x, min=lo), A(3, 130), A(130))
    add("where", lambda c, x, y: torch.where(c, x, y), A(3, 130, domain="bool"), A(3, 130), A(1, 130))
    add("where_scalar", lambda x: torch.where(x > 0, x, 0.25), A(3, 130))
    add("masked_fill", lambda x, m: x.masked_fill(m, -1.5), A(2, 5, 129), A(5, 129, domain="bool"))
    add("masked_fill_neg_inf_softmax", lambda x, m: torch.softmax(x.masked_fill(m, float("-inf")), -1),
        A(2, 5, 7), A(5, 7, domain="bool"), tol=R)
    add("chain", lambda x, y: torch.tanh(x * 2 + y).exp() - x.abs(), A(2, 5, 129), A(129),
        tol=_tol((1e-4, 1e-4), (4e-2, 4e-2)))
    # -- comparisons, logical, casts (no grad) ------------------------------------------------------
    for cmp_name, cmp_fn in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le),
                             ("gt", torch.gt), ("ge", torch.ge)]:
        add(cmp_name, cmp_fn, A(3, 130, domain="int"), A(1, 130, domain="int"), dtypes=(f32,), grad=False)
    add("gt_scalar", lambda x: x > 0.25, A(3, 130), grad=False)
    add("logical_and", torch.logical_and, A(3, 130, domain="bool"), A(3, 130, domain="bool"), dtypes=(f32,),
        grad=False)
    add("logical_or", torch.logical_or, A(3, 130, domain="bool"), A(130, domain="bool"), dtypes=(f32,), grad=False)
    add("logical_xor", torch.logical_xor, A(3, 130), A(3, 130, domain="bool"), grad=False)
    add("logical_not", torch.logical_not, A(3, 130, domain="bool"), dtypes=(f32,), grad=False)
    add("bool_ops", lambda a, b: (a & ~b) | (a ^ b), A(3, 130, domain="bool"), A(3, 130, domain="bool"),
        dtypes=(f32,), grad=False)
    add("cast_to_bf16", lambda x: x.to(torch.bfloat16), A(3, 130), dtypes=(f32,))
    add("cast_to_f32", lambda x: x.float() * 3, A(3, 130), dtypes=(bf16, f16))
    add("cast_to_f16", lambda x: x.to(torch.float16) * 3, A(3, 130), dtypes=(f32, bf16))
    add("cast_bool_to_float", lambda m, x: m.to(x.dtype) * x, A(3, 130, domain="bool"), A(3, 130))
    add("cast_int_to_float", lambda i, x: i.to(x.dtype) + x, A(3, 130, domain="int"), A(3, 130))
    add("cast_to_bool", lambda x: (x * 0 + (x > 0).float()).bool(), A(3, 130), grad=False)
    # -- reductions ----------------------------------------------------------------------------------
    add("sum_last", lambda x: x.sum(-1), A(2, 5, 129), tol=R)
    add("sum_keepdim", lambda x: x.sum(-1, keepdim=True), A(3, 130), tol=R)
    add("sum_dim0", lambda x: x.sum(0), A(2, 5, 129), tol=R)
    add("sum_mid", lambda x: x.sum(1, keepdim=True), A(2, 5, 129), tol=R)
    add("sum_all", lambda x: x.sum(), A(2, 5, 129), tol=_tol((1e-3, 1e-4), (0.5, 4e-2)))
    add("sum_dims", lambda x: x.sum((0, 2)), A(2, 5, 129), tol=R)
    add("sum_transposed", lambda x: x.sum(-1), A(130, 3, layout="t"), tol=R)
    add("mean_last", lambda x: x.mean(-1), A(2, 5, 129), tol=R)
    add("mean_dim0_keepdim", lambda x: x.mean(0, keepdim=True), A(3, 130), tol=R)
    add("mean_all", lambda x: x.mean(), A(2, 5, 129), tol=R)
    add("amax", lambda x: x.amax(-1), A(2, 5, 129, domain="distinct"), tol=R)
    add("amax_dim0", lambda x: x.amax(0, keepdim=True), A(3, 130, domain="distinct"), tol=R)
    add("amin", lambda x: x.amin(1), A(2, 5, 129, domain="distinct"), tol=R)
    add("amin_all", lambda x: x.amin(), A(3, 130, domain="distinct"), tol=R, grad=False)
    add("max_dim_values", lambda x: x.max(-1).values, A(3, 130, domain="distinct"), tol=R)
    add("min_dim_both", lambda x: tuple(x.min(1, keepdim=True)), A(2, 5, 129, domain="distinct"), tol=R)
    add("var", lambda x: x.var(-1), A(2, 5, 129), tol=R)
    add("var_unbiased_false_keep", lambda x: x.var(0, unbiased=False, keepdim=True), A(3, 130), tol=R)
    add("std", lambda x: x.std(-1), A(3, 130), tol=R)
    add("std_all", lambda x: x.std(), A(3, 130), tol=R)
    add("sum_size1_dim", lambda x: x.sum(1), A(3, 1, 130), tol=R)
    add("mean_dims_keepdim", lambda x: x.mean((1, 2), keepdim=True), A(2, 5, 129), tol=R)
    add("var_dims_corr0", lambda x: torch.var(x, (0, 2), correction=0), A(2, 5, 129), tol=R)
    add("std_keepdim_transposed", lambda x: x.std(0, keepdim=True), A(130, 3, layout="t"), tol=R)
    add("sum_expanded", lambda x: x.expand(4, 3, 130).sum(0), A(3, 130), tol=R)
    add("argmax", lambda x: x.argmax(-1), A(2, 5, 129, domain="distinct"), grad=False)
    add("argmax_dim0_keepdim", lambda x: x.argmax(0, keepdim=True), A(3, 130, domain="distinct"), grad=False)
    add("argmin", lambda x: x.argmin(1), A(2, 5, 129, domain="distinct"), grad=False)
    # prod's backward needs cumprod (no lowering yet: rejected), so forward only.
    add("prod", lambda x: x.prod(-1), A(3, 13, domain="pos"), tol=R, grad=False)
    add("prod_dim0", lambda x: x.prod(0), A(3, 130, domain="pos"), tol=R, grad=False)
    add("any", lambda m: m.any(-1), A(3, 130, domain="bool"), dtypes=(f32,), grad=False)
    add("any_all", lambda x: (x > 2.5).any(), A(3, 130), grad=False)
    add("all", lambda m: m.all(0), A(3, 130, domain="bool"), dtypes=(f32,), grad=False)
    add("all_dim_keepdim", lambda x: (x > -3).all(-1, keepdim=True), A(2, 5, 129), grad=False)
    # -- matmul family -------------------------------------------------------------------------------
    M = _tol((1e-4, 1e-4), (4e-2, 4e-2))
    add("mm", torch.mm, A(5, 130), A(130, 7), tol=M)
    add("mm_transposed", torch.mm, A(5, 130), A(130, 7, layout="t"), tol=M)
    add("mm_big_k", torch.mm, A(3, 300), A(300, 5), tol=_tol((2e-4, 1e-4), (8e-2, 4e-2)))
    add("mm_m1_n1", torch.mm, A(1, 130), A(130, 1), tol=M)
    add("addmm_beta_alpha", lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), A(5, 7), A(5, 33), A(33, 7),
        tol=M)
    add("bmm", torch.bmm, A(2, 5, 129), A(2, 129, 3), tol=M)
    add("addmm", lambda b, x, w: torch.addmm(b, x, w), A(7), A(5, 130), A(130, 7), tol=M)
    add("matmul_bcast", torch.matmul, A(2, 5, 9), A(9, 6), tol=M)
    add("matmul_batch_bcast", torch.matmul, A(2, 1, 5, 9), A(3, 9, 6), tol=M)
    add("matmul_vec", torch.matmul, A(5, 9), A(9), tol=M)
    add("linear", F.linear, A(5, 130), A(7, 130), A(7), tol=M)
    add("linear_3d", F.linear, A(2, 5, 33), A(7, 33), A(7), tol=M)
    add("linear_no_bias", lambda x, w: F.linear(x, w), A(5, 33), A(7, 33), tol=M)
    add("linear_weight_t", lambda x, w: F.linear(x, w.t()), A(5, 33), A(33, 7), tol=M)
    add("linear_gelu", lambda x, w, b: F.gelu(F.linear(x, w, b)), A(5, 33), A(7, 33), A(7), tol=M)
    # -- softmax and norms ---------------------------------------------------------------------------
    add("softmax", lambda x: torch.softmax(x, -1), A(2, 5, 129), tol=R)
    add("softmax_dim0", lambda x: torch.softmax(x, 0), A(3, 130), tol=R)
    add("softmax_transposed", lambda x: torch.softmax(x, -1), A(130, 3, layout="t"), tol=R)
    add("softmax_size1_rows", lambda x: torch.softmax(x, -1), A(1, 130), tol=R)
    add("log_softmax", lambda x: F.log_softmax(x, -1), A(2, 5, 129), tol=R)
    add("log_softmax_dim1", lambda x: F.log_softmax(x, 1), A(2, 5, 7), tol=R)
    N = _tol((2e-4, 2e-4), (6e-2, 4e-2))
    add("layer_norm", lambda x, w, b: F.layer_norm(x, (129,), w, b), A(2, 5, 129), A(129), A(129), tol=N)
    add("layer_norm_no_affine", lambda x: F.layer_norm(x, (130,)), A(3, 130), tol=N)
    add("layer_norm_2d", lambda x: F.layer_norm(x, (5, 7)), A(2, 5, 7), tol=N)
    add("rms_norm", lambda x, w: F.rms_norm(x, (129,), w, eps=1e-6), A(2, 5, 129), A(129), tol=N)
    add("rms_norm_manual", rms_norm_manual, A(2, 5, 129), A(129), tol=N)
    # -- movement ------------------------------------------------------------------------------------
    add("view", lambda x: x.view(10, 129) * 2, A(2, 5, 129))
    add("reshape_transposed", lambda x: x.reshape(-1) + 1, A(7, 3, layout="t"))
    add("permute", lambda x: x.permute(2, 0, 1) * 2, A(2, 5, 129))
    add("permute_contiguous", lambda x: x.permute(1, 0, 2).contiguous(), A(2, 5, 129))
    add("transpose", lambda x: x.transpose(0, 1) + 1, A(3, 130))
    add("t_out", lambda x: x.t(), A(3, 130), grad=False)  # a pure view: autograd replays it
    add("expand", lambda x: x.expand(3, 4, 130) * 1.5, A(3, 1, 130))
    add("slice", lambda x: x[:, 2:100:3] * 2, A(3, 130))
    add("slice_dim0_step", lambda x: x[1::2].exp(), A(7, 13, layout="t"))
    add("slice_neg", lambda x: x[1:, -5:] + 1, A(3, 130))
    add("select", lambda x: x[:, 1] * 2, A(2, 5, 129))
    add("select_last", lambda x: x[..., -1] + 1, A(2, 5, 129))
    add("squeeze_unsqueeze", lambda x: x.squeeze(1).unsqueeze(0) * 2, A(3, 1, 130))
    add("flatten", lambda x: torch.flatten(x, 1) * 2, A(2, 5, 129))
    add("clone", lambda x: x.clone(), A(3, 130))
    add("contiguous_t", lambda x: x.contiguous(), A(130, 3, layout="t"))
    add("contiguous_slice", lambda x: x.contiguous(), A(3, 65, layout="slice"))
    add("cat", lambda x, y: torch.cat([x, y], 0), A(3, 130), A(2, 130))
    add("cat_last", lambda x, y: torch.cat([x * 2, y], -1), A(2, 5, 129), A(2, 5, 3))
    add("stack", lambda x, y: torch.stack([x, y], 1), A(3, 130), A(3, 130))
    add("split", lambda x: [t * (i + 1) for i, t in enumerate(torch.split(x, 50, -1))], A(3, 130))
    add("chunk", lambda x: [t.exp() for t in x.chunk(3, 0)], A(7, 13))
    add("full_like_ops", lambda x: x + torch.full((3, 130), 2.5, dtype=x.dtype), A(3, 130))
    add("zeros_ones", lambda x: x + torch.zeros_like(x) + torch.ones(130, dtype=x.dtype), A(3, 130))
    add("arange", lambda x: x * torch.arange(130, dtype=x.dtype), A(3, 130))
    add("arange_int", lambda x: x + torch.arange(2, 132, 1).to(x.dtype), A(130), tol=_tol((2e-5, 2e-5), (1.0, 1e-2)))
    return c


CASES: list[OpCase] = _cases()
