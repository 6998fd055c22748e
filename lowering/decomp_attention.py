"""Decompositions of scaled_dot_product_attention's CPU forward and backward into matmuls and a softmax.

On CPU, ``F.scaled_dot_product_attention`` reaches AOTAutograd as
``_scaled_dot_product_flash_attention_for_cpu``: its forward decomposes to the math path (bmm,
softmax), but autograd records the fused ``..._backward`` op, which no NeuronCore kernel implements
(and whose saved "logsumexp" is, after the forward decomposition, really the attention matrix).
:func:`sdpa_flash_cpu_backward` recomputes the probabilities from q, k, v (causal or additive/bool
mask, scale; a fully masked row's are 0) and applies the standard softmax-attention gradients in fp32, so both passes lower
through the ordinary matmul / reduction / elementwise rules.

The forward itself goes through torch's math decomposition, whose second output is the attention
matrix where the op's schema promises the rows' logsumexp: :func:`sdpa_flash_cpu` keeps its output (the
graph ``lowering/attention.py`` recognises) and computes the logsumexp apart, so a caller that reads it
(the op called directly) gets eager's values and a graph that doesn't loses it to dead-code elimination.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)
aten = torch.ops.aten


def _fp32_heads(query: torch.Tensor, *kv: torch.Tensor) -> tuple[Any, ...]:
    """(rep, q, *kv) in fp32, each key/value head repeated across the `rep` query heads that share it (GQA)."""
    rep = query.shape[1] // kv[0].shape[1]
    grouped = (t.to(torch.float32) for t in kv)
    return rep, query.to(torch.float32), *(t.repeat_interleave(rep, dim=1) if rep != 1 else t for t in grouped)


def _scores(q: torch.Tensor, k: torch.Tensor, s: float, is_causal: bool, attn_mask: torch.Tensor | None
            ) -> torch.Tensor:
    """s * q k^T (+ additive or bool mask, causal -inf) of fp32 q and k with as many heads."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * s
    n_q, n_k = scores.shape[-2], scores.shape[-1]
    if is_causal:
        rows = torch.arange(n_q).unsqueeze(1)
        cols = torch.arange(n_k).unsqueeze(0)
        scores = torch.where(cols <= rows, scores, -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = torch.where(attn_mask, scores, -math.inf)
        else:
            scores = scores + attn_mask.to(torch.float32)
    return scores


def sdpa_flash_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                   is_causal: bool = False, *, attn_mask: torch.Tensor | None = None, scale: float | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, logsumexp): torch's math decomposition for the output; the fp32 logsumexp of every row's
    scores beside it (0 for a row whose every score is -inf, as the CPU kernel gives)."""
    math_path = torch._decomp.decomposition_table[aten._scaled_dot_product_flash_attention_for_cpu.default]
    output, _ = math_path(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    _, q, k = _fp32_heads(query, key)
    scores = _scores(q, k, query.shape[-1] ** -0.5 if scale is None else scale, is_causal, attn_mask)
    top = scores.amax(dim=-1)
    finite = torch.where(top == -math.inf, 0.0, top)
    lse = torch.log(torch.exp(scores - finite.unsqueeze(-1)).sum(dim=-1)) + finite
    return output, torch.where(top == -math.inf, 0.0, lse)


def sdpa_flash_cpu_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            out: torch.Tensor, logsumexp: torch.Tensor, dropout_p: float, is_causal: bool, *,
                            attn_mask: torch.Tensor | None = None, scale: float | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of softmax(q k^T * scale + mask) v, recomputing the probabilities (dropout_p must be 0)."""
    torch._check(dropout_p == 0.0, lambda: "scaled_dot_product_attention backward with dropout is not supported")
    dtype = query.dtype
    rep, q, k, v = _fp32_heads(query, key, value)
    g = grad_out.to(torch.float32)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    scores = _scores(q, k, s, is_causal, attn_mask)
    # a row whose every score is -inf (a padded query under a sliding window, say) attends to nothing: its
    # probabilities are 0, as the forward's guard and the CPU kernel give, not softmax's NaN
    p = torch.where((scores == -math.inf).all(dim=-1, keepdim=True), 0.0, torch.softmax(scores, dim=-1))
    dv = torch.matmul(p.transpose(-2, -1), g)
    dp = torch.matmul(g, v.transpose(-2, -1))
    ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
    dq = torch.matmul(ds, k) * s
    dk = torch.matmul(ds.transpose(-2, -1), q) * s
    if rep != 1:
        shape = (dk.shape[0], dk.shape[1] // rep, rep, *dk.shape[2:])
        dk = dk.reshape(shape).sum(dim=2)
        dv = dv.reshape(shape).sum(dim=2)
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


ATTENTION: dict[Any, Callable[..., Any]] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa_flash_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: sdpa_flash_cpu_backward,
}
