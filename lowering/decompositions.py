"""The decomposition table AOTAutograd applies before lowering.

PyTorch's core-ATen table plus the composite ops we prefer to see as primitives (softmax,
layer_norm, addmm, var_mean, dropout, ...), minus the ops we lower directly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.inductor_prims  # noqa: F401  (registers prims.fma, which Dynamo emits for addcmul_ & co.)
from neuron_compile.lowering.views import dense
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

aten = torch.ops.aten

EXTRA = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.addmm, aten.var_mean, aten.native_dropout,
    aten.max.dim, aten.min.dim, aten.hardtanh, aten.addcmul, aten.addcdiv, aten.logsumexp, aten.lerp,
    aten.baddbmm, aten.addmv, aten.mv, aten.dot, aten.squeeze_copy, aten.unsqueeze_copy, aten.expand_copy,
    aten.permute_copy, aten.view_copy, aten.t_copy, aten.transpose_copy, aten.split_with_sizes, aten.unbind,
    aten.std, aten.std_mean, aten.log_sigmoid_forward, aten.leaky_relu, aten.elu, aten.hardsigmoid,
    aten.hardswish, aten.mish, aten.celu, aten.selu, aten.glu, aten.sigmoid_backward, aten.tanh_backward,
    aten._log_softmax_backward_data, aten._softmax_backward_data, aten.gelu_backward, aten.silu_backward,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.clamp_min, aten.clamp_max, aten.square, aten.trunc,
    aten.full_like, aten.zeros_like, aten.ones_like, aten.new_zeros, aten.new_ones, aten.new_full, aten.zeros,
    aten.ones, aten.empty_like, aten.index_select, aten.mean.dim,
    aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit,
    aten.native_batch_norm_backward, aten.linalg_vector_norm, aten.repeat,
    aten.as_strided_copy, aten.as_strided_scatter, aten.ldexp, aten.narrow_copy,
    aten.unbind_copy, aten.gcd, aten.lcm, aten.grid_sampler_2d,
    aten._batch_norm_with_update_functional, aten._batch_norm_no_update, aten.batch_norm_backward,
    aten.rrelu_with_noise_backward,
]
# Ops we lower ourselves even though a decomposition exists.
KEEP = {aten.gelu.default, aten.silu.default, aten.mean.dim, aten.mean.default, aten.var.correction,
        aten.softplus.default, aten.clamp.default, aten.where.self, aten.abs.default, aten.sigmoid.default,
        aten.index_select.default, aten.embedding.default, aten.rsqrt.default, aten.t.default,
        aten.transpose.int, aten.cat.default}


def _var_mean(x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    """var_mean as mean + var (torch's reference decomposes into prims, which we do not lower)."""
    dims = list(range(x.dim())) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    mean = aten.mean.dim(x, dims, True)
    var = aten.var.correction(x, dims, correction=1 if correction is None else correction, keepdim=keepdim)
    return var, mean if keepdim else aten.squeeze.dims(mean, dims)


def _native_layer_norm(x: torch.Tensor, normalized_shape: Any, weight: Any, bias: Any, eps: float) -> Any:
    """LayerNorm as mean/var/rsqrt on ATen ops (torch's reference goes through prims)."""
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    acc = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    mean = aten.mean.dim(acc, dims, True)
    centered = aten.sub.Tensor(acc, mean)
    var = aten.mean.dim(aten.mul.Tensor(centered, centered), dims, True)  # reuses the SBUF-resident rows
    rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    out = aten.mul.Tensor(centered, rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    if bias is not None:
        out = aten.add.Tensor(out, bias)
    # the statistics come back in the dtype eager gives them: on CPU the input's (a reduced-precision input with
    # fp32 affine parameters: fp32), on an accelerator fp32
    stats = acc.dtype
    if x.device.type == "cpu":
        params = [t.dtype for t in (weight, bias) if t is not None]
        stats = params[0] if params and params[0] != x.dtype else x.dtype
    # eager's kernel writes a contiguous result whatever the input's layout (a transposed attention output): the
    # strides decide the paths of what follows (linear folds a contiguous 3-D input into one addmm)
    return out.to(x.dtype).contiguous(), mean.to(stats), rstd.to(stats)


def _integral_scalars(t: torch.Tensor, *scalars: Any) -> tuple[Any, ...]:
    """addmm/addbmm's beta and alpha as eager takes them: truncated to integers for integer operands."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return scalars
    return tuple(int(x) for x in scalars)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    """addmm as mm + bias so the bias add fuses into the matmul's PSUM eviction."""
    beta, alpha = _integral_scalars(a, beta, alpha)
    out = aten.mm.default(a, b)
    if alpha != 1:
        out = aten.mul.Tensor(out, alpha)
    if beta == 0:
        return out
    return aten.add.Tensor(out, bias if beta == 1 else aten.mul.Tensor(bias, beta))


def _max_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """max.dim as (amax, argmax): both lower as reductions (torch has no decomposition for it)."""
    return aten.amax.default(x, [dim], keepdim), aten.argmax.default(x, dim, keepdim)


def _min_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """min.dim as (amin, argmin)."""
    return aten.amin.default(x, [dim], keepdim), aten.argmin.default(x, dim, keepdim)


def _constant_pad_nd(x: torch.Tensor, pad: Any, value: Any = 0) -> torch.Tensor:
    """Constant padding as slices (negative pads) and a cat with filled blocks (torch's reference uses prims)."""
    out = x
    for i in range(len(pad) // 2):
        dim = x.dim() - 1 - i
        lo, hi = int(pad[2 * i]), int(pad[2 * i + 1])
        if lo < 0 or hi < 0:
            size = out.shape[dim]
            out = aten.slice.Tensor(out, dim, max(-lo, 0), size - max(-hi, 0))
        parts = []
        for n in (max(lo, 0), None, max(hi, 0)):
            if n is None:
                parts.append(out)
            elif n:
                shape = list(out.shape)
                shape[dim] = n
                parts.append(aten.full.default(shape, value, dtype=x.dtype, device=x.device))
        if len(parts) > 1:
            out = aten.cat.default(parts, dim)
    return out if out is not x else aten.clone.default(x)


def _addbmm(x: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    """addbmm: beta x + alpha sum_b b1[b] @ b2[b] (one batched matmul, then a sum over the batch)."""
    beta, alpha = _integral_scalars(b1, beta, alpha)
    if b1.dtype.is_floating_point or b1.dtype.is_complex:
        out = aten.sum.dim_IntList(aten.bmm.default(b1, b2), [0])
    else:  # one matmul over the batch's concatenated reductions: it wraps at the operands' width as eager does
        nb, n, k = b1.shape
        out = aten.mm.default(b1.permute(1, 0, 2).reshape(n, nb * k), b2.reshape(nb * k, b2.shape[2]))
    if alpha != 1:
        out = aten.mul.Tensor(out, alpha)
    return out if beta == 0 else aten.add.Tensor(out, x if beta == 1 else aten.mul.Tensor(x, beta))


def _dense_order(t: torch.Tensor) -> list[int] | None:
    """The dims of ``t`` from outermost to innermost when its strides are a dense layout in that order, else None."""
    if not dense(t.shape, t.stride()):
        return None
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), -t.shape[d]))


def _copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """aten.copy (functional): ``src`` cast to ``dst``'s dtype and broadcast to its shape, laid out like ``dst``
    as eager's copy is (a clone of ``dst`` written over): later views of it (autograd's among them) see the same
    strides. A ``dst`` with gaps between its elements comes back contiguous."""
    out = aten.expand.default(src.to(dst.dtype), list(dst.shape))
    order = _dense_order(dst)
    if order is None or order == sorted(order):
        return aten.clone.default(out, memory_format=torch.contiguous_format)
    laid = aten.clone.default(aten.permute.default(out, order), memory_format=torch.contiguous_format)
    return aten.permute.default(laid, [order.index(d) for d in range(dst.dim())])


def _max_all(x: torch.Tensor) -> torch.Tensor:
    """max() / min() without dim: amax/amin over every dim (NaN propagates as in torch)."""
    return aten.amax.default(x, list(range(x.dim())))


def _min_all(x: torch.Tensor) -> torch.Tensor:
    return aten.amin.default(x, list(range(x.dim())))


def _cdist(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: Any = None) -> torch.Tensor:
    """cdist as the p-norm of pairwise differences (exact; torch's own direct path)."""
    d = aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3))
    if d.numel() == 0:  # no pairs, or points of no coordinates (all at distance 0): an inf norm of nothing raises
        return aten.sum.dim_IntList(aten.abs.default(d), [-1])
    return aten.linalg_vector_norm.default(d, p, [-1])


def _repeat(x: torch.Tensor, repeats: Any) -> torch.Tensor:
    """aten.repeat, contiguous as eager's result always is (PyTorch's decomposition keeps the input's layout, and a
    later ``view`` of a permuted input's repeat then fails to trace: WavLM's position bias)."""
    repeats = [int(r) for r in repeats]
    t = x
    for _ in range(len(repeats) - x.dim()):
        t = t.unsqueeze(0)
    for i in range(len(repeats)):
        t = t.unsqueeze(2 * i)  # [1, s0, 1, s1, ...]
    sizes = [n for r, s in zip(repeats, t.shape[1::2], strict=True) for n in (r, s)]
    out = t.expand(sizes).reshape([r * s for r, s in zip(repeats, sizes[1::2], strict=True)])
    return aten.clone.default(out, memory_format=torch.contiguous_format)  # a view of the expand when it can be


def _diagonal_scatter(x: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """diagonal_scatter: the two dims moved last, their diagonal written by an index_put, moved back."""
    d1, d2 = dim1 % x.dim(), dim2 % x.dim()
    xp = torch.movedim(x, (d1, d2), (-2, -1))
    n = src.shape[-1]
    rows = torch.arange(n, device=x.device) + max(-offset, 0)
    cols = torch.arange(n, device=x.device) + max(offset, 0)
    out = aten.index_put.default(xp, [None] * (xp.dim() - 2) + [rows, cols], src.to(x.dtype))
    return torch.movedim(out, (-2, -1), (d1, d2))


def _zeros(size: Any, dtype: Any, like: torch.Tensor | None = None) -> torch.Tensor:
    dtype = dtype if dtype is not None else (like.dtype if like is not None else torch.get_default_dtype())
    return aten.full.default(list(size), 0, dtype=dtype, device=torch.device("cpu"))


def _empty(size: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> torch.Tensor:
    """empty / empty_strided / empty_permuted: uninitialized in torch, zeros here (never stale data). Also
    _efficientzerotensor (autograd's gradient of a piecewise-constant op, e.g. sgn): a memset of zeros."""
    return _zeros(size, dtype)


def _searchsorted_scalar(seq: torch.Tensor, value: Any, *, out_int32: bool = False, right: bool = False,
                         side: Any = None, sorter: Any = None) -> torch.Tensor:
    """searchsorted of one Python number: the Tensor overload with a 0-d value (a 0-d result, as eager's)."""
    v = aten.scalar_tensor.default(value, dtype=torch.result_type(seq, value))
    return aten.searchsorted.Tensor(seq, v, out_int32=out_int32, right=right, side=side, sorter=sorter)


def _embedding_renorm(w: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """embedding_renorm (``nn.Embedding(max_norm=...)``): every row the indices name whose norm exceeds max_norm
    is scaled by max_norm / (norm + 1e-7), as eager; the other rows are unchanged."""
    rows = w.shape[0]
    flat = indices.reshape(-1)
    counts = aten.index_put.default(aten.full.default([rows], 0.0, dtype=torch.float32), [flat],
                                    aten.full.default([flat.shape[0]], 1.0, dtype=torch.float32), True)
    norms = torch.linalg.vector_norm(w.float(), float(norm_type), dim=1)
    scale = torch.where((counts > 0) & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return (w.float() * scale.unsqueeze(1)).to(w.dtype)


def _new_empty(x: torch.Tensor, size: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> torch.Tensor:
    return _zeros(size, dtype, x)


def _empty_like(x: torch.Tensor, *args: Any, dtype: Any = None, **kwargs: Any) -> torch.Tensor:
    """Zeros laid out like ``x`` when ``x`` is dense (eager's ``empty_like`` keeps such a layout), so that a sampler
    filling it in place draws in eager's order (lowering/ops/random.py)."""
    order = _dense_order(x) if kwargs.get("memory_format") in (None, torch.preserve_format) else None
    if order is None or order == sorted(order):
        return _zeros(x.shape, dtype, x)
    laid = _zeros([x.shape[d] for d in order], dtype, x)
    return laid.permute([order.index(d) for d in range(x.dim())])


# Euclid's steps never exceed 46 for magnitudes below 2**31 (integers compute in int32 on a NeuronCore): the
# worst pair is two consecutive Fibonacci numbers, and F(47) > 2**31.
_EUCLID_STEPS = 46


def _gcd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gcd (prims.gcd, behind aten.gcd and aten.lcm): Euclid's algorithm on the magnitudes, a fixed number of
    remainder steps (a pair that is done stays as it is), as eager's loop computes it."""
    a, b = torch.abs(a), torch.abs(b)
    for _ in range(_EUCLID_STEPS):
        going = a != 0
        a, b = torch.where(going, torch.remainder(b, torch.where(going, a, 1)), 0), torch.where(going, a, b)
    return b


def _lcm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """lcm: ``|a / gcd * b|`` (exact: the gcd divides a), 0 where both are 0, as eager."""
    g = _gcd(a, b)
    return torch.where(g == 0, 0, torch.abs(torch.div(a, torch.where(g == 0, 1, g), rounding_mode="trunc") * b))


def _angle(x: torch.Tensor) -> Any:
    """angle of a real tensor: pi below zero, 0 elsewhere (-0.0 included), NaN kept; complex stays refused."""
    if x.is_complex():
        return NotImplemented
    out_dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    xf = x.to(out_dtype)
    return torch.where(torch.isnan(xf), xf, torch.where(xf < 0, math.pi, 0.0).to(out_dtype))


def _dist(a: torch.Tensor, b: torch.Tensor, p: Any = 2) -> torch.Tensor:
    """aten.dist: the p-norm of the broadcast difference."""
    return torch.linalg.vector_norm(a - b, float(p))


def _pow_scalar_base(base: Any, e: Any) -> Any:
    """``base ** e`` for a Python number ``base`` that ``exp(e * ln(base))`` (the lowering) gets wrong: 1 (1 for
    every e, inf and NaN too), 0, negative, infinite or NaN, with C's ``pow`` rules as eager has them: a negative
    base takes the sign of an odd integer exponent and gives NaN for a finite non-integer one."""
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not isinstance(e, torch.Tensor):
        return NotImplemented
    dtype = torch.result_type(base, e)
    b = float(base)
    if not dtype.is_floating_point or (b > 0 and b != 1 and math.isfinite(b)):
        return NotImplemented
    x = e.to(torch.float32)
    m = abs(b)
    nan, inf = float("nan"), float("inf")
    if math.isnan(b):
        mag = torch.where(x == 0, 1.0, nan)
    elif m == 1:
        mag = torch.where(x.isnan() & (b < 0), nan, 1.0)
    elif m in (0.0, inf):
        big, small = (inf, 0.0) if m == inf else (0.0, inf)
        mag = torch.where(x > 0, big, torch.where(x < 0, small, torch.where(x == 0, 1.0, nan)))
    else:
        mag = torch.exp(x * math.log(m))
    if math.copysign(1.0, b) < 0:
        integer = x == x.trunc()  # inf counts (even), NaN doesn't
        mag = torch.where(integer & (x.abs().fmod(2.0) == 1.0), -mag, mag)
        if 0 < m < inf:
            mag = torch.where(integer, mag, nan)
    return mag.to(dtype)


def _fma(a: Any, b: Any, c: Any) -> torch.Tensor:
    """prims.fma (behind addcmul / addcdiv / lerp in the optimizers' update rules, e.g. AdamW's
    ``exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)``): ``a * b + c``, rounded twice where eager
    rounds once (VectorE has no fused multiply-add), so within an ulp of the result."""
    return aten.add.Tensor(aten.mul.Tensor(a, b), c)


# Per-tensor ops of the foreach ops not named like them: the norm, and maximum / minimum of a number (a clamp: the
# torch functions of those names take tensors only)
_FOREACH_FN = {"norm": torch.linalg.vector_norm}
_FOREACH_SCALAR_FN = {"maximum": torch.clamp_min, "minimum": torch.clamp_max}


def _foreach(base: str, overload: str) -> Callable[..., Any]:
    """``aten._foreach_<base>.<overload>`` as one per-tensor op per list element (clip_grad_norm_'s
    ``_foreach_norm`` / ``_foreach_mul``, foreach optimizers): list arguments pair up element by element, any other
    argument (a number, a 0-d tensor) goes to every call. Each result is the per-tensor op's, so it matches eager's
    foreach kernel element for element."""
    if overload in ("Scalar", "ScalarList") and base in _FOREACH_SCALAR_FN:
        fn = _FOREACH_SCALAR_FN[base]
    else:
        fn = _FOREACH_FN.get(base) or getattr(torch, base)

    def decomposed(*args: Any, **kwargs: Any) -> list[Any]:
        n = len(next(a for a in args if isinstance(a, (list, tuple))))
        if base in ("addcmul", "addcdiv") and len(args) == 4:  # the value (a number, or one per tensor) is keyword-only
            *args, value = args
            return [fn(*[a[i] for a in args], value=value[i] if isinstance(value, (list, tuple)) else value)
                    for i in range(n)]
        return [fn(*[a[i] if isinstance(a, (list, tuple)) else a for a in args], **kwargs) for i in range(n)]

    return decomposed


def _foreach_table() -> dict[Any, Callable[..., Any]]:
    """Every out-of-place ``aten._foreach_*`` overload this torch has, except the few with no per-tensor
    counterpart here (``powsum``, ``mm``, and addcmul / addcdiv with their values in a tensor), which stay refused by
    name."""
    table: dict[Any, Callable[..., Any]] = {}
    for name in dir(aten):
        if not name.startswith("_foreach_") or name.endswith("_"):
            continue
        base = name[len("_foreach_"):]
        if base == "mm" or not (base in _FOREACH_FN or hasattr(torch, base)):
            continue
        packet = getattr(aten, name)
        for overload in packet.overloads():
            if "out" in overload or (base in ("addcmul", "addcdiv") and overload == "Tensor"):
                continue
            table[getattr(packet, overload)] = _foreach(base, overload)
    return table


def _addc(op: Any, combine: Any) -> Callable[..., Any]:
    """addcmul / addcdiv (``combine``: mul / div) as eager's kernel computes them, self + value * t1 (op) t2. For a
    complex result, the outer sum adds the parts: eager's fused kernel has no ``alpha`` product that add.Tensor
    does (which turns an inf part's partner into NaN)."""
    torch_rule = get_decompositions([op])[op.default]

    def rule(self: torch.Tensor, tensor1: torch.Tensor, tensor2: torch.Tensor, *, value: Any = 1) -> Any:
        if not any(t.is_complex() for t in (self, tensor1, tensor2)):
            return torch_rule(self, tensor1, tensor2, value=value)
        dtype = elementwise_dtypes(self, tensor1, tensor2, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]
        term = combine(aten.mul.Tensor(tensor1.to(dtype), value), tensor2.to(dtype))
        total = aten.add.Tensor(aten.view_as_real(self.to(dtype)), aten.view_as_real(term))
        return aten.view_as_complex(total)

    return rule


OWN: dict[Any, Callable[..., Any]] = {
    aten.addcmul.default: _addc(aten.addcmul, aten.mul.Tensor),
    aten.addcdiv.default: _addc(aten.addcdiv, aten.div.Tensor),
    aten.pow.Scalar: _pow_scalar_base,
    torch.ops.prims.gcd.default: _gcd,
    torch.ops.prims.fma.default: _fma,
    aten.lcm.default: _lcm,
    aten.angle.default: _angle,
    aten.dist.default: _dist,
    aten.empty.memory_format: _empty,
    aten.empty_strided.default: _empty,
    aten.empty_permuted.default: _empty,
    aten._efficientzerotensor.default: _empty,
    aten.searchsorted.Scalar: _searchsorted_scalar,
    aten.embedding_renorm.default: _embedding_renorm,
    aten.new_empty.default: _new_empty,
    aten.new_empty_strided.default: _new_empty,
    aten.empty_like.default: _empty_like,
    aten.diagonal_scatter.default: _diagonal_scatter,
    aten.repeat.default: _repeat,
    aten.addbmm.default: _addbmm,
    aten.copy.default: _copy,
    aten.max.default: _max_all,
    aten.min.default: _min_all,
    aten._cdist_forward.default: _cdist,
    aten.constant_pad_nd.default: _constant_pad_nd,
    aten.addmm.default: _addmm,
    aten.max.dim: _max_dim,
    aten.min.dim: _min_dim,
    aten.var_mean.correction: _var_mean,
    aten.native_layer_norm.default: _native_layer_norm,
}


def _first(fn: Callable[..., Any], then: Callable[..., Any] | None) -> Callable[..., Any]:
    """``fn``, or ``then`` where ``fn`` returns NotImplemented (an op with no ``then`` is traced as it is)."""
    if then is None:
        return fn

    def first(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return then(*args, **kwargs) if out is NotImplemented else out

    return first


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([op for op in EXTRA]))
    for op in KEEP:
        table.pop(op, None)
    table.update(OWN)
    for op, fn in _foreach_table().items():
        table.setdefault(op, fn)
    from neuron_compile.lowering.decomp_attention import ATTENTION
    from neuron_compile.lowering.decomp_bits import BITS
    from neuron_compile.lowering.decomp_fakequant import FAKEQUANT
    from neuron_compile.lowering.decomp_fp8 import FP8_DECOMPOSITIONS
    from neuron_compile.lowering.decomp_igamma import IGAMMA
    from neuron_compile.lowering.decomp_index import INDEX
    from neuron_compile.lowering.decomp_intmm import INTMM
    from neuron_compile.lowering.decomp_intpool import INTPOOL
    from neuron_compile.lowering.decomp_intpow import INTPOW
    from neuron_compile.lowering.decomp_intprod import INTPROD
    from neuron_compile.lowering.decomp_nn import NN
    from neuron_compile.lowering.decomp_special import SPECIAL

    table.update(ATTENTION)
    table.update(BITS)
    table.update(FAKEQUANT)
    table.update(FP8_DECOMPOSITIONS)
    table.update(IGAMMA)
    table.update(NN)
    table.update(INDEX)
    table.update(SPECIAL)
    from neuron_compile.lowering.decomp_scatter import SCATTER  # scatter family, EmbeddingBag, long topk

    table.update(SCATTER)
    from neuron_compile.lowering.ops.random import RANDOM_DECOMPOSITIONS

    table.update(RANDOM_DECOMPOSITIONS)
    from neuron_compile.lowering.decomp_conv import conv_decompositions

    table.update(conv_decompositions())
    from neuron_compile.lowering.decomp_conv3d import CONV3D

    table.update(CONV3D)
    from neuron_compile.lowering.decomp_moe import MOE

    table.update(MOE)
    from neuron_compile.lowering.decomp_grid3d import GRID3D
    from neuron_compile.lowering.decomp_histogram import HISTOGRAM
    from neuron_compile.lowering.decomp_linalg import LINALG
    from neuron_compile.lowering.decomp_matrix_exp import MATRIX_EXP
    from neuron_compile.lowering.decomp_pool import POOL
    from neuron_compile.lowering.decomp_qr import QR
    from neuron_compile.lowering.decomp_segment import SEGMENT
    from neuron_compile.lowering.decomp_vjp import VJP

    table.update(GRID3D)
    table.update(VJP)
    table.update(POOL)
    table.update(SEGMENT)
    table.update(HISTOGRAM)
    table.update(LINALG)
    table.update(QR)
    table.update(MATRIX_EXP)
    for op, fn in {**INTMM, **INTPOW, **INTPOOL, **INTPROD}.items():  # integer operands only: anything else goes on to the one before
        table[op] = _first(fn, table.get(op))
    return table


def decompositions() -> dict[Any, Callable[..., Any]]:
    """The table a compile uses: ours, plus the custom ops of libraries loaded by now (MoE kernels, PyTorch's
    chunked linear_cross_entropy)."""
    from neuron_compile.lowering.decomp_lce import loaded
    from neuron_compile.lowering.decomp_moe import third_party

    return {**decomposition_table(), **third_party(), **loaded()}
