"""Resampling lowerings: upsample / interpolate and adaptive average pooling, forward and backward.

Every one of these ops is a separable linear map ``out = A_h x A_w^T`` per (n, c) plane (the backward applies
the transposed matrices). :func:`resample_matrix` builds each 1-D matrix by running the eager ATen op on a
basis (so indices and weights are exactly eager's, whatever the mode, align_corners and scale arguments),
:func:`runs` compresses it into strided runs, and the rule emits one
:class:`~neuron_compile.lowering.ir.ResampleKernel`. The op reaches us as ``neuron_compile::resample`` from
the decompositions in :mod:`lowering.decomp_conv`.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import numpy as np
import torch
from neuron_compile.lowering.decomp_conv import RESAMPLE
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.ir import Access, ArgSpec, BufferRef, KernelCall, ResampleKernel
from neuron_compile.lowering.ops.conv import SBUF_BUDGET, arg_index
from neuron_compile.lowering.ops.pool import plane_rows
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import register_lowering
from neuron_compile.lowering.resample_u8 import MAX_TAPS, eager_matrix, part_matrix
from neuron_compile.lowering.resample_u8 import MODES as U8_MODES
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx
from torch._dispatch.python import no_python_dispatcher
from torch.utils._python_dispatch import _disable_current_modes

log = logging.getLogger(__name__)
aten = torch.ops.aten

Run = tuple[bool, int, int, int, int, int, float]
MAX_STEP = 8  # output steps tried when growing a run
MAX_RUNS = 4096  # instructions per pass beyond which a resampling is refused (a very irregular map)


@functools.lru_cache(maxsize=256)
def resample_matrix(mode: str, in_n: int, out_n: int, align_corners: bool, scale: float | None) -> np.ndarray:
    """``A[out_n, in_n]`` of one spatial dim: eager's own op applied to the basis of ``in_n`` positions (run on
    real CPU tensors even while the caller traces with fake tensors, and by the ATen kernel even under AOTAutograd's
    Python dispatcher, whose Python decompositions of the upsample ops round the source position differently: a
    weight off by up to an fp32 ulp of the source index, 2^-16 for positions in [128, 256))."""
    with _disable_current_modes(), no_python_dispatcher():
        a = _eager_matrix(mode, in_n, out_n, align_corners, scale)
    a.setflags(write=False)
    return a


def _eager_matrix(mode: str, in_n: int, out_n: int, align_corners: bool, scale: float | None) -> np.ndarray:
    if mode.endswith(("_u8hi", "_u8lo")):  # a uint8 pass's integer weights, high bits or low byte
        return part_matrix(mode, in_n, out_n, align_corners, scale)
    return eager_matrix(mode, in_n, out_n, align_corners, scale, torch.float32)


def runs(a: np.ndarray) -> tuple[tuple[Run, ...], bool]:
    """Strided runs covering the nonzeros of ``a[out, in]`` slot by slot (the k-th nonzero of each row), and
    whether some row has none (the pass must start from zeros)."""
    rows = [[(int(i), float(a[o, i])) for i in np.flatnonzero(a[o])] for o in range(a.shape[0])]
    fill = any(not r for r in rows)
    out: list[Run] = []
    for slot in range(max((len(r) for r in rows), default=0)):
        entries = {o: r[slot] for o, r in enumerate(rows) if len(r) > slot}
        used: set[int] = set()
        for o0 in sorted(entries):
            if o0 in used:
                continue
            i0, w0 = entries[o0]
            best = (1, 1, 0)  # (count, o_step, i_step)
            for ost in range(1, MAX_STEP + 1):
                e1 = entries.get(o0 + ost)
                if e1 is None or o0 + ost in used or e1[1] != w0 or e1[0] < i0:
                    continue
                ist = e1[0] - i0
                n = 2
                while True:
                    e = entries.get(o0 + n * ost)
                    if e is None or o0 + n * ost in used or e != (i0 + n * ist, w0):
                        break
                    n += 1
                if n > best[0]:
                    best = (n, ost, ist)
            n, ost, ist = best
            used.update(o0 + j * ost for j in range(n))
            out.append((slot == 0 and not fill, o0, ost, n, i0, ist, w0))
    return tuple(out), fill


def stages(a_h: np.ndarray, in_w: int, out_w: int) -> tuple[tuple[int, int, int, int], ...] | None:
    """Output row stages ``(o0, o1, i_lo, i_hi)`` whose input band, W-pass and result tiles fit the SBUF budget."""
    out_h, in_h = a_h.shape
    span = []
    for o in range(out_h):
        nz = np.flatnonzero(a_h[o])
        span.append((int(nz.min()), int(nz.max()) + 1) if len(nz) else None)
    result = []
    o0 = 0
    while o0 < out_h:
        lo, hi = in_h, 0
        o1 = o0
        while o1 < out_h:
            s = span[o1]
            nlo, nhi = (min(lo, s[0]), max(hi, s[1])) if s else (lo, hi)
            nr = max(nhi - nlo, 1)
            if o1 > o0 and 4 * (nr * (in_w + out_w) + (o1 + 1 - o0) * out_w) > SBUF_BUDGET:
                break
            lo, hi, o1 = nlo, nhi, o1 + 1
        if hi <= lo:  # rows with no input at all (a backward with unreached outputs): any one input row
            lo, hi = 0, 1
        if 4 * ((hi - lo) * (in_w + out_w) + (o1 - o0) * out_w) > SBUF_BUDGET:
            return None
        result.append((o0, o1, lo, hi))
        o0 = o1
    return tuple(result)


def _matrices(node: fx.Node) -> tuple[np.ndarray, np.ndarray]:
    _, in_size, out_size, mode, align_corners, scales, transpose = node.args
    modes = mode.split(",") if "," in mode else [mode] * len(in_size)  # one mode per dim, or one for both
    a = [resample_matrix(m, int(i), int(o), bool(align_corners), None if s is None else float(s))
         for m, i, o, s in zip(modes, in_size, out_size, scales, strict=True)]
    return (a[0].T, a[1].T) if transpose else (a[0], a[1])


def _resample_check(node: fx.Node) -> str | None:
    xv = node.args[0].meta.get("val")
    if not isinstance(xv, torch.Tensor) or not xv.dtype.is_floating_point:
        if isinstance(xv, torch.Tensor) and xv.dtype == torch.uint8 and node.args[3] in U8_MODES:
            (h, _), (oh, ow) = node.args[1], node.args[2]
            if xv.shape[1] > 4 and ow == 1 and oh != h:
                return ("uint8 resampling of more than 4 channels to an output width of 1 while the height changes: "
                        "eager's CPU kernel for that case gives other values than its own 1 to 4 channel kernel, so "
                        "a compiled result would differ from one of them; resample the height first, then the width")
            return (f"uint8 resampling with more than {MAX_TAPS} input pixels per output (an antialiased downscale "
                    f"that large): its integer sums would round in fp32; resample x.float() and round back")
        return "resampling of a floating-point or uint8 tensor only: resample x.float() and cast the result back"
    if math.prod(node_shape(node)) == 0 or math.prod(node_shape(node.args[0])) == 0:
        return None
    a_h, a_w = _matrices(node)
    if max(len(runs(a_h)[0]), len(runs(a_w)[0])) > MAX_RUNS:
        return f"resampling {node.args[3]} of {tuple(node.args[1])} -> {tuple(node.args[2])} is too irregular"
    if stages(a_h, a_w.shape[1], a_w.shape[0]) is None:
        return f"resampling rows of width {a_w.shape[1]} -> {a_w.shape[0]} do not fit the SBUF budget"
    return None


@register_lowering(RESAMPLE, family="resample", kind="conv", check=_resample_check)
def lower_resample(gl: Any, node: fx.Node) -> None:
    """neuron_compile.resample (upsample, interpolate, adaptive avg pool; backward = A^T): runs of strided
    VectorE multiply-adds, W pass then H pass per stage of output rows."""
    shape = node_shape(node)
    dtype = node.meta["val"].dtype
    if math.prod(shape) == 0 or math.prod(node_shape(node.args[0])) == 0:
        if math.prod(shape) != 0:
            raise AssertionError("resampling an empty input into a non-empty output")
        buf = gl._buffer(BufferRef("empty", 0, 0, 0, storage_dtype(dtype) or "float32"))
        gl.views[node] = View(buf, shape, contiguous_strides(shape), 0, dtype)
        return
    a_h, a_w = _matrices(node)
    rh, fh = runs(a_h)
    rw, fw = runs(a_w)
    st = stages(a_h, a_w.shape[1], a_w.shape[0])
    assert st is not None
    xv = gl.view_of(node.args[0])
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    outer, nrows, strides = plane_rows([xv, out])
    args: list[int] = []
    x_acc = Access(arg_index(args, xv.buffer), xv.offset, strides[0])
    kernel = ResampleKernel(
        f"k{kernel_index}_resample", "resample", tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in args),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype),), outer, nrows,
        (xv.shape[2], xv.shape[3]), (shape[2], shape[3]), rh, rw, (fh, fw), st, x_acc,
        Access(0, out.offset, strides[1]), (f"resample:{node.args[3]}{'_backward' if node.args[6] else ''}",))
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf,)))
    log.debug("%s: %s", node.name, kernel)

