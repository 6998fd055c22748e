"""``flex_attention`` as dense attention, before AOTAutograd traces it.

Input: the Dynamo FX graph, whose ``flex_attention(q, k, v, score_mod=..., block_mask=...)`` calls are
``higher_order.flex_attention`` nodes with the score and mask functions as subgraphs; output: the same graph
(changed in place) with each such node calling :func:`dense_flex_attention` instead, which AOTAutograd then
traces (and differentiates) into ordinary ATen ops: ``q @ k^T * scale``, the score function and the mask
applied to every (batch, head, query, key) element through ``vmap``, a safe softmax (a fully masked row is 0)
and ``@ v``. This is PyTorch's own math reference (``sdpa_dense``, what eager flex_attention computes on the
CPU), so the values are eager's; the block-sparse structure of the block mask only skips work and is not used.
Hugging Face's ``attn_implementation="flex_attention"`` and hand-written flex attention compile this way.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

log = logging.getLogger(__name__)
FLEX = torch.ops.higher_order.flex_attention


def dense_flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Any,
                         block_mask: tuple[Any, ...], scale: float, kernel_options: dict[str, Any],
                         score_mod_other_buffers: tuple[Any, ...] = (),
                         mask_mod_other_buffers: tuple[Any, ...] = ()) -> tuple[torch.Tensor, ...]:
    """The ``flex_attention`` HOP's (out, logsumexp, max) as PyTorch's dense math (``sdpa_dense``). Under autocast,
    as eager's autocast rule for the op: q, k and v cast to the autocast dtype, then the math with autocast off
    (the scores, score function and softmax stay fp32; only the final product is in the autocast dtype)."""
    from torch._higher_order_ops.flex_attention import sdpa_dense
    from torch.amp.autocast_mode import _cast

    device = query.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        query, key, value = (_cast(t, device, dtype) for t in (query, key, value))  # float64 stays
    with torch.autocast(device, enabled=False):
        return sdpa_dense(query, key, value, score_mod, block_mask, scale, kernel_options,
                          tuple(score_mod_other_buffers), tuple(mask_mod_other_buffers))


def rewrite_flex_attention(gm: fx.GraphModule) -> fx.GraphModule:
    """Point the Dynamo graph's ``flex_attention`` nodes at :func:`dense_flex_attention`. Returns ``gm``."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is FLEX:
            node.target = dense_flex_attention
            changed += 1
    if changed:
        gm.recompile()
        log.debug("flex_attention as dense attention: %d call(s)", changed)
    return gm
