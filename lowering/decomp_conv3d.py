"""3-D convolutions and max pooling as 2-D kernels (video models, Qwen2-VL's patch embedding, 3-D U-Nets).

The depth dim never gets a kernel of its own:

- ``convolution`` (3-D): the depth taps fold into the input channels. Each output depth ``od`` reads input depths
  ``od * sd - pd + kd * dd``; those kD strided depth slices, stacked beside each group's channels, make one 2-D
  convolution over ``[N * OD, groups * kD * C/g, H, W]`` with the weight ``[O, kD * C/g, kH, kW]``, so every
  (depth, height, width) tap is one contraction of the same implicit GEMM.
- transposed 3-D: the depth taps fold into the *output* channels of a transposed 2-D convolution over
  ``[N * D, C, H, W]``; input depth ``id`` and tap ``kd`` land on output depth ``id * sd - pd + kd * dd``, which is
  a zero-stuffing (stride), a shift per tap (pads) and a sum.
- ``convolution_backward`` (3-D): grad_input is the convolution running the other way (both directions above), the
  grad_weight the 2-D weight gradient of the depth-folded forward, unfolded, and grad_bias a sum.
- ``max_pool3d_with_indices``: the (H, W) window first (the 2-D max pool on ``[N, C * D, H, W]`` with its argmax),
  then the depth taps; the pick over depth keeps eager's scan order (depth outermost: the first maximum, the last
  NaN), so values and indices are eager's. Its backward adds each gradient at its index (eager's own rule).
- ``adaptive_max_pool3d``: a max pool when the output divides the input, else every window gathered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from neuron_compile.lowering.decomp_conv import (
    _adaptive_window_rows,
    _per_dim,
    _pool_out,
    _scatter_back,
    crop_windows,
    pad_windows,
)

aten = torch.ops.aten


def _depth_taps(x: torch.Tensor, out_d: int, k: int, s: int, p: int, d: int) -> torch.Tensor:
    """``[N, C, OD, kD, H, W]``: tap ``kd`` of output depth ``od`` is input depth ``od * s - p + kd * d`` of ``x``
    ([N, C, D, H, W]), zero where that depth is padding."""
    depth = x.shape[2]
    need = (out_d - 1) * s + d * (k - 1) + 1  # padded depths the windows span
    xp = aten.constant_pad_nd.default(x, [0, 0, 0, 0, p, max(0, need - depth - p)], 0.0)
    taps = [aten.slice.Tensor(xp, 2, kd * d, kd * d + (out_d - 1) * s + 1, s) for kd in range(k)]
    return torch.stack(taps, 3)


def _fold_depth(x: torch.Tensor, out_d: int, k: int, s: int, p: int, d: int, groups: int) -> torch.Tensor:
    """The 2-D convolution input of a 3-D one: ``[N * OD, groups * kD * C/g, H, W]`` (channels ordered group, tap,
    channel, so a grouped 2-D convolution keeps each group's taps together)."""
    n, c, _, h, w = x.shape
    if k == 1 and s == 1 and p == 0:
        return x.permute(0, 2, 1, 3, 4).reshape(n * out_d, c, h, w)
    t = _depth_taps(x, out_d, k, s, p, d)  # [N, C, OD, kD, H, W]
    t = t.reshape(n, groups, c // groups, out_d, k, h, w).permute(0, 3, 1, 4, 2, 5, 6)
    return t.reshape(n * out_d, groups * k * (c // groups), h, w)


def _fold_weight(w: torch.Tensor) -> torch.Tensor:
    """``[O, C/g, kD, kH, kW]`` -> ``[O, kD * C/g, kH, kW]`` (the tap outer, as :func:`_fold_depth` orders them)."""
    o, cg, k, kh, kw = w.shape
    return w.permute(0, 2, 1, 3, 4).reshape(o, k * cg, kh, kw)


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv3d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: list[int], padding: list[int],
            dilation: list[int], groups: int) -> torch.Tensor:
    n, o = x.shape[0], w.shape[0]
    out_d = _out_size(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0])
    x2 = _fold_depth(x, out_d, w.shape[2], stride[0], padding[0], dilation[0], groups)
    y = aten.convolution.default(x2, _fold_weight(w), None, stride[1:], padding[1:], dilation[1:], False, [0, 0],
                                 groups)
    y = y.reshape(n, out_d, o, y.shape[2], y.shape[3]).permute(0, 2, 1, 3, 4)
    return y if bias is None else y + bias.reshape(o, 1, 1, 1)


def _conv_transpose3d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
                      padding: list[int], dilation: list[int], output_padding: list[int],
                      groups: int) -> torch.Tensor:
    n, cin, depth, h, wd = x.shape
    _, og, k, kh, kw = w.shape
    s, p, d = stride[0], padding[0], dilation[0]
    w2 = w.permute(0, 2, 1, 3, 4).reshape(cin, k * og, kh, kw)  # the depth tap joins each group's outputs
    x2 = x.permute(0, 2, 1, 3, 4).reshape(n * depth, cin, h, wd)
    y = aten.convolution.default(x2, w2, None, stride[1:], padding[1:], dilation[1:], True, output_padding[1:],
                                 groups)
    oh, ow = y.shape[2], y.shape[3]
    y = y.reshape(n, depth, groups, k, og, oh, ow).permute(0, 2, 4, 3, 1, 5, 6)  # [N, g, O/g, kD, D, OH, OW]
    if s > 1:  # input depth i lands on s * i: interleave s - 1 zero depths after each
        y = torch.stack([y, *[torch.zeros_like(y)] * (s - 1)], 5).flatten(4, 5)
        y = aten.slice.Tensor(y, 4, 0, (depth - 1) * s + 1)
    span = (depth - 1) * s + 1
    full = span + d * (k - 1)  # uncropped output depth
    out_d = full - 2 * p + output_padding[0]
    acc = None
    for kd in range(k):  # tap kd shifts by kd * d
        t = aten.select.int(y, 3, kd)
        t = aten.constant_pad_nd.default(t, [0, 0, 0, 0, kd * d, full - span - kd * d], 0.0)
        acc = t if acc is None else acc + t
    acc = aten.constant_pad_nd.default(acc, [0, 0, 0, 0, 0, max(0, output_padding[0] - p)], 0.0)
    acc = aten.slice.Tensor(acc, 3, p, p + out_d)  # [N, g, O/g, OD, OH, OW]
    out = acc.reshape(n, groups * og, out_d, oh, ow)
    return out if bias is None else out + bias.reshape(-1, 1, 1, 1)


def _convolution(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Any, padding: Any,
                 dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Any:
    """aten.convolution: 3-D ones as 2-D kernels; 1-D and 2-D stay for their own lowering rule unless one conv
    kernel can't hold them (:mod:`lowering.decomp_bigconv`)."""
    if x.dim() != 5 or not x.dtype.is_floating_point or w.dim() != 5:
        from neuron_compile.lowering.decomp_bigconv import convolution

        return convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    st, pad, dil = _per_dim(stride, 3, [1, 1, 1]), _per_dim(padding, 3, [0, 0, 0]), _per_dim(dilation, 3, [1, 1, 1])
    if transposed:
        return _conv_transpose3d(x, w, bias, st, pad, dil, _per_dim(output_padding, 3, [0, 0, 0]), groups)
    return _conv3d(x, w, bias, st, pad, dil, groups)


def _conv3d_weight_grad(x: torch.Tensor, go: torch.Tensor, weight_size: list[int], stride: list[int],
                        padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """grad_weight of ``go = conv3d(x, w)``: the 2-D weight gradient of the depth-folded convolution, unfolded."""
    from neuron_compile.lowering.decomp_conv import CONV_WEIGHT_GRAD

    o, cg, k, kh, kw = weight_size
    n, out_d = go.shape[0], go.shape[2]
    x2 = _fold_depth(x, out_d, k, stride[0], padding[0], dilation[0], groups)
    go2 = go.permute(0, 2, 1, 3, 4).reshape(n * out_d, o, go.shape[3], go.shape[4])
    gw = CONV_WEIGHT_GRAD(x2, go2, [o, k * cg, kh, kw], stride[1:], padding[1:], dilation[1:], groups)
    return gw.reshape(o, k, cg, kh, kw).permute(0, 2, 1, 3, 4)


def _convolution_backward(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias_sizes: Any, stride: Any,
                          padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
                          output_mask: list[bool]) -> Any:
    st, pad, dil = _per_dim(stride, 3, [1, 1, 1]), _per_dim(padding, 3, [0, 0, 0]), _per_dim(dilation, 3, [1, 1, 1])
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            gi = crop_windows(_conv3d(go, w, None, st, pad, dil, groups), x)
        else:  # the output_padding that brings the transposed convolution back to the input's size
            op = [x.shape[2 + i] - ((go.shape[2 + i] - 1) * st[i] - 2 * pad[i] + dil[i] * (w.shape[2 + i] - 1) + 1)
                  for i in range(3)]
            gi = _conv_transpose3d(go, w, None, st, pad, dil, op, groups)
    if output_mask[1]:  # a transposed convolution's weight is that of the convolution running back
        a, b = (go, pad_windows(go, x, w, st, pad, dil)) if transposed else (x, go)
        gw = _conv3d_weight_grad(a, b, list(w.shape), st, pad, dil, groups)
    if output_mask[2]:
        gb = aten.sum.dim_IntList(go, [0, 2, 3, 4])
    return gi, gw, gb


def _pick_depth(v: torch.Tensor, dim: int) -> torch.Tensor:
    """Per position, the tap along ``dim`` eager's scan picks: the last NaN if any, else the first maximum."""
    k = v.shape[dim]
    shape = [1] * v.dim()
    shape[dim] = k
    pos = torch.arange(k, device=v.device).reshape(shape)
    nan = torch.isnan(v)
    last_nan = torch.where(nan, pos, -1).amax(dim)
    clean = torch.where(nan, float("-inf"), v)
    first_max = torch.where(clean == clean.amax(dim, keepdim=True), pos, k).amin(dim)
    return torch.where(last_nan >= 0, last_nan, first_max)


def _window_depths(out_d: int, k: int, s: int, p: int, d: int, depth: int, device: Any) -> torch.Tensor:
    """``[OD * kD]`` input depths of each pooling window's taps (arange arithmetic, so it traces as a graph
    constant). A tap outside the input repeats the window's first or last depth inside it: eager never reads
    padding, and a repeat changes neither the first maximum nor the last NaN."""
    base = torch.arange(out_d, device=device).unsqueeze(1) * s - p  # [OD, 1]
    taps = base + torch.arange(k, device=device).unsqueeze(0) * d  # [OD, kD]
    lo = base + (torch.clamp(-base, min=0) + d - 1) // d * d
    hi = base + torch.clamp((depth - 1 - base) // d, max=k - 1) * d
    return torch.minimum(torch.maximum(taps, lo), hi).reshape(-1)


def _max_pool3d_with_indices(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                             dilation: Any = 1, ceil_mode: bool = False) -> Any:
    if x.dim() == 4:  # unbatched [C, D, H, W]
        v, i = _max_pool3d_with_indices(x.unsqueeze(0), kernel_size, stride, padding, dilation, ceil_mode)
        return v.squeeze(0), i.squeeze(0)
    if x.dim() != 5 or not x.dtype.is_floating_point:
        return NotImplemented
    ks = _per_dim(kernel_size, 3, [1, 1, 1])
    st, pad, dil = _per_dim(stride, 3, ks), _per_dim(padding, 3, [0, 0, 0]), _per_dim(dilation, 3, [1, 1, 1])
    n, c, depth, h, w = x.shape
    v2, i2 = aten.max_pool2d_with_indices.default(x.reshape(n, c * depth, h, w), ks[1:], st[1:], pad[1:], dil[1:],
                                                  ceil_mode)
    oh, ow = v2.shape[2], v2.shape[3]
    v2, i2 = v2.reshape(n, c, depth, oh, ow), i2.reshape(n, c, depth, oh, ow)
    out_d = _pool_out(depth, ks[0], st[0], pad[0], dil[0], ceil_mode)
    flat = _window_depths(out_d, ks[0], st[0], pad[0], dil[0], depth, x.device)
    tv = aten.index_select.default(v2, 2, flat).reshape(n, c, out_d, ks[0], oh, ow)
    ti = aten.index_select.default(i2, 2, flat).reshape(n, c, out_d, ks[0], oh, ow)
    pick = _pick_depth(tv, 3).unsqueeze(3)
    values = tv.gather(3, pick).squeeze(3)
    depth_of = flat.reshape(1, 1, out_d, ks[0], 1, 1).expand(n, c, out_d, ks[0], oh, ow)
    index = depth_of.gather(3, pick).squeeze(3) * (h * w) + ti.gather(3, pick).squeeze(3)
    return values, index


def _max_pool3d_with_indices_backward(go: torch.Tensor, x: torch.Tensor, kernel_size: Any, stride: Any,
                                      padding: Any, dilation: Any, ceil_mode: bool, indices: torch.Tensor) -> Any:
    return _scatter_back(go, x, indices, 3)


def _adaptive_max_pool3d(x: torch.Tensor, output_size: Any) -> Any:
    """adaptive_max_pool3d: a max pool (kernel = stride) when the output divides the input, else every window's
    elements gathered ([..., od, oh, ow, kd*kh*kw] in eager's scan order) and the eager pick over them."""
    out = [int(o) for o in output_size]
    if any(o <= 0 for o in out) or not x.dtype.is_floating_point or x.dim() not in (4, 5):
        return NotImplemented
    sizes = [int(s) for s in x.shape[-3:]]
    if all(s % o == 0 for s, o in zip(sizes, out, strict=True)):
        k = [s // o for s, o in zip(sizes, out, strict=True)]
        return _max_pool3d_with_indices(x, k, k, [0, 0, 0], [1, 1, 1], False)
    (d, h, w), (od, oh, ow) = sizes, out
    deps, kd = _adaptive_window_rows(d, od, x.device)
    rows, kh = _adaptive_window_rows(h, oh, x.device)
    cols, kw = _adaptive_window_rows(w, ow, x.device)
    lead = list(x.shape[:-3])
    win = x.index_select(-3, deps.reshape(-1)).index_select(-2, rows.reshape(-1)).index_select(-1, cols.reshape(-1))
    win = win.reshape(*lead, od, kd, oh, kh, ow, kw)
    nl = len(lead)
    win = win.permute(*range(nl), nl, nl + 2, nl + 4, nl + 1, nl + 3, nl + 5).reshape(*lead, od, oh, ow, kd * kh * kw)
    pick = _pick_depth(win, -1).unsqueeze(-1)
    flat = (deps.view(od, 1, 1, kd, 1, 1) * (h * w) + rows.view(1, oh, 1, 1, kh, 1) * w
            + cols.view(1, 1, ow, 1, 1, kw)).reshape(od, oh, ow, kd * kh * kw)
    indices = flat.expand(*lead, od, oh, ow, kd * kh * kw).gather(-1, pick).squeeze(-1)
    return win.gather(-1, pick).squeeze(-1), indices


def _adaptive_max_pool3d_backward(go: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> Any:
    return _scatter_back(go, x, indices, 3)


CONV3D: dict[Any, Callable[..., Any]] = {
    aten.convolution.default: _convolution,
    aten.max_pool3d_with_indices.default: _max_pool3d_with_indices,
    aten.max_pool3d_with_indices_backward.default: _max_pool3d_with_indices_backward,
    aten.adaptive_max_pool3d.default: _adaptive_max_pool3d,
    aten.adaptive_max_pool3d_backward.default: _adaptive_max_pool3d_backward,
}
