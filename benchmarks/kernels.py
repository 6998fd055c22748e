"""Kernel performance under the cost model: issue 5's workloads (a)-(g) on trn2, one row each.

Run ``python benchmarks/kernels.py`` (``--only a,c`` for a subset, ``--json`` for machine output,
``--target trn3``). Nothing executes on the simulator: each workload is captured with Dynamo +
AOTAutograd (our decompositions), lowered with the real lowering (``build_artifacts``), and every
kernel's instruction stream is enumerated analytically from its rendered source
(:mod:`neuron_compile.instruction_stream`, validated against the simulator trace in
``tests/perf``). Columns: estimated time (:mod:`neuron_compile.costmodel`), roofline time and its
bound (:mod:`neuron_compile.roofline`, the graph's own minimal bytes), efficiency = roofline /
estimate, actual HBM bytes / minimal bytes, kernel calls, and the issue's target efficiency.
``--rules`` adds the efficiency under two other dependency rules (REFERENCE 4.4's first order, and a stricter
one), to show how much an estimate leans on the model's dependency term. Kernels with a checked fast path
(attention's unshifted softmax, which reruns the exact kernel when a row is out of range) are costed on the
fast path, which random inputs always take; a line under the table gives the time if every check failed.
Exit status 0 (it reports; it does not enforce the targets).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger(__name__)

TARGETS = {"a": 0.85, "b": 0.85, "c": 0.70, "d": 0.80, "e": 0.80, "f": 0.80, "g": 0.70}


def measure(name: str, fn: Callable[..., Any], inputs: list[Any], target: str) -> dict[str, Any]:
    from neuron_compile.backend import build_artifacts
    from neuron_compile.capture import aten_graphs
    from neuron_compile.config import config
    from neuron_compile.costmodel import estimate, total
    from neuron_compile.instruction_stream import kernel_segments, kernel_stream
    from neuron_compile.roofline import graph_roofline

    t0 = time.perf_counter()
    graphs = aten_graphs(fn, *inputs)
    est_total = None
    roof_ns = 0.0
    min_bytes = 0
    calls = 0
    bounds = []
    # the same kernels under two other dependency rules (see _rules_header): the sensitivity of the estimate
    first_order_ns = strict_ns = tripped_ns = 0.0
    guarded = 0
    with config.patch(target=target):
        for gm, ins in graphs:
            _, _, plan = build_artifacts(gm, ins)
            streams = [kernel_stream(k) for k in plan.kernels]
            per_kernel = [estimate(s, target) for s in streams]
            ests = [per_kernel[c.kernel] for c in plan.calls]
            # kernels with a runtime guard (attention's unshifted softmax): also the time when it trips everywhere
            tripped = [total([estimate(seg, target) for seg in kernel_segments(k, loaded_flag=1)], target)
                       if any(r.instruction == "register_load" for r in s) else e
                       for k, s, e in zip(plan.kernels, streams, per_kernel, strict=True)]
            guarded += sum(1 for c in plan.calls if tripped[c.kernel] is not per_kernel[c.kernel])
            tripped_ns += total([tripped[c.kernel] for c in plan.calls], target).time_ns
            for e in ests:
                top = max(e.engine_ns.values())
                rest = sum(e.engine_ns.values()) - top
                first_order_ns += top
                strict_ns += top + rest / max(1, min(e.store_tiles, e.dma_transfers - e.store_tiles))
            g = total(ests, target)
            est_total = g if est_total is None else total([est_total, g], target)
            roof = graph_roofline(plan, target)
            roof_ns += roof.time_ns
            bounds.append(roof.bound)
            min_bytes += roof.min_bytes
            calls += len(plan.calls)
    assert est_total is not None
    est_ns = est_total.time_ns
    return {"workload": name, "estimated_us": est_ns / 1e3, "roofline_us": roof_ns / 1e3,
            "bound": "+".join(dict.fromkeys(bounds)), "efficiency": roof_ns / est_ns if est_ns else 0.0,
            "hbm_bytes": est_total.hbm_bytes, "min_hbm_bytes": min_bytes,
            "hbm_ratio": est_total.hbm_bytes / min_bytes if min_bytes else 0.0, "kernels": calls,
            "graphs": len(graphs), "engine_us": {e: v / 1e3 for e, v in est_total.engine_ns.items()},
            "efficiency_first_order": roof_ns / first_order_ns if first_order_ns else 0.0,
            "efficiency_strict_dependency": roof_ns / strict_ns if strict_ns else 0.0,
            "guarded_calls": guarded, "guard_tripped_us": tripped_ns / 1e3,
            "seconds": time.perf_counter() - t0}


def workloads() -> dict[str, tuple[str, Callable[[], tuple[Callable[..., Any], list[Any]]]]]:
    bf16 = torch.bfloat16

    def gemm() -> tuple[Callable[..., Any], list[Any]]:
        return (lambda a, b: a @ b), [torch.randn(4096, 4096, dtype=bf16), torch.randn(4096, 4096, dtype=bf16)]

    def mlp() -> tuple[Callable[..., Any], list[Any]]:
        m = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096))
        return m.to(bf16).eval(), [torch.randn(2048, 4096, dtype=bf16)]

    def attention() -> tuple[Callable[..., Any], list[Any]]:
        q, k, v = (torch.randn(4, 16, 2048, 128, dtype=bf16) for _ in range(3))
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]

    def layernorm() -> tuple[Callable[..., Any], list[Any]]:
        return torch.nn.LayerNorm(4096).eval(), [torch.randn(8192, 4096)]

    def softmax() -> tuple[Callable[..., Any], list[Any]]:
        return (lambda x: torch.softmax(x, -1)), [torch.randn(8192, 8192)]

    def chain() -> tuple[Callable[..., Any], list[Any]]:
        return (lambda x: ((x * 2.0 + 1.0).relu() * 3.0 - 0.5).abs()), [torch.randn(64 * 1024 * 1024)]

    def gpt() -> tuple[Callable[..., Any], list[Any]]:
        sys.path.insert(0, str(ROOT / "examples"))
        from models import GPT, GPTConfig

        cfg = GPTConfig(vocab=50257, seq=1024, d_model=768, n_heads=12, n_layers=12)
        model = GPT(cfg).to(bf16).eval()
        return model, [torch.randint(0, cfg.vocab, (4, cfg.seq))]

    return {
        "a": ("GEMM bf16 4096^3", gemm),
        "b": ("MLP bf16 2048x4096->16384->4096 GELU", mlp),
        "c": ("causal attention bf16 B4 H16 S2048 D128", attention),
        "d": ("LayerNorm fp32 8192x4096", layernorm),
        "e": ("softmax fp32 8192x8192", softmax),
        "f": ("6 elementwise ops fp32 64M", chain),
        "g": ("GPT-2 small bf16 fwd (12L d768 s1024 b4)", gpt),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated workload letters (default: all)")
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rules", action="store_true",
                        help="also print the efficiency under two other dependency rules: REFERENCE 4.4's first order "
                             "(max of per-engine sums) and a stricter one (non-bottleneck work / min(store DMAs, load "
                             "DMAs) instead of / store DMAs)")
    args = parser.parse_args(argv)
    chosen = [w.strip() for w in args.only.split(",") if w.strip()] or list(workloads())
    rows = []
    for key in chosen:
        title, make = workloads()[key]
        fn, inputs = make()
        try:
            row = measure(title, fn, inputs, args.target)
        except Exception as exc:  # report the failure, keep the table going
            row = {"workload": title, "error": f"{type(exc).__name__}: {exc}"[:200]}
        row["id"] = key
        row["target_efficiency"] = TARGETS[key]
        rows.append(row)
        if not args.json:
            line = _fmt(row) + (_rules(row) if args.rules else "")
            print(line if len(rows) > 1 else _header() + (_rules_header() if args.rules else "") + "\n" + line,
                  flush=True)
    if args.json:
        print(json.dumps({"target": args.target, "rows": rows}, indent=1))
    else:
        for r in rows:
            if r.get("guarded_calls"):
                print(f"{r['id']}: {r['guarded_calls']} kernel call(s) run a checked fast path (attention's unshifted "
                      f"softmax); if every check failed and the exact kernel reran: {r['guard_tripped_us']:.1f} us, "
                      f"{r['roofline_us'] / r['guard_tripped_us']:.1%}")
    return 0


def _header() -> str:
    return (f"{'':2} {'workload':<42} {'est us':>10} {'roof us':>10} {'bound':<12} {'eff':>6} {'target':>6} "
            f"{'HBM/min':>8} {'kernels':>7} {'bench s':>7}")


def _rules_header() -> str:
    return f" {'1st-ord':>7} {'strict':>7}"


def _rules(r: dict[str, Any]) -> str:
    if "error" in r:
        return ""
    return f" {r['efficiency_first_order']:>7.1%} {r['efficiency_strict_dependency']:>7.1%}"


def _fmt(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['id']:2} {r['workload']:<42} ERROR {r['error']}"
    return (f"{r['id']:2} {r['workload']:<42} {r['estimated_us']:>10.1f} {r['roofline_us']:>10.1f} {r['bound']:<12} "
            f"{r['efficiency']:>6.1%} {r['target_efficiency']:>6.0%} {r['hbm_ratio']:>8.2f} {r['kernels']:>7} "
            f"{r['seconds']:>7.1f}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
