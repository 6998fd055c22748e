"""Per-region compilation with backend="neuron": only part of a program runs as NKI kernels.

Three ways, each checked against eager PyTorch:

1. ``model.block = torch.compile(model.block, backend="neuron")``: one transformer block compiled
   (forward and backward), the embedding and LM head stay eager.
2. ``model.block.compile(backend="neuron")``: the same through ``nn.Module.compile`` (in place).
3. A function decorated with ``@torch.compile(backend="neuron")`` that has a graph break in the
   middle (a ``print``): Dynamo splits it and each graph is compiled on its own.

Run: ``python examples/per_region.py`` (exit status 1 if any result differs from eager).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import Block, GPTConfig  # noqa: E402

import neuron_compile  # noqa: E402,F401  (registers backend="neuron"; the entry point does too)
from neuron_compile.backend import compiled_graphs, reset  # noqa: E402

ATOL = RTOL = 1e-4


class TinyLM(nn.Module):
    """Embedding -> one transformer block -> LM head; only ``block`` is compiled in this example."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.block = Block(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.tok(idx)))


@torch.compile(backend="neuron", dynamic=False)
def gated_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = F.silu(x @ w1)
    print("  (graph break: this print runs eagerly between the two compiled graphs)")
    return torch.softmax(h @ w2, dim=-1)


def report(name: str, got: torch.Tensor, expected: torch.Tensor, graphs: int) -> bool:
    err = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, atol=ATOL, rtol=RTOL)
    print(f"{name}: {graphs} compiled graph(s), max abs error vs eager {err:.3e}: {'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=128, seq=32, d_model=64, n_heads=2, n_layers=1)
    model = TinyLM(cfg)
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    ok = True

    # 1. torch.compile on one submodule: forward and backward of the block run on the simulator.
    expected = model(idx)
    expected.sum().backward()
    eager_grads = [p.grad.clone() for p in model.block.parameters()]
    compiled_model = copy.deepcopy(model)
    compiled_model.zero_grad(set_to_none=True)
    reset()
    compiled_model.block = torch.compile(compiled_model.block, backend="neuron", dynamic=False)
    got = compiled_model(idx)
    got.sum().backward()
    kinds = [g["kind"] for g in compiled_graphs()]
    ok &= report("model.block = torch.compile(model.block) forward", got, expected, kinds.count("forward"))
    grad_err = max((p.grad - e).abs().max().item()
                   for p, e in zip(compiled_model.block.parameters(), eager_grads, strict=True))
    grads_ok = all(torch.allclose(p.grad, e, atol=ATOL, rtol=RTOL)
                   for p, e in zip(compiled_model.block.parameters(), eager_grads, strict=True))
    print(f"model.block = torch.compile(model.block) backward: {kinds.count('backward')} compiled graph(s), "
          f"max abs grad error vs eager {grad_err:.3e}: {'ok' if grads_ok else 'MISMATCH'}")
    ok &= grads_ok and kinds == ["forward", "backward"]

    # 2. nn.Module.compile: compiles the module in place (inference here).
    inplace = copy.deepcopy(model)
    inplace.block.compile(backend="neuron", dynamic=False)
    reset()
    with torch.no_grad():
        ok &= report("model.block.compile(backend='neuron')", inplace(idx), model(idx), len(compiled_graphs()))

    # 3. A decorated function with a graph break: two graphs, each compiled.
    x, w1, w2 = torch.randn(16, 64), torch.randn(64, 96) * 0.1, torch.randn(96, 40) * 0.1
    reset()
    got = gated_mlp(x, w1, w2)
    graphs = len(compiled_graphs())
    ok &= report("@torch.compile function with a graph break", got,
                 torch.softmax(F.silu(x @ w1) @ w2, dim=-1), graphs)
    ok &= graphs == 2

    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
