"""Template context of the template-kernel families: convolution, its weight gradient, pooling/resampling.

Input: a :class:`~neuron_compile.lowering.ir.ConvKernel` (or another kind in :data:`TEMPLATE_KERNELS`);
output: the variables its ``<family>.nki.j2`` template reads. The template *is* the kernel; this module only
derives plain numbers from the IR (offset ranges of the taps, the largest phase, tile dtypes). Hardware
limits come from ``simulator_limits``.
"""

from __future__ import annotations

import logging
from typing import Any

from neuron_compile.lowering.ir import ConvKernel, ConvWgradKernel, PoolKernel, ResampleKernel

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

MATMUL_N = 512  # fp32 elements of one PSUM bank per partition: the moving free size of one matmul
PSUM_BANK_BYTES = 2048

TEMPLATE_KERNELS: tuple[type, ...] = (ConvKernel, ConvWgradKernel, PoolKernel, ResampleKernel)


def tap_range(phases: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]) -> tuple[int, int]:
    """(lowest, highest) input offset over every tap of every phase ((0, 0) when no phase has a tap)."""
    offs = [off for _, _, taps in phases for _, off in taps]
    return (min(offs), max(offs)) if offs else (0, 0)


ZERO_TILE_ELEMS = 8192  # elements per partition of the zero tile that pads a tap-packed conv's HBM scratch


def _tap_step(phases: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]) -> int:
    """Input offset between consecutive taps of a single-phase dim (its dilation)."""
    taps = phases[0][2]
    return taps[1][1] - taps[0][1] if len(taps) > 1 else 1


def _itemsize(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def conv_context(k: ConvKernel) -> dict[str, Any]:
    ci_major = k.w.strides[2] > k.w.strides[1]
    lo_h, hi_h = tap_range(k.phases_h)
    lo_w, hi_w = tap_range(k.phases_w)
    nb, _, rb, cb = k.block
    return {
        "qh": max(q for _, q, _ in k.phases_h), "qw": max(q for _, q, _ in k.phases_w),
        "lo_h": lo_h, "hi_h": hi_h, "lo_w": lo_w, "hi_w": hi_w,
        "nbp": max(1, min(nb, MATMUL_N // (rb * cb))),
        # whole-tile steps after the eviction run in fp32; otherwise the eviction rounds to the output dtype
        "stage_dtype": "float32" if k.post else k.outputs[0].dtype,
        # weights whose C_in stride exceeds the C_out stride (transposed-conv layout) load C_in-major directly
        "w_ci_major": ci_major,
        "stationary": ("w_sb[it][:, :, kh * KW + kw]" if k.gpp > 1 and k.cin_g == 1 else
                       "w_sb[it][:, kh, kw, :]" if k.gpp > 1 else "w_sb[it][:, :, kh, kw]" if ci_major
                       else "w_sb[it][:, kh * KW + kw, :]"),
        "taps_per_bank": max(1, PSUM_BANK_BYTES // (min(PMAX, k.gpp * k.cout_g) * _itemsize(k.compute_dtype))),
        # tap packing (k.tap_rows): padding (the input goes through a zero-padded HBM scratch) and dilation
        "pad": (-lo_h, -lo_w), "dil": tuple(_tap_step(ph) for ph in (k.phases_h, k.phases_w)),
        "scratch": bool(k.tap_rows and (lo_h < 0 or lo_w < 0)), "cp": min(PMAX, k.groups * k.cin_g),
        "zero_images": max(1, ZERO_TILE_ELEMS // max(-lo_h * (k.in_hw[1] - 2 * lo_w), -lo_w * k.in_hw[0], 1)),
    }


def template_context(kernel: Any) -> dict[str, Any]:
    if isinstance(kernel, ConvKernel):
        return {"k": kernel, "p": conv_context(kernel), "pmax": PMAX}
    if isinstance(kernel, ConvWgradKernel):
        cin = min(PMAX, kernel.gpp * kernel.cin_g)
        return {"k": kernel, "pmax": PMAX, "bank": MATMUL_N,
                "xtb": max(1, min(kernel.taps_per_pass, PSUM_BANK_BYTES // (cin * _itemsize(kernel.compute_dtype))))}
    if isinstance(kernel, PoolKernel):
        # what a tap's index tile holds: its flat input offset (max indices) or its number (backward)
        tap_id = "(kh * DH - PH) * W + kw * DW - PW" if kernel.mode == "max_index" else "kh * KW + kw"
        return {"k": kernel, "pmax": PMAX, "tap_id": tap_id}
    if isinstance(kernel, ResampleKernel):
        return {"k": kernel, "pmax": PMAX}
    raise TypeError(kernel)  # pragma: no cover
