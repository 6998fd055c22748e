"""Small models shared by the examples, tests and benchmarks (random weights, no downloads)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab: int = 512
    seq: int = 64
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)
        k = k.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)
        v = v.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class ManualCausalSelfAttention(CausalSelfAttention):
    """The same attention written out (matmul, masked_fill, softmax): no SDPA."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        h = self.n_heads
        q = q.view(b, s, h, d // h).transpose(1, 2)
        k = k.view(b, s, h, d // h).transpose(1, 2)
        v = v.view(b, s, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: type[nn.Module] = CausalSelfAttention) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.out = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """A GPT-style decoder: token + position embeddings, pre-LN blocks, LM head."""

    def __init__(self, cfg: GPTConfig, attention: type[nn.Module] = CausalSelfAttention) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        s = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(s, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class MLP(nn.Module):
    def __init__(self, d_in: int = 96, d_hidden: int = 200, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
