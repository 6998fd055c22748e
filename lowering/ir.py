"""Kernel IR: what the lowering produces and the templates render.

The IR is small, frozen and printable: every class has a canonical ``to_json()`` and a readable
``__str__`` (one op per line), so debug dumps, golden files and the cache key all come from the
same form.

A :class:`LoopKernel` is a tiled loop nest over a canonical iteration *space*
``(outer..., part, free)`` (or ``(outer..., part, red_outer..., free)`` when it reduces): outer dims
are unrolled Python loops, ``part`` is tiled by 128 onto SBUF partitions and ``free`` is tiled along
the free axis. Its ``ops`` form an SSA tile program in which every value is either *full* (a
``[P, F]`` tile) or *row* (a ``[P, 1]`` tile constant along the free/reduced dims). A matmul kernel is
a loop kernel whose first op is a ``matmul`` (an inner K loop accumulating in PSUM) followed by an
elementwise epilogue. Kernel arguments are flat 1-D HBM buffers addressed through
:class:`Access` patterns, so views (transposes, broadcasts, slices) cost nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Values attached to ops are JSON scalars, tuples of them, or value names.
Attr = tuple[str, Any]


@dataclass(frozen=True)
class Access:
    """Affine addressing of a flat HBM argument: ``arg[offset + sum(strides[d] * idx[d])]`` over the space."""

    arg: int
    offset: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class TileOp:
    """One SSA op of a tile program. ``kind`` is 'full' or 'row'; ``args`` are value names or literals."""

    out: str
    opcode: str
    kind: str
    dtype: str
    args: tuple[Any, ...] = ()
    attrs: tuple[Attr, ...] = ()
    phase: int = 0

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    def __str__(self) -> str:
        args = ", ".join(str(a) for a in self.args)
        attrs = "".join(f", {k}={v!r}" for k, v in self.attrs)
        return f"  [{self.phase}] {self.out}: {self.kind}<{self.dtype}> = {self.opcode}({args}{attrs})"


@dataclass(frozen=True)
class ArgSpec:
    """A flat HBM kernel argument or result: element count and NKI dtype name."""

    numel: int
    dtype: str


@dataclass(frozen=True)
class LoopKernel:
    name: str
    family: str  # 'pointwise' | 'reduction' | 'matmul'
    space: tuple[int, ...]
    n_outer: int  # leading dims unrolled as Python loops
    reduce_dims: tuple[int, ...]  # space dims reduced (empty for pointwise/matmul); the last one is 'free'
    free_tile: int
    part_tile: int
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    ops: tuple[TileOp, ...]
    n_phases: int = 1
    source_ops: tuple[str, ...] = ()  # the ATen ops this kernel implements (for reports)
    # matmul only: contraction size and operand accesses (over space + a trailing K dim)
    matmul: tuple[Attr, ...] = ()

    @property
    def part_dim(self) -> int:
        return self.n_outer

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        head = (f"kernel {self.name} [{self.family}] space={self.space} outer={self.n_outer} "
                f"reduce={self.reduce_dims} tile=({self.part_tile},{self.free_tile}) phases={self.n_phases}")
        ins = "\n".join(f"  in{i}: {a.dtype}[{a.numel}]" for i, a in enumerate(self.inputs))
        outs = "\n".join(f"  out{i}: {a.dtype}[{a.numel}]" for i, a in enumerate(self.outputs))
        return "\n".join([head, ins, outs, *map(str, self.ops)])


@dataclass(frozen=True)
class CopyKernel:
    """HBM->HBM DMA copies: each (src arg, src access, dst output, dst access) over its own space."""

    name: str
    family: str  # 'copy'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    copies: tuple[tuple[int, Access, int, Access, tuple[int, ...]], ...]  # (src_arg, src, dst_out, dst, space)
    source_ops: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        lines = [f"kernel {self.name} [copy]"]
        lines += [f"  out{d}{da.strides}@{da.offset} <- in{s}{sa.strides}@{sa.offset} over {sp}"
                  for s, sa, d, da, sp in self.copies]
        return "\n".join(lines)


@dataclass(frozen=True)
class GatherKernel:
    """Row gather ``out[o, i, f] = table[t_off + o.t_outer + idx[i] * row_stride + f * elem_stride]``.

    Embedding and index_select: ``rows`` indices (int32 in HBM, read through ``index``) are loaded
    128 per tile onto partitions and each partition's row is fetched by an indirect DMA
    (``vector_offset``). ``outer`` lists unrolled loops as (size, table stride, out stride); the
    output is ``out[o_off + o.out_outer + i * row_size + f]`` (contiguous rows).
    """

    name: str
    family: str  # 'gather'
    inputs: tuple[ArgSpec, ...]  # (table, indices)
    outputs: tuple[ArgSpec, ...]
    rows: int
    row_size: int
    num_rows_table: int
    table_offset: int = 0
    row_stride: int = 0
    elem_stride: int = 1
    index: Access = Access(1, 0, (1,))  # over the rows
    outer: tuple[tuple[int, int, int], ...] = ()  # (size, table stride, out stride)
    wrap_negative: bool = False  # index + num_rows_table for negative indices (x[idx] semantics)
    source_ops: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [gather] rows={self.rows} row_size={self.row_size} "
                f"table_rows={self.num_rows_table} row_stride={self.row_stride} outer={self.outer}")


@dataclass(frozen=True)
class IndexAddKernel:
    """``out = base; out[idx[n], :] += values[n, :]`` (index_put accumulate) as a one-hot matmul.

    For each tile of ``rows`` (<= 128) target rows and ``row_size`` chunk (<= 512): PSUM accumulates
    ``onehot[n, v]^T @ values[n, :]`` over 128-token tiles (the one-hot built on chip from iota and
    an ``equal`` compare), then the base tile is added and stored. Deterministic; duplicates add up.
    Accesses (arg, offset, (stride over rows/tokens, stride over the row)) plus unrolled ``outer``
    loops as (size, base stride, values stride, out stride); the output is dense like the base.
    """

    name: str
    family: str  # 'index_put'
    inputs: tuple[ArgSpec, ...]  # (base, indices, values)
    outputs: tuple[ArgSpec, ...]
    rows: int  # rows of the target (V)
    tokens: int  # number of indices (N)
    row_size: int  # elements per row (D)
    base: Access
    index: Access
    values: Access
    out: Access
    outer: tuple[tuple[int, int, int, int], ...] = ()
    compute_dtype: str = "float32"
    source_ops: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [index_put] rows={self.rows} tokens={self.tokens} row_size={self.row_size} "
                f"outer={self.outer}")


@dataclass(frozen=True)
class ScanKernel:
    """Inclusive scan (cumsum) along the free dim of a canonical space ``(outer..., part, free)``.

    Each 128-partition tile walks the free dim in chunks with ``tensor_tensor_scan``, carrying the
    running (P, 1) value from one chunk to the next; fp32 accumulation.
    """

    name: str
    family: str  # 'scan'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    space: tuple[int, ...]
    n_outer: int
    src: Access
    dst: Access
    op: str = "add"
    free_tile: int = 512
    source_ops: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [scan:{self.op}] space={self.space} outer={self.n_outer} "
                f"src={self.src} dst={self.dst}")


@dataclass(frozen=True)
class AttentionKernel:
    """Fused scaled-dot-product attention forward: ``out = softmax(scale * q k^T + mask) v`` per (b, h).

    One kernel for the whole SDPA subgraph (lowering/attention.py). Per (b, h): Q, K, V are loaded
    with one DMA each (rows on partitions), Q and K transposed on TensorE (D on partitions); per
    128-query tile the scores of a key step (up to ``key_step`` keys) go to PSUM, the causal
    diagonal is masked by accumulating a -BIG bias (built once with ``affine_select``), the row max
    and an exp with a fused row sum give P (online softmax across steps), P is transposed on
    TensorE and P V accumulates in PSUM. Accesses are ``(arg, offset, (b, h, s, d) strides)`` into the
    flat arguments (the mask's last two are (query, key) strides; 0 = broadcast); ``out`` is
    written through ``out_strides`` over ``(b, h, query, d)``.
    """

    name: str
    family: str  # 'attention'
    inputs: tuple[ArgSpec, ...]  # (q, k, v[, mask])
    outputs: tuple[ArgSpec, ...]
    batch: int
    heads: int
    sq: int
    sk: int
    d: int
    dv: int
    scale: float
    causal: bool
    q: tuple[int, int, tuple[int, ...]]  # (arg, offset, (b, h, s, d) strides)
    k: tuple[int, int, tuple[int, ...]]
    v: tuple[int, int, tuple[int, ...]]
    mask: tuple[int, int, tuple[int, ...]] | None
    out_strides: tuple[int, ...]
    compute_dtype: str  # matmul operand dtype (the inputs' storage dtype)
    key_step: int = 2048
    source_ops: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [attention] b={self.batch} h={self.heads} sq={self.sq} sk={self.sk} d={self.d} "
                f"dv={self.dv} scale={self.scale!r} causal={self.causal} mask={self.mask is not None} "
                f"dtype={self.compute_dtype} step={self.key_step}")


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


Kernel = LoopKernel | CopyKernel | GatherKernel | IndexAddKernel | ScanKernel | AttentionKernel | ConvKernel \
    | ConvWgradKernel | PoolKernel | ResampleKernel


@dataclass(frozen=True)
class BufferRef:
    """A runtime buffer: a graph input, a kernel output, or a constant baked into the plan."""

    kind: str  # 'input' | 'kernel' | 'const' | 'random' (drawn by the runner per call) | 'empty'
    index: int  # input index / kernel index / constant index / random index (Plan.randoms)
    slot: int = 0  # which output of the kernel
    numel: int = 0
    dtype: str = "float32"


@dataclass(frozen=True)
class OutputSpec:
    """How the runner builds one graph output: a strided view of a buffer, or a Python value."""

    buffer: int | None  # index into Plan.buffers, None for a literal
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    offset: int = 0
    torch_dtype: str = "float32"
    literal: Any = None


@dataclass(frozen=True)
class KernelCall:
    kernel: int  # index into Plan.kernels
    args: tuple[int, ...]  # buffer indices
    results: tuple[int, ...]  # buffer indices it defines


@dataclass(frozen=True)
class InputSpec:
    """What the runner expects for graph input ``i`` and how to pass it (as a flat buffer)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    torch_dtype: str
    nki_dtype: str
    is_tensor: bool = True
    used: bool = True


@dataclass(frozen=True)
class RandomSpec:
    """How the runner draws one random buffer: a torch sampler, its parameters, size and dtype."""

    sampler: str  # 'uniform' | 'normal' | 'bernoulli' | 'exponential' | 'randint'
    params: tuple[float, ...]
    numel: int
    torch_dtype: str


@dataclass(frozen=True)
class DeviceCheck:
    """A 0/1 value the kernels compute (``buffer[offset]``); the runner raises ``message`` when it is 0."""

    buffer: int
    offset: int
    message: str
    kind: str = "assert"  # 'index' (IndexOutOfRangeError) | 'assert' (DeviceAssertionError)


@dataclass(frozen=True)
class Plan:
    """Everything the runner needs: kernels, buffers, the call order and how to build outputs."""

    kernels: tuple[Kernel, ...]
    buffers: tuple[BufferRef, ...]
    calls: tuple[KernelCall, ...]
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    constants: tuple[tuple[str, tuple[int, ...], list[Any]], ...] = ()  # (dtype, shape, values)
    summary: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    checks: tuple[DeviceCheck, ...] = ()  # device-side assertions the runner reads after the kernels
    randoms: tuple[RandomSpec, ...] = ()  # samplers of the 'random' buffers, drawn by the runner per call

    def to_json(self) -> dict[str, Any]:
        data = _jsonable(asdict(self))
        data["kernels"] = [dict(k.to_json(), _type=type(k).__name__) for k in self.kernels]
        return data

    def __str__(self) -> str:
        return "\n".join(str(k) for k in self.kernels)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return repr(obj)
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"))


def _decode(tp: Any, value: Any) -> Any:
    """Rebuild a value of type ``tp`` from its JSON form (dataclasses, tuples, unions; Any stays as loaded)."""
    import dataclasses
    import types
    import typing

    if value is None:
        return value
    if tp is Any:
        return _tuplify(value)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _decode(arg, value)
            except (TypeError, KeyError, ValueError):
                continue
        return value
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        hints = typing.get_type_hints(tp)
        fields = {f.name for f in dataclasses.fields(tp)}
        return tp(**{k: _decode(hints[k], v) for k, v in value.items() if k in fields})
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
    if isinstance(value, list):
        return tuple(value)
    return value


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


KERNEL_TYPES: dict[str, type] = {}


def kernel_to_json(kernel: Any) -> dict[str, Any]:
    """Lossless JSON form of a kernel (floats such as inf kept: encode with ``allow_nan=True``)."""
    return dict(asdict(kernel), _type=type(kernel).__name__)


def kernel_from_json(data: dict[str, Any]) -> Any:
    if not KERNEL_TYPES:
        KERNEL_TYPES.update({cls.__name__: cls for cls in (LoopKernel, CopyKernel, GatherKernel, IndexAddKernel,
                                                            ScanKernel, AttentionKernel, ConvKernel,
                                                            ConvWgradKernel, PoolKernel, ResampleKernel)})
    data = dict(data)
    cls = KERNEL_TYPES[data.pop("_type")]
    return _decode(cls, data)
