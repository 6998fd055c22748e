"""Kernel IR of the CNN families: convolution (and its transpose), its weight gradient, pooling, resampling.

Each renders through its own template (``codegen/templates/conv*.nki.j2``, ``pool.nki.j2``,
``resample.nki.j2``); see :mod:`neuron_compile.lowering.ir` for the common pieces (``Access``, ``ArgSpec``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from neuron_compile.lowering.ir_base import Access, ArgSpec, _jsonable


@dataclass(frozen=True)
class ConvKernel:
    """Convolution and transposed convolution as an implicit GEMM on TensorE (``conv.nki.j2``).

    Two spatial dims (1-D convolutions have ``H = 1``). Per spatial dim a tuple of *phases*
    ``(out_start, count, ((tap, in_offset), ...))``: output position ``out_start + out_step * q`` (q < count)
    reads input position ``q * in_step + in_offset`` for each listed tap (outside ``[0, size)`` is zero
    padding). A convolution has one phase (``out_step = 1``, ``in_step = stride``, offsets ``k * dilation -
    padding``); a transposed convolution has ``stride`` phases (``out_step = stride``, ``in_step = 1``) that
    list only the taps that land on that phase, so no multiply is spent on inserted zeros.

    Channels: ``groups`` groups of ``cin_g`` input / ``cout_g`` output channels; ``gpp`` groups are packed
    into one block-diagonal weight tile (depthwise: 128 channels per matmul). Per output tile the PSUM
    accumulator ``[C_out tile, images x rows x cols <= 512]`` sums ``nc_matmul(stationary = weight tap
    [C_in tile, C_out tile], moving = strided input window [C_in tile, positions])`` over C_in tiles and taps;
    input rows arrive once per stage as a zero-padded SBUF band. Accesses are (arg, offset, strides) with
    strides over (n, c, h, w) for ``x`` / ``out`` and (group, co, ci, kh, kw) for ``w``.
    The eviction applies ``evict = (func, scale column, bias column, scale immediate)``: ``func(scale * acc +
    bias)`` (columns index ``col_access``, -1: none); ``post`` lists whole-tile steps after it:
    ("tensor", op, operand) / ("col", op, column) / ("act", func) / ("scalar", op, value).
    """

    name: str
    family: str  # 'conv'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    batch: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    groups: int
    cin_g: int
    cout_g: int
    gpp: int  # groups per block-diagonal pack
    x: Access
    w: Access
    out: Access
    out_step: tuple[int, int]
    in_step: tuple[int, int]
    phases_h: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]
    phases_w: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]
    block: tuple[int, int, int, int]  # (images per stage, q rows per stage, q rows per PSUM tile, q cols per PSUM tile)
    compute_dtype: str
    evict: tuple[str, int, int, float] = ("copy", -1, -1, 1.0)
    post: tuple[tuple[Any, ...], ...] = ()
    post_access: tuple[Access, ...] = ()  # full operands of ``post`` steps, strides over (n, c, h, w)
    col_access: tuple[Access, ...] = ()  # per-channel columns (scale/bias): strides over (c,)
    source_ops: tuple[str, ...] = ()
    tap_rows: int = 0  # > 0: taps packed onto partitions, this many kernel rows (x KW taps x C_in) per matmul

    def roofline_flops(self) -> tuple[int, str, int]:
        """The convolution's math: 2 x C_in/g per (output element, tap that reaches it); the epilogue per element."""
        pairs = sum(qh * qw * len(th) * len(tw) for _, qh, th in self.phases_h for _, qw, tw in self.phases_w)
        cout = self.groups * self.cout_g
        out = self.batch * cout * self.out_hw[0] * self.out_hw[1]
        return 2 * self.batch * cout * self.cin_g * pairs, self.compute_dtype, out * (1 + len(self.post))

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [conv] tap_rows={self.tap_rows} n={self.batch} in={self.in_hw} out={self.out_hw} k={self.kernel} "
                f"groups={self.groups} cin/g={self.cin_g} cout/g={self.cout_g} gpp={self.gpp} "
                f"steps={self.out_step}/{self.in_step} block={self.block} dtype={self.compute_dtype} "
                f"evict={self.evict} post={self.post}")


@dataclass(frozen=True)
class ConvWgradKernel:
    """Weight gradient of a convolution on TensorE (``conv_wgrad.nki.j2``).

    ``gw[co, ci, kh, kw] = sum over (n, oh, ow) of go[n, co, oh, ow] * x[n, ci, oh*s + kh*d - p, ow*s + kw*d - p]``
    (two spatial dims; 1-D has H = 1). Output positions are the contraction, so per chunk of <= 128 positions
    (``chunk`` = images, rows, cols) go and each tap's input window are transposed on TensorE, and PSUM holds
    one ``[C_out tile, C_in tile]`` block per tap for ``taps_per_pass`` taps. Groups are packed ``gpp`` per
    tile and only the diagonal blocks are stored. ``x``/``go`` strides are over (n, c, h, w), ``out`` over
    (co, ci) with the taps contiguous (kh * KW + kw).
    """

    name: str
    family: str  # 'conv_wgrad'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    batch: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    cin_g: int
    cout_g: int
    gpp: int
    x: Access
    go: Access
    out: Access
    chunk: tuple[int, int, int]
    taps_per_pass: int
    compute_dtype: str
    source_ops: tuple[str, ...] = ()
    stage_rows: int = 1  # output rows whose go and input band are loaded together (chunks are views into them)

    def roofline_flops(self) -> tuple[int, str, int]:
        """2 x (output positions) per weight element."""
        taps = self.kernel[0] * self.kernel[1]
        pos = self.batch * self.out_hw[0] * self.out_hw[1]
        return 2 * pos * self.groups * self.cout_g * self.cin_g * taps, self.compute_dtype, 0

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [conv_wgrad] n={self.batch} in={self.in_hw} out={self.out_hw} k={self.kernel} "
                f"stride={self.stride} pad={self.padding} dil={self.dilation} groups={self.groups} gpp={self.gpp} "
                f"chunk={self.chunk} taps/pass={self.taps_per_pass} dtype={self.compute_dtype}")


@dataclass(frozen=True)
class PoolKernel:
    """Window pooling on VectorE (``pool.nki.j2``): max / avg forward, max indices, max / avg backward.

    ``rows`` (N x C, or C with ``outer`` = N when they do not merge) on partitions, 2 spatial dims on the
    free axis (1-D: H = 1). Per spatial dim the taps are ``(k, lo, hi, count_lo, count_hi)``: tap k reads
    a real input position for outputs in ``[lo, hi)`` (so padding is never read) and counts toward an
    average's divisor for outputs in ``[count_lo, count_hi)``. Forward stages are output rows, backward
    stages are input rows (outputs whose windows reach a stage are recomputed by it). ``mode`` is 'max',
    'max_index', 'avg', 'max_backward' or 'avg_backward'; accesses are (outer, row, h, w) strides; in a
    backward ``go`` is the gradient and ``x`` the forward input (max: the argmax is recomputed from it,
    first maximum in window order, NaN wins, as eager).
    """

    name: str
    family: str  # 'pool'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    mode: str
    outer: int
    rows: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    taps_h: tuple[tuple[int, int, int, int, int], ...]
    taps_w: tuple[tuple[int, int, int, int, int], ...]
    x: Access | None
    go: Access | None
    out: Access
    stage: int
    divisor: float = 0.0  # avg: a divisor_override (0: count the window)
    source_ops: tuple[str, ...] = ()

    def roofline_flops(self) -> tuple[int, str, int]:
        """One elementwise op per (output element, tap)."""
        taps = sum(hi - lo for _, lo, hi, _, _ in self.taps_h) * sum(hi - lo for _, lo, hi, _, _ in self.taps_w)
        return 0, "float32", self.outer * self.rows * taps

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [pool:{self.mode}] outer={self.outer} rows={self.rows} in={self.in_hw} "
                f"out={self.out_hw} k={self.kernel} stride={self.stride} pad={self.padding} dil={self.dilation} "
                f"stage={self.stage} divisor={self.divisor}")


@dataclass(frozen=True)
class ResampleKernel:
    """A separable linear resampling ``out = A_h x A_w^T`` per (n, c) plane on VectorE (``resample.nki.j2``).

    Upsampling (nearest, nearest-exact, (bi)linear, bicubic), adaptive average pooling and all their
    backwards (the transposed matrices) are such maps. Each matrix is given as *runs*
    ``(assign, o_start, o_step, count, i_start, i_step, weight)``: for j < count, output
    ``o_start + j * o_step`` takes (assign) or adds ``weight * input[i_start + j * i_step]``; the first
    nonzero of every output row is an assigning run unless ``fill`` (some output has no entry: zeroed first).
    The W pass runs on each stage's input rows, the H pass produces the stage's output rows ``stages``
    ``(o0, o1, i_lo, i_hi)``. Rows (N x C) on partitions; accesses are (outer, row, h, w) strides.
    """

    name: str
    family: str  # 'resample'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    outer: int
    rows: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    runs_h: tuple[tuple[bool, int, int, int, int, int, float], ...]
    runs_w: tuple[tuple[bool, int, int, int, int, int, float], ...]
    fill: tuple[bool, bool]  # (H pass, W pass)
    stages: tuple[tuple[int, int, int, int], ...]
    x: Access
    out: Access
    source_ops: tuple[str, ...] = ()

    def roofline_flops(self) -> tuple[int, str, int]:
        """One multiply-add per matrix entry applied: the W pass over every input row, the H pass per output column."""
        w_pass = sum(run[3] for run in self.runs_w) * self.in_hw[0]
        h_pass = sum(run[3] for run in self.runs_h) * self.out_hw[1]
        return 0, "float32", 2 * self.outer * self.rows * (w_pass + h_pass)

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [resample] outer={self.outer} rows={self.rows} in={self.in_hw} "
                f"out={self.out_hw} runs={len(self.runs_h)}+{len(self.runs_w)} stages={len(self.stages)}")
