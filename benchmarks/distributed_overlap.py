"""Compute vs communication of one FSDP2 training step of a GPT-2-small-sized model on trn2, by the cost models.

Run ``python benchmarks/distributed_overlap.py`` (``--ranks 64 --micro-batch 8 --json``). Nothing runs on
Trainium or the simulator:

- compute: one transformer block's forward and backward ATen graphs (bf16 parameters, as FSDP2's
  ``MixedPrecisionPolicy(param_dtype=bfloat16)`` runs them) and the LM head + loss are captured with
  Dynamo + AOTAutograd for one sequence, lowered with the real lowering, and every kernel's instruction
  stream is costed by :mod:`neuron_compile.costmodel`; a micro-batch of ``B`` sequences is taken as
  ``B`` times one (kernel time grows linearly in the token dimension at these sizes);
- communication: FSDP2's collectives per block, priced by :mod:`neuron_compile.comm_cost`: an
  all-gather of the block's bf16 parameters before its forward and again before its backward
  (``reshard_after_forward=True``), and a reduce-scatter of its fp32 gradients after its backward
  (``reduce_dtype=float32``); the root module (embeddings, final norm, head) likewise;
- overlap: :func:`neuron_compile.comm_cost.simulate_overlap` replays the step with FSDP2's
  one-block-ahead prefetch: block i+1's all-gather is issued before block i computes (forward), block
  i-1's before block i's backward, and each reduce-scatter right after its block's backward.

It prints per-block and per-step compute time, communication time, exposed communication and the share
of communication hidden behind compute. Exit status 0 (it reports, it does not enforce).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
log = logging.getLogger(__name__)


def capture_train_graphs(fn: Any, *inputs: torch.Tensor) -> list[tuple[torch.fx.GraphModule, list[Any]]]:
    """The forward and backward ATen graphs of ``fn(*inputs).backward()`` (this package's decompositions)."""
    from neuron_compile.lowering.decompositions import decompositions
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append((gm, list(example_inputs)))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep, decompositions=decompositions())
    out = torch.compile(fn, backend=backend, dynamic=False)(*inputs)
    out.backward()
    return graphs


def graph_us(gm: torch.fx.GraphModule, inputs: list[Any], target: str) -> tuple[float, float]:
    """Device time of one ATen graph (every kernel call): the cost model's estimate of our kernels, and the
    roofline (the graph's FLOPs and minimal bytes at peak), in us."""
    from neuron_compile.backend import build_artifacts
    from neuron_compile.config import config
    from neuron_compile.costmodel import estimate, total
    from neuron_compile.instruction_stream import kernel_stream
    from neuron_compile.roofline import graph_roofline

    with config.patch(target=target):
        _, _, plan = build_artifacts(gm, inputs)
        per_kernel = [estimate(kernel_stream(k), target) for k in plan.kernels]
        est = total([per_kernel[c.kernel] for c in plan.calls], target).time_ns / 1e3
        return est, graph_roofline(plan, target).time_ns / 1e3


def fsdp2_step(layers: int, t: dict[str, float], comm: dict[str, float]) -> list[tuple[str, Any, float]]:
    """One FSDP2 step as compute / issue / wait steps, with one-block-ahead prefetch (module docstring)."""
    steps: list[tuple[str, Any, float]] = [("issue", "ag_root", comm["ag_root"]), ("issue", "ag_fw0", comm["ag_block"]),
                                           ("wait", "ag_root", 0.0)]
    for i in range(layers):  # forward: block i+1's parameters gather while block i computes
        if i + 1 < layers:
            steps.append(("issue", f"ag_fw{i + 1}", comm["ag_block"]))
        steps += [("wait", f"ag_fw{i}", 0.0), ("compute", f"fw{i}", t["block_fw"])]
    steps += [("compute", "head_fw", t["head_fw"]), ("compute", "head_bw", t["head_bw"]),
              ("issue", f"ag_bw{layers - 1}", comm["ag_block"])]
    for i in reversed(range(layers)):  # backward: block i-1's gather and block i's reduce-scatter in flight
        if i > 0:
            steps.append(("issue", f"ag_bw{i - 1}", comm["ag_block"]))
        steps += [("wait", f"ag_bw{i}", 0.0), ("compute", f"bw{i}", t["block_bw"]),
                  ("issue", f"rs{i}", comm["rs_block"])]
    steps.append(("issue", "rs_root", comm["rs_root"]))
    return steps


def main(argv: list[str] | None = None) -> int:
    from models import GPT, GPTConfig

    from neuron_compile.comm_cost import estimate_collective, simulate_overlap

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=64, help="data-parallel ranks (64 = one trn2.48xlarge at LNC=2)")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--target", default="trn2")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    cfg = GPTConfig(vocab=50257, seq=args.seq, d_model=768, n_heads=12, n_layers=args.layers)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = GPT(cfg)
    block = model.blocks[0].to(torch.bfloat16)
    x = torch.randn(1, cfg.seq, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    block_graphs = capture_train_graphs(lambda t: block(t).float().square().mean(), x)
    head = torch.nn.Sequential(model.ln_f, model.head).to(torch.bfloat16)
    labels = torch.randint(0, cfg.vocab, (1, cfg.seq))
    head_graphs = capture_train_graphs(
        lambda t: F.cross_entropy(head(t).float().view(-1, cfg.vocab), labels.view(-1)), x.detach().requires_grad_())
    (bf_gm, bf_in), (bb_gm, bb_in) = block_graphs[0], block_graphs[-1]
    (hf_gm, hf_in), (hb_gm, hb_in) = head_graphs[0], head_graphs[-1]
    b = args.micro_batch
    times = {name: [t * b for t in graph_us(gm, ins, args.target)]
             for name, gm, ins in (("block_fw", bf_gm, bf_in), ("block_bw", bb_gm, bb_in), ("head_fw", hf_gm, hf_in),
                                   ("head_bw", hb_gm, hb_in))}
    compute_s = time.perf_counter() - t0

    n = args.ranks
    block_params = sum(q.numel() for q in model.blocks[0].parameters())
    root_params = sum(q.numel() for name, q in model.named_parameters() if not name.startswith("blocks."))

    def gather(params: int) -> Any:  # bf16 parameters: each rank holds 1/n, gets them all
        return estimate_collective("all_gather", n, 2 * params // n, 2 * params, args.target)

    def scatter(params: int) -> Any:  # fp32 gradients: each rank gives them all, keeps 1/n reduced
        return estimate_collective("reduce_scatter", n, 4 * params, 4 * params // n, args.target)

    ag_block, rs_block, ag_root, rs_root = gather(block_params), scatter(block_params), gather(root_params), \
        scatter(root_params)
    layers = cfg.n_layers
    comm = {"ag_block": ag_block.time_us, "rs_block": rs_block.time_us, "ag_root": ag_root.time_us,
            "rs_root": rs_root.time_us}
    overlap = simulate_overlap(fsdp2_step(layers, {k: v[0] for k, v in times.items()}, comm))
    at_roofline = simulate_overlap(fsdp2_step(layers, {k: v[1] for k, v in times.items()}, comm))

    result = {
        "target": args.target, "ranks": n, "micro_batch": b, "seq": cfg.seq, "layers": layers,
        "params": sum(q.numel() for q in model.parameters()), "block_params": block_params,
        "root_params": root_params,
        "compute_us": {k: {"estimate": round(v[0], 1), "roofline": round(v[1], 1)} for k, v in times.items()},
        "all_gather_block": ag_block.to_json(), "reduce_scatter_block": rs_block.to_json(),
        "all_gather_root": ag_root.to_json(), "reduce_scatter_root": rs_root.to_json(),
        "step": overlap.to_json(), "step_at_roofline": at_roofline.to_json(), "estimate_seconds": round(compute_s, 1),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"FSDP2 step of a GPT-2-small-sized model ({result['params'] / 1e6:.1f} M parameters, {layers} blocks, "
          f"seq {cfg.seq}, {b} sequences per rank) on {n} {args.target} ranks, bf16 compute, fp32 gradient reduction")
    print(f"  compute per rank (us)   {'estimate':>10} {'roofline':>10}   (cost model of our kernels; the graphs' "
          f"FLOPs and bytes at peak; {compute_s:.0f} s to estimate)")
    for name, label in (("block_fw", "block forward"), ("block_bw", "block backward"), ("head_fw", "head+loss forward"),
                        ("head_bw", "head+loss backward")):
        print(f"  {label:<22} {times[name][0]:>10.1f} {times[name][1]:>10.1f}")
    for name, est in (("block all-gather", ag_block), ("block reduce-scatter", rs_block),
                      ("root all-gather", ag_root), ("root reduce-scatter", rs_root)):
        print(f"  {name:<22} {est.describe()}")
    for label, o in (("step (our kernels)", overlap), ("step (at roofline)", at_roofline)):
        print(f"  {label:<19} compute {o.compute_us / 1e3:8.2f} ms | communication {o.comm_us / 1e3:6.2f} ms | "
              f"exposed {o.exposed_comm_us / 1e3:6.2f} ms | hidden {o.hidden_fraction:6.1%} | "
              f"step {o.total_us / 1e3:8.2f} ms | communication / compute {o.comm_us / o.compute_us:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
