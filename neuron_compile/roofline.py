"""Roofline of kernels and graphs: FLOPs, minimal HBM bytes and the best-case time they allow.

FLOPs come from the kernel IR, not from executed instructions, so redundant work in a kernel does
not raise its own bound: a matmul op counts ``2*M*N*K`` (TensorE, at the operand dtype's peak),
every other compute tile op 1 FLOP per element it produces (a reduction: per element it reads) at
the combined Vector + Scalar + GpSimd element rate for the kernel's I/O dtype. A fused attention
kernel counts the math of attention (:func:`attention_flops`), not of its decomposition. Minimal HBM bytes:
each kernel input read once and each output written once (``ArgSpec``\\ s); a gather reads only the
rows it gathers. A graph's minimal bytes are its own inputs and outputs (intermediates between
kernels could stay on chip). ``bound = max(PE FLOPs / PE peak, elementwise FLOPs / element peak,
bytes / HBM bandwidth per core)``; efficiency = bound / estimated time.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from neuron_compile.costmodel import hardware, itemsize
from neuron_compile.lowering.ir import (
    AttentionKernel,
    GatherKernel,
    IndexAddKernel,
    LoopKernel,
    Plan,
    ScanKernel,
)

log = logging.getLogger(__name__)

_COMPUTE = frozenset(("tensor_tensor", "tensor_scalar", "activation", "reciprocal", "select", "reduce", "divide"))


@dataclass(frozen=True)
class Roofline:
    pe_flops: int
    pe_dtype: str
    elementwise_flops: int
    elementwise_dtype: str
    min_bytes: int
    target: str

    @property
    def flops(self) -> int:
        return self.pe_flops + self.elementwise_flops

    def component_ns(self) -> dict[str, float]:
        hw = hardware(self.target)
        return {"pe": self.pe_flops / hw.pe_flops_per_s(self.pe_dtype) * 1e9 if self.pe_flops else 0.0,
                "elementwise": (self.elementwise_flops / hw.elementwise_per_s(self.elementwise_dtype) * 1e9
                                if self.elementwise_flops else 0.0),
                "hbm": self.min_bytes / hw.hbm_core_gbps_roofline}

    @property
    def time_ns(self) -> float:
        return max(self.component_ns().values())

    @property
    def bound(self) -> str:
        c = self.component_ns()
        return max(c, key=lambda k: c[k])

    def __add__(self, other: Roofline) -> Roofline:
        return Roofline(self.pe_flops + other.pe_flops, self.pe_dtype if self.pe_flops else other.pe_dtype,
                        self.elementwise_flops + other.elementwise_flops,
                        self.elementwise_dtype if self.elementwise_flops else other.elementwise_dtype,
                        self.min_bytes + other.min_bytes, self.target)

    def to_json(self) -> dict[str, Any]:
        return {"flops": self.flops, "pe_flops": self.pe_flops, "pe_dtype": self.pe_dtype,
                "elementwise_flops": self.elementwise_flops, "min_hbm_bytes": self.min_bytes,
                "time_ns": self.time_ns, "bound": self.bound, "components_ns": self.component_ns()}


def _arg_bytes(specs: Any) -> int:
    return sum(a.numel * itemsize(a.dtype) for a in specs)


def min_bytes(kernel: Any) -> int:
    """Each input read once, each output written once (a gather's table: only the gathered rows)."""
    if isinstance(kernel, GatherKernel):
        outer = math.prod(s for s, _, _ in kernel.outer) if kernel.outer else 1
        table = outer * kernel.rows * kernel.row_size * itemsize(kernel.inputs[0].dtype)
        return table + _arg_bytes(kernel.inputs[1:]) + _arg_bytes(kernel.outputs)
    return _arg_bytes(kernel.inputs) + _arg_bytes(kernel.outputs)


def _io_dtype(kernel: Any) -> str:
    specs = list(kernel.outputs) or list(kernel.inputs)
    return specs[0].dtype if specs else "float32"


def kernel_flops(kernel: Any) -> tuple[int, str, int]:
    """(TensorE FLOPs, operand dtype, elementwise FLOPs) of one IR kernel."""
    own = getattr(kernel, "roofline_flops", None)  # template-kernel families count their own math
    if own is not None:
        return own()
    if isinstance(kernel, LoopKernel):
        numel = math.prod(kernel.space)
        reduced = math.prod(kernel.space[d] for d in kernel.reduce_dims) if kernel.reduce_dims else kernel.space[-1]
        rows = numel // max(reduced, 1)
        pe, pe_dtype, elem = 0, "bfloat16", 0
        for op in kernel.ops:
            if op.opcode == "matmul":
                pe += 2 * numel * int(op.attr("k"))
                pe_dtype = str(op.attr("a_dtype", "float32"))
            elif op.opcode == "reduce":
                elem += numel  # one op per element read
            elif op.opcode in _COMPUTE:
                elem += numel if op.kind == "full" else rows
        return pe, pe_dtype, elem
    if isinstance(kernel, IndexAddKernel):
        outer = math.prod(s for s, *_ in kernel.outer) if kernel.outer else 1
        return 0, "float32", outer * kernel.tokens * kernel.row_size
    if isinstance(kernel, ScanKernel):
        return 0, "float32", math.prod(kernel.space)
    if isinstance(kernel, AttentionKernel):
        return attention_flops(kernel)
    return 0, "float32", 0


def attention_pairs(kernel: AttentionKernel) -> int:
    """(query, key) score pairs attention needs: all of them, or those on/below the diagonal when causal."""
    if not kernel.causal:
        return kernel.sq * kernel.sk
    return sum(min(q + 1, kernel.sk) for q in range(kernel.sq))


def attention_flops(kernel: AttentionKernel) -> tuple[int, str, int]:
    """Attention counts the math of attention, not of a particular decomposition: ``2*D`` (q k^T) plus
    ``2*Dv`` (p v) TensorE FLOPs per needed score pair (4*B*H*S*S*D for D = Dv, ~x0.5 when causal: masked pairs
    need no work), and 2 elementwise ops per pair (row max, exp with its fused row sum) on fp32 scores. The
    decomposed graph's count (mask, max, sub, exp, sum, div, guard on every pair) would credit work a fused
    kernel never has to do."""
    pairs = kernel.batch * kernel.heads * attention_pairs(kernel)
    return 2 * pairs * (kernel.d + kernel.dv), kernel.compute_dtype, 2 * pairs


def _elementwise_dtype(kernel: Any) -> str:
    return "float32" if isinstance(kernel, AttentionKernel) else _io_dtype(kernel)


def kernel_roofline(kernel: Any, target: str = "trn2") -> Roofline:
    pe, pe_dtype, elem = kernel_flops(kernel)
    return Roofline(pe, pe_dtype, elem, _elementwise_dtype(kernel), min_bytes(kernel), target)


def graph_min_bytes(plan: Plan) -> int:
    """The graph's inputs read once and its outputs written once."""
    total = 0
    for b in plan.buffers:
        if b.kind in ("input", "const", "random"):
            total += b.numel * itemsize(b.dtype)
    seen: set[int] = set()
    for o in plan.outputs:
        if o.buffer is None or o.buffer in seen:
            continue
        seen.add(o.buffer)
        b = plan.buffers[o.buffer]
        if b.kind == "kernel":
            total += b.numel * itemsize(b.dtype)
    return total


def graph_roofline(plan: Plan, target: str = "trn2") -> Roofline:
    """Summed kernel FLOPs with the graph's own minimal bytes."""
    parts = [kernel_roofline(k, target) for k in plan.kernels]
    if not parts:
        return Roofline(0, "bfloat16", 0, "float32", graph_min_bytes(plan), target)
    acc = parts[0]
    for r in parts[1:]:
        acc = acc + r
    return Roofline(acc.pe_flops, acc.pe_dtype, acc.elementwise_flops, acc.elementwise_dtype, graph_min_bytes(plan),
                    target)
