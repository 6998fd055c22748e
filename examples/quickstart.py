"""The main job: compile a small GPT-style model with backend="neuron" and check it against eager.

Builds a GPT (token + position embeddings, causal attention, LayerNorm, GELU MLP, LM head) with
random weights, compiles it with ``torch.compile(model, backend="neuron", dynamic=False)``, runs it
on the bundled NKI simulator (or the real ``nki`` when installed) and compares with eager PyTorch.
Run: ``python examples/quickstart.py`` (exit status 1 if the results differ).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import GPT, GPTConfig, ManualCausalSelfAttention  # noqa: E402

import neuron_compile  # noqa: E402,F401  (registers backend="neuron"; the entry point does too)
from neuron_compile.backend import compiled_graphs, reset  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--manual-attention", action="store_true",
                        help="write attention out (matmul, masked_fill, softmax) instead of F.scaled_dot_product_attention")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    cfg = GPTConfig(vocab=512, seq=args.seq, d_model=128, n_heads=4, n_layers=args.layers)
    attention = ManualCausalSelfAttention if args.manual_attention else None
    model = GPT(cfg, attention) if attention else GPT(cfg)
    model.eval()
    idx = torch.randint(0, cfg.vocab, (args.batch, cfg.seq))

    with torch.no_grad():
        t0 = time.perf_counter()
        expected = model(idx)
        eager_s = time.perf_counter() - t0

        reset()
        compiled = torch.compile(model, backend="neuron", dynamic=False)
        t0 = time.perf_counter()
        got = compiled(idx)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = compiled(idx)
        run_s = time.perf_counter() - t0

    graphs = compiled_graphs()
    err = (got - expected).abs().max().item()
    print(f"model: GPT {cfg.n_layers} layers, d_model={cfg.d_model}, heads={cfg.n_heads}, vocab={cfg.vocab}, "
          f"batch={args.batch}, seq={cfg.seq}")
    for i, g in enumerate(graphs):
        names = ", ".join(k.name for k in g["plan"].kernels)
        print(f"graph {i} ({g['kind']}): {g['kernels']} NKI kernels: {names}")
    print(f"max abs error vs eager: {err:.3e}")
    print(f"eager: {eager_s * 1000:.1f} ms | first call (compile + simulate): {first_s:.2f} s | "
          f"steady-state simulated run: {run_s:.2f} s")
    ok = torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
