"""grid_sampler_3d (``F.grid_sample`` on 5-D inputs: volumetric warps, 3-D spatial transformers) as gathers.

Each output point's source coordinate along x (W), y (H) and z (D) is unnormalized from [-1, 1] as eager does
(``align_corners`` maps -1 and 1 to the corner pixels' centres, otherwise to their outer edges), then padded:
clipped to [0, size - 1] (border), or reflected about the borders (align_corners) / pixel edges and clipped
(reflection). Trilinear mode reads the 8 surrounding voxels with eager's weights (a corner outside the volume reads
0, the zeros padding); nearest mode reads the voxel at the coordinate rounded half to even. All corners are read by
one row gather from the volume laid out as one row of channels per voxel. The backward is the vjp of this decomposition (lowering/decomp_vjp.py).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def source_coordinate(c: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """The source pixel coordinate of normalized ``c`` along a dim of ``size``, with eager's padding modes
    (0 zeros: as is, 1 border: clipped, 2 reflection: reflected, then clipped)."""
    u = (c + 1) / 2 * (size - 1) if align_corners else ((c + 1) * size - 1) / 2
    if padding_mode == 0:
        return u
    if padding_mode == 2:
        low, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
        if span <= 0:
            return torch.zeros_like(u)
        d = (u - low).abs()
        extra = torch.fmod(d, span)
        flips = torch.floor(d / span)
        u = torch.where(torch.fmod(flips, 2) == 0, extra + low, span + low - extra)
    return torch.clamp(u, 0, size - 1)


def grid_sampler_3d(x: torch.Tensor, grid: torch.Tensor, interpolation_mode: int = 0, padding_mode: int = 0,
                    align_corners: bool = False) -> Any:
    """aten.grid_sampler_3d for trilinear (0) and nearest (1) interpolation (eager has no bicubic in 3-D)."""
    if interpolation_mode not in (0, 1):
        return NotImplemented
    n, c, d, h, w = x.shape
    od, oh, ow = grid.shape[1:4]
    out_dtype = x.dtype
    if x.numel() == 0 or grid.numel() == 0:
        return torch.zeros(n, c, od, oh, ow, dtype=out_dtype)
    acc = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    table = x.to(acc).permute(0, 2, 3, 4, 1).reshape(n * d * h * w, c)  # one row of channels per voxel
    sizes = (w, h, d)
    src = [source_coordinate(grid[..., k].to(acc), size, padding_mode, align_corners) for k, size in enumerate(sizes)]
    batch = torch.arange(n, dtype=torch.int64).reshape(n, 1, 1, 1) * (d * h * w)
    if interpolation_mode == 1:
        corners = [[torch.round(s) for s in src]]
        weights: list[torch.Tensor | None] = [None]
    else:
        low = [torch.floor(s) for s in src]
        corners, weights = [], []
        for corner in range(8):
            bits = [(corner >> k) & 1 for k in range(3)]
            corners.append([lo + b for lo, b in zip(low, bits, strict=True)])
            weight = None
            for s_, lo, b in zip(src, low, bits, strict=True):
                f = s_ - lo if b else lo + 1 - s_
                weight = f if weight is None else weight * f
            weights.append(weight)
    rows, inside = [], []
    for at in corners:  # the voxel row of every corner, clamped into the volume (a corner outside reads 0)
        inside.append((at[0] >= 0) & (at[0] <= w - 1) & (at[1] >= 0) & (at[1] <= h - 1) & (at[2] >= 0)
                      & (at[2] <= d - 1))
        ix, iy, iz = (torch.clamp(a, 0, size - 1).to(torch.int64) for a, size in zip(at, sizes, strict=True))
        rows.append((batch + (iz * h + iy) * w + ix).reshape(-1))
    vals = torch.index_select(table, 0, torch.cat(rows)).reshape(len(corners), n, od, oh, ow, c)  # one gather
    out = None
    for k, (ok, weight) in enumerate(zip(inside, weights, strict=True)):
        term = torch.where(ok.unsqueeze(-1), vals[k], 0)
        if weight is not None:
            term = term * weight.unsqueeze(-1)
        out = term if out is None else out + term
    return out.permute(0, 4, 1, 2, 3).to(out_dtype)  # type: ignore[union-attr]


GRID3D = {aten.grid_sampler_3d.default: grid_sampler_3d}
