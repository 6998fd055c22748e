"""torchvision's ``roi_align`` (Mask/Faster/Keypoint R-CNN's box heads, ``MultiScaleRoIAlign``) as tensor math.

``torch.ops.torchvision.roi_align`` is a C++ custom op with its own autograd, so, like ``F.interpolate``
(:func:`neuron_compile.lowering.decomp_conv.rewrite_interpolate`), the Dynamo graph's call is replaced before
AOTAutograd traces it: by :func:`roi_align`, which samples each box's bins with bilinear gathers and whose
gradient (a scatter-add into the feature map) AOTAutograd derives. The box coordinates get no gradient, as in
torchvision.

The sampling follows torchvision's CPU kernel: box ``k`` covers ``[x1, x2] x [y1, y2]`` times ``spatial_scale``
(minus half a pixel when ``aligned``; at least one pixel wide and high when not), cut into ``PH x PW`` bins; each
bin averages ``g x g`` bilinear samples at ``start + p * bin + (i + 0.5) * bin / g``. A sample beyond one pixel
outside the map reads 0; one in the border pixel clamps to it.

Only a fixed grid (``sampling_ratio > 0``, the torchvision detection models' 2) compiles: an adaptive grid
(``<= 0``) takes ``ceil(box size / bins)`` samples, a count the box values decide, so it is refused by name.
"""

from __future__ import annotations

from typing import Any

import torch
from neuron_compile.lowering.registry import register_declined
from torch import fx


def _sample_axis(start: torch.Tensor, size: torch.Tensor, bins: int, grid: int, extent: int) -> tuple[Any, ...]:
    """One axis of every box's sample grid [K, bins * grid]: the low and high pixel, their weights, and whether
    the sample reads the map at all (torchvision: not beyond -1 or ``extent``)."""
    bin_size = size / bins
    p = torch.arange(bins, dtype=start.dtype).repeat_interleave(grid)  # bin of each sample
    i = torch.arange(grid, dtype=start.dtype).repeat(bins) + 0.5  # place in its bin
    pos = start[:, None] + p * bin_size[:, None] + i * bin_size[:, None] / grid
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
    """``torchvision.ops.roi_align`` for ``x`` [N, C, H, W] and ``rois`` [K, 5] (batch index, x1, y1, x2, y2)."""
    _, channels, height, width = x.shape
    rois = rois.detach().to(x.dtype)
    g = int(sampling_ratio)
    shift = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (rois[:, c] * spatial_scale - shift for c in (1, 2, 3, 4))
    w, h = x2 - x1, y2 - y1
    if not aligned:  # the legacy boxes are at least one pixel
        w, h = w.clamp(min=1.0), h.clamp(min=1.0)
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


def _roi_align_targets() -> dict[Any, Any]:
    ops = getattr(torch.ops, "torchvision", None)
    if ops is None or not hasattr(ops, "roi_align"):
        return {}
    return {ops.roi_align: roi_align, ops.roi_align.default: roi_align}


def _adaptive_grid(node: fx.Node) -> str:
    return ("an adaptive sampling grid (sampling_ratio <= 0) takes ceil(box size / bins) samples per bin, a count "
            "the box values decide; pass a fixed sampling_ratio > 0 (torchvision's detection models use 2), or run "
            "this op eagerly")


def rewrite_roi_align(gm: fx.GraphModule) -> fx.GraphModule:
    """Point the Dynamo graph's fixed-grid ``torchvision.roi_align`` calls at :func:`roi_align` (in place)."""
    targets = _roi_align_targets()
    if not targets:
        return gm
    register_declined(_adaptive_grid, torchvision_op := torch.ops.torchvision.roi_align.default)
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in targets:
            continue
        ratio = node.args[5] if len(node.args) > 5 else node.kwargs.get("sampling_ratio")
        fixed = isinstance(ratio, int) and ratio > 0 and not node.kwargs
        node.target = roi_align if fixed else torchvision_op  # the overload is refused by name, with why
        changed = True
    if changed:
        gm.recompile()
    return gm
