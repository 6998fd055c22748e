"""Convolution lowerings: ``aten.convolution`` (1-D/2-D, transposed or not) as an implicit GEMM on TensorE.

Input: a ``convolution`` node (its arguments are strided views of runtime buffers); output: one
:class:`~neuron_compile.lowering.ir.ConvKernel` rendered by ``conv.nki.j2``. This module computes the plan
as plain data: per spatial dim the *phases* (which taps feed which output positions, at which input
offsets), the group packing (block-diagonal weight tiles), and the stage / PSUM block sizes that fit the
SBUF budget and one PSUM bank. A shape whose input band cannot fit SBUF is refused by the rule's check.
The backward (``convolution_backward``) is decomposed in :mod:`lowering.decomp_conv` into a transposed
convolution (grad_input), ``neuron_compile::conv_weight_grad`` (grad_weight) and a sum (grad_bias).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from neuron_compile.lowering.conv_fusion import CONV_FUSED
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.ir import Access, ArgSpec, BufferRef, ConvKernel, KernelCall
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import qualified_name, register_lowering
from neuron_compile.lowering.views import View, contiguous_strides
from torch import fx

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)
aten = torch.ops.aten

SBUF_BUDGET = 96 * 1024  # bytes per partition a conv kernel's live tiles may take (of ~192 KiB; the simulator counts a
# tile and its replacement both live while a loop rebinds it)
MATMUL_N = 512  # moving free size of one matmul (one fp32 PSUM bank)
_FLOAT = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

Phase = tuple[int, int, tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class ConvGeometry:
    """What a convolution node computes, normalized to 2 spatial dims (1-D: H = 1)."""

    batch: int
    cin: int
    cout: int
    groups: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    transposed: bool

    @property
    def cin_g(self) -> int:
        return self.cin // self.groups

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups


def pair(v: Any, n: int, fill: int) -> tuple[int, int]:
    vals = [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    vals = vals * n if len(vals) == 1 else vals
    return (fill, vals[0]) if n == 1 else (vals[0], vals[1])


def conv_args(node: fx.Node) -> tuple[Any, ...]:
    """(x, w, bias, stride, padding, dilation, transposed, groups) of a convolution or conv_fused node."""
    a = node.args
    if node.target == aten.convolution.default:
        return a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[8]
    return a[0], a[1], a[2], a[5], a[6], a[7], a[8], a[10]


def geometry(node: fx.Node) -> ConvGeometry:
    x, w, _, stride, padding, dilation, transposed, groups = conv_args(node)
    return geometry_of(node_shape(x), node_shape(w), node_shape(node), stride, padding, dilation, transposed, groups)


def geometry_of(xs: tuple[int, ...], ws: tuple[int, ...], os_: tuple[int, ...], stride: Any, padding: Any,
                dilation: Any, transposed: bool, groups: int) -> ConvGeometry:
    """The geometry of a convolution of input shape ``xs``, weight ``ws`` and output ``os_`` (1-D or 2-D)."""
    nsp = len(xs) - 2
    hw = (1, xs[2]) if nsp == 1 else (xs[2], xs[3])
    ohw = (1, os_[2]) if nsp == 1 else (os_[2], os_[3])
    ks = (1, ws[2]) if nsp == 1 else (ws[2], ws[3])
    cout = ws[1] * int(groups) if transposed else ws[0]
    return ConvGeometry(xs[0], xs[1], cout, int(groups), hw, ohw, ks, pair(stride, nsp, 1), pair(padding, nsp, 0),
                        pair(dilation, nsp, 1), bool(transposed))


def phases(in_size: int, out_size: int, k: int, stride: int, pad: int, dil: int, transposed: bool
           ) -> tuple[int, int, tuple[Phase, ...]]:
    """(out_step, in_step, phases) of one spatial dim; taps that never read a real input position are dropped."""
    if not transposed:
        taps = tuple((t, t * dil - pad) for t in range(k)
                     if (out_size - 1) * stride + t * dil - pad >= 0 and t * dil - pad < in_size)
        return 1, stride, ((0, out_size, taps),)
    out = []
    for r in range(min(stride, out_size)):
        q = -(-(out_size - r) // stride)
        taps = tuple((t, (r + pad - t * dil) // stride) for t in range(k) if (r + pad - t * dil) % stride == 0)
        taps = tuple((t, off) for t, off in taps if off < in_size and q - 1 + off >= 0)
        out.append((r, q, taps))
    return stride, 1, tuple(out)


def itemsize(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def plan_blocks(geo: ConvGeometry, ph: tuple[int, int, tuple[Phase, ...]], pw: tuple[int, int, tuple[Phase, ...]],
                gpp: int, dtype: str, out_bytes: int, n_full: int, tap_rows: int = 0
                ) -> tuple[int, int, int, int] | None:
    """(images per stage, q rows per stage, q rows per PSUM tile, q cols per PSUM tile) within the SBUF budget."""
    (sh, ish, phs_h), (sw, isw, phs_w) = ph, pw
    qh = max(q for _, q, _ in phs_h)
    qw = max(q for _, q, _ in phs_w)
    offs_h = [o for _, _, t in phs_h for _, o in t] or [0]
    offs_w = [o for _, _, t in phs_w for _, o in t] or [0]
    reach_h, reach_w = max(offs_h) - min(offs_h), max(offs_w) - min(offs_w)
    if tap_rows:  # each tap group's band holds only the window origins (its partitions are the shifted copies)
        reach_h = reach_w = 0
    bw = (qw - 1) * isw + reach_w + 1
    ci_pack = (gpp if gpp > 1 else 1) * geo.cin_g
    ci_tiles = -(-geo.kernel[0] // tap_rows) if tap_rows else -(-ci_pack // PMAX)
    dsz = itemsize(dtype)
    weights = ci_tiles * geo.kernel[0] * geo.kernel[1] * min(PMAX, max(gpp * geo.cout_g, 1)) * dsz

    def cost(nb: int, qb: int) -> int:
        br = (qb - 1) * ish + reach_h + 1
        stage = nb * qb * sh * qw * sw
        return weights + ci_tiles * nb * br * bw * dsz + stage * (out_bytes + 4 * n_full) + 4 * MATMUL_N

    cb = min(qw, MATMUL_N)
    if qh * qw <= MATMUL_N:  # whole planes per PSUM tile: several images per stage
        nb = max(1, geo.batch)
        while nb > 1 and cost(nb, qh) > SBUF_BUDGET:
            nb = (nb + 1) // 2
        if cost(nb, qh) <= SBUF_BUDGET:
            return nb, qh, qh, qw
    qb = qh
    while qb > 1 and cost(1, qb) > SBUF_BUDGET:
        qb = (qb + 1) // 2
    if cost(1, qb) > SBUF_BUDGET:
        return None
    return 1, qb, max(1, min(qb, MATMUL_N // cb)), cb


def tap_rows(geo: ConvGeometry, ph: Any, pw: Any, w_strides: tuple[int, ...]) -> int:
    """Kernel rows per tap group when taps can be packed onto partitions (0: not applicable): a plain convolution
    with few input channels (KW x C_in <= 128), every tap present, C_out-major weights."""
    kh, kw = geo.kernel
    if geo.transposed or geo.groups != 1 or kh * kw == 1 or kw * geo.cin > PMAX or w_strides[2] > w_strides[1] \
            or len(ph[2][0][2]) != kh or len(pw[2][0][2]) != kw:
        return 0
    return min(kh, PMAX // (kw * geo.cin))


def group_pack(geo: ConvGeometry) -> int:
    """Groups per block-diagonal weight tile: as many as fit 128 input and 128 output channels."""
    if geo.groups == 1 or geo.cin_g > PMAX or geo.cout_g > PMAX:
        return 1
    return max(1, min(geo.groups, PMAX // geo.cin_g, PMAX // geo.cout_g))


def _plan(node: fx.Node) -> tuple[ConvGeometry, Any, Any, int, tuple[int, int, int, int] | None]:
    return _plan_of(geometry(node), node.args[0].meta["val"].dtype, node.meta["val"].dtype)


def _plan_of(geo: ConvGeometry, x_dtype: torch.dtype, out_dtype: torch.dtype, n_full: int = 0
             ) -> tuple[ConvGeometry, Any, Any, int, tuple[int, int, int, int] | None]:
    ph = phases(geo.in_hw[0], geo.out_hw[0], geo.kernel[0], geo.stride[0], geo.padding[0], geo.dilation[0],
                geo.transposed)
    pw = phases(geo.in_hw[1], geo.out_hw[1], geo.kernel[1], geo.stride[1], geo.padding[1], geo.dilation[1],
                geo.transposed)
    gpp = group_pack(geo)
    dtype = storage_dtype(x_dtype) or "float32"
    out_bytes = itemsize(storage_dtype(out_dtype) or "float32")
    return geo, ph, pw, gpp, plan_blocks(geo, ph, pw, gpp, dtype, out_bytes, n_full)


def fits_with(node: fx.Node, n_full: int) -> bool:
    """Whether the convolution ``node`` still fits one kernel with ``n_full`` full-size epilogue operands staged
    beside its output (what the epilogue fusion asks before it adds a residual)."""
    return _plan_of(geometry(node), node.args[0].meta["val"].dtype, node.meta["val"].dtype, n_full)[4] is not None


def fits(xs: tuple[int, ...], ws: tuple[int, ...], os_: tuple[int, ...], stride: Any, padding: Any, dilation: Any,
         transposed: bool, groups: int, dtype: torch.dtype) -> bool:
    """Whether one conv kernel holds this 1-D/2-D convolution (its weights and an input band within the SBUF
    budget): what the lowering's check asks, for a decomposition to ask before it emits the convolution."""
    geo = geometry_of(xs, ws, os_, stride, padding, dilation, transposed, groups)
    return math.prod(os_) == 0 or _plan_of(geo, dtype, dtype)[4] is not None


def _conv_check(node: fx.Node) -> str | None:
    x, w = conv_args(node)[:2]
    xv, wv = x.meta.get("val"), w.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor):
        return "convolution of non-tensor arguments"
    if xv.dtype not in _FLOAT or wv.dtype not in _FLOAT:
        return f"convolution of {xv.dtype} x {wv.dtype} is not supported (floating point only)"
    if xv.dim() == 5:
        return "3-D convolution reached the lowering undecomposed (lowering.decomp_conv3d folds it into 2-D)"
    if xv.dim() not in (3, 4):
        return f"convolution of a {xv.dim()}-D input is not supported (expected [N, C, L] or [N, C, H, W])"
    if math.prod(node_shape(node)) == 0:
        return None
    geo, _, _, _, blocks = _plan(node)
    if blocks is None and geo.transposed and geo.kernel[0] * geo.kernel[1] * PMAX * 4 > SBUF_BUDGET // 2:
        return (f"transposed convolution with a {geo.kernel[0]}x{geo.kernel[1]} kernel: its weight taps do not fit "
                f"the SBUF budget of one kernel (only stride == kernel without padding is rewritten as a matmul); "
                f"use a smaller kernel")
    if blocks is None:
        return (f"convolution input rows of width {geo.in_hw[1]} with {geo.cin_g} channels per group do not fit the "
                f"SBUF budget of one kernel; split the input along its width")
    return None


def arg_index(args: list[int], buf: int) -> int:
    if buf not in args:
        args.append(buf)
    return args.index(buf)


def nchw(view: View) -> tuple[int, tuple[int, int, int, int]]:
    """Offset and (n, c, h, w) strides of a [N, C, L] or [N, C, H, W] view."""
    s = view.strides
    return view.offset, ((s[0], s[1], 0, s[2]) if len(s) == 3 else (s[0], s[1], s[2], s[3]))


@register_lowering(aten.convolution.default, family="conv", kind="conv", check=_conv_check)
def lower_convolution(gl: Any, node: fx.Node) -> None:
    """aten.convolution (1-D/2-D, stride/padding/dilation/groups, transposed): implicit GEMM on TensorE."""
    emit_conv(gl, node, node.args[0], node.args[1], node.args[2], ("copy", -1, -1, 1.0), (), (),
              (qualified_name(node.target),))


@register_lowering(CONV_FUSED, family="conv", kind="conv", check=_conv_check)
def lower_conv_fused(gl: Any, node: fx.Node) -> None:
    """neuron_compile.conv_fused: a convolution with its elementwise epilogue (bias, folded BatchNorm,
    activation in the PSUM eviction; residual adds and later ops on the staged tile)."""
    spec = json.loads(node.args[11])
    func, a, b = spec["evict"]
    scale_col = a if isinstance(a, int) else -1
    scale_imm = float(a["scalar"]) if isinstance(a, dict) else 1.0
    post = tuple(tuple(step) for step in spec["post"])
    emit_conv(gl, node, node.args[0], node.args[1], None, (func, scale_col, -1 if b is None else b, scale_imm), post,
              tuple(node.args[4]), tuple(node.meta.get("conv_source", ("aten.convolution.default",))),
              cols=tuple(node.args[3]))


def emit_conv(gl: Any, node: fx.Node, x_node: fx.Node, w_node: fx.Node, bias: fx.Node | None,
              evict: tuple[str, int, int, float], post: tuple[tuple[Any, ...], ...], post_nodes: tuple[fx.Node, ...],
              source_ops: tuple[str, ...], cols: tuple[fx.Node, ...] = ()) -> None:
    """One ConvKernel for ``node`` (a convolution, or a fused convolution + epilogue with the same geometry).

    ``cols`` are per-channel [C] operands referred to by ``evict`` (the conv bias is appended as the last).
    """
    shape = node_shape(node)
    if math.prod(shape) == 0:  # an empty batch or channel dim: no kernel
        dtype = node.meta["val"].dtype
        buf = gl._buffer(BufferRef("empty", 0, 0, 0, storage_dtype(dtype) or "float32"))
        gl.views[node] = View(buf, shape, contiguous_strides(shape), 0, dtype)
        return
    geo, ph, pw, gpp, blocks = _plan(node)
    assert blocks is not None
    out_bytes = itemsize(storage_dtype(node.meta["val"].dtype) or "float32")
    if post_nodes:
        blocks = plan_blocks(geo, ph, pw, gpp, storage_dtype(x_node.meta["val"].dtype) or "float32", out_bytes,
                             len(post_nodes))
        assert blocks is not None
    xv, wv = gl.view_of(x_node), gl.view_of(w_node)
    args: list[int] = []
    x_off, x_st = nchw(xv)
    x_acc = Access(arg_index(args, xv.buffer), x_off, x_st)
    ws = wv.strides if len(wv.strides) == 4 else (wv.strides[0], wv.strides[1], 0, wv.strides[2])
    if geo.transposed:  # weight [C_in, C_out / g, kh, kw]
        w_st = (geo.cin_g * ws[0], ws[1], ws[0], ws[2], ws[3])
    else:  # weight [C_out, C_in / g, kh, kw]
        w_st = (geo.cout_g * ws[0], ws[0], ws[1], ws[2], ws[3])
    w_acc = Access(arg_index(args, wv.buffer), wv.offset, w_st)
    col_acc = []
    for c in (*cols, *([bias] if bias is not None else [])):
        cv = gl.view_of(c)
        col_acc.append(Access(arg_index(args, cv.buffer), cv.offset, (_channel_stride(cv, shape),)))
    if bias is not None:
        func, scale, _, imm = evict
        evict = (func, scale, len(col_acc) - 1, imm)
    post_acc = []
    for p in post_nodes:
        pv = gl.view_of(p)
        pst = _broadcast_nchw(pv, shape)
        post_acc.append(Access(arg_index(args, pv.buffer), pv.offset, pst))
    kernel_index = len(gl.kernels)
    buf, out = gl.new_output(node, kernel_index, 0)
    o_off, o_st = nchw(out)
    cdt = storage_dtype(xv.torch_dtype) or "float32"
    kernel = ConvKernel(
        f"k{kernel_index}_conv{'_transpose' if geo.transposed else ''}", "conv",
        tuple(ArgSpec(gl.buffers[b].numel, gl.buffers[b].dtype) for b in args),
        (ArgSpec(gl.buffers[buf].numel, gl.buffers[buf].dtype),),
        geo.batch, geo.in_hw, geo.out_hw, geo.kernel, geo.groups, geo.cin_g, geo.cout_g, gpp,
        x_acc, w_acc, Access(0, o_off, o_st), (ph[0], pw[0]), (ph[1], pw[1]), ph[2], pw[2], blocks, cdt,
        evict, post, tuple(post_acc), tuple(col_acc), source_ops)
    rows = tap_rows(geo, ph, pw, w_st)
    packed_blocks = plan_blocks(geo, ph, pw, gpp, cdt, out_bytes, len(post_nodes), rows) if rows else None
    candidates = [kernel] + [dataclasses.replace(kernel, block=b) for b in _smaller_stages(blocks)]
    if packed_blocks is not None:
        packed = dataclasses.replace(kernel, block=packed_blocks, tap_rows=rows)
        candidates += [packed] + [dataclasses.replace(packed, block=b) for b in _smaller_stages(packed_blocks)]
    if len(candidates) > 1:  # the cost model decides: fewer matmuls vs extra DMAs, stage overlap vs DMA count
        kernel = min(candidates, key=estimated_ns)
    gl.kernels.append(kernel)
    gl.calls.append(KernelCall(kernel_index, tuple(args), (buf,)))
    log.debug("%s: %s", node.name, kernel)


def _smaller_stages(block: tuple[int, int, int, int]) -> list[tuple[int, int, int, int]]:
    """Stage heights a half and a quarter of ``block``'s (more stages: a band's DMA overlaps the previous stage's
    matmuls), when a stage holds more than one PSUM tile of rows of one image."""
    nb, qb, rb, cb = block
    out = []
    for div in (2, 4):
        q = -(-qb // div)
        if nb == 1 and q >= rb and q < qb:
            out.append((nb, q, min(rb, q), cb))
    return out


def estimated_ns(kernel: ConvKernel) -> float:
    """The cost model's time of ``kernel`` on the configured target (its rendered instruction stream)."""
    from neuron_compile.codegen.render import render_kernel

    from neuron_compile.config import config
    from neuron_compile.costmodel import estimate
    from neuron_compile.instruction_stream import source_stream

    args = [(a.numel, a.dtype) for a in kernel.inputs]
    ns = estimate(source_stream(render_kernel(kernel), kernel.name, args), config.target).time_ns
    log.debug("%s (tap_rows=%d): %.1f us", kernel.name, kernel.tap_rows, ns / 1e3)
    return ns


def _channel_stride(view: View, shape: tuple[int, ...]) -> int:
    """The stride of a per-channel operand ([C], [C, 1, 1], [1, C, 1, 1], ...) along the channels of ``shape``."""
    if len(view.shape) == 1:
        return view.strides[0]
    from neuron_compile.lowering import space as sp

    return sp.broadcast_strides(view.shape, view.strides, shape)[1]


def _broadcast_nchw(view: View, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(n, c, h, w) strides of ``view`` broadcast to the conv output ``shape`` ([N, C, L] or [N, C, H, W])."""
    from neuron_compile.lowering import space as sp

    st = sp.broadcast_strides(view.shape, view.strides, shape)
    return (st[0], st[1], 0, st[2]) if len(shape) == 3 else (st[0], st[1], st[2], st[3])


__all__ = ["ConvGeometry", "emit_conv", "fits", "fits_with", "geometry", "geometry_of", "lower_convolution", "phases", "plan_blocks"]
