"""Mixture-of-experts routing as ATen ops the backend lowers.

Hugging Face's MoE layers (Mixtral, Qwen-MoE, ...) sort the (token, expert) pairs by expert, count the tokens of
each expert with ``torch.histc``, turn the counts into offsets with ``cumsum(dtype=torch.int32)`` and run one
grouped matmul (``torch._grouped_mm``, or transformers' ``grouped_mm_fallback`` custom op when the weights are
not bf16). With static shapes none of this needs data-dependent sizes:

* ``histc``: each element's bin by torch's own fp32 formula (``trunc((x - min) * bins / (max - min))``, the
  right edge in the last bin, elements outside ``[min, max]`` and NaN dropped; with ``min == max`` the data's
  range, widened by 1 on both sides when that is a single value), then a one-hot count;
* a float ``cumsum`` / ``sum`` with an integer ``dtype=``: the truncating cast first, as torch does;
* grouped matmuls: the group of every row (``searchsorted(offs, row, right=True)``), all groups' products
  computed and each row's own one selected (rows past the last offset are 0, as transformers' fallback leaves
  them). Every group's weights meet every row, so this costs ``groups`` times the FLOPs of the grouped product,
  but a row only ever sees its own group's result: a NaN in another expert's weights never reaches it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from neuron_compile.lowering.registry import register_declined

aten = torch.ops.aten
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _histc(x: torch.Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> Any:  # noqa: A002 (torch's names)
    """aten.histc on fp32 input (torch counts low-precision inputs in their own dtype, saturating at 256 in bf16)."""
    if x.dtype != torch.float32:
        return NotImplemented
    flat = x.reshape(-1)
    if float(min) == float(max):  # the data's range (torch: aminmax, then +-1 when it is one value)
        if flat.numel() == 0:
            lo, hi = torch.zeros((), dtype=x.dtype), torch.ones((), dtype=x.dtype)
        else:
            lo, hi = torch.amin(flat), torch.amax(flat)
            same = lo == hi
            lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    else:
        lo = torch.full((), float(min), dtype=x.dtype)
        hi = torch.full((), float(max), dtype=x.dtype)
    pos = torch.trunc((flat - lo) * float(bins) / (hi - lo))
    pos = torch.where(pos == bins, bins - 1, pos)
    inside = (flat >= lo) & (flat <= hi)
    onehot = (pos.unsqueeze(1) == torch.arange(bins, dtype=x.dtype).unsqueeze(0)) & inside.unsqueeze(1)
    return onehot.to(x.dtype).sum(0)


def _histc_reason(node: torch.fx.Node) -> str:
    x = node.args[0].meta.get("val")
    dtype = x.dtype if isinstance(x, torch.Tensor) else None
    if dtype == torch.float64:
        return ("histc of float64 would count in float32 here (float64 runs as float32), where a value beside a bin "
                "edge can fall in the neighbouring bin of eager's float64 count: take the histogram of x.float()")
    saturation = "saturating at 256 in bfloat16, " if dtype == torch.bfloat16 else ""
    return (f"histc of {dtype}: torch counts it in that dtype ({saturation}with its rounding of the bin positions), "
            f"which is not reproduced: take the histogram of x.float()")


register_declined(_histc_reason, aten.histc.default)


def _cumsum(x: torch.Tensor, dim: int, *, dtype: Any = None) -> Any:
    """cumsum(float, dtype=int): torch casts (truncating) before it sums."""
    if dtype not in INTS or not x.is_floating_point():
        return NotImplemented
    return aten.cumsum.default(x.to(dtype), dim, dtype=dtype)


def _sum_dim(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """sum(float, dtype=int): torch casts (truncating) before it sums."""
    if dtype not in INTS or not x.is_floating_point():
        return NotImplemented
    return aten.sum.dim_IntList(x.to(dtype), dim, keepdim, dtype=dtype)


def _sum(x: torch.Tensor, *, dtype: Any = None) -> Any:
    """sum over everything as torch's core decomposition writes it (``sum.dim_IntList(x, [])``), the float input
    of an integer ``dtype=`` cast first."""
    if dtype in INTS and x.is_floating_point():
        x = x.to(dtype)
    return aten.sum.dim_IntList(x, [], dtype=dtype)


def _groups(offs: torch.Tensor, n: int) -> torch.Tensor:
    """The group of each of ``n`` positions: how many offsets are <= it (== len(offs) past the last offset)."""
    return torch.searchsorted(offs.to(torch.int64), torch.arange(n, dtype=torch.int64), right=True)


def _select_rows(per_group: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Row s of ``per_group[group[s]]`` ([G, S, N] -> [S, N]); rows whose group is G are 0."""
    g, s, n = per_group.shape
    idx = group.clamp(max=g - 1).view(1, s, 1).expand(1, s, n)
    picked = torch.gather(per_group, 0, idx).squeeze(0)
    return torch.where((group < g).unsqueeze(1), picked, torch.zeros((), dtype=picked.dtype))


def grouped_rows(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """[S, K] x [G, K, N] with the rows grouped by ``offs`` -> [S, N]."""
    g, s = w.shape[0], a.shape[0]
    per_group = torch.bmm(a.unsqueeze(0).expand(g, s, a.shape[1]), w)
    return _select_rows(per_group, _groups(offs, s))


def grouped_contraction(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """[M, K] x [K, N] with the contraction grouped by ``offs`` -> [G, M, N] (out[g] sums group g's K only)."""
    g, k = offs.shape[0], a.shape[1]
    mine = (_groups(offs, k).unsqueeze(0) == torch.arange(g, dtype=torch.int64).unsqueeze(1))  # [G, K]
    zero = torch.zeros((), dtype=a.dtype)
    a_g = torch.where(mine.unsqueeze(1), a.unsqueeze(0), zero)  # [G, M, K]
    b_g = torch.where(mine.unsqueeze(2), b.unsqueeze(0), zero)  # [G, K, N]
    return torch.bmm(a_g, b_g)


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Any:
    """aten._grouped_mm: 2-D x 3-D (rows grouped), 2-D x 2-D (contraction grouped), 3-D x 3-D (batched)."""
    if bias is not None or (out_dtype is not None and out_dtype != a.dtype):
        return NotImplemented
    if a.dim() == 3 and b.dim() == 3 and offs is None:
        return torch.bmm(a, b)
    if offs is None:
        return NotImplemented
    if a.dim() == 2 and b.dim() == 3:
        return grouped_rows(a, b, offs)
    if a.dim() == 2 and b.dim() == 2:
        return grouped_contraction(a, b, offs)
    return NotImplemented


def _fallback_backward(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor) -> Any:
    """transformers::grouped_mm_fallback_backward -> (grad_input, grad_weight): grad_weight[e] sums expert e's rows
    only (x^T grad with the contraction over rows grouped)."""
    return grouped_rows(grad, w.transpose(1, 2), offs), grouped_contraction(x.t(), grad, offs)


MOE: dict[Any, Callable[..., Any]] = {
    aten.histc.default: _histc,
    aten.cumsum.default: _cumsum,
    aten.sum.dim_IntList: _sum_dim,
    aten.sum.default: _sum,
    aten._grouped_mm.default: _grouped_mm,
}


def registered(namespace: str, ops: Sequence[tuple[str, Callable[..., Any]]]) -> dict[Any, Callable[..., Any]]:
    """``{torch.ops.<namespace>.<name>.default: fn}`` for the custom ops a loaded library has registered by now
    (looked up at every compile: a library imported after the first compile still gets them)."""
    ns = getattr(torch.ops, namespace, None)
    table: dict[Any, Callable[..., Any]] = {}
    for name, fn in ops:
        try:
            table[getattr(ns, name).default] = fn
        except (AttributeError, RuntimeError):
            continue
    return table


def third_party() -> dict[Any, Callable[..., Any]]:
    """Decompositions of the MoE custom ops of loaded libraries: transformers' grouped_mm_fallback(input [S, K],
    weight [E, K, N], offs [E]) -> [S, N] (the rows grouped) and its backward."""
    return registered("transformers", (("grouped_mm_fallback", grouped_rows),
                                       ("grouped_mm_fallback_backward", _fallback_backward)))
