"""Decompositions of the CNN / diffusion ops onto the conv, pool and resample kernel families.

- ``convolution_backward`` -> a transposed convolution (grad_input: the same implicit GEMM as the forward),
  ``neuron_compile::conv_weight_grad`` (grad_weight, :class:`~neuron_compile.lowering.ir.ConvWgradKernel`)
  and a sum over (N, spatial) (grad_bias, an ordinary reduction kernel).
- ``max_pool2d_with_indices`` -> ``neuron_compile::max_pool`` + ``max_pool_index`` (indices only where used),
  its backward -> ``neuron_compile::max_pool_backward``, which recomputes the argmax from the input instead of
  reading stored indices (training keeps no index tensor; eager's tie and NaN rules are reproduced).
- ``native_group_norm`` -> mean/var/rsqrt on the [N, G, C/G, HxW] view with the affine broadcast in that view
  (one reduction kernel); its backward is PyTorch's own decomposition onto reductions and elementwise ops.
- upsample (nearest, nearest-exact, bilinear/linear, bicubic; ``.default`` and ``.vec``), adaptive average
  pooling, and their backwards -> ``neuron_compile::resample`` (a separable linear map, transposed for the
  backward; :mod:`lowering.ops.resample`).

The ``neuron_compile::*`` ops are defined here with an eager implementation (their semantics; also what
FakeTensor tracing runs) and are only ever seen by our own lowering rules.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from neuron_compile.lowering import resample_u8
from neuron_compile.lowering.registry import register_declined

log = logging.getLogger(__name__)
aten = torch.ops.aten

_LIB = torch.library.Library("neuron_compile", "FRAGMENT")
_LIB.define("conv_weight_grad(Tensor input, Tensor grad_output, int[] weight_size, int[] stride, int[] padding, "
            "int[] dilation, int groups) -> Tensor")


def _conv_weight_grad_eager(x: torch.Tensor, go: torch.Tensor, weight_size: list[int], stride: list[int],
                            padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """grad_weight of ``go = conv(x, w)`` (not transposed) for a weight of ``weight_size``."""
    w = torch.empty(weight_size, dtype=x.dtype, device=x.device)
    return aten.convolution_backward.default(go, x, w, None, stride, padding, dilation, False,
                                             [0] * len(stride), groups, [False, True, False])[1]


_LIB.impl("conv_weight_grad", _conv_weight_grad_eager, "CompositeExplicitAutograd")
CONV_WEIGHT_GRAD = torch.ops.neuron_compile.conv_weight_grad.default


_LIB.define("max_pool(Tensor x, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) "
            "-> Tensor")
_LIB.define("max_pool_index(Tensor x, int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
            "bool ceil_mode) -> Tensor")
_LIB.define("max_pool_backward(Tensor grad_output, Tensor x, int[] kernel_size, int[] stride, int[] padding, "
            "int[] dilation, bool ceil_mode) -> Tensor")


def _max_pool_eager(x: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                    dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    return aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _max_pool_index_eager(x: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                          dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    return aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[1]


def _max_pool_backward_eager(go: torch.Tensor, x: torch.Tensor, kernel_size: list[int], stride: list[int],
                             padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    """The gradient routed to each window's argmax (recomputed from ``x``: first maximum, NaN wins)."""
    idx = aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[1]
    return aten.max_pool2d_with_indices_backward.default(go, x, kernel_size, stride, padding, dilation, ceil_mode,
                                                         idx)


_LIB.impl("max_pool", _max_pool_eager, "CompositeExplicitAutograd")
_LIB.impl("max_pool_index", _max_pool_index_eager, "CompositeExplicitAutograd")
_LIB.impl("max_pool_backward", _max_pool_backward_eager, "CompositeExplicitAutograd")
MAX_POOL = torch.ops.neuron_compile.max_pool.default
MAX_POOL_INDEX = torch.ops.neuron_compile.max_pool_index.default
MAX_POOL_BACKWARD = torch.ops.neuron_compile.max_pool_backward.default


def _per_dim(value: Any, n: int, default: list[int]) -> list[int]:
    """A conv/pool size argument as ``n`` ints: one value serves every dim, an empty one takes ``default``."""
    v = list(value) if isinstance(value, (list, tuple)) else [value]
    v = v or list(default)
    return [int(x) for x in (v * n if len(v) == 1 else v)]


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """torch's pooling output size (a ceil_mode window must start inside the input or its left padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any) -> tuple[list[int], ...]:
    ks = _per_dim(kernel_size, 2, [1])
    return ks, _per_dim(stride, 2, ks), _per_dim(padding, 2, [0]), _per_dim(dilation, 2, [1])


def _max_pool2d_with_indices(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                             dilation: Any = 1, ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices as two ops: training needs only the values (the backward recomputes the argmax)."""
    ks, st, pad, dil = _pool_args(x, kernel_size, stride, padding, dilation)
    if x.dim() == 3:  # unbatched [C, H, W]
        v, i = _max_pool2d_with_indices(x.unsqueeze(0), ks, st, pad, dil, ceil_mode)
        return v.squeeze(0), i.squeeze(0)
    return MAX_POOL(x, ks, st, pad, dil, ceil_mode), MAX_POOL_INDEX(x, ks, st, pad, dil, ceil_mode)


def _max_pool2d_with_indices_backward(go: torch.Tensor, x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any,
                                      dilation: Any, ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    ks, st, pad, dil = _pool_args(x, kernel_size, stride, padding, dilation)
    if x.dim() == 3:  # unbatched [C, H, W]
        return MAX_POOL_BACKWARD(go.unsqueeze(0), x.unsqueeze(0), ks, st, pad, dil, ceil_mode).squeeze(0)
    return MAX_POOL_BACKWARD(go, x, ks, st, pad, dil, ceil_mode)


_LIB.define("resample(Tensor x, int[] in_size, int[] out_size, str mode, bool align_corners, float?[] scales, "
            "bool transpose) -> Tensor")


def _resample_eager(x: torch.Tensor, in_size: list[int], out_size: list[int], mode: str, align_corners: bool,
                    scales: list[float | None], transpose: bool) -> torch.Tensor:
    """``A_h x A_w^T`` per plane (``A_h^T x A_w`` when ``transpose``: the backward), A from ``resample_matrix``."""
    from neuron_compile.lowering.ops.resample import resample_matrix

    modes = mode.split(",") if "," in mode else [mode] * len(in_size)
    a = [torch.from_numpy(resample_matrix(m, int(i), int(o), bool(align_corners), s).copy())
         for m, i, o, s in zip(modes, in_size, out_size, scales, strict=True)]
    if transpose:
        a = [m.t() for m in a]
    return torch.einsum("nchw,oh,pw->ncop", x.float(), a[0], a[1]).to(x.dtype)


def _resample_fake(x: torch.Tensor, in_size: list[int], out_size: list[int], mode: str, align_corners: bool,
                   scales: list[float | None], transpose: bool) -> torch.Tensor:
    hw = in_size if transpose else out_size
    return x.new_empty((x.shape[0], x.shape[1], int(hw[0]), int(hw[1])))


_LIB.impl("resample", _resample_eager, "CompositeExplicitAutograd")
torch.library.register_fake("neuron_compile::resample", _resample_fake, lib=_LIB)
RESAMPLE = torch.ops.neuron_compile.resample.default


def _resample_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.args = inputs[1:]


def _resample_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    in_size, out_size, mode, align_corners, scales, transpose = ctx.args
    return (RESAMPLE(grad, in_size, out_size, mode, align_corners, scales, not transpose),
            None, None, None, None, None, None)


torch.library.register_autograd("neuron_compile::resample", _resample_backward, setup_context=_resample_setup,
                                lib=_LIB)
_INTERP_MODES = {"nearest": "nearest", "nearest-exact": "nearest-exact", "linear": "bilinear",
                 "bilinear": "bilinear", "bicubic": "bicubic", "trilinear": "bilinear"}


def interpolate(input: torch.Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> torch.Tensor:
    """``F.interpolate`` for 1-D/2-D nearest, nearest-exact, (bi)linear and bicubic as ``neuron_compile::resample``
    (sizes and scales as F.interpolate passes them to the ATen op); any other case is F.interpolate itself."""
    nsp = input.dim() - 2
    if antialias or nsp not in (1, 2, 3) or mode not in _INTERP_MODES or (size is None) == (scale_factor is None):
        return torch.nn.functional.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor,
                                               antialias)
    in_hw = [int(s) for s in input.shape[2:]]
    if size is not None:
        osize = [int(s) for s in (size if isinstance(size, (list, tuple)) else [size] * nsp)]
        scales: list[float | None] = [None] * nsp
    else:
        sf = [float(s) for s in (scale_factor if isinstance(scale_factor, (list, tuple)) else [scale_factor] * nsp)]
        osize = [int(math.floor(i * s)) for i, s in zip(in_hw, sf, strict=True)]
        scales = [None] * nsp if recompute_scale_factor else list(sf)
    return _resample(input, in_hw, osize, _INTERP_MODES[mode], bool(align_corners), scales, False)


def _upsample_call(input: torch.Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                   align_corners: bool | None = None) -> torch.Tensor:
    return interpolate(input, size, scale_factor, mode, align_corners)


def _upsample_nearest(input: torch.Tensor, size: Any = None, scale_factor: Any = None) -> torch.Tensor:
    return interpolate(input, size, scale_factor, mode="nearest")


def _upsample_bilinear(input: torch.Tensor, size: Any = None, scale_factor: Any = None) -> torch.Tensor:
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


_INTERP_CALLS = {torch.nn.functional.interpolate: interpolate, torch.nn.functional.upsample: _upsample_call,
                 torch.nn.functional.upsample_nearest: _upsample_nearest,
                 torch.nn.functional.upsample_bilinear: _upsample_bilinear}


def rewrite_interpolate(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Point the Dynamo graph's ``F.interpolate`` (and ``F.upsample*``) calls at :func:`interpolate`: PyTorch
    decomposes the upsample ops
    above autograd into index/index_put graphs (multi-index gathers, float-to-int casts), so they must be
    replaced before AOTAutograd traces them. Returns ``gm`` (changed in place)."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _INTERP_CALLS:
            node.target = _INTERP_CALLS[node.target]
            changed = True
    if changed:
        gm.recompile()
    return gm


def _adaptive_windows(x: torch.Tensor, output_size: Any) -> list[int] | None:
    """The window of an adaptive pooling whose output size divides the input (then it is a plain pooling)."""
    sizes = [int(s) for s in x.shape[-2:]]
    out = [int(o) for o in output_size]
    if any(o <= 0 or s % o for s, o in zip(sizes, out, strict=True)):
        return None
    return [s // o for s, o in zip(sizes, out, strict=True)]


def _adaptive_max_pool2d(x: torch.Tensor, output_size: Any) -> Any:
    """adaptive_max_pool2d: max pooling with kernel = stride when the output size divides the input, else the
    windows gathered (:func:`_adaptive_max_gathered`)."""
    if any(int(o) <= 0 for o in output_size) or not x.dtype.is_floating_point:
        return NotImplemented
    k = _adaptive_windows(x, output_size)
    if k is None:
        return _adaptive_max_gathered(x, [int(o) for o in output_size])
    return _max_pool2d_with_indices(x, k, k, [0, 0], [1, 1], False)


def _adaptive_window_rows(size: int, out: int, device: Any) -> tuple[torch.Tensor, int]:
    """Input positions of each output's adaptive window [out, K] (window i spans floor(i*size/out) to
    ceil((i+1)*size/out); shorter windows repeat their last position, which leaves the max and its first
    position unchanged) and K, the longest window."""
    longest = max(-(-(i + 1) * size // out) - (i * size) // out for i in range(out))
    i = torch.arange(out, device=device).unsqueeze(1)
    start = (i * size) // out
    end = ((i + 1) * size + out - 1) // out
    return torch.minimum(start + torch.arange(longest, device=device).unsqueeze(0), end - 1), longest


def _adaptive_max_gathered(x: torch.Tensor, out: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """adaptive_max_pool2d for any output size: every window's elements gathered ([..., oh, ow, kh*kw], rows
    then columns in row-major order), their max, and its flat input position (h * W + w) as the indices."""
    (h, w), (oh, ow) = x.shape[-2:], out
    rows, kh = _adaptive_window_rows(int(h), oh, x.device)
    cols, kw = _adaptive_window_rows(int(w), ow, x.device)
    lead = list(x.shape[:-2])
    win = x.index_select(-2, rows.reshape(-1)).index_select(-1, cols.reshape(-1))  # [..., oh*kh, ow*kw]
    win = win.reshape(*lead, oh, kh, ow, kw).movedim(-3, -2).reshape(*lead, oh, ow, kh * kw)
    values, pick = win.max(-1)
    flat = (rows.view(oh, 1, kh, 1) * int(w) + cols.view(1, ow, 1, kw)).reshape(oh, ow, kh * kw)
    indices = flat.expand(*lead, oh, ow, kh * kw).gather(-1, pick.unsqueeze(-1)).squeeze(-1)
    return values, indices


def _scatter_back(go: torch.Tensor, x: torch.Tensor, indices: torch.Tensor, nsp: int) -> torch.Tensor:
    """Each output gradient added at its input position (``indices`` flat over the ``nsp`` spatial dims)."""
    lead = x.dim() - nsp
    flat = go.new_zeros(*x.shape[:lead], x.shape[lead:].numel())
    return flat.scatter_add(-1, indices.flatten(lead), go.flatten(lead)).view(x.shape)


def _adaptive_max_pool2d_backward(go: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> Any:
    k = _adaptive_windows(x, go.shape[-2:])
    if k is None:  # each output's gradient added at its max's input position
        return _scatter_back(go, x, indices, 2)
    return _max_pool2d_with_indices_backward(go, x, k, k, [0, 0], [1, 1], False, indices)


def _resample(x: torch.Tensor, in_sp: list[int], out_sp: list[int], mode: str, align_corners: bool,
              scales: list[float | None], transpose: bool) -> torch.Tensor:
    """``neuron_compile::resample`` over the 1, 2 or 3 trailing spatial dims of a batched input ([N, C, *sp]).

    1-D runs as H = 1; 3-D as two separable passes: (H, W) on the [N, C x D, H, W] view, then D on
    [N, C, D, H x W] (its W map the identity); ``transpose`` (a backward) applies them in reverse order."""
    if x.dtype == torch.uint8 and mode in ("nearest", "nearest-exact"):  # a uint8 image: each output one input
        # pixel (weight 1.0, so exact through the float kernel)
        return _resample(x.float(), in_sp, out_sp, mode, align_corners, scales, transpose).to(torch.uint8)
    if x.dtype == torch.uint8 and mode in resample_u8.MODES and len(in_sp) == 2 and not transpose:
        out = _resample_uint8(x, in_sp, out_sp, mode, align_corners, (list(scales) + [None, None])[:2])
        if out is not None:
            return out
    nsp = len(in_sp)
    scales = (list(scales) + [None] * nsp)[:nsp]
    if nsp == 1:
        y = RESAMPLE(x.unsqueeze(2), [1, *in_sp], [1, *out_sp], mode, align_corners, [None, *scales], transpose)
        return y.squeeze(2)
    if nsp == 2:
        return RESAMPLE(x, list(in_sp), list(out_sp), mode, align_corners, scales, transpose)
    n, c = x.shape[0], x.shape[1]
    (d, h, w), (od, oh, ow) = in_sp, out_sp
    depth_mode = f"{mode},identity"
    if not transpose:
        y = RESAMPLE(x.reshape(n, c * d, h, w), [h, w], [oh, ow], mode, align_corners, scales[1:], False)
        y = RESAMPLE(y.reshape(n, c, d, oh * ow), [d, oh * ow], [od, oh * ow], depth_mode, align_corners,
                     [scales[0], None], False)
        return y.reshape(n, c, od, oh, ow)
    y = RESAMPLE(x.reshape(n, c, od, oh * ow), [d, oh * ow], [od, oh * ow], depth_mode, align_corners,
                 [scales[0], None], True)
    y = RESAMPLE(y.reshape(n, c * d, oh, ow), [h, w], [oh, ow], mode, align_corners, scales[1:], True)
    return y.reshape(n, c, d, h, w)


def _resample_uint8(x: torch.Tensor, in_sp: list[int], out_sp: list[int], mode: str, align_corners: bool,
                    scales: list[float | None]) -> torch.Tensor | None:
    """eager's uint8 bilinear / bicubic (lowering/resample_u8.py): the width pass, then the height pass, each an
    exact integer sum rounded at its precision and saturated to [0, 255]; None where eager's kernels disagree with
    each other (more than 4 channels to an output width of 1 while the height changes: refused by the lowering)."""
    (h, w), (oh, ow) = in_sp, out_sp
    if (h, w) == (oh, ow):
        return x.clone()
    if x.shape[1] > 4 and ow == 1 and oh != h:
        return None
    y = x.float()
    for dim, n_in, n_out in ((1, w, ow), (0, h, oh)):  # eager's order: horizontal first
        if n_in == n_out:
            continue
        if resample_u8.too_many_taps(mode, n_in, n_out, align_corners, scales[dim]):
            return None
        size_in, size_out = list(y.shape[2:]), list(y.shape[2:])
        size_out[dim] = n_out
        sc = [scales[dim] if d == dim else None for d in (0, 1)]
        # the pass with the weights' high bits, then with their low byte (each sum exact in fp32)
        hi, lo = (RESAMPLE(y, size_in, size_out, ",".join(f"{mode}_u8{part}" if d == dim else "identity" for d in (0, 1)),
                           align_corners, sc, False) for part in ("hi", "lo"))
        _, p = resample_u8.int_weights(mode, n_in, n_out, align_corners, scales[dim])
        total = hi.to(torch.int32) * resample_u8.SPLIT + lo.to(torch.int32) + (1 << (p - 1) if p else 0)
        y = torch.clamp(torch.bitwise_right_shift(total, p), 0, 255).float()
    return y.to(torch.uint8)


def _vec_sizes(x: torch.Tensor, output_size: Any, scale_factors: Any) -> tuple[list[int], list[float | None]]:
    nsp = x.dim() - 2
    if output_size is not None:
        return [int(s) for s in output_size], [None] * nsp
    return ([int(x.shape[2 + i] * float(scale_factors[i])) for i in range(nsp)],
            [float(s) for s in scale_factors])


def _aa_declined(in_hw: list[int], out_hw: list[int]) -> bool:
    """Antialiased resampling to one column while the height changes: eager's CPU kernel repeats its first output
    row down the column (torch 2.13; its backward is the true transpose), so no result can match it."""
    return int(out_hw[-1]) == 1 and int(out_hw[0]) != int(in_hw[0])


def _aa_reason(node: torch.fx.Node) -> str | None:
    x = node.args[0].meta.get("val")
    if isinstance(x, torch.Tensor) and _aa_declined(list(x.shape[2:]), list(node.args[1])):
        return ("antialiased resampling to an output width of 1 while the height changes: eager's CPU kernel "
                "repeats the first output row there, so a compiled result would differ from it; resample the "
                "height first (to [H_out, W_in]), then the width")
    return None


register_declined(_aa_reason, aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default)


def _upsample(mode: str, ac: bool | None) -> dict[str, Callable[..., Any]]:
    """Forward (.default / .vec) and backward decompositions of one upsample mode (ac None: no align_corners arg)."""

    def default(x: torch.Tensor, output_size: Any, *rest: Any) -> torch.Tensor:
        if mode.endswith("_aa") and _aa_declined(list(x.shape[2:]), list(output_size)):
            return NotImplemented
        align, scales = (False, list(rest)) if ac is None else (bool(rest[0]), list(rest[1:]))
        nsp = x.dim() - 2
        scales = (scales + [None] * nsp)[:nsp]
        return _resample(x, list(x.shape[2:]), list(output_size), mode, align, scales, False)

    def vec(x: torch.Tensor, output_size: Any, *rest: Any) -> torch.Tensor:
        align, scale_factors = (False, rest[0]) if ac is None else (bool(rest[0]), rest[1])
        osize, scales = _vec_sizes(x, output_size, scale_factors)
        return _resample(x, list(x.shape[2:]), osize, mode, align, scales, False)

    def backward(go: torch.Tensor, output_size: Any, input_size: Any, *rest: Any) -> torch.Tensor:
        align, scales = (False, list(rest)) if ac is None else (bool(rest[0]), list(rest[1:]))
        nsp = go.dim() - 2
        scales = (scales + [None] * nsp)[:nsp]
        return _resample(go, list(input_size[2:]), list(output_size), mode, align, scales, True)

    return {"default": default, "vec": vec, "backward": backward}


def _batched(nsp: int, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` for an op that also takes an unbatched input ([C, *sp]): run it on [1, C, *sp]."""

    def wrapped(*args: Any) -> torch.Tensor:
        if args[0].dim() == nsp + 2:
            return fn(*args)
        return fn(*(a.unsqueeze(0) if isinstance(a, torch.Tensor) else a for a in args)).squeeze(0)

    return wrapped


def _adaptive_avg_pool(x: torch.Tensor, output_size: Any) -> torch.Tensor:
    return _resample(x, list(x.shape[2:]), [int(s) for s in output_size], "adaptive_avg", False, [], False)


def _adaptive_avg_pool_backward(go: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return _resample(go, list(x.shape[2:]), list(go.shape[2:]), "adaptive_avg", False, [], True)


def _unbatched_only(op: Any, nsp: int) -> Callable[..., Any]:
    """A decomposition that turns an unbatched call of ``op`` into a batched one (NotImplemented otherwise)."""

    def fn(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if x.dim() != nsp + 1:
            return NotImplemented
        rest = [a.unsqueeze(0) if isinstance(a, torch.Tensor) and a.dim() == nsp + 1 else a for a in args]
        return op(x.unsqueeze(0), *rest, **kwargs).squeeze(0)

    return fn


def _avg_pool3d_as_2d(x: torch.Tensor, go: torch.Tensor | None, kernel: Any, stride: Any, padding: Any,
                      ceil_mode: bool, count_pad: bool, divisor: int | None) -> torch.Tensor:
    """avg_pool3d (or its backward when ``go`` is given) whose window is trivial along one spatial dim (kernel 1,
    stride 1, no padding, as LocalResponseNorm's channel window is): that dim joins the channels and the rest is
    avg_pool2d, whose rule exists; any other window runs as two avg_pool2d passes (:func:`_avg_pool3d_separable`)."""
    if x.dim() == 4:
        out = _avg_pool3d_as_2d(x.unsqueeze(0), None if go is None else go.unsqueeze(0), kernel, stride, padding,
                                ceil_mode, count_pad, divisor)
        return out if out is NotImplemented else out.squeeze(0)
    ks = _per_dim(kernel, 3, [])
    st = _per_dim(stride, 3, ks)
    pad = _per_dim(padding, 3, [0, 0, 0])
    trivial = [d for d in (2, 1, 0) if ks[d] == 1 and st[d] == 1 and pad[d] == 0]
    if x.dim() != 5:
        return NotImplemented
    if not trivial:
        return _avg_pool3d_separable(x, go, ks, st, pad, ceil_mode, count_pad, divisor)
    d = trivial[0]
    keep = [i for i in range(3) if i != d]
    perm = [0, 1, 2 + d, 2 + keep[0], 2 + keep[1]]
    inv = [perm.index(i) for i in range(5)]

    def fold(t: torch.Tensor) -> torch.Tensor:
        t = t.permute(perm)
        return t.reshape(t.shape[0], t.shape[1] * t.shape[2], t.shape[3], t.shape[4])

    def unfold(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        p = like.permute(perm)
        return t.reshape(p.shape[0], p.shape[1], p.shape[2], t.shape[2], t.shape[3]).permute(inv)

    k2, s2, p2 = [ks[i] for i in keep], [st[i] for i in keep], [pad[i] for i in keep]
    if go is None:
        y = aten.avg_pool2d.default(fold(x), k2, s2, p2, ceil_mode, count_pad, divisor)
        return unfold(y, x)
    gi = aten.avg_pool2d_backward.default(fold(go), fold(x), k2, s2, p2, ceil_mode, count_pad, divisor)
    return unfold(gi, x)


def _avg_pool3d_separable(x: torch.Tensor, go: torch.Tensor | None, ks: list[int], st: list[int], pad: list[int],
                          ceil_mode: bool, count_pad: bool, divisor: int | None) -> torch.Tensor:
    """avg_pool3d as two avg_pool2d passes: (H, W) on [N, C*D, H, W], then D on [N, C, D, OH*OW]. The window is a
    box, so its divisor (counting padding or not, clipped by ceil_mode) is the product of the per-dim ones; with
    divisor_override the first pass sums (divisor 1) and the second divides."""
    n, c, d, h, w = x.shape
    first = ([ks[1], ks[2]], [st[1], st[2]], [pad[1], pad[2]], ceil_mode, count_pad, 1 if divisor else None)
    second = ([ks[0], 1], [st[0], 1], [pad[0], 0], ceil_mode, count_pad, divisor)
    x1 = x.reshape(n, c * d, h, w)
    y1 = aten.avg_pool2d.default(x1, *first)
    oh, ow = y1.shape[2], y1.shape[3]
    z = y1.reshape(n, c, d, oh * ow)
    if go is None:
        y = aten.avg_pool2d.default(z, *second)
        return y.reshape(n, c, y.shape[2], oh, ow)
    gz = aten.avg_pool2d_backward.default(go.reshape(n, c, go.shape[2], oh * ow), z, *second)
    return aten.avg_pool2d_backward.default(gz.reshape(n, c * d, oh, ow), x1, *first).reshape(x.shape)


def _avg_pool3d(x: torch.Tensor, kernel: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
                count_pad: bool = True, divisor: int | None = None) -> torch.Tensor:
    return _avg_pool3d_as_2d(x, None, kernel, stride, padding, ceil_mode, count_pad, divisor)


def _avg_pool3d_backward(go: torch.Tensor, x: torch.Tensor, kernel: Any, stride: Any, padding: Any,
                         ceil_mode: bool, count_pad: bool, divisor: int | None) -> torch.Tensor:
    return _avg_pool3d_as_2d(x, go, kernel, stride, padding, ceil_mode, count_pad, divisor)


def _replication_pad_backward(go: torch.Tensor, x: torch.Tensor, padding: Any) -> torch.Tensor:
    """replication_padNd_backward: per padded dim (last first), the gradient of the replicated edge rows is summed
    into the first / last input row. Negative (cropping) padding: the vjp of the forward's decomposition."""
    pads = [int(p) for p in padding]
    if any(p < 0 for p in pads):
        from neuron_compile.lowering.decomp_vjp import replication_pad_backward_by_vjp

        return replication_pad_backward_by_vjp(go, x, pads)
    g = go
    for i in range(len(pads) // 2):
        dim, lo, hi = x.dim() - 1 - i, pads[2 * i], pads[2 * i + 1]
        n = x.shape[dim]
        if n == 1:
            g = g.sum(dim, keepdim=True)
            continue
        head = g.narrow(dim, 0, lo + 1).sum(dim, keepdim=True)
        tail = g.narrow(dim, lo + n - 1, hi + 1).sum(dim, keepdim=True)
        parts = [head, g.narrow(dim, lo + 1, n - 2), tail] if n > 2 else [head, tail]
        g = torch.cat(parts, dim)
    return g


def _resample_decompositions() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = {
        aten._adaptive_avg_pool2d.default: _batched(2, _adaptive_avg_pool),
        aten._adaptive_avg_pool2d_backward.default: _batched(2, _adaptive_avg_pool_backward),
        aten._adaptive_avg_pool3d.default: _batched(3, _adaptive_avg_pool),
        aten._adaptive_avg_pool3d_backward.default: _batched(3, _adaptive_avg_pool_backward),
        aten.avg_pool2d.default: _unbatched_only(aten.avg_pool2d.default, 2),
        aten.avg_pool2d_backward.default: _unbatched_only(aten.avg_pool2d_backward.default, 2),
        aten.avg_pool3d.default: _avg_pool3d,
        aten.avg_pool3d_backward.default: _avg_pool3d_backward,
        aten.replication_pad1d_backward.default: _replication_pad_backward,
        aten.replication_pad2d_backward.default: _replication_pad_backward,
        aten.replication_pad3d_backward.default: _replication_pad_backward,
    }
    for mode, ac, fwd, bwd in (
            ("nearest", None, aten.upsample_nearest2d, aten.upsample_nearest2d_backward),
            ("nearest", None, aten.upsample_nearest1d, aten.upsample_nearest1d_backward),
            ("nearest-exact", None, aten._upsample_nearest_exact2d, aten._upsample_nearest_exact2d_backward),
            ("nearest-exact", None, aten._upsample_nearest_exact1d, aten._upsample_nearest_exact1d_backward),
            ("bilinear", True, aten.upsample_bilinear2d, aten.upsample_bilinear2d_backward),
            ("bilinear", True, aten.upsample_linear1d, aten.upsample_linear1d_backward),
            ("bicubic", True, aten.upsample_bicubic2d, aten.upsample_bicubic2d_backward),
            ("bilinear_aa", True, aten._upsample_bilinear2d_aa, aten._upsample_bilinear2d_aa_backward),
            ("bicubic_aa", True, aten._upsample_bicubic2d_aa, aten._upsample_bicubic2d_aa_backward),
            ("nearest", None, aten.upsample_nearest3d, aten.upsample_nearest3d_backward),
            ("nearest-exact", None, aten._upsample_nearest_exact3d, aten._upsample_nearest_exact3d_backward),
            ("bilinear", True, aten.upsample_trilinear3d, aten.upsample_trilinear3d_backward)):
        fns = _upsample(mode, ac)
        table[fwd.default] = fns["default"]
        table[fwd.vec] = fns["vec"]
        table[bwd.default] = fns["backward"]
    return table


def _native_group_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, n: int, c: int,
                       hxw: int, group: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GroupNorm on the [N, G, C/G, HxW] view: mean/var reductions over the last two dims, the per-channel affine
    as a [G, C/G, 1] broadcast, so statistics, normalization and affine are one reduction kernel."""
    acc = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    xg = aten.view.default(acc, [n, group, c // group, hxw])
    mean = aten.mean.dim(xg, [2, 3], True)
    centered = aten.sub.Tensor(xg, mean)
    var = aten.mean.dim(aten.mul.Tensor(centered, centered), [2, 3], True)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    out = aten.mul.Tensor(centered, rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, aten.view.default(weight, [group, c // group, 1]))
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(bias, [group, c // group, 1]))
    out = aten.view.default(out.to(x.dtype), list(x.shape))
    # eager returns the statistics in the input dtype (and its backward reads them rounded)
    return out, aten.view.default(mean, [n, group]).to(x.dtype), aten.view.default(rstd, [n, group]).to(x.dtype)


def crop_windows(gi: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The grad_input of a transposed convolution, a convolution back over grad_output, cut to the input's size:
    with an output_padding of at least the stride it has more windows than the input has positions, and those
    start past the input's last position."""
    for d in range(2, x.dim()):
        if gi.shape[d] > x.shape[d]:
            gi = aten.slice.Tensor(gi, d, 0, x.shape[d])
    return gi


def pad_windows(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int],
                dilation: list[int]) -> torch.Tensor:
    """The input of a transposed convolution, zero-padded at the end to every window the convolution back over
    grad_output has (see :func:`crop_windows`; the added positions contribute nothing to the weight's gradient)."""
    pads: list[int] = []
    for i in reversed(range(x.dim() - 2)):
        windows = (go.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1
        pads += [0, max(windows - x.shape[2 + i], 0)]
    return aten.constant_pad_nd.default(x, pads) if any(pads) else x


def _convolution_backward(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias_sizes: Any, stride: list[int],
                          padding: list[int], dilation: list[int], transposed: bool, output_padding: list[int],
                          groups: int, output_mask: list[bool]) -> Any:
    """convolution_backward as two convolutions' worth of kernels: the grad_input is a convolution running
    the other way (transposed <-> not), the grad_weight a correlation of the input with grad_output."""
    nsp = x.dim() - 2
    if nsp == 3:
        from neuron_compile.lowering.decomp_conv3d import _convolution_backward as conv3d_backward

        return conv3d_backward(go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                               output_mask)
    if nsp not in (1, 2):
        return NotImplemented
    stride, padding, dilation = (list(v) * nsp if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    # one conv kernel can't hold it: the forward was rewritten, and so is its backward
    from neuron_compile.lowering.decomp_bigconv import convolution_backward

    big = convolution_backward(go, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask)
    if big is not NotImplemented:
        return big
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            gi = crop_windows(aten.convolution.default(go, w, None, stride, padding, dilation, False, [0] * nsp,
                                                       groups), x)
        else:
            # the output_padding that makes the transposed convolution come back to the input's size
            op = [x.shape[2 + i] - ((go.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
                                    + dilation[i] * (w.shape[2 + i] - 1) + 1) for i in range(nsp)]
            gi = aten.convolution.default(go, w, None, stride, padding, dilation, True, op, groups)
    if output_mask[1]:
        if transposed:  # y = conv_transpose(x, w) is the grad_input of x = conv(y, w): swap the roles
            gw = CONV_WEIGHT_GRAD(go, pad_windows(go, x, w, stride, padding, dilation), list(w.shape), stride,
                                  padding, dilation, groups)
        else:
            gw = CONV_WEIGHT_GRAD(x, go, list(w.shape), stride, padding, dilation, groups)
    if output_mask[2]:
        gb = aten.sum.dim_IntList(go, [0, *range(2, go.dim())])
    return gi, gw, gb


def conv_decompositions() -> dict[Any, Callable[..., Any]]:
    return {aten.convolution_backward.default: _convolution_backward,
            aten.max_pool2d_with_indices.default: _max_pool2d_with_indices,
            aten.max_pool2d_with_indices_backward.default: _max_pool2d_with_indices_backward,
            aten.native_group_norm.default: _native_group_norm,
            aten.adaptive_max_pool2d.default: _adaptive_max_pool2d,
            aten.adaptive_max_pool2d_backward.default: _adaptive_max_pool2d_backward,
            **_resample_decompositions()}
