"""FFTs on real pairs: ``aten._fft_r2c`` / ``_fft_c2r`` / ``_fft_c2c`` as dense DFT matrix products.

:mod:`lowering.complex_pairs` calls :func:`fft_op` for these three ops (every ``torch.fft`` function reaches
AOTAutograd as one of them, with ``_conj`` / casts around it). A transform over several dims is one 1-D transform
per dim (the DFT is separable). Along one dim of length ``n`` a 1-D transform is a product with ``n x n`` cosine
and sine matrices, built on the host in float64 from ``jk mod n`` (exact angles) and rounded once to the value
dtype, so TensorE does the work as ordinary matmuls. Its rounding error grows like ``sqrt(n)`` ulps of the output
(an FFT's like ``log n``): fine for the signal lengths where a dense product is sensible, and lengths above
:data:`MAX_LENGTH` are left to the refusal (the matrices alone would take ``8 n^2`` bytes).

Conventions (ATen's): ``normalization`` 0 = none, 1 = ``1 / sqrt(N)``, 2 = ``1 / N`` with ``N`` the product of
the signal lengths; ``forward`` picks the sign of the exponent (``exp(-2 pi i jk / n)`` forward); ``_fft_r2c`` with
``onesided`` keeps the ``n // 2 + 1`` non-redundant outputs of its last dim, and ``_fft_c2r`` reads those back
(Hermitian symmetry; the imaginary parts of the zero and Nyquist terms are ignored, as pocketfft does).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from neuron_compile.lowering.registry import register_declined
from torch import fx

aten = torch.ops.aten

MAX_LENGTH = 2048  # longest transformed dim: two 2048 x 2048 fp32 matrices are 32 MiB of graph constants
FFT_OPS = frozenset((aten._fft_r2c.default, aten._fft_c2r.default, aten._fft_c2c.default))


class FFTUnsupported(Exception):
    """An FFT the dense form does not cover (:func:`fft_problem` says why)."""


def _angles(n_out: int, n_in: int, n: int) -> np.ndarray:
    """``2 pi (jk mod n) / n`` for output index j < n_out and input index k < n_in, exact before the cos/sin."""
    jk = np.outer(np.arange(n_out, dtype=np.int64), np.arange(n_in, dtype=np.int64)) % n
    return 2.0 * np.pi * jk / n


class _FFT:
    """The transforms of one op, emitted through the complex-pairs rewriter ``rw``."""

    def __init__(self, rw: Any, node: fx.Node, dtype: torch.dtype) -> None:
        self.rw, self.node, self.dtype = rw, node, dtype

    def const(self, tag: str, value: np.ndarray) -> fx.Node:
        """A graph constant (a buffer of the rewritten module) holding ``value`` in the value dtype."""
        gm = self.rw.gm
        name = f"_dft_{self.node.name}_{tag}"
        gm.register_buffer(name, torch.from_numpy(value).to(self.dtype), persistent=False)
        out = self.rw.graph.get_attr(name)
        out.meta["val"] = torch.empty(value.shape, dtype=self.dtype, device="meta")
        return out

    def along(self, x: fx.Node, dim: int, mat: fx.Node, n_out: int) -> fx.Node:
        """``mat [n_out, n_in]`` applied along ``dim`` of the real tensor ``x`` (permute, flatten, mm, back)."""
        emit = self.rw.emit
        shape = list(x.meta["val"].shape)
        nd = len(shape)
        order = [d for d in range(nd) if d != dim] + [dim]
        moved = emit(aten.clone.default, emit(aten.permute.default, x, order), memory_format=torch.contiguous_format)
        rows = math.prod(shape[d] for d in order[:-1])
        flat = emit(aten.view.default, moved, [rows, shape[dim]])
        prod = emit(aten.mm.default, flat, emit(aten.t.default, mat))
        back = emit(aten.view.default, prod, [shape[d] for d in order[:-1]] + [n_out])
        inverse = [order.index(d) for d in range(nd)]
        return emit(aten.permute.default, back, inverse)

    def c2c(self, z: fx.Node, dim: int, forward: bool) -> fx.Node:
        """One complex 1-D DFT along ``dim`` of the pair tensor ``z``: X = sum_k x_k exp(-+2 pi i jk / n). Each
        matrix multiplies both parts in one product (the pair dim rides along as rows)."""
        n = z.meta["val"].shape[dim]
        theta = _angles(n, n, n)
        c, s = self.const(f"c{dim}", np.cos(theta)), self.const(f"s{dim}", np.sin(theta))
        emit, part = self.rw.emit, self.rw.part
        cz, sz = self.along(z, dim, c, n), self.along(z, dim, s, n)
        cr, ci, sr, si = part(cz, 0), part(cz, 1), part(sz, 0), part(sz, 1)
        if forward:  # (C - iS)(xr + i xi)
            return self.rw.pair(emit(aten.add.Tensor, cr, si), emit(aten.sub.Tensor, ci, sr))
        return self.rw.pair(emit(aten.sub.Tensor, cr, si), emit(aten.add.Tensor, ci, sr))

    def normalize(self, x: fx.Node, normalization: int, signal: int) -> fx.Node:
        """``x`` times ATen's normalization factor (both parts of a pair tensor at once)."""
        if normalization == 0:
            return x
        return self.rw.emit(aten.mul.Tensor, x, 1.0 / math.sqrt(signal) if normalization == 1 else 1.0 / signal)


def _signal(node: fx.Node) -> tuple[list[int], list[int]]:
    """The input shape of an ``_fft_*`` node and its transformed dims (non-negative)."""
    in_shape = list(node.args[0].meta["val"].shape)
    return in_shape, [d % max(len(in_shape), 1) for d in node.args[1]]


def fft_problem(node: fx.Node) -> str | None:
    """Why the dense form can't take this ``_fft_*`` node (None: it can); also the refusal's reason."""
    in_shape, dims = _signal(node)
    lengths = [in_shape[d] for d in dims]
    if node.target == aten._fft_c2r.default:
        n, m = int(node.args[3]), in_shape[dims[-1]]
        lengths[-1] = n
        if m != n // 2 + 1:
            return f"an inverse real FFT reading {m} half-spectrum values for {n} outputs (expected {n // 2 + 1})"
    if max(lengths, default=0) > MAX_LENGTH:
        return (f"an FFT over {max(lengths)} points: FFTs run as dense DFT matrix products, up to {MAX_LENGTH} "
                f"points per transformed dim; compute longer ones eagerly (outside the compiled region)")
    return None


register_declined(fft_problem, *FFT_OPS)


def fft_op(rw: Any, node: fx.Node, real_dtype: torch.dtype) -> fx.Node:
    """The real-pair form of one ``_fft_*`` node (``rw``: the complex-pairs rewriter)."""
    problem = fft_problem(node)
    if problem is not None:
        raise FFTUnsupported(problem)
    t, a = node.target, node.args
    src = rw.env[a[0]]
    in_shape, dims = _signal(node)
    normalization = int(a[2])
    f = _FFT(rw, node, real_dtype)
    emit = rw.emit
    if t == aten._fft_r2c.default:
        last = dims[-1]
        n = in_shape[last]
        m = n // 2 + 1 if a[3] else n
        theta = _angles(m, n, n)
        z = rw.pair(f.along(src, last, f.const("rc", np.cos(theta)), m),
                    emit(aten.neg.default, f.along(src, last, f.const("rs", np.sin(theta)), m)))
        for d in dims[:-1]:
            z = f.c2c(z, d, forward=True)
        return f.normalize(z, normalization, math.prod(in_shape[d] for d in dims))
    if t == aten._fft_c2c.default:
        z = src
        for d in dims:
            z = f.c2c(z, d, forward=bool(a[3]))
        return f.normalize(z, normalization, math.prod(in_shape[d] for d in dims))
    # _fft_c2r: the other dims inverse-transformed, then the half spectrum of the last one back to n real values
    last, n = dims[-1], int(a[3])
    m = in_shape[last]
    z = src
    for d in dims[:-1]:
        z = f.c2c(z, d, forward=False)
    re, im = rw.part(z, 0), rw.part(z, 1)
    theta = _angles(n, m, n)
    weight = np.full(m, 2.0)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    out = emit(aten.sub.Tensor, f.along(re, last, f.const("ic", np.cos(theta) * weight), n),
               f.along(im, last, f.const("is", np.sin(theta) * weight), n))
    signal = math.prod([in_shape[d] for d in dims[:-1]] + [n])
    return f.normalize(out, normalization, signal)
