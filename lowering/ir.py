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

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_compile.lowering.ir_base import Access, ArgSpec, Attr, TileOp, _jsonable, plain
from neuron_compile.lowering.ir_conv import ConvKernel, ConvWgradKernel, PoolKernel, ResampleKernel

__all__ = ["Access", "ArgSpec", "Attr", "TileOp", "ConvKernel", "ConvWgradKernel", "PoolKernel", "ResampleKernel"]

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
    src_dtype: str = ""  # a bitcast (aten.view.dtype): sources read as this storage dtype of the same size

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
    """``out = base; out[idx[n], :] += values[n, :]`` (index_put accumulate, index_add, scatter_add with an index
    shared by every row) as a DMA scatter-add.

    ``out`` starts as a copy of ``base``. Indices go 128 per tile onto partitions. Within a tile, duplicate indices
    are combined on TensorE (an index-equality matrix times the values, so each row's sum is in fp32), and only the
    first of each duplicate group writes. ``dma_compute`` then adds the rows into ``out`` in HBM (scatter
    read-modify-write). The cost is O(tokens x row_size), whatever the number of target rows. Indices outside
    ``[0, rows)`` (after wrapping negatives when ``wrap``) are skipped; with ``flag_slot >= 0`` they also clear
    that check output, which raises after the kernels. Accesses (arg, offset, (stride over rows/tokens, stride
    over the row)) plus unrolled ``outer`` loops as (size, base stride, values stride, out stride); the output is
    dense like the base.
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
    wrap: bool = True  # negative indices count from the end (index_put); index_add raises on them
    flag_slot: int = -1  # output slot of the bounds-check flag, -1 when the graph checks the indices itself

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [index_put] rows={self.rows} tokens={self.tokens} row_size={self.row_size} "
                f"outer={self.outer}")


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
class SortKernel:
    """Sort every row of ``(outer..., rows, n)`` along its last dim: a bitonic network in SBUF.

    Rows go 128 per tile onto partitions, the row along the free axis padded to a power of two with
    sentinel keys. Keys are int32: the values themselves for integers, for floats the fp32 bit pattern
    made monotone (-0.0 equal to +0.0, every NaN above +inf, as torch orders them). Comparisons are
    lexicographic on (key, original index), so equal keys keep their original order (a stable sort)
    in either direction. The sorted columns ``keep`` = [lo, hi) are stored: values through ``values``
    and int32 indices through ``indices`` (accesses over ``(outer..., rows, hi - lo)``; None = not needed).
    """

    name: str
    family: str  # 'sort'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    space: tuple[int, ...]  # (outer..., rows, n)
    n_outer: int
    src: Access
    values: Access | None
    indices: Access | None
    descending: bool = False
    keep: tuple[int, int] = (0, 0)
    key: str = "float"  # 'float' (fp32 bit-pattern keys) | 'int' (int32 values are the keys)
    select: str = ""  # '' | 'median' | 'nanmedian' | 'mode': store one column per row, its position found on chip
    chunks: int = 1  # > 1: a row longer than one partition holds spans several partitions (plain sort only)
    source_ops: tuple[str, ...] = ()
    flag_slot: int = -1  # output slot of the device-check flag (Plan.checks), -1: none

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [sort] space={self.space} outer={self.n_outer} desc={self.descending} "
                f"keep={self.keep} key={self.key} select={self.select!r} values={self.values} indices={self.indices}")


@dataclass(frozen=True)
class SearchKernel:
    """searchsorted/bucketize: torch's binary search, run for every value at once.

    Values of ``(outer..., rows, m)`` sit 128 rows per tile on partitions, chunks of the row along the
    free axis; each partition holds its row's sorted sequence (``n_seq`` elements; ``seq`` strides over
    the space's leading dims, 0 for a shared 1-D sequence, and its last entry the sequence's own stride),
    optionally permuted by ``sorter``. Every step gathers the middle element per value (``nc_n_gather``)
    and moves the bounds exactly as ATen's CPU search does, so NaN cases match too. int32 output.
    """

    name: str
    family: str  # 'search'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    space: tuple[int, ...]  # (outer..., rows, m)
    n_outer: int
    values: Access
    out: Access
    seq: Access
    n_seq: int
    sorter: Access | None = None
    right: bool = False
    key: str = "float"  # 'float' (fp32 compares) | 'int' (exact int32 compares)
    source_ops: tuple[str, ...] = ()
    flag_slot: int = -1  # output slot of the device-check flag (Plan.checks), -1: none

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [search] space={self.space} outer={self.n_outer} n_seq={self.n_seq} "
                f"right={self.right} sorter={self.sorter is not None} key={self.key}")


@dataclass(frozen=True)
class LineGatherKernel:
    """``out = x.gather(dim, index)`` for any index shape: one line (all dims but ``dim``) per partition.

    Space ``(outer..., lines, j)`` is the index's, ``dim`` last. Each partition holds its line of ``x``
    (``size`` elements along ``dim``, in chunks) in SBUF and picks ``index``'s elements with
    ``nc_n_gather``. ``x``/``out`` accesses: strides over the space, the last entry ``x``'s stride
    along ``dim`` (for ``x``). Indices outside ``[lo, size)`` clear the check flag (output ``flag_slot``, a
    ``DeviceCheck``); negative ones from ``lo = -size`` wrap.
    """

    name: str
    family: str  # 'line_gather'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    space: tuple[int, ...]
    n_outer: int
    x: Access
    index: Access
    out: Access
    size: int
    lo: int = 0
    key: str = "float"  # tile dtype: 'float' (fp32) | 'int' (int32)
    source_ops: tuple[str, ...] = ()
    flag_slot: int = -1  # output slot of the device-check flag (Plan.checks), -1: none

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return f"kernel {self.name} [line_gather] space={self.space} size={self.size} lo={self.lo}"


@dataclass(frozen=True)
class ScatterKernel:
    """``out = self`` with ``src`` scattered along ``dim`` at ``index`` (scatter/scatter_add/scatter_reduce,
    index_add/index_copy/index_fill/index_reduce), any index shape, duplicates resolved like CPU torch.

    Space ``(outer..., lines, j)`` is the index's, ``dim`` last; a line's targets (``size`` along ``dim``)
    sit on its partition. Per chunk of targets, every index is compared with every target (iota) and the
    matching sources are reduced (``reduce``: sum/prod/mean/amax/amin; 'assign' takes the last match, as
    CPU torch's sequential loop does), then combined with the line of ``self`` (``include_self``).
    ``base``/``out`` accesses: strides over the space with their stride along ``dim`` last; ``src`` None
    means the scalar ``fill``. ``precopy``: copy all of ``self`` first (lines the index does not cover).
    Indices outside ``[lo, size)`` clear the check flag (output ``flag_slot``, a ``DeviceCheck``); negative
    ones from ``lo = -size`` wrap.
    """

    name: str
    family: str  # 'scatter'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    space: tuple[int, ...]
    n_outer: int
    base: Access
    index: Access
    src: Access | None
    out: Access
    size: int
    reduce: str  # 'assign' | 'sum' | 'prod' | 'mean' | 'amax' | 'amin'
    include_self: bool = True
    fill: float = 0.0
    lo: int = 0
    precopy: int = 0  # elements of a dense self copied to out first (0: every line is covered)
    key: str = "float"
    source_ops: tuple[str, ...] = ()
    flag_slot: int = -1  # output slot of the device-check flag (Plan.checks), -1: none
    overflow_slot: int = -1  # int64 sums: exact (hi, lo) words, this output flags a result outside int32

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [scatter:{self.reduce}] space={self.space} size={self.size} "
                f"include_self={self.include_self} lo={self.lo} precopy={self.precopy} key={self.key}")


@dataclass(frozen=True)
class ScanKernel:
    """Inclusive scans along the last dim of ``(outer..., rows, n)``: cumsum, cumprod, cummax, cummin,
    logcumsumexp, 128 rows per tile on partitions.

    fp32 sums/products: ``tensor_tensor_scan`` over chunks with a carried (P, 1) value; logcumsumexp: a
    running max and the rescaled sum ``s_i = s_{i-1} exp(m_{i-1} - m_i) + exp(x_i - m_i)`` as one linear
    scan. Integer sums: exact 64-bit (hi, lo) int32 words added with carries (Hillis-Steele on GpSimd);
    with ``int64_out`` a result outside int32 (which NeuronCores store) clears the check flag, else int32
    wraps as torch's int32 does. cummax/cummin: whole rows, a max/min scan of int32 order keys (NaN as
    torch: it wins and stays) and of the updating positions (ties take the latest), values gathered by
    index. ``values``/``indices`` accesses over the space (indices None unless cummax/cummin).
    """

    name: str
    family: str  # 'scan'
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    space: tuple[int, ...]
    n_outer: int
    src: Access
    values: Access
    indices: Access | None
    op: str  # 'sum' | 'prod' | 'max' | 'min' | 'logsumexp'
    key: str = "float"  # 'float' | 'int'
    int64_out: bool = False
    source_ops: tuple[str, ...] = ()
    flag_slot: int = -1  # output slot of the device-check flag (Plan.checks), -1: none

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        return (f"kernel {self.name} [scan:{self.op}] space={self.space} outer={self.n_outer} key={self.key} "
                f"int64_out={self.int64_out}")


FAMILY_KERNELS: tuple[type, ...] = (SortKernel, SearchKernel, LineGatherKernel, ScatterKernel, ScanKernel)  # rendered by their family template (codegen/render_family.py)

Kernel = (LoopKernel | CopyKernel | GatherKernel | IndexAddKernel | ScanKernel | AttentionKernel | SortKernel | SearchKernel
          | LineGatherKernel | ScatterKernel | ConvKernel | ConvWgradKernel | PoolKernel | ResampleKernel)


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
    layout: tuple[int, ...] | None = None  # eager's strides when they differ (a dense permutation, channels_last)


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

    sampler: str  # 'uniform' | 'normal' | 'bernoulli' | 'exponential' | 'geometric' | 'log_normal' | 'cauchy'
    #              | 'randint' | 'randperm'
    params: tuple[float, ...]
    numel: int
    torch_dtype: str
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()  # the layout eager fills when not contiguous (its memory order is the draw order)


@dataclass(frozen=True)
class DeviceCheck:
    """A 0/1 value the kernels compute (``buffer[offset]``); the runner raises ``message`` when it is 0
    (``whole``: a buffer of marks, raised when any is 1)."""

    buffer: int
    offset: int
    message: str
    kind: str = "assert"  # 'index' | 'linalg' | 'assert': the exception, errors.device_check_error(kind)
    whole: bool = False  # the whole buffer holds marks: raise if any element is nonzero


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


def dumps(obj: Any) -> str:
    return json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"))


def _decode(tp: Any, value: Any) -> Any:
    """Rebuild a value of type ``tp`` from its JSON form (dataclasses, tuples, unions; Any stays as loaded)."""
    return _decoder(tp)(value)


@functools.cache
def _decoder(tp: Any) -> Callable[[Any], Any]:
    """The function that rebuilds values of type ``tp`` from JSON, worked out once per type (inspecting the type
    per value was most of reading a plan back)."""
    import dataclasses
    import types
    import typing

    if tp is Any:
        return lambda value: None if value is None else _tuplify(value)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        arms = [arg for arg in typing.get_args(tp) if arg is not type(None)]

        def union(value: Any) -> Any:
            if value is None:
                return value
            for arm in arms:
                try:
                    return _decoder(arm)(value)
                except (TypeError, KeyError, ValueError):
                    continue
            return value

        return union
    if dataclasses.is_dataclass(tp):
        def record(value: Any) -> Any:
            if not isinstance(value, dict):
                return _as_loaded(value)
            decoders = _field_decoders(tp)  # looked up per call: a dataclass may hold its own type
            return tp(**{k: decoders[k](v) for k, v in value.items() if k in decoders})

        return record
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = args[0]
            return lambda value: None if value is None else tuple(_decoder(item)(v) for v in value)
        return lambda value: None if value is None else tuple(
            _decoder(a)(v) for a, v in zip(args, value, strict=True))
    return _as_loaded


def _as_loaded(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@functools.cache
def _field_decoders(tp: type) -> dict[str, Callable[[Any], Any]]:
    return {name: _decoder(hint) for name, hint in _field_hints(tp).items()}


@functools.cache
def _field_hints(tp: type) -> dict[str, Any]:
    """A dataclass's fields and their resolved types (``typing.get_type_hints`` per decoded value was ~40% of
    reading a cached plan: T5's 105 kernels decode ~1,300 dataclass values)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(tp)
    return {f.name: hints[f.name] for f in dataclasses.fields(tp)}


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


KERNEL_TYPES: dict[str, type] = {}


def kernel_to_json(kernel: Any) -> dict[str, Any]:
    """Lossless JSON form of a kernel (floats such as inf kept: encode with ``allow_nan=True``)."""
    return dict(plain(kernel), _type=type(kernel).__name__)


def kernel_from_json(data: dict[str, Any]) -> Any:
    if not KERNEL_TYPES:
        KERNEL_TYPES.update({cls.__name__: cls for cls in (LoopKernel, CopyKernel, GatherKernel, IndexAddKernel,
                                                            ScanKernel, AttentionKernel, *FAMILY_KERNELS, ConvKernel,
                                                            ConvWgradKernel, PoolKernel, ResampleKernel)})
    data = dict(data)
    cls = KERNEL_TYPES[data.pop("_type")]
    return _decode(cls, data)
