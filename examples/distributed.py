"""FSDP2 training with backend="neuron" under torchrun: a small GPT sharded over the ranks, losses vs eager.

Run on two CPU processes (gloo; on Trainium the same script runs on the Neuron process group):

    torchrun --nproc_per_node=2 examples/distributed.py

Each rank builds the same tiny GPT (``examples/models.py``, random weights) twice. Both copies are
sharded with FSDP2 (``fully_shard`` on every block and on the root, parameters in bf16 and gradients
reduced in fp32 by ``MixedPrecisionPolicy``); one trains eagerly, the other with every block compiled by
``torch.compile(block, backend="neuron")`` (``--compile model`` compiles the whole model instead). Each
rank trains on its own batch, so FSDP2's reduce-scatter really averages different gradients. Rank 0
prints both losses per step, the largest difference of the final parameters and the graphs compiled,
then ``MATCH`` when the runs agree (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import GPT, GPTConfig  # noqa: E402

import neuron_compile  # noqa: E402,F401  (registers backend="neuron")


def shard(model: GPT) -> GPT:
    """FSDP2: each block is its own unit (all-gathered just before it runs, freed after), the root holds the rest."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def train(model: nn.Module, params: nn.Module, idx: torch.Tensor, target: torch.Tensor, steps: int,
          lr: float) -> list[float]:
    opt = torch.optim.SGD(params.parameters(), lr=lr, momentum=0.9)  # Adam would amplify bf16 rounding noise
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        logits = model(idx).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def full(p: torch.Tensor) -> torch.Tensor:
    """A sharded parameter gathered to its full value (a collective: every rank must call it)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compile", choices=("blocks", "model"), default="blocks")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--rtol", type=float, default=2e-3, help="relative tolerance per step's loss (bf16)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print("run me with torchrun: torchrun --nproc_per_node=2 examples/distributed.py", file=sys.stderr)
        return 2

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=128, seq=32, d_model=64, n_heads=2, n_layers=2)
    base = GPT(cfg)
    eager_model, neuron_model = shard(copy.deepcopy(base)), shard(copy.deepcopy(base))
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own batch
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq + 1), generator=g)
    idx, target = tokens[:, :-1], tokens[:, 1:]

    eager = train(eager_model, eager_model, idx, target, args.steps, args.lr)
    t0 = time.perf_counter()
    if args.compile == "blocks":
        for block in neuron_model.blocks:
            block.compile(backend="neuron")
        compiled: nn.Module = neuron_model
    else:
        compiled = torch.compile(neuron_model, backend="neuron")
    neuron = train(compiled, neuron_model, idx, target, args.steps, args.lr)
    neuron_s = time.perf_counter() - t0

    diff = max((full(p.detach()).float() - full(q.detach()).float()).abs().max().item()
               for p, q in zip(eager_model.parameters(), neuron_model.parameters(), strict=True))
    graphs = neuron_compile.get_compile_metrics()
    ok = all(abs(n - e) <= args.rtol * abs(e) for e, n in zip(eager, neuron, strict=True))
    verdict = torch.tensor([int(ok)])
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)  # every rank's losses must match
    if rank == 0:
        print(f"model: GPT {cfg.n_layers} layers, d_model={cfg.d_model}, FSDP2 over {world} ranks (bf16 params, "
              f"fp32 reduction), compiled: {args.compile}")
        print(f"{'step':>4} {'eager loss':>12} {'neuron loss':>12}   (rank 0)")
        for i, (e, n) in enumerate(zip(eager, neuron, strict=True)):
            print(f"{i:>4} {e:>12.6f} {n:>12.6f}")
        kinds = [m["kind"] for m in graphs]
        where = sorted({Path(m["location"]).name for m in graphs if m["kind"] == "forward"})
        print(f"graphs compiled on rank 0: {kinds.count('forward')} forward, {kinds.count('backward')} backward "
              f"(forward at {', '.join(where)}); neuron run {neuron_s:.1f} s (compile included)")
        print(f"max |param difference| after {args.steps} steps: {diff:.3g}")
        print("MATCH" if verdict.item() else "MISMATCH")
    dist.barrier()  # both ranks tear gloo down together (not one while rank 0 still prints and holds the pair open)
    dist.destroy_process_group()
    return 0 if verdict.item() else 1


if __name__ == "__main__":
    sys.exit(main())
