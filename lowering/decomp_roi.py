"""torchvision's ``roi_align`` (Mask/Faster/Keypoint R-CNN's box heads, ``MultiScaleRoIAlign``) as tensor math.

``torch.ops.torchvision.roi_align`` is a C++ custom op with its own autograd, so the Dynamo graph's call is replaced
before AOTAutograd traces it (:mod:`neuron_compile.lowering.torchvision_ops`): by :func:`roi_align`, which samples each box's bins with bilinear gathers and whose
gradient (a scatter-add into the feature map) AOTAutograd derives. The box coordinates get no gradient, as in
torchvision.

The sampling follows torchvision's CPU kernel: box ``k`` covers ``[x1, x2] x [y1, y2]`` times ``spatial_scale``
(minus half a pixel when ``aligned``; at least one pixel wide and high when not), cut into ``PH x PW`` bins; each
bin averages ``g x g`` bilinear samples at ``start + p * bin + (i + 0.5) * bin / g``. A sample beyond one pixel
outside the map reads 0; one in the border pixel clamps to it.

A fixed grid (``sampling_ratio > 0``, the R-CNN box heads' 2) gathers the four pixels of every sample. An adaptive
grid (``<= 0``: Mask R-CNN's mask targets, Detectron2's ROIAlignV2) takes ``g = ceil(box size / bins)`` samples
per bin, a count the box values decide, so it is computed without enumerating samples: bilinear sampling is
separable, so a bin's average is ``Wy @ image @ Wx^T / (gy * gx)``, where ``Wy[p, r]`` sums the weights the bin's
row samples give pixel row ``r``. Samples are at most a pixel apart once there are two or more (``g > 1`` means
``bin / g`` is above 1/2), so at most five of them weigh on a row, found from the row's position: a fixed window of
samples per row, however many the bin has.

Sample positions use eager's quotients exactly (:func:`~neuron_compile.lowering.exact_float.ieee_divide`): which
samples a bin has and which land inside the map are decided by them, and integer boxes hit those edges exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from neuron_compile.lowering.exact_float import ieee_divide


def _sample_axis(start: torch.Tensor, size: torch.Tensor, bins: int, grid: int, extent: int) -> tuple[Any, ...]:
    """One axis of every box's sample grid [K, bins * grid]: the low and high pixel, their weights, and whether
    the sample reads the map at all (torchvision: not beyond -1 or ``extent``)."""
    bin_size = ieee_divide(size, bins)
    p = torch.arange(bins, dtype=start.dtype).repeat_interleave(grid)  # bin of each sample
    i = torch.arange(grid, dtype=start.dtype).repeat(bins) + 0.5  # place in its bin
    pos = start[:, None] + p * bin_size[:, None] + ieee_divide(i * bin_size[:, None], grid)  # eager's order
    inside = (pos >= -1.0) & (pos <= extent)
    pos = pos.clamp(min=0)
    low = pos.floor()
    edge = low >= extent - 1
    low = torch.where(edge, float(extent - 1), low)
    high = torch.where(edge, low, low + 1)
    frac = torch.where(edge, 0.0, pos - low)
    return low.long(), high.long(), 1.0 - frac, frac, inside


def roi_align(x: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
              sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """``torchvision.ops.roi_align`` for ``x`` [N, C, H, W] and ``rois`` [K, 5] (batch index, x1, y1, x2, y2), in
    float32 with autocast off (torchvision's autocast rule runs it in float32 and casts the result back)."""
    with torch.autocast("cpu", enabled=False):
        out = _roi_align_fp32(x.float(), rois.detach().float(), spatial_scale, pooled_height, pooled_width,
                              sampling_ratio, aligned)
    return out.to(x.dtype)


def _roi_align_fp32(x: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                    pooled_width: int, sampling_ratio: int, aligned: bool) -> torch.Tensor:
    _, channels, height, width = x.shape
    g = int(sampling_ratio)
    shift = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (rois[:, c] * spatial_scale - shift for c in (1, 2, 3, 4))
    w, h = x2 - x1, y2 - y1
    if not aligned:  # the legacy boxes are at least one pixel
        w, h = w.clamp(min=1.0), h.clamp(min=1.0)
    if g <= 0:
        return _roi_align_adaptive(x, rois, pooled_height, pooled_width, x1, y1, w, h)
    y_lo, y_hi, y_wlo, y_whi, y_in = _sample_axis(y1, h, pooled_height, g, height)
    x_lo, x_hi, x_wlo, x_whi, x_in = _sample_axis(x1, w, pooled_width, g, width)
    channels_last = x.permute(0, 2, 3, 1)  # [N, H, W, C]: one gather per corner reads whole pixels
    batch = rois[:, 0].long()[:, None, None]  # eager truncates the float batch index

    def corner(ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:  # [K, PH*g, PW*g, C]
        return channels_last[batch, ys[:, :, None], xs[:, None, :]]

    def weight(wy: torch.Tensor, wx: torch.Tensor) -> torch.Tensor:
        return (wy[:, :, None] * wx[:, None, :])[..., None]

    val = (weight(y_wlo, x_wlo) * corner(y_lo, x_lo) + weight(y_wlo, x_whi) * corner(y_lo, x_hi)
           + weight(y_whi, x_wlo) * corner(y_hi, x_lo) + weight(y_whi, x_whi) * corner(y_hi, x_hi))
    val = torch.where((y_in[:, :, None] & x_in[:, None, :])[..., None], val, 0.0)
    k = rois.shape[0]
    val = val.reshape(k, pooled_height, g, pooled_width, g, channels).sum((2, 4)) / max(g * g, 1)
    return val.permute(0, 3, 1, 2)


def _row_weights(start: torch.Tensor, size: torch.Tensor, bins: int, extent: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One axis of an adaptive grid: ``W`` [K, bins, extent], the summed bilinear weight every bin's samples give
    each pixel row, and the per-box sample count ``g`` [K] (``ceil(size / bins)``, 0 for an empty box)."""
    bin_size = ieee_divide(size, bins)  # [K]
    g = torch.ceil(bin_size)
    step = torch.where(g > 0, bin_size / g.clamp(min=1), 1.0)[:, None, None, None]
    first = (start[:, None] + torch.arange(bins, dtype=start.dtype) * bin_size[:, None])[:, :, None, None]  # bin's 0
    r = torch.arange(extent, dtype=start.dtype)[None, None, :, None]
    lowest = torch.where(r == 0, -1.0, r - 1)  # the first position that weighs on row r (-1 clamps to row 0)
    i0 = (torch.floor((lowest - first) / step - 0.5) - 1).clamp(min=0)  # one sample early, for rounding
    i = i0 + torch.arange(_WINDOW, dtype=start.dtype)  # [K, bins, extent, window]
    pos = first + ieee_divide((i + 0.5) * bin_size[:, None, None, None], g.clamp(min=1)[:, None, None, None])
    used = (i < g[:, None, None, None]) & (pos >= -1.0) & (pos <= extent)
    tent = (1.0 - (pos.clamp(0, extent - 1) - r).abs()).clamp(min=0)
    return torch.where(used, tent, 0.0).sum(-1), g


_WINDOW = 7  # samples whose weight on one row can be non-zero: at most 5 (1/2 apart over 2 pixels), plus rounding


_GATHER_LIMIT = 1 << 24  # elements of per-box image copies always worth gathering


def _roi_align_adaptive(x: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
                        x1: torch.Tensor, y1: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The adaptive grid as ``Wy @ image @ Wx^T / count`` per box. With one image every box reads it; when a copy
    of each box's image is no bigger than the batch (Mask R-CNN's mask targets: one box per mask) or small, the
    images are gathered; otherwise each box's row weights are spread over the batch (zero outside its own image) and
    one contraction over (image, row) reads the batch once, at the cost of multiplying by the zeros."""
    n, c, height, width = x.shape
    k = rois.shape[0]
    wy, gy = _row_weights(y1, h, pooled_height, height)  # [K, PH, H]
    wx, gx = _row_weights(x1, w, pooled_width, width)  # [K, PW, W]
    batch = rois[:, 0].long()
    if n == 1:
        rows = torch.einsum("kpr,crw->kcpw", wy, x[0])
    elif k * c * height * width <= max(2 * x.numel(), _GATHER_LIMIT):
        rows = torch.einsum("kpr,kcrw->kcpw", wy, x[batch])
    else:
        own = (batch[:, None] == torch.arange(n))[:, None, :, None]  # [K, 1, N, 1]
        rows = torch.einsum("kpnr,ncrw->kcpw", torch.where(own, wy[:, :, None, :], 0.0), x)
    pooled = torch.einsum("kcpw,kqw->kcpq", rows, wx)
    return pooled / (gy * gx).clamp(min=1)[:, None, None, None]
