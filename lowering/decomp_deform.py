"""torchvision's ``deform_conv2d`` (deformable convolution v1 and v2, ``torchvision.ops.DeformConv2d``) as tensor math.

Like ``roi_align`` (:mod:`neuron_compile.lowering.decomp_roi`), the C++ op is replaced in the Dynamo graph before
AOTAutograd traces it (:mod:`neuron_compile.lowering.torchvision_ops`), so its gradients (input, offsets, mask,
weight, bias) are derived from the math below.

Each output pixel's kernel tap ``(i, j)`` reads the input at ``(oy * stride - pad + i * dilation + dy,
ox * stride - pad + j * dilation + dx)``, where ``(dy, dx)`` is the tap's offset for that pixel (one pair per offset
group of channels), by bilinear interpolation with zeros outside the map, times the tap's mask value (v2). The
sampled "columns" ``[B, C * kh * kw, out_h * out_w]`` are then multiplied by the weight, per weight group, as im2col
convolution does, and the bias added.

The interpolation weighs each of the four neighbouring pixels that lies inside the map, as torchvision's CPU kernel
does; a sample at or beyond a pixel outside the map reads 0 either way. Its derivative in the sample position is
the same one-sided slope (the cell ``[floor(y), floor(y) + 1]``) as torchvision's offset gradient, including at
``y == -1`` exactly, where a zero offset with padding 1 puts the first tap (the usual initialisation of a DCN's
offset branch).
"""

from __future__ import annotations

import torch


def deform_conv2d(x: torch.Tensor, weight: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor,
                  stride_h: int, stride_w: int, pad_h: int, pad_w: int, dil_h: int, dil_w: int, groups: int,
                  offset_groups: int, use_mask: bool) -> torch.Tensor:
    """``torch.ops.torchvision.deform_conv2d``'s arguments, as ``torchvision.ops.deform_conv2d`` passes them; in
    float32 with autocast off (torchvision's autocast rule runs it in float32 and casts the result back)."""
    with torch.autocast("cpu", enabled=False):
        out = _deform_conv2d_fp32(x.float(), weight.float(), offset.float(), mask.float() if use_mask else None,
                                  bias.float(), (stride_h, stride_w), (pad_h, pad_w), (dil_h, dil_w), groups,
                                  offset_groups)
    return out.to(x.dtype)


def _deform_conv2d_fp32(x: torch.Tensor, weight: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None,
                        bias: torch.Tensor, stride: tuple[int, int], pad: tuple[int, int], dil: tuple[int, int],
                        groups: int, offset_groups: int) -> torch.Tensor:
    batch, channels, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    out_h, out_w = offset.shape[2:]
    taps, per_group = kh * kw, channels // offset_groups
    off = offset.reshape(batch, offset_groups, taps, 2, out_h, out_w)
    y = _tap_positions(out_h, stride[0], pad[0], kh, dil[0], kw, rows=True) + off[:, :, :, 0]  # [B, G, K, oh, ow]
    xs = _tap_positions(out_w, stride[1], pad[1], kw, dil[1], kh, rows=False) + off[:, :, :, 1]
    pixels = x.permute(0, 2, 3, 1).reshape(batch, height * width, offset_groups, per_group)  # one gather per pixel
    cols = _bilinear(pixels, y, xs, height, width)  # [B, G, K, oh, ow, C/G]
    if mask is not None:
        cols = cols * mask.reshape(batch, offset_groups, taps, out_h, out_w)[..., None]
    cols = cols.permute(0, 1, 5, 2, 3, 4).reshape(batch, groups, channels // groups * taps, out_h * out_w)
    w = weight.reshape(groups, out_channels // groups, channels // groups * taps)
    out = torch.einsum("gok,bgkl->bgol", w, cols).reshape(batch, out_channels, out_h, out_w)
    return out + bias[:, None, None]


def _tap_positions(size: int, stride: int, pad: int, taps: int, dilation: int, other_taps: int,
                   rows: bool) -> torch.Tensor:
    """``o * stride - pad + t * dilation`` for every output index ``o`` and tap ``t`` of one axis, laid out
    ``[K, oh, 1]`` (rows) or ``[K, 1, ow]`` (columns) over the ``kh * kw`` taps in row-major order."""
    base = torch.arange(size) * stride - pad
    tap = torch.arange(taps) * dilation
    tap = tap.repeat_interleave(other_taps) if rows else tap.repeat(other_taps)
    grid = (base[None, :] + tap[:, None]).float()  # exact integers, added to the offset as eager adds them
    return grid[:, :, None] if rows else grid[:, None, :]


def _bilinear(pixels: torch.Tensor, y: torch.Tensor, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Bilinear samples of ``pixels`` [B, H*W, G, C/G] at ``(y, x)`` [B, G, K, oh, ow]; a neighbour outside the map
    reads 0."""
    y0, x0 = y.floor(), x.floor()
    ly, lx = y - y0, x - x0
    batch_index = torch.arange(pixels.shape[0])[:, None, None, None, None]
    group_index = torch.arange(pixels.shape[2])[None, :, None, None, None]
    total = None
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            row, col = y0 + dy, x0 + dx
            inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
            flat = (row.clamp(0, height - 1) * width + col.clamp(0, width - 1)).long()
            value = torch.where(inside[..., None], pixels[batch_index, flat, group_index], 0.0)
            term = (wy * wx)[..., None] * value
            total = term if total is None else total + term
    return total
