"""Sort, search, scatter and scan kernels under the cost model (trn2 by default), one row per workload.

Run ``python benchmarks/sort_scatter.py`` (``--target trn3``, ``--json``). Nothing executes: each workload is
captured and lowered like ``benchmarks/kernels.py`` does (its ``measure``), every kernel's instruction
stream enumerated from the rendered source and costed (:mod:`neuron_compile.costmodel`). Columns: estimated
time, roofline time (minimal HBM bytes / elementwise work) and its bound, efficiency = roofline / estimate,
kernel calls. The sort family is compare-exchange bound (a bitonic network does n log2(n)^2 / 4 pair
compares per row), so efficiency against the byte roofline is expected to be low; the rows show where the
time goes when the op appears in a model (sampling, position ids, EmbeddingBag, scatter_reduce). The scatter-adds
(an embedding's gradient, a GNN's aggregation, bag-of-words counts) are DMA scatter-adds of rows or elements.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent


def _measure() -> Callable[..., dict[str, Any]]:
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "kernels.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.measure


def workloads() -> dict[str, tuple[Callable[..., Any], list[Any]]]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50257, generator=g)
    rows = torch.randn(128, 1024, generator=g)
    mask = (torch.rand(8, 2048, generator=g) > 0.1).long()
    x = torch.randn(64, 512, generator=g)
    idx = torch.randint(0, 512, (64, 256), generator=g)
    src = torch.randn(64, 256, generator=g)
    weight = torch.randn(10000, 64, generator=g)
    bag_idx = torch.randint(0, 10000, (4096,), generator=g)
    offsets = torch.arange(0, 4096, 16)
    bounds = torch.sort(torch.randn(255, generator=g)).values
    table_grad = torch.zeros(50257, 768)
    token_ids = torch.randint(0, 50257, (1024,), generator=g)
    token_grads = torch.randn(1024, 768, generator=g)
    nodes = torch.zeros(4096, 64)
    edges = torch.randint(0, 4096, (20000,), generator=g)
    messages = torch.randn(20000, 64, generator=g)
    counts = torch.zeros(32, 8192)
    words = torch.randint(0, 8192, (32, 512), generator=g)
    return {
        "embedding grad: index_put 1024 rows -> 50257 x 768": (
            lambda t, i, v: t.index_put((i,), v, accumulate=True), [table_grad, token_ids, token_grads]),
        "GNN sum: scatter_add 20000 x 64 edges -> 4096 nodes": (
            lambda x, e, m: x.scatter_add(0, e.unsqueeze(1).expand(-1, 64), m), [nodes, edges, messages]),
        "word counts: scatter_add 32 x 512 -> 32 x 8192": (
            lambda c, w: c.scatter_add(1, w, torch.ones(32, 512)), [counts, words]),
        "topk(50) of 8 x 50257 logits": (lambda t: torch.topk(t, 50), [logits]),
        "sort 128 x 1024 (values + indices)": (lambda t: torch.sort(t, -1), [rows]),
        "median 128 x 1024": (lambda t: torch.median(t, -1), [rows]),
        "bucketize 128 x 1024 into 256 buckets": (lambda t, b: torch.bucketize(t, b), [rows, bounds]),
        "position ids: cumsum(int64 mask) 8 x 2048": (lambda m: torch.cumsum(m, -1) - 1, [mask]),
        "cummax 128 x 1024": (lambda t: torch.cummax(t, -1), [rows]),
        "scatter_reduce amax 64 x 512 <- 64 x 256": (lambda a, i, s: a.scatter_reduce(1, i, s, "amax"),
                                                      [x, idx, src]),
        "EmbeddingBag sum 4096 idx / 256 bags / 10000 x 64": (
            lambda w, i, o: F.embedding_bag(i, w, o, mode="sum"), [weight, bag_idx, offsets]),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="trn2")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    measure = _measure()
    rows = []
    for name, (fn, inputs) in workloads().items():
        rows.append(measure(name, fn, inputs, a.target))
    if a.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    print(f"{'workload':52} {'est us':>9} {'roof us':>9} {'bound':>12} {'eff':>6} {'kernels':>7}")
    for r in rows:
        print(f"{r['workload']:52} {r['estimated_us']:9.1f} {r['roofline_us']:9.1f} {r['bound']:>12} "
              f"{r['efficiency']:6.1%} {r['kernels']:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
