"""Convolutions too large for one conv kernel, rewritten onto kernels that hold them.

A conv kernel keeps every tap's weight tile in SBUF (``lowering.ops.conv``), so a kernel of more than ~190 taps
per 128 output channels (fp32; ViT's 16 x 16 patch embedding has 256, ViT-B/32's 1024) does not fit. Two
rewrites, for 1-D/2-D convolutions and only when the direct kernel does not fit:

* **patches**: stride == kernel, no padding or dilation, one group (a ViT/CLIP patch embedding): the windows don't
  overlap, so the convolution is a matmul of the patches (a reshape and permute of the input, no im2col copy
  beyond one layout change) with the flattened weight, ``[N * OH * OW, C * kh * kw] @ [C * kh * kw, O]``;
  its backward is two matmuls the same way. A transposed one with stride == kernel (an "unpatchify") is the mirror
  image: each input position's output patch is one row of ``[N * H * W, C] @ [C, O * kh * kw]``.
* **tap blocks**: any other shape (not transposed) sums the convolutions of blocks of kernel rows (and columns,
  when one row is too many taps) over the explicitly padded input, each shifted to its taps' origin, in fp32. The
  backward runs each block's own ``convolution_backward`` and adds the input gradients back at their offsets; the
  weight gradient is the blocks' gradients side by side.

Both are registered as decompositions of ``aten.convolution`` / ``aten.convolution_backward`` (the ATen level
AOTAutograd traces), so forward, backward and the inference graph take the same path. Shapes whose input band
alone is too wide for one kernel, and other large transposed kernels, stay as they are and are refused by the conv
lowering's check.
"""

from __future__ import annotations

from typing import Any

import torch
from neuron_compile.lowering.ops.conv import fits, pair

aten = torch.ops.aten


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _as_2d(x: torch.Tensor, w: torch.Tensor, stride: Any, padding: Any, dilation: Any
           ) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int], list[int]]:
    """A 1-D convolution's arguments as a 2-D one's (H = 1)."""
    nsp = x.dim() - 2
    st, pad, dil = (list(pair(v, nsp, fill)) for v, fill in ((stride, 1), (padding, 0), (dilation, 1)))
    return (x, w, st, pad, dil) if nsp == 2 else (x.unsqueeze(2), w.unsqueeze(2), st, pad, dil)


def _direct(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int],
            groups: int) -> bool:
    """Whether one conv kernel holds this (2-D-shaped) convolution."""
    out = [_out_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(2)]
    return fits(tuple(x.shape), tuple(w.shape), (x.shape[0], w.shape[0], *out), stride, padding, dilation, False,
                groups, x.dtype)


def _is_patches(w: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int) -> bool:
    return groups == 1 and list(w.shape[2:]) == stride and not any(padding) and all(d == 1 for d in dilation)


def _blocks(x: torch.Tensor, w: torch.Tensor, stride: list[int], dilation: list[int], groups: int
            ) -> tuple[int, int] | None:
    """(kernel rows, kernel cols) per block: the most rows of whole kernel rows that fit, else the most columns of
    one row; None when not even one tap fits (the input band is too wide)."""
    kh, kw = w.shape[2:]
    oh, ow = (_out_size(x.shape[2 + i], w.shape[2 + i], stride[i], 0, dilation[i]) for i in range(2))

    def ok(r: int, c: int) -> bool:
        xs = (x.shape[0], x.shape[1], (oh - 1) * stride[0] + (r - 1) * dilation[0] + 1,
              (ow - 1) * stride[1] + (c - 1) * dilation[1] + 1)
        return fits(xs, (w.shape[0], w.shape[1], r, c), (x.shape[0], w.shape[0], oh, ow), stride, [0, 0], dilation,
                    False, groups, x.dtype)

    for r in range(kh, 0, -1):
        if ok(r, kw):
            return r, kw
    for c in range(kw - 1, 0, -1):
        if ok(1, c):
            return 1, c
    return None


def _pad(x: torch.Tensor, padding: list[int]) -> torch.Tensor:
    return aten.constant_pad_nd.default(x, [padding[1], padding[1], padding[0], padding[0]]) if any(padding) else x


def _tap_slices(x: torch.Tensor, w: torch.Tensor, out: list[int], stride: list[int], dilation: list[int],
                block: tuple[int, int]) -> list[tuple[tuple[slice, slice], tuple[slice, slice]]]:
    """Per block, row-major: (its input rows/cols in the padded input, its kernel rows/cols)."""
    kh, kw = w.shape[2:]
    r, c = block
    res = []
    for a0 in range(0, kh, r):
        for b0 in range(0, kw, c):
            rb, cb = min(r, kh - a0), min(c, kw - b0)
            i0, j0 = a0 * dilation[0], b0 * dilation[1]
            rows = slice(i0, i0 + (out[0] - 1) * stride[0] + (rb - 1) * dilation[0] + 1)
            cols = slice(j0, j0 + (out[1] - 1) * stride[1] + (cb - 1) * dilation[1] + 1)
            res.append(((rows, cols), (slice(a0, a0 + rb), slice(b0, b0 + cb))))
    return res


def _patches(x: torch.Tensor, k: list[int]) -> tuple[torch.Tensor, list[int]]:
    """``[N * OH * OW, C * kh * kw]`` patch rows of ``x`` (rows past the last whole window dropped) and (OH, OW)."""
    n, c, h, wd = x.shape
    out = [h // k[0], wd // k[1]]
    x = x[:, :, :out[0] * k[0], :out[1] * k[1]]
    x = x.reshape(n, c, out[0], k[0], out[1], k[1]).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n * out[0] * out[1], c * k[0] * k[1]), out


def _transposed_patches(x: torch.Tensor, w: torch.Tensor, stride: Any, padding: Any, dilation: Any,
                        output_padding: Any, groups: int) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
    """(x, w) as 2-D and the output padding of a transposed convolution one conv kernel can't hold whose windows
    don't overlap (stride == kernel, no padding or dilation, one group: an "unpatchify"); None otherwise."""
    x2, w2, st, pad, dil = _as_2d(x, w, stride, padding, dilation)
    op = list(pair(output_padding, x.dim() - 2, 0))
    out = [(x2.shape[2 + i] - 1) * st[i] - 2 * pad[i] + dil[i] * (w2.shape[2 + i] - 1) + op[i] + 1 for i in range(2)]
    if fits(tuple(x2.shape), tuple(w2.shape), (x2.shape[0], w2.shape[1] * groups, *out), st, pad, dil, True, groups,
            x.dtype) or not _is_patches(w2, st, pad, dil, groups):
        return None
    return x2, w2, op


def _unpatchify(x2: torch.Tensor, w2: torch.Tensor, bias: torch.Tensor | None, op: list[int]) -> torch.Tensor:
    """``conv_transpose(x, w)`` with stride == kernel: each input position writes its own output patch,
    ``[N * H * W, C] @ [C, O * kh * kw]``; output_padding rows and columns get only the bias."""
    n, c, h, wd = x2.shape
    o, k = w2.shape[1], list(w2.shape[2:])
    y = aten.mm.default(x2.permute(0, 2, 3, 1).reshape(n * h * wd, c), w2.reshape(c, -1))
    y = y.reshape(n, h, wd, o, k[0], k[1]).permute(0, 3, 1, 4, 2, 5).reshape(n, o, h * k[0], wd * k[1])
    if any(op):
        y = aten.constant_pad_nd.default(y, [0, op[1], 0, op[0]])
    return y if bias is None else y + bias.reshape(1, -1, 1, 1)


def convolution(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Any, padding: Any,
                dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Any:
    """aten.convolution (1-D/2-D) that one conv kernel can't hold; anything else NotImplemented."""
    if x.dim() not in (3, 4) or not x.dtype.is_floating_point or x.numel() == 0 or w.numel() == 0:
        return NotImplemented
    nsp = x.dim() - 2
    if transposed:
        tp = _transposed_patches(x, w, stride, padding, dilation, output_padding, groups)
        if tp is None:
            return NotImplemented
        y = _unpatchify(tp[0], tp[1], bias, tp[2]).contiguous()
        return y.squeeze(2) if nsp == 1 else y
    x2, w2, st, pad, dil = _as_2d(x, w, stride, padding, dilation)
    if _direct(x2, w2, st, pad, dil, groups):
        return NotImplemented
    if _is_patches(w2, st, pad, dil, groups):
        rows, out = _patches(x2, st)
        wm = w2.reshape(w2.shape[0], -1).t()
        y = aten.mm.default(rows, wm) if bias is None else aten.addmm.default(bias, rows, wm)
        y = y.reshape(x.shape[0], out[0], out[1], w.shape[0]).permute(0, 3, 1, 2)
    else:
        xp = _pad(x2, pad)
        block = _blocks(xp, w2, st, dil, groups)
        if block is None:
            return NotImplemented
        out = [_out_size(xp.shape[2 + i], w2.shape[2 + i], st[i], 0, dil[i]) for i in range(2)]
        acc = None
        for (rows, cols), (kr, kc) in _tap_slices(xp, w2, out, st, dil, block):
            part = aten.convolution.default(xp[:, :, rows, cols], w2[:, :, kr, kc], None, st, [0, 0], dil, False,
                                            [0, 0], groups).to(torch.float32)
            acc = part if acc is None else acc + part
        assert acc is not None
        if bias is not None:
            acc = acc + bias.to(torch.float32).reshape(1, -1, 1, 1)
        y = acc.to(x.dtype)
    y = y.contiguous()
    return y.squeeze(2) if nsp == 1 else y


def convolution_backward(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int],
                         dilation: list[int], transposed: bool, output_padding: list[int], groups: int,
                         output_mask: list[bool]) -> Any:
    """The backward of :func:`convolution`'s rewrites; NotImplemented where the forward kept the direct kernel."""
    if x.dim() not in (3, 4) or not x.dtype.is_floating_point or x.numel() == 0 or w.numel() == 0 \
            or go.numel() == 0:
        return NotImplemented
    nsp = x.dim() - 2
    go2 = go if nsp == 2 else go.unsqueeze(2)
    gi = gw = None
    if transposed:
        tp = _transposed_patches(x, w, stride, padding, dilation, output_padding, groups)
        if tp is None:
            return NotImplemented
        x2, w2, _ = tp
        n, c, h, wd = x2.shape
        gp, _ = _patches(go2, list(w2.shape[2:]))  # [N * H * W, O * kh * kw]: the output padding drops out
        xr = x2.permute(0, 2, 3, 1).reshape(n * h * wd, c)
        if output_mask[0]:
            gi = aten.mm.default(gp, w2.reshape(c, -1).t()).reshape(n, h, wd, c).permute(0, 3, 1, 2)
        if output_mask[1]:
            gw = aten.mm.default(xr.t(), gp).reshape(w2.shape)
        return _finish(go, gi, gw, output_mask, nsp)
    x2, w2, st, pad, dil = _as_2d(x, w, stride, padding, dilation)
    if _direct(x2, w2, st, pad, dil, groups):
        return NotImplemented
    if _is_patches(w2, st, pad, dil, groups):
        rows, out = _patches(x2, st)
        n, c, h, wd = x2.shape
        gp = go2.permute(0, 2, 3, 1).reshape(n * out[0] * out[1], w2.shape[0])
        if output_mask[0]:
            gr = aten.mm.default(gp, w2.reshape(w2.shape[0], -1))
            gr = gr.reshape(n, out[0], out[1], c, st[0], st[1]).permute(0, 3, 1, 4, 2, 5)
            gi = gr.reshape(n, c, out[0] * st[0], out[1] * st[1])
            if (h, wd) != (out[0] * st[0], out[1] * st[1]):  # rows past the last whole window get no gradient
                gi = aten.constant_pad_nd.default(gi, [0, wd - out[1] * st[1], 0, h - out[0] * st[0]])
        if output_mask[1]:
            gw = aten.mm.default(gp.t(), rows).reshape(w2.shape)
    else:
        xp = _pad(x2, pad)
        block = _blocks(xp, w2, st, dil, groups)
        if block is None:
            return NotImplemented
        out = list(go2.shape[2:])
        gxp = None
        gw_rows: dict[int, list[torch.Tensor]] = {}  # per block of kernel rows, its blocks of columns in order
        for (rows, cols), (kr, kc) in _tap_slices(xp, w2, out, st, dil, block):
            xb = xp[:, :, rows, cols]
            gib, gwb, _ = aten.convolution_backward.default(go2, xb, w2[:, :, kr, kc], None, st, [0, 0], dil, False,
                                                             [0, 0], groups, [output_mask[0], output_mask[1], False])
            if output_mask[0]:
                placed = aten.constant_pad_nd.default(gib.to(torch.float32), [
                    cols.start, xp.shape[3] - cols.stop, rows.start, xp.shape[2] - rows.stop])
                gxp = placed if gxp is None else gxp + placed
            if output_mask[1]:
                gw_rows.setdefault(kr.start, []).append(gwb)
        if output_mask[0]:
            assert gxp is not None
            gi = gxp[:, :, pad[0]:pad[0] + x2.shape[2], pad[1]:pad[1] + x2.shape[3]].to(x.dtype)
        if output_mask[1]:
            gw = torch.cat([torch.cat(blocks, dim=3) for blocks in gw_rows.values()], dim=2)
    return _finish(go, gi, gw, output_mask, nsp)


def _finish(go: torch.Tensor, gi: torch.Tensor | None, gw: torch.Tensor | None, output_mask: list[bool], nsp: int
            ) -> tuple[torch.Tensor | None, ...]:
    gb = aten.sum.dim_IntList(go, [0, *range(2, go.dim())]) if output_mask[2] else None
    if nsp == 1:
        gi = None if gi is None else gi.squeeze(2)
        gw = None if gw is None else gw.squeeze(2)
    return gi, None if gw is None else gw.contiguous(), gb


__all__ = ["convolution", "convolution_backward"]
