"""Decompositions of torch.nn's fused inference fast paths into ops the backend lowers.

``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` in eval mode without autograd call fused
native kernels (``_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``) that PyTorch
has no decomposition for. These functions restate their documented semantics with ATen ops: packed
QKV projection, scaled dot-product attention with the mask types the fast path passes (0: ``[L, S]``
attention mask, 1: ``[B, S]`` key padding mask, 2: ``[B, H, L, S]``; boolean True = masked out), rows
with every key masked give zeros (the fast path's masked softmax), then the output projection, and
for the encoder layer the residuals, LayerNorms and feed-forward block.

Dropout in training is restated as eager's CPU dropout computes it (:func:`native_dropout`), so that under
``torch.manual_seed`` a compiled training step drops the same elements as eager.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, mask_type: int | None) -> torch.Tensor:
    """softmax over the last dim with boolean ``mask`` (True = masked) broadcast per ``mask_type``; rows
    whose keys are all masked give zeros, as the native masked softmax does."""
    if mask is None:
        return torch.softmax(scores, -1)
    b, h, lq, s = scores.shape
    if mask_type == 1 or (mask.dim() == 2 and mask.shape == (b, s) and mask_type is None):
        m = mask.view(b, 1, 1, s)
    elif mask.dim() == 2:
        m = mask.view(1, 1, lq, s)
    else:
        m = mask.reshape(-1 if mask.dim() == 4 else 1, *mask.shape[-3:]) if mask.dim() >= 3 else mask
    m = m.expand(b, h, lq, s)
    if mask.dtype != torch.bool:  # an additive float mask
        return torch.softmax(scores + m, -1)
    filled = scores.masked_fill(m, float("-inf"))
    probs = torch.softmax(filled, -1)
    return probs.masked_fill(m.all(-1, keepdim=True), 0.0)


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int, num_heads: int,
               qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
               mask: torch.Tensor | None, mask_type: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    b, lq, _ = query.shape
    s = key.shape[1]
    hd = embed_dim // num_heads
    wq, wk, wv = qkv_weight.split(embed_dim, 0)
    bq, bk, bv = qkv_bias.split(embed_dim, 0)
    q = torch.nn.functional.linear(query, wq, bq).view(b, lq, num_heads, hd).transpose(1, 2)
    k = torch.nn.functional.linear(key, wk, bk).view(b, s, num_heads, hd).transpose(1, 2)
    v = torch.nn.functional.linear(value, wv, bv).view(b, s, num_heads, hd).transpose(1, 2)
    scores = (q * (hd ** -0.5)) @ k.transpose(-2, -1)
    probs = _masked_softmax(scores, mask, mask_type)
    out = (probs @ v).transpose(1, 2).reshape(b, lq, embed_dim)
    return torch.nn.functional.linear(out, proj_weight, proj_bias), probs


def native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
                                num_head: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                                proj_weight: torch.Tensor, proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                need_weights: bool = True, average_attn_weights: bool = True,
                                mask_type: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    out, probs = _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
                            mask, mask_type)
    if not need_weights:
        return out, torch.empty(0, dtype=out.dtype, device=out.device)
    return out, probs.mean(1) if average_attn_weights else probs


def transformer_encoder_layer_fwd(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                                  qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                                  use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                                  norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                                  ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                                  ffn_bias_2: torch.Tensor, mask: torch.Tensor | None = None,
                                  mask_type: int | None = None) -> torch.Tensor:
    def ln(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (embed_dim,), w, bias, eps)

    def sa(x: torch.Tensor) -> torch.Tensor:
        return _attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                          mask_type)[0]

    def ff(x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.linear(x, ffn_weight_1, ffn_bias_1)
        h = torch.nn.functional.gelu(h) if use_gelu else torch.relu(h)
        return torch.nn.functional.linear(h, ffn_weight_2, ffn_bias_2)

    x = src
    if norm_first:
        x = x + sa(ln(x, norm_weight_1, norm_bias_1))
        return x + ff(ln(x, norm_weight_2, norm_bias_2))
    x = ln(x + sa(x), norm_weight_1, norm_bias_1)
    return ln(x + ff(x), norm_weight_2, norm_bias_2)


def masked_softmax(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, mask_type: int | None = None) -> Any:
    """aten._masked_softmax (True = masked; fully masked rows give zeros), the mask broadcast to ``x``."""
    d = -1 if dim is None else dim
    m = mask.expand_as(x) if mask.shape != x.shape else mask
    probs = torch.softmax(x.masked_fill(m, float("-inf")), d)
    return probs.masked_fill(m.all(d, keepdim=True), 0.0)


def trilinear(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1: list[int], expand2: list[int],
              expand3: list[int], sumdim: list[int], unroll_dim: int = 1) -> torch.Tensor:
    """aten._trilinear (nn.Bilinear and its gradients): the three inputs, each unsqueezed at its ``expand`` dims
    to a common rank, multiplied and summed over ``sumdim``; one einsum, so it lowers to matmuls.
    ``unroll_dim`` only picks the eager loop order."""
    rank = i1.dim() + len(expand1)
    letters = [chr(ord("a") + d) for d in range(rank)]
    subs = ["".join(letters[d] for d in range(rank) if d not in set(e)) for e in (expand1, expand2, expand3)]
    out = "".join(letters[d] for d in range(rank) if d not in set(sumdim))
    return torch.einsum(f"{subs[0]},{subs[1]},{subs[2]}->{out}", i1, i2, i3)


def _pairs(n: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows i < j of pdist's upper triangle, in its order (a graph constant after folding)."""
    ij = torch.triu_indices(n, n, 1, device=device)
    return ij[0], ij[1]


def pdist_forward(a: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """_pdist_forward: the p-norm of every row pair's difference (i < j, row-major), as eager computes it (direct
    differences, not the Gram-matrix shortcut that cancels for close points)."""
    n = a.shape[0]
    if n < 2:
        return a.new_zeros(0)
    i, j = _pairs(n, a.device)
    return torch.linalg.vector_norm(a.index_select(0, i) - a.index_select(0, j), p, -1)


def _distance_grad(diff: torch.Tensor, g: torch.Tensor, d: torch.Tensor, p: float) -> torch.Tensor:
    """The gradient of one pair's p-norm ``d`` of ``diff`` times ``g``, with eager's per-p formulas (CPU
    DistanceOpsKernel): 0 at a zero distance, every tied coordinate for the inf-norm, none at a zero coordinate
    for p < 1."""
    zero = torch.zeros_like(diff)
    if p == 0:
        return zero
    if p == 1:
        return torch.sign(diff) * g
    if p == 2:
        return torch.where(d == 0, zero, g * diff / d)
    if p == float("inf"):
        return g * torch.sign(diff) * (diff.abs() == d)
    if p < 2:
        keep = (d != 0) & ~((diff == 0) & (p < 1))
        return torch.where(keep, torch.sign(diff) * diff.abs().pow(p - 1) * g / d.pow(p - 1), zero)
    return torch.where(d == 0, zero, diff * diff.abs().pow(p - 2) * g / d.pow(p - 1))


def pdist_backward(grad: torch.Tensor, a: torch.Tensor, p: float, dist: torch.Tensor) -> torch.Tensor:
    """_pdist_backward: each pair's gradient added to row i and subtracted from row j."""
    n = a.shape[0]
    if n < 2 or p == 0:
        return torch.zeros_like(a)
    i, j = _pairs(n, a.device)
    pair = _distance_grad(a.index_select(0, i) - a.index_select(0, j), grad.unsqueeze(-1), dist.unsqueeze(-1), p)
    return torch.zeros_like(a).index_add(0, i, pair).index_add(0, j, -pair)


def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                   dist: torch.Tensor) -> torch.Tensor:
    """_cdist_backward (x1's gradient; autograd gets x2's by swapping the operands): every pair's gradient summed
    over the rows of x2."""
    if p == 0 or x1.numel() == 0 or x2.shape[-2] == 0:
        return torch.zeros_like(x1)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    pair = _distance_grad(diff, grad.unsqueeze(-1), dist.unsqueeze(-1), p)
    return pair.sum(-2).sum_to_size(x1.shape)


def weight_norm_interface_backward(grad_w: torch.Tensor, v: torch.Tensor, g: torch.Tensor, norms: torch.Tensor,
                                   dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """_weight_norm_interface_backward (``w = v * g / ||v||``, the norm over every dim but ``dim``): grad_g is
    ``<grad_w, v> / ||v||`` and grad_v ``(g / ||v||) (grad_w - v grad_g / ||v||)``, accumulated in fp32."""
    acc = torch.float32 if v.dtype in (torch.bfloat16, torch.float16) else v.dtype
    gw, vv, gg, nn_ = grad_w.to(acc), v.to(acc), g.to(acc), norms.to(acc)
    dims = [i for i in range(v.dim()) if i != dim % v.dim()] if dim != -1 else list(range(v.dim()))
    grad_g = (gw * vv).sum(dims, keepdim=True) / nn_
    grad_v = (gg / nn_) * (gw - vv * (grad_g / nn_))
    return grad_v.to(v.dtype), grad_g.reshape(g.shape).to(g.dtype)


def native_dropout(x: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``F.dropout`` in training, drawn as eager's CPU kernel draws it: a noise tensor of ``x``'s dtype filled by
    ``bernoulli_(1 - p)``, divided by ``1 - p`` in that dtype, times ``x``. PyTorch's own decomposition compares a
    ``rand_like`` with ``p`` instead, which has the same distribution but consumes the generator differently, so
    its masks never match eager's. p = 0, p = 1 and empty inputs draw nothing, as in eager."""
    if not train or p == 0 or x.numel() == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    if not x.dtype.is_floating_point:
        raise RuntimeError("result type Float can't be cast to the desired output type Long")
    noise = aten.div.Tensor(aten.bernoulli.p(x, 1.0 - p), 1.0 - p)  # drawn in x's layout (lowering/ops/random.py)
    return x * noise, noise != 0


NN: dict[Any, Any] = {
    aten.native_dropout.default: native_dropout,
    aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
    aten._pdist_forward.default: pdist_forward,
    aten._pdist_backward.default: pdist_backward,
    aten._cdist_backward.default: cdist_backward,
    aten._trilinear.default: trilinear,
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._masked_softmax.default: masked_softmax,
}
