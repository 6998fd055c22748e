"""A few training steps of a model zoo entry (tests/models/zoo.py) through ``backend="neuron"``.

The script ``benchmarks/precompile.py --script "benchmarks/zoo_train.py llama"`` precompiles: what a
user's training loop on a Hugging Face model looks like to ``neuron-compile precompile`` (forward and
backward graphs, an optimizer step between calls). Prints the loss per step.

Run: ``python benchmarks/zoo_train.py NAME [--steps 3]`` (NAME: gpt2, llama, bert, ...; needs transformers
for the Hugging Face entries).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))

from zoo import ZOO, loss_of  # noqa: E402

import neuron_compile  # noqa: E402,F401  (registers backend="neuron")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=[e.name for e in ZOO])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: expected at least 1")
    entry = next(e for e in ZOO if e.name == args.name)
    torch.manual_seed(0)
    model, inputs = entry.build()
    model.train()
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(compiled(**inputs))
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.6f} ({time.perf_counter() - t0:.2f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
