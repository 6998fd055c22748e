"""Migration evaluation with the Python API: eager fallback, numeric checks, metrics, bucketing.

A small MLP scorer whose middle step, ``torch.linalg.eigh``'s leading eigenvector of a matrix of scores, has no
NeuronCore lowering (eigenvectors are unique only up to sign, which is LAPACK's choice, so they stay on the host). With ``options={"fallback": "eager", "check": True}`` it runs in eager PyTorch
between kernels, every compiled graph is compared with eager, and the reports say what fell back
(``neuron_compile.get_fallback_ops()``) and what compiling cost (``neuron_compile.get_compile_metrics()``).
The same model is then wrapped with :mod:`neuron_compile.bucketing` so five batch sizes compile
three static graphs. Run: ``python examples/evaluate.py`` or ``neuron-compile check examples/evaluate.py``
(exit status 1 if the results differ from eager).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import neuron_compile
from neuron_compile.bucketing import bucketed


class Reranker(nn.Module):
    """Scores items, takes the leading eigenvector of their 6 x 6 score matrix (unsupported: runs eagerly; its
    magnitudes, which don't depend on the sign), and mixes it."""

    def __init__(self, d: int = 64, side: int = 6) -> None:
        super().__init__()
        self.side = side
        self.proj = nn.Linear(d, d)
        self.score = nn.Linear(d, side * side)
        self.mix = nn.Linear(side, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(self.score(torch.relu(self.proj(x))), dim=-1).view(-1, self.side, self.side)
        leading = torch.linalg.eigh(scores @ scores.mT).eigenvectors[..., -1].abs()
        return torch.tanh(self.mix(leading))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--no-bucketing", action="store_true", help="skip the bucketing part")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = Reranker().eval()
    compiled = torch.compile(model, backend="neuron", dynamic=False,
                             options={"fallback": "eager", "check": True})
    x = torch.randn(args.batch, 64)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    err = (got - want).abs().max().item()
    print(f"max |compiled - eager| = {err:.2e}")

    print("\nops that fell back to eager:")
    for op in neuron_compile.get_fallback_ops():
        print(f"  {op['op']} x{op['count']} inputs {op['signatures']} at {op['locations']}")
    print("\ncompile metrics:")
    for m in neuron_compile.get_compile_metrics():
        times = ", ".join(f"{k} {v:.0f}" for k, v in m["times_ms"].items())
        print(f"  {m['name']}: {m['nodes']} nodes -> {m['kernels']} kernels, {m['fallback_ops']} eager op(s), "
              f"{m['segments']} segments, cache {m['cache']}; ms: {times}")

    ok = err < 1e-4
    if not args.no_bucketing:
        run = bucketed(compiled, batch_dim=0, buckets=[4, 8, 16])
        for batch in (3, 4, 6, 7, 12):
            xb = torch.randn(batch, 64)
            with torch.no_grad():
                diff = (run(xb) - model(xb)).abs().max().item()
            ok = ok and diff < 1e-4
        print("\n" + run.report())
    print("\nOK" if ok else "\nMISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
