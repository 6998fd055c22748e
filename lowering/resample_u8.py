"""uint8 bilinear and bicubic resampling as eager's CPU kernels compute it: integer weights, one rounding per pass.

For a uint8 image eager does not resample in float. Each separable pass (the width first, then the height) uses
the pass's double-precision weights scaled to int16 at a precision ``p`` (the largest ``p <= 22`` with the largest
weight times ``2^p``, rounded, under ``2^15``; each weight rounded half away from zero), sums ``weight * pixel`` as
integers, adds ``2^(p-1)``, shifts right by ``p`` and saturates to [0, 255]. The result differs from rounding the
float resampling by one in places (bicubic more: its overshoot saturates between passes).

The compiled form keeps those integer sums exact: the float resample kernel runs each pass twice, once with the
weights' high bits (``w // 256``) and once with their low byte, each sum exact in fp32, and the two are combined,
rounded and saturated in int32 (:func:`lowering.decomp_conv._resample_uint8`). The double weights come from eager's
own kernel applied to a basis in float64 (the same double computation its uint8 path makes): :func:`eager_matrix`,
which also gives the float kernel its float32 weights.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch._dispatch.python import no_python_dispatcher
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten

MODES = ("bilinear", "bicubic", "bilinear_aa", "bicubic_aa")
SPLIT = 256  # the weights' low byte: both partial sums stay exact in fp32 (|w // 256| < 2^7, w % 256 < 2^8)
MAX_TAPS = (1 << 24) // (255 * SPLIT)  # taps per output beyond which a low-byte sum could round in fp32


def eager_matrix(mode: str, in_n: int, out_n: int, align_corners: bool, scale: float | None,
                 dtype: torch.dtype) -> np.ndarray:
    """``A[out_n, in_n]`` of one spatial dim: eager's own kernel applied to the basis of ``in_n`` positions, in
    ``dtype`` (float32 for the float resample kernel, float64 for the uint8 weights, which eager computes in
    double)."""
    basis = torch.eye(in_n, dtype=dtype).reshape(1, in_n, in_n, 1)
    if mode == "nearest":
        y = aten.upsample_nearest2d.default(basis, [out_n, 1], scale, None)
    elif mode == "nearest-exact":
        y = aten._upsample_nearest_exact2d.default(basis, [out_n, 1], scale, None)
    elif mode == "bilinear":
        y = aten.upsample_bilinear2d.default(basis, [out_n, 1], align_corners, scale, None)
    elif mode == "bicubic":
        y = aten.upsample_bicubic2d.default(basis, [out_n, 1], align_corners, scale, None)
    elif mode in ("bilinear_aa", "bicubic_aa"):  # antialiased (PIL-style, separable): the other dim 2 -> 2 is an
        # identity (eager's antialiased kernels mishandle a 1 -> 1 dim, so the basis is two columns wide)
        op = aten._upsample_bilinear2d_aa if mode == "bilinear_aa" else aten._upsample_bicubic2d_aa
        y = op.default(basis.expand(1, in_n, in_n, 2).contiguous(), [out_n, 2], align_corners, scale, None)[..., :1]
    elif mode == "adaptive_avg":
        y = aten._adaptive_avg_pool2d.default(basis, [out_n, 1])
    elif mode == "identity":
        return np.eye(in_n, dtype=np.float32 if dtype == torch.float32 else np.float64)
    else:
        raise ValueError(f"unknown resample mode {mode!r}")
    return y[0, :, :, 0].t().contiguous().numpy()


@functools.lru_cache(maxsize=128)
def int_weights(mode: str, in_n: int, out_n: int, align_corners: bool, scale: float | None
                ) -> tuple[np.ndarray, int]:
    """(``W[out_n, in_n]`` as integers, precision ``p``) of one pass, as eager's uint8 kernel scales them."""
    with _disable_current_modes(), no_python_dispatcher():
        w = eager_matrix(mode, in_n, out_n, align_corners, scale, torch.float64)
    top = float(w.max())
    p = 0
    while p < 22 and int(0.5 + top * (1 << (p + 1))) < (1 << 15):
        p += 1
    v = w * (1 << p)
    ints = np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int64)
    ints.setflags(write=False)
    return ints, p


def part_matrix(mode: str, in_n: int, out_n: int, align_corners: bool, scale: float | None) -> np.ndarray:
    """The float32 matrix of a resample mode ``<mode>_u8hi`` (the weights' ``w // 256``) or ``<mode>_u8lo``
    (``w % 256``)."""
    base, part = mode[:-5], mode[-2:]
    ints, _ = int_weights(base, in_n, out_n, align_corners, scale)
    hi = np.floor_divide(ints, SPLIT)
    return (hi if part == "hi" else ints - hi * SPLIT).astype(np.float32)


def too_many_taps(mode: str, in_n: int, out_n: int, align_corners: bool, scale: float | None) -> bool:
    ints, _ = int_weights(mode, in_n, out_n, align_corners, scale)
    return int((ints != 0).sum(axis=1).max(initial=0)) > MAX_TAPS
