"""``neuron-compile ops``: the supported ATen overloads and their dtypes, generated from the registry.

The lowering registry (``neuron_compile.lowering.registry.rules()``) is the only source: for every
registered overload and every candidate dtype, :func:`probe` builds a one-node FX graph on meta
tensors (sample arguments derived from the op's schema) and asks the backend's own refusal check
(``neuron_compile.backend.unsupported_nodes``: the rule's ``check`` plus the input/output dtype
rules) whether it would be lowered. A dtype torch itself rejects for the op is left out.
Output: text (default), ``--json`` (schema below) or ``--markdown PATH`` (``docs/ops.md``, which
is generated, never edited by hand; ``--check`` tells whether a committed copy is stale).

JSON schema (``"schema": 1``)::

    {"schema": 1, "dtypes": [str...], "families": [str...],
     "ops": [{"op": "aten.add.Tensor", "family": str, "kind": str, "dtypes": [str...], "doc": str}...]}
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._ops import OpOverload

log = logging.getLogger(__name__)
aten = torch.ops.aten

SCHEMA_VERSION = 1

# Candidate dtypes, in display order. float64 is accepted but runs as float32 (with a warning).
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64", torch.int64: "i64",
         torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool"}

SHAPE = (4, 8)  # sample data shape: small, 2-D, so reductions/views/transposes all have a dim to act on


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _t(dtype: torch.dtype, shape: Sequence[int] = SHAPE) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _idx(shape: Sequence[int]) -> torch.Tensor:
    return _t(torch.int64, shape)


Sample = tuple[tuple[Any, ...], dict[str, Any]]

from neuron_compile.lowering.decomp_scatter import GATHER_LINES, SCATTER_LINES  # noqa: E402


def _bitcast_peer(d: torch.dtype) -> torch.dtype:
    """Another dtype of ``d``'s size that a bitcast may move to (int32 when there is none: the probe is refused)."""
    from neuron_compile.lowering.dtypes import BITCAST_SIZES

    size = BITCAST_SIZES.get(d)
    return next((o for o, n in BITCAST_SIZES.items() if o != d and n == size), torch.int32)


# Ops whose schema alone does not give a valid (and lowerable) call: explicit sample arguments.
# Index tensors are int64 and masks bool whatever the probed data dtype ``d``.
_OVERRIDES: dict[OpOverload, Callable[[torch.dtype], Sample]] = {
    aten.mm.default: lambda d: ((_t(d, (4, 8)), _t(d, (8, 5))), {}),
    aten.polygamma.default: lambda d: ((1, _t(d)), {}),  # the order n first
    aten.bmm.default: lambda d: ((_t(d, (2, 4, 8)), _t(d, (2, 8, 5))), {}),
    aten.embedding.default: lambda d: ((_t(d), _idx((3,))), {}),
    aten.index_select.default: lambda d: ((_t(d), 0, _idx((3,))), {}),
    aten.index.Tensor: lambda d: ((_t(d), [_idx((3,))]), {}),
    aten.index_put.default: lambda d: ((_t(d), [_idx((3,))], _t(d, (3, 8)), True), {}),
    aten.gather.default: lambda d: ((_t(d), 1, _idx((4, 1))), {}),
    aten.scatter.value: lambda d: ((_t(d), 1, _idx((4, 1)), 1), {}),
    aten.scatter.src: lambda d: ((_t(d), 1, _idx((4, 1)), _t(d, (4, 1))), {}),
    aten.scatter_add.default: lambda d: ((_t(d), 1, _idx((4, 1)), _t(d, (4, 1))), {}),
    aten.masked_fill.Tensor: lambda d: ((_t(d), _t(torch.bool), _t(d, ())), {}),
    aten.clamp.default: lambda d: ((_t(d), 0, 1), {}),
    aten.clamp.Tensor: lambda d: ((_t(d), _t(d)), {}),
    aten.transpose.int: lambda d: ((_t(d), 0, 1), {}),
    aten.select.int: lambda d: ((_t(d), 0, 1), {}),
    aten.expand.default: lambda d: ((_t(d, (1, 8)), [4, 8]), {}),
    aten.as_strided.default: lambda d: ((_t(d), [8, 4], [1, 8]), {}),
    aten.as_strided_scatter.default: lambda d: ((_t(d), _t(d, (2, 3)), [2, 3], [8, 2], 1), {}),
    torch.ops.prims.as_strided_scatter.default: lambda d: ((_t(d), _t(d, (2, 3)), [2, 3], [8, 2], 1), {}),
    aten.view.default: lambda d: ((_t(d), [8, 4]), {}),
    aten.view.dtype: lambda d: ((_t(d), _bitcast_peer(d)), {}),
    aten._unsafe_view.default: lambda d: ((_t(d), [8, 4]), {}),
    aten.reshape.default: lambda d: ((_t(d), [8, 4]), {}),
    aten.permute.default: lambda d: ((_t(d), [1, 0]), {}),
    aten.slice.Tensor: lambda d: ((_t(d), 1, 2, 6), {}),
    aten.squeeze.default: lambda d: ((_t(d, (4, 1, 8)),), {}),
    aten.squeeze.dim: lambda d: ((_t(d, (4, 1, 8)), 1), {}),
    aten.squeeze.dims: lambda d: ((_t(d, (4, 1, 8)), [1]), {}),
    aten.cat.default: lambda d: (([_t(d), _t(d)], 1), {}),
    torch.ops.prims.convert_element_type.default: lambda d: ((_t(d), d), {}),
    aten.pow.Scalar: lambda d: ((2, _t(d)), {}),
    aten._assert_async.msg: lambda d: ((_t(d, ()), "index out of range"), {}),
    aten.randint_like.default: lambda d: ((_t(d), 10), {}),
    aten.randint_like.low_dtype: lambda d: ((_t(d), 0, 10), {}),
    aten.randint.default: lambda d: ((10, [4, 8]), {"dtype": d}),
    aten.randint.low: lambda d: ((0, 10, [4, 8]), {"dtype": d}),
    aten.bernoulli.p: lambda d: ((_t(d), 0.3), {}),
    aten.geometric.default: lambda d: ((_t(d), 0.3), {}),
    aten.normal.float_float: lambda d: ((0.5, 2.0, [4, 8]), {"dtype": d}),
    aten.randperm.default: lambda d: ((8,), {"dtype": d}),
    aten.round.decimals: lambda d: ((_t(d),), {"decimals": 2}),
    aten.div.Tensor_mode: lambda d: ((_t(d), _t(d)), {"rounding_mode": "floor"}),
    aten.div.Scalar_mode: lambda d: ((_t(d), 3), {"rounding_mode": "trunc"}),
    aten.unfold.default: lambda d: ((_t(d), 1, 2, 2), {}),
    aten.arange.default: lambda d: ((8,), {"dtype": d}),
    aten.arange.start: lambda d: ((0, 8), {"dtype": d}),
    aten.arange.start_step: lambda d: ((0, 8, 1), {"dtype": d}),
    aten.kthvalue.default: lambda d: ((_t(d), 2, 1), {}),
    aten.topk.default: lambda d: ((_t(d), 2), {}),
    aten.sort.stable: lambda d: ((_t(d),), {"stable": True, "dim": 1}),
    aten.searchsorted.Tensor: lambda d: ((_t(d, (8,)), _t(d)), {}),
    aten.bucketize.Tensor: lambda d: ((_t(d), _t(d, (5,))), {}),
    GATHER_LINES: lambda d: ((_t(d), 1, _idx((4, 3)), 0), {}),
    aten._assert_async.msg: lambda d: ((_t(torch.bool, ()), "message"), {}),
    aten._embedding_bag_backward.default: lambda d: ((_t(d, (2, 8)), _idx((5,)), _idx((2,)), _idx((5,)), _idx((2,)),
                                                      _idx((2, 8)), 10, False, 0, False, None), {}),
    SCATTER_LINES: lambda d: ((_t(d), 1, _idx((4, 3)), _t(d, (4, 3)), 0.0, "sum", True, 0, "runtime"), {}),
    aten.convolution.default: lambda d: ((_t(d, (2, 4, 8, 8)), _t(d, (6, 4, 3, 3)), _t(d, (6,)), [1, 1], [1, 1],
                                          [1, 1], False, [0, 0], 1), {}),
    aten.avg_pool2d.default: lambda d: ((_t(d, (2, 4, 8, 8)), [2, 2]), {}),
    aten.avg_pool2d_backward.default: lambda d: ((_t(d, (2, 4, 4, 4)), _t(d, (2, 4, 8, 8)), [2, 2], [2, 2], [0, 0],
                                                  False, True, None), {}),
    aten.adaptive_max_pool2d.default: lambda d: ((_t(d, (2, 4, 8, 8)), [4, 4]), {}),
}


def _schema_sample(op: OpOverload, d: torch.dtype) -> Sample:
    """Sample arguments from the schema: tensors of dtype ``d`` (masks bool), dims -1, scalars 2."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    tensor_inputs = False
    for a in op._schema.arguments:
        t = str(a.type)  # "Tensor", "Optional[Tensor]", "List[int]", "Optional[int]", "number", ...
        if a.kwarg_only:
            continue
        base = t[len("Optional["):-1] if t.startswith("Optional[") else t
        if base == "Tensor":
            tensor_inputs = True
            if t != base and a.has_default_value():
                break
            args.append(_t(torch.bool if a.name in ("condition", "mask") else d))
        elif a.name in ("dim", "dims") and base == "int":
            args.append(-1)
        elif a.name in ("dim", "dims") and base == "List[int]":
            args.append([-1])
        elif base == "List[int]" and not a.has_default_value():
            args.append(list(SHAPE))
        elif base == "number" and not a.has_default_value():
            args.append(2)
        elif a.has_default_value():
            break  # keep every later positional at its default
        else:
            raise ValueError(f"no sample for argument {a.name}: {t} of {op}")
    if not tensor_inputs and any(a.name == "dtype" for a in op._schema.arguments):
        kwargs["dtype"] = d  # factories: the dtype is the one they create
    return tuple(args), kwargs


def sample(op: OpOverload, d: torch.dtype) -> Sample:
    maker = _OVERRIDES.get(op)
    return maker(d) if maker is not None else _schema_sample(op, d)


def _node_arg(graph: fx.Graph, value: Any, counter: list[int]) -> Any:
    if isinstance(value, torch.Tensor):
        counter[0] += 1
        node = graph.placeholder(f"arg{counter[0]}")
        node.meta["val"] = value
        return node
    if isinstance(value, (list, tuple)):
        return type(value)(_node_arg(graph, v, counter) for v in value)
    return value


def probe(op: OpOverload, d: torch.dtype) -> bool | None:
    """True if the backend lowers ``op`` on dtype ``d``, False if it refuses, None if torch rejects the call."""
    from torch.utils._pytree import tree_map_only

    from neuron_compile.backend import unsupported_nodes

    try:
        args, kwargs = sample(op, d)
        factory = "device" in (a.name for a in op._schema.arguments) and not any(
            isinstance(a, torch.Tensor) for a in args)
        out = op(*args, **kwargs, **({"device": "meta"} if factory else {}))
    except Exception:  # the dtype is not valid for this op in torch itself (or the sample is)
        return None
    decomposed = _decomposed(op, args, kwargs)
    if decomposed is not None:
        # a decomposition traces where eager's own CPU kernel may not exist (meta tensors take any dtype)
        try:
            op(*tree_map_only(torch.Tensor, lambda t: torch.zeros(t.shape, dtype=t.dtype), args), **kwargs)
        except Exception:
            return None
        return not unsupported_nodes(decomposed)
    graph = fx.Graph()
    counter = [0]
    node = graph.call_function(op, _node_arg(graph, args, counter), kwargs)
    node.meta["val"] = out
    graph.output(node)
    return not unsupported_nodes(fx.GraphModule(torch.nn.Module(), graph))


def _decomposed(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> fx.GraphModule | None:
    """The graph a compile lowers for ``op`` on these arguments when one of the backend's decompositions takes it
    (integer matmuls, for one, are limb matmuls in fp32); None when the op reaches its lowering rule as it is."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from neuron_compile.lowering.decompositions import decompositions

    table = decompositions()
    if op not in table:
        return None
    flat, spec = tree_flatten(args)
    where = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]

    def call(*tensors: torch.Tensor) -> Any:
        values = list(flat)
        for i, t in zip(where, tensors, strict=True):
            values[i] = t
        return op(*tree_unflatten(values, spec), **kwargs)

    try:
        gm = make_fx(call, decomposition_table=table, tracing_mode="fake")(*[flat[i] for i in where])
    except Exception:  # the decomposition does not trace on the sample: probe the op's own rule
        return None
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    if calls == [op]:
        return None  # the decomposition declined (NotImplemented): the rule takes the op
    return gm


@dataclass(frozen=True)
class OpSupport:
    op: str
    family: str
    kind: str
    dtypes: tuple[str, ...]
    doc: str


def matrix() -> list[OpSupport]:
    """Every registered overload with the dtypes it lowers, sorted by family then op name."""
    from neuron_compile.lowering.registry import rules

    # Internal ops (e.g. neuron_compile::attention, made by a pattern matcher) are not user-facing ATen ops.
    return list(_matrix(tuple(r for r in rules().values() if r.op.namespace in ("aten", "prims"))))


@functools.cache
def _matrix(registered: tuple[Any, ...]) -> tuple[OpSupport, ...]:
    rows = []
    for rule in registered:
        op = rule.op
        dtypes = tuple(dtype_name(d) for d in DTYPES if probe(op, d))
        if not dtypes:
            log.warning("support matrix: no dtype probed as supported for %s (add a sample to _OVERRIDES)", rule.name)
        rows.append(OpSupport(rule.name, rule.family, rule.kind, dtypes, rule.doc))
    return tuple(sorted(rows, key=lambda r: (r.family, r.op)))


def to_json(rows: list[OpSupport]) -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "dtypes": [dtype_name(d) for d in DTYPES],
            "families": sorted({r.family for r in rows}),
            "ops": [dict(asdict(r), dtypes=list(r.dtypes)) for r in rows]}


def render_text(rows: list[OpSupport]) -> str:
    width = max((len(r.op) for r in rows), default=10)
    out: list[str] = []
    for family in sorted({r.family for r in rows}):
        members = [r for r in rows if r.family == family]
        out.append(f"{family} ({len(members)})")
        for r in members:
            out.append(f"  {r.op:<{width}}  {' '.join(r.dtypes) or '(none)'}")
    out.append(f"{len(rows)} ATen overloads; float64 runs as float32 (with a warning).")
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(rows: list[OpSupport]) -> str:
    names = [dtype_name(d) for d in DTYPES]
    out = [
        "# Supported ATen ops",
        "",
        "<!-- Generated by `neuron-compile ops --markdown docs/ops.md`: do not edit by hand. -->",
        "",
        f"{len(rows)} ATen overloads lower to NKI kernels, grouped by family; ✓ marks each dtype the backend "
        "accepts for the op (probed with int64 index tensors and bool masks). Everything else PyTorch uses is either "
        "decomposed first by AOTAutograd into these ops (softmax, layer_norm, linear, cross_entropy, SDPA, ...; "
        "convolution_backward, max_pool1d/2d with indices and backward, interpolate/upsample in every separable mode "
        "(antialiased bilinear/bicubic too), "
        "adaptive_avg_pool1d/2d/3d and group_norm go to the conv, pool and resample kernels; 3-D convolutions "
        "(forward, transposed, backward) and 3-D max pooling run as 2-D ones with the depth taps folded into "
        "channels or picked afterwards; ops of Python scalars only, such as `tril_indices` and window functions, "
        "are computed at compile time as graph constants; histc on fp32 and "
        "the mixture-of-experts grouped matmuls, `torch._grouped_mm` and transformers' `grouped_mm_fallback`, "
        "to comparisons, sums and batched matmuls; complex values, as in complex rotary embeddings, as real pairs: "
        "arithmetic (quotients as c10::complex divides), views, data movement, gathers and scatters, sums and "
        "products (cumulative too), matrix products, comparisons, casts, and the elementary functions and their "
        "inverses (exp, log, log1p, expm1, powers, trigonometric and hyperbolic), to eager's special values; torch.fft (fft/ifft/rfft/irfft/hfft/ihfft and "
        "their 2-D/n-D forms, stft) as dense DFT matrix products on those pairs, up to 2048 points per transformed "
        "dim; the direct linear algebra (LU with partial pivoting, solve, inv, det, slogdet, triangular solves, "
        "Cholesky and its solves, Householder QR, geqrf/ormqr/householder_product, matrix_exp by scaling and "
        "squaring, for real and complex matrices up to 64 x 64) as unrolled eliminations and reflections, singular "
        "or indefinite inputs raising `torch.linalg.LinAlgError` as in eager; symmetric (Hermitian) eigenvalues and "
        "singular values (eigvalsh, svdvals, cond, matrix_rank, the 2- and nuclear norms, pinv, matrix_sqrth) as "
        "unrolled Jacobi sweeps for "
        "up to 16 columns, an eigh/svd whose vectors the graph reads refused (their signs are LAPACK's); "
        "`torch.cond` as both branches and a select of each "
        "result; `igamma`/`igammac` as an unrolled series and continued fraction for a <= 100; `frexp`/`nextafter` as "
        "integer arithmetic on bitcasts; `hash_tensor` as int32 word pairs of the float64/int64 patterns, returned "
        "as uint64; fake quantization (QAT's `FakeQuantize`, per tensor and per channel) as "
        "rounding and clamping) or "
        "refused at compile time with an `UnsupportedOpError` naming the op and your source line. float64 runs "
        "as float32 (with a warning). Integer ops compute in exact int32 (GpSimd integer `tensor_tensor`, wrapping "
        "like int32; int64 values live as int32) or are refused; int8/int16/uint8 values compute in int32 and wrap "
        "at their own width as torch's (sums kept in a narrow dtype are int64 sums cast); integer matmuls and "
        "convolutions are fp32 products of 8-bit limbs, integer powers square-and-multiply and integer max and "
        "average pooling a scan of their taps in int32, integer prod/cumprod trees of multiplications, integer "
        "scatter/index sums scatter-adds, their means a sum and a count and their products a one-hot table multiplied "
        "out, all exact, an int64 result past int32 raising; an integer division by zero raises as eager's.",
        "",
    ]
    header = "| ATen op | kind | " + " | ".join(SHORT[d] for d in DTYPES) + " | notes |"
    rule = "|" + "---|" * (len(DTYPES) + 3)
    for family in sorted({r.family for r in rows}):
        members = [r for r in rows if r.family == family]
        out += [f"## {family}", "", header, rule]
        for r in members:
            marks = " | ".join("✓" if n in r.dtypes else "" for n in names)
            out.append(f"| `{r.op}` | {r.kind} | {marks} | {_md_cell(r.doc)} |")
        out.append("")
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="machine-readable output (schema in the module docstring)")
    fmt.add_argument("--markdown", metavar="PATH", help="write the Markdown table (docs/ops.md) to PATH")
    parser.add_argument("--check", action="store_true",
                        help="with --markdown: write nothing, exit 1 if PATH differs from the generated table")
    parser.add_argument("--family", action="append", metavar="NAME", help="only this op family (repeatable)")


def run(args: argparse.Namespace) -> int:
    if args.check and not args.markdown:
        print("neuron-compile ops: error: --check needs --markdown PATH", file=sys.stderr)
        return 2
    rows = matrix()
    if args.family:
        known = sorted({r.family for r in rows})
        unknown = [f for f in args.family if f not in known]
        if unknown:
            print(f"neuron-compile ops: error: unknown family {', '.join(unknown)}; families: {', '.join(known)}",
                  file=sys.stderr)
            return 2
        rows = [r for r in rows if r.family in args.family]
    try:
        if args.json:
            sys.stdout.write(json.dumps(to_json(rows), indent=1) + "\n")
        elif args.markdown:
            path = Path(args.markdown)
            if not args.markdown.strip() or path.is_dir():
                print(f"neuron-compile ops: error: --markdown {args.markdown!r} is a directory, not a file; give the "
                      f"Markdown file to write, e.g. --markdown {path / 'ops.md'}", file=sys.stderr)
                return 2
            text = render_markdown(rows)
            if args.check:
                try:
                    current = path.read_text(encoding="utf-8") if path.exists() else None
                except (OSError, UnicodeDecodeError) as exc:
                    print(f"neuron-compile ops: error: cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                          file=sys.stderr)
                    return 1
                if current != text:
                    print(f"{path} is out of date: run `neuron-compile ops --markdown {path}`", file=sys.stderr)
                    return 1
                print(f"{path} is up to date ({len(rows)} ops)")
                return 0
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            except OSError as exc:
                print(f"neuron-compile ops: error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
                return 1
            print(f"wrote {path} ({len(rows)} ops)")
        else:
            sys.stdout.write(render_text(rows))
    except BrokenPipeError:  # `neuron-compile ops | head`
        return 0
    return 0
