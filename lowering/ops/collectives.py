"""Collectives in the graph: ``_c10d_functional`` ops become host steps between kernel segments.

A graph holding collectives (DTensor tensor parallelism, functional collectives written in a model,
Dynamo's traced ``torch.distributed`` calls) is cut at each of them by
:mod:`neuron_compile.collective_runner`: the compute between two collectives is compiled into NKI
kernels as usual, and each collective runs through ``torch.distributed`` on the process group the
user created (gloo on CPU; the Neuron process group on Trainium), issued asynchronously and waited
for at its ``wait_tensor``, so kernels that do not need its result run while it is in flight.

Each rule here turns a node into a :class:`CollectiveSpec` (what moves, over which group, how much)
that the runner executes and :mod:`neuron_compile.comm_cost` prices; its ``check`` refuses, by name,
what cannot be lowered: a process group whose backend cannot take the tensors, a dtype NeuronCores
do not move, a reduction the collective engines do not do, dynamic split sizes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from neuron_compile.lowering.registry import register_lowering
from torch import fx

log = logging.getLogger(__name__)

# Process-group backends a compiled collective may run on: gloo (CPU tensors, the simulator) and the
# Neuron process group (device tensors on Trainium).
SUPPORTED_BACKENDS = ("gloo", "neuron")
# Reductions of the Neuron collective engines (and gloo); bitwise and premultiplied sums are refused.
SUPPORTED_REDUCE_OPS = ("sum", "avg", "max", "min", "product")
# Dtypes a compiled collective moves (the backend's tensor dtypes; float64 travels as it is here).
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
                    torch.int16, torch.int8, torch.uint8, torch.bool)

_c10d = torch.ops._c10d_functional


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective as the runner issues it and the cost model prices it.

    ``op``: all_reduce | all_gather | reduce_scatter | all_to_all | broadcast; ``numel``/``dtype`` per input
    tensor (several for the coalesced forms); ``in_bytes``/``out_bytes`` per rank.
    """

    op: str
    group_name: str
    group_size: int
    backend: str
    dtypes: tuple[str, ...]
    in_numels: tuple[int, ...]
    out_numels: tuple[int, ...]
    reduce_op: str = ""
    src: int = -1  # broadcast: group-local source rank
    output_splits: tuple[int, ...] = ()
    input_splits: tuple[int, ...] = ()
    coalesced: bool = False

    @property
    def in_bytes(self) -> int:
        return sum(n * _itemsize(d) for n, d in zip(self.in_numels, self.dtypes, strict=True))

    @property
    def out_bytes(self) -> int:
        return sum(n * _itemsize(d) for n, d in zip(self.out_numels, self.dtypes, strict=True))

    def describe(self) -> str:
        extra = f" {self.reduce_op}" if self.reduce_op else ""
        extra += f" src={self.src}" if self.op == "broadcast" else ""
        return (f"{self.op}{extra} of {self.in_bytes} B/rank ({', '.join(self.dtypes)}) over group "
                f"'{self.group_name}' ({self.backend}, {self.group_size} ranks)")


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def resolve_group(group_name: Any) -> tuple[Any, str]:
    """The process group a collective names and its backend; raises ValueError with the reason."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("torch.distributed is not initialized in this process (call "
                         "torch.distributed.init_process_group first)")
    if isinstance(group_name, dist.ProcessGroup):
        pg = group_name
    else:
        from torch.distributed.distributed_c10d import _resolve_process_group

        try:
            pg = _resolve_process_group(str(group_name))
        except Exception as exc:  # an unknown or destroyed group
            raise ValueError(f"process group '{group_name}' cannot be resolved ({exc})") from exc
    try:
        backend = str(dist.get_backend(pg))
    except Exception:  # groups created outside init_process_group's registry (e.g. by hand)
        backend = str(getattr(pg, "name", lambda: "unknown")())
    return pg, backend.lower()


def _tensor_meta(a: Any) -> torch.Tensor | None:
    val = a.meta.get("val") if isinstance(a, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _inputs(node: fx.Node) -> list[torch.Tensor | None]:
    first = node.args[0]
    if isinstance(first, (list, tuple)):
        return [_tensor_meta(a) for a in first]
    return [_tensor_meta(first)]


def _group_arg(node: fx.Node) -> Any:
    return node.args[-1] if node.args else node.kwargs.get("group_name")


def check_collective(node: fx.Node) -> str | None:
    """Why this collective cannot be lowered (None when it can): group, backend, dtype, reduction, splits."""
    for t in _inputs(node):
        if t is None:
            return "its input is not a tensor with known shape"
        if t.dtype not in SUPPORTED_DTYPES:
            return (f"a collective on dtype {t.dtype} cannot be lowered (compiled collectives move "
                    f"{', '.join(_dtype_name(d) for d in SUPPORTED_DTYPES)}); cast before communicating")
    reduce_op = _reduce_op(node)
    if reduce_op is not None and reduce_op.lower() not in SUPPORTED_REDUCE_OPS:
        return (f"reduction '{reduce_op}' cannot be lowered (the collective engines reduce with "
                f"{', '.join(SUPPORTED_REDUCE_OPS)})")
    if node.target is _c10d.all_to_all_single.default:
        for sizes in (node.args[1], node.args[2]):
            if any(not isinstance(s, int) for s in (sizes or [])):
                return "all_to_all_single with data-dependent (symbolic) split sizes cannot be lowered; " \
                       "pass static split sizes"
    group = _group_arg(node)
    try:
        _, backend = resolve_group(group)
    except ValueError as exc:
        return f"{exc}"
    if backend not in SUPPORTED_BACKENDS:
        return (f"process group '{group}' uses backend '{backend}', which compiled collectives cannot run on "
                f"(supported: {', '.join(SUPPORTED_BACKENDS)}); create the group with backend='gloo' on CPU or "
                f"the Neuron process group on Trainium")
    return None


def _reduce_op(node: fx.Node) -> str | None:
    if node.target in (_c10d.all_reduce.default, _c10d.all_reduce_coalesced.default,
                       _c10d.reduce_scatter_tensor.default, _c10d.reduce_scatter_tensor_coalesced.default):
        return str(node.args[1])
    return None


def _spec(node: fx.Node, op: str, out_numels: list[int], **kw: Any) -> CollectiveSpec:
    ins = [t for t in _inputs(node) if t is not None]
    pg, backend = resolve_group(_group_arg(node))
    return CollectiveSpec(op, str(_group_arg(node)), int(pg.size()), backend,
                          tuple(_dtype_name(t.dtype) for t in ins), tuple(t.numel() for t in ins),
                          tuple(out_numels), **kw)


@register_lowering(_c10d.all_reduce.default, _c10d.all_reduce_coalesced.default, family="collective",
                   kind="collective", check=check_collective)
def lower_all_reduce(node: fx.Node) -> CollectiveSpec:
    """all_reduce(x, op, group): every rank gets the reduction (sum/avg/max/min/product) of all ranks' x."""
    ins = [t for t in _inputs(node) if t is not None]
    return _spec(node, "all_reduce", [t.numel() for t in ins], reduce_op=str(node.args[1]),
                 coalesced=isinstance(node.args[0], (list, tuple)))


@register_lowering(_c10d.all_gather_into_tensor.default, _c10d.all_gather_into_tensor_coalesced.default,
                   family="collective", kind="collective", check=check_collective)
def lower_all_gather(node: fx.Node) -> CollectiveSpec:
    """all_gather_into_tensor(x, n, group): the ranks' x concatenated along dim 0, in rank order."""
    ins = [t for t in _inputs(node) if t is not None]
    n = int(node.args[1])
    return _spec(node, "all_gather", [t.numel() * n for t in ins], coalesced=isinstance(node.args[0], (list, tuple)))


@register_lowering(_c10d.reduce_scatter_tensor.default, _c10d.reduce_scatter_tensor_coalesced.default,
                   family="collective", kind="collective", check=check_collective)
def lower_reduce_scatter(node: fx.Node) -> CollectiveSpec:
    """reduce_scatter_tensor(x, op, n, group): rank r gets chunk r (dim 0) of the reduction of all ranks' x."""
    ins = [t for t in _inputs(node) if t is not None]
    n = int(node.args[2])
    return _spec(node, "reduce_scatter", [t.numel() // max(n, 1) for t in ins], reduce_op=str(node.args[1]),
                 coalesced=isinstance(node.args[0], (list, tuple)))


@register_lowering(_c10d.all_to_all_single.default, family="collective", kind="collective", check=check_collective)
def lower_all_to_all(node: fx.Node) -> CollectiveSpec:
    """all_to_all_single(x, out_splits, in_splits, group): rank r sends rows in_splits[j] to rank j (equal
    chunks of dim 0 when the splits are empty)."""
    x = _inputs(node)[0]
    assert x is not None
    out = _tensor_meta(node)
    return _spec(node, "all_to_all", [out.numel() if out is not None else x.numel()],
                 output_splits=tuple(int(s) for s in node.args[1] or ()),
                 input_splits=tuple(int(s) for s in node.args[2] or ()))


@register_lowering(_c10d.broadcast.default, family="collective", kind="collective", check=check_collective)
def lower_broadcast(node: fx.Node) -> CollectiveSpec:
    """broadcast(x, src, group): every rank gets group-rank src's x."""
    x = _inputs(node)[0]
    assert x is not None
    return _spec(node, "broadcast", [x.numel()], src=int(node.args[1]))


def check_wait(node: fx.Node) -> str | None:
    return None if _tensor_meta(node.args[0]) is not None else "wait_tensor of a value that is not a tensor"


@register_lowering(_c10d.wait_tensor.default, family="collective", kind="collective", check=check_wait)
def lower_wait(node: fx.Node) -> None:
    """wait_tensor(x): the point where the collective producing x must have finished (its first use)."""
    return None


def is_wait(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is _c10d.wait_tensor.default


def collective_bytes(spec: CollectiveSpec) -> int:
    """The larger of one rank's input and output: the buffer the algorithm streams."""
    return max(spec.in_bytes, spec.out_bytes, 0)


def numel_of(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
