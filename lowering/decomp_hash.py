"""``torch.hash_tensor``: the xor of every element's 64-bit pattern, as two int32 words, uint64 at the boundary.

Eager widens each element to its 64-bit kind (floats to float64, integers and bools to int64), reinterprets the bits
as uint64 and xors them over the reduced dims. NeuronCores have no 64-bit types, so :func:`hash_words` rewrites each
``hash_tensor`` whose result the graph returns into int32 ops computing the low and high words of those patterns
(``[..., 2]``, little-endian order) and xors them pairwise; the runner's result is viewed as uint64 on the host
(:func:`with_uint64_outputs`), no copy. A float32 value's float64 pattern is exact integer arithmetic on its bits:
the exponent re-biased, the mantissa shifted, subnormals normalized (they are normal in float64), NaN quieted as
the CPU's conversion does. float16/bfloat16 widen to float32 exactly first. float64 inputs are refused: they run
as float32 here, so their low bits are gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from neuron_compile.lowering.registry import register_declined
from torch import fx

aten = torch.ops.aten
_SIGN = -(2**31)


def float64_words(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) int32 words of float32 ``x`` widened to float64, bit for bit."""
    bits = x.view(torch.int32)
    sign = bits & _SIGN
    e = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    m = torch.where((e == 0xFF) & (m != 0), m | 0x400000, m)  # NaN: quieted
    hi = sign | (torch.where(e == 0xFF, 0x7FF, e + 896) << 20) | (m >> 3)  # exponent bias 127 -> 1023
    lo = (m & 7) << 29
    # subnormal m * 2^-149: normal in float64, exponent k - 149 with k = floor(log2 m) (m converts to float exactly)
    k = (((m.to(torch.float32).view(torch.int32) >> 23) & 0xFF) - 127).clamp(0, 22)
    rest = m - (torch.ones_like(k) << k)  # the bits below the leading one, shifted to the top of 52: by 52 - k
    sub_hi = sign | ((k + 874) << 20) | torch.where(k <= 20, rest << (20 - k).clamp(min=0),
                                                    rest >> (k - 20).clamp(min=0))
    sub_lo = torch.where(k > 20, rest << (52 - k).clamp(max=31), 0)
    subnormal, zero = (e == 0) & (m != 0), (e == 0) & (m == 0)
    hi = torch.where(zero, sign, torch.where(subnormal, sub_hi, hi))
    lo = torch.where(zero, 0, torch.where(subnormal, sub_lo, lo))
    return lo, hi


def hash_words(x: torch.Tensor, dim: Any = None, keepdim: bool = False, mode: int = 0) -> torch.Tensor:
    """``hash_tensor(x, dim, keepdim)`` as int32 ``[..., 2]``: the low and high words of the uint64 result."""
    if x.is_floating_point():
        lo, hi = float64_words(x.to(torch.float32))
    else:
        lo = x.to(torch.int32)
        hi = lo >> 31  # sign extension to int64 (0 for bool and uint8)
    words = torch.stack([lo, hi], -1)
    n = x.dim()
    dims = list(range(n)) if dim is None or (isinstance(dim, (list, tuple)) and not dim) else (
        [dim] if isinstance(dim, int) else list(dim))
    dims = sorted({d % n for d in dims}) if n else []
    kept = [d for d in range(n) if d not in dims]
    count = math.prod(x.shape[d] for d in dims)
    words = words.permute(*kept, *dims, n).reshape(*[x.shape[d] for d in kept], count, 2)
    while words.shape[-2] > 1:  # pairwise xor; an odd one out is xored with 0
        half = (words.shape[-2] + 1) // 2
        top = words[..., half:, :]
        pad = torch.zeros_like(words[..., : half - top.shape[-2], :])
        words = words[..., :half, :] ^ torch.cat([top, pad], -2)
    words = words.squeeze(-2)
    if keepdim:
        words = words.reshape(*[1 if d in dims else x.shape[d] for d in range(n)], 2)
    return words


@dataclass
class HashWords:
    """The rewritten graph and which of its outputs are uint64 hashes held as int32 word pairs."""

    gm: fx.GraphModule
    outputs: list[int]

    def wrap(self, runner: Callable[..., Any]) -> Callable[..., Any]:
        return with_uint64_outputs(runner, self.outputs)


def with_uint64_outputs(runner: Callable[..., Any], outputs: Sequence[int]) -> Callable[..., Any]:
    """``runner`` with its int32 ``[..., 2]`` word-pair outputs at ``outputs`` viewed as uint64 (``neuron_uint64``
    says which, so that a warm start rebuilds the same wrapper)."""
    where = set(outputs)

    def as_uint64(*args: Any) -> Any:
        results = runner(*args)
        return type(results)(r.contiguous().view(torch.uint64).squeeze(-1) if i in where else r
                             for i, r in enumerate(results))

    for attr in ("neuron_constants", "neuron_complex_io"):  # an inner wrapper's, read by the warm start
        if hasattr(runner, attr):
            setattr(as_uint64, attr, getattr(runner, attr))
    as_uint64.neuron_uint64 = list(outputs)  # type: ignore[attr-defined]
    return as_uint64


def returned_hashes(gm: fx.GraphModule) -> list[fx.Node]:
    """The ``hash_tensor`` nodes :func:`rewrite_hashes` compiles: of a float32-or-narrower real tensor, mode 0, and
    only returned (so a check of the graph before the rewrite, the training graph's, lets them through)."""
    out = gm.graph.output_node()

    def hashable(node: fx.Node) -> bool:
        x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        return (isinstance(x, torch.Tensor) and x.dtype != torch.float64 and not x.is_complex()
                and node.kwargs.get("mode", 0) == 0 and all(u is out for u in node.users))

    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in HASH_OPS and hashable(n)]


def rewrite_hashes(gm: fx.GraphModule) -> HashWords | None:
    """Each ``hash_tensor`` the graph only returns as int32 word pairs (None when there is none); one the graph uses
    otherwise stays and is refused by :func:`hash_problem`."""
    from neuron_compile.lowering.decomp_vjp import splice_traced
    from neuron_compile.lowering.decompositions import decompositions

    hits = returned_hashes(gm)
    if not hits:
        return None
    positions = [i for i, r in enumerate(gm.graph.output_node().args[0]) if r in hits]
    for node in hits:
        splice_traced(gm, node, hash_words, decompositions())
    gm.graph.lint()
    gm.recompile()
    return HashWords(gm, positions)


def hash_problem(node: fx.Node) -> str:
    x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
        return ("float64 runs as float32 on NeuronCores, so the low bits of its float64 patterns are gone; hash "
                "the tensor eagerly (outside the compiled region), or hash it as float32")
    return ("only a hash the graph returns is compiled (its uint64 result exists on the host only); return it "
            "from the compiled region and use it there")


HASH_OPS = tuple(getattr(aten.hash_tensor, o) for o in aten.hash_tensor.overloads() if "out" not in o) \
    if hasattr(aten, "hash_tensor") else ()
register_declined(hash_problem, *HASH_OPS)
