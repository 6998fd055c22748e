"""Training with backend="neuron": a few optimizer steps whose losses must match eager.

Builds a tiny GPT (``examples/models.py``) with random weights, copies it, and trains both copies
from identical initial weights on the same random token batches: one eager, one through
``torch.compile(model, backend="neuron", dynamic=False)`` (forward and backward graphs both run as
NKI kernels on the bundled simulator). Prints the two losses side by side per step.
Run: ``python examples/train.py`` (exit status 1 if any step's losses differ beyond ``--rtol``).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import GPT, GPTConfig  # noqa: E402

import neuron_compile  # noqa: E402,F401  (registers backend="neuron"; the entry point does too)
from neuron_compile.backend import compiled_graphs, reset  # noqa: E402


class LMLoss(nn.Module):
    """The model and its loss in one module, so the compiled graphs include cross-entropy and its backward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def train(model: nn.Module, loss_fn: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
          lr: float, optimizer: str) -> list[float]:
    """Run one optimizer step per batch on ``model`` (loss computed by ``loss_fn``); return the losses."""
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for idx, target in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(idx, target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance per step's loss")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    cfg = GPTConfig(vocab=128, seq=32, d_model=64, n_heads=2, n_layers=2)
    eager_model = GPT(cfg)
    neuron_model = copy.deepcopy(eager_model)  # identical initial weights
    # One fixed batch of random tokens, next-token targets: the loss should fall as the model memorizes it.
    tokens = torch.randint(0, cfg.vocab, (args.batch, cfg.seq + 1))
    batches = [(tokens[:, :-1], tokens[:, 1:])] * args.steps

    t0 = time.perf_counter()
    eager = train(eager_model, LMLoss(eager_model), batches, args.lr, args.optimizer)
    eager_s = time.perf_counter() - t0

    reset()
    compiled = torch.compile(LMLoss(neuron_model), backend="neuron", dynamic=False)
    t0 = time.perf_counter()
    neuron = train(neuron_model, compiled, batches, args.lr, args.optimizer)
    neuron_s = time.perf_counter() - t0

    print(f"model: GPT {cfg.n_layers} layers, d_model={cfg.d_model}, heads={cfg.n_heads}, vocab={cfg.vocab}, "
          f"batch={args.batch}, seq={cfg.seq}; optimizer {args.optimizer}, lr={args.lr}")
    for g in compiled_graphs():
        print(f"{g['kind']} graph: {g['kernels']} NKI kernels")
    print(f"{'step':>4}  {'eager loss':>12}  {'neuron loss':>12}  {'rel diff':>9}")
    ok = True
    for i, (e, n) in enumerate(zip(eager, neuron, strict=True)):
        rel = abs(n - e) / max(abs(e), 1e-12)
        ok &= rel <= args.rtol
        print(f"{i:>4}  {e:>12.7f}  {n:>12.7f}  {rel:>9.2e}")
    param_diff = max((a - b).abs().max().item()
                     for a, b in zip(eager_model.parameters(), neuron_model.parameters(), strict=True))
    print(f"max abs parameter difference after {args.steps} steps: {param_diff:.3e}")
    print(f"eager: {eager_s:.2f} s | neuron (compile + simulate, forward and backward): {neuron_s:.2f} s")
    if eager[-1] >= eager[0]:
        print(f"note: eager loss did not decrease ({eager[0]:.4f} -> {eager[-1]:.4f})")
    print("MATCH" if ok else f"MISMATCH (rtol={args.rtol})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
