"""``torch.nn.attention.flex_attention`` through the backend (inference), against eager.

The flex_attention higher-order op is compiled as PyTorch's dense math (``lowering.decomp_flex``): the score
function and the mask applied to every element through vmap. Its mask functions index captured tensors with
0-d indices (``padding[b, kv]``), a multi-index gather whose result is 0-d inside the vmapped function.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

B, H, S, D = 2, 4, 8, 16


def _qkv(kv_heads: int = H) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, S, D, generator=g), torch.randn(B, kv_heads, S, D, generator=g),
            torch.randn(B, kv_heads, S, D, generator=g))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_flex_attention_with_padding_block_mask_and_score_mod_matches_eager() -> None:
    padding = torch.ones(B, S, dtype=torch.bool)
    padding[1, 5:] = False

    def mask_mod(b, h, q, kv):  # causal and padding: Hugging Face's flex mask, a 2-index gather per element
        return (kv <= q) & padding[b, kv]

    def score_mod(score, b, h, q, kv):
        return score + (q - kv) * 0.1

    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    q, k, v = _qkv()
    block_mask = create_block_mask(mask_mod, B, H, S, S, device="cpu")
    got = torch.compile(f, backend="neuron", dynamic=False)(q, k, v, block_mask)
    assert _rel(got, f(q, k, v, block_mask)) < 1e-5


@pytest.mark.parametrize("gqa", [False, True])
def test_flex_attention_head_bias_buffer_and_logsumexp_match_eager(gqa: bool) -> None:
    bias = torch.linspace(-1.0, 1.0, H)

    def score_mod(score, b, h, q, kv):  # a captured tensor read per head
        return score + bias[h] * (kv - q)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, enable_gqa=gqa, return_lse=True, scale=0.3)

    q, k, v = _qkv(2 if gqa else H)
    out, lse = torch.compile(f, backend="neuron", dynamic=False)(q, k, v)
    want_out, want_lse = f(q, k, v)
    assert _rel(out, want_out) < 1e-5 and _rel(lse, want_lse) < 1e-5


def test_flex_attention_under_bf16_autocast_is_eagers_rule() -> None:
    """Eager's autocast rule for flex_attention: q, k, v in bf16, the scores and softmax in fp32, a bf16 result
    (scores in bf16 would be twice as far from float64)."""

    def score_mod(score, b, h, q, kv):
        return score + (q - kv) * 0.1

    def f(q, k, v):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return flex_attention(q, k, v, score_mod=score_mod)

    q, k, v = (t * 3 for t in _qkv())
    got, want = torch.compile(f, backend="neuron", dynamic=False)(q, k, v), f(q, k, v)
    assert got.dtype == want.dtype == torch.bfloat16
    assert _rel(got.float(), want.float()) < 1e-3
