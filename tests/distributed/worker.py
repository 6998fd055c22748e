"""One rank of a distributed test job: runs the named cases, writes ``rank<N>.json`` into ``--out``.

Started by :func:`launcher.torchrun` (``torchrun --nproc_per_node=2``, gloo on CPU). Each case runs the
same training (or collective) code twice on this rank, once eagerly and once compiled with
``backend="neuron"``, and records what the tests compare: losses of both runs, the largest difference of
the final parameters, how many graphs and segments were compiled, and the compile seconds. A case that
raises records its exception type, message and cause; the tests assert on them. Before each case the
rank writes ``rank<N>.progress`` (the case it is in, then ``after <case>`` while it waits for the other
ranks) so a hung job can say which rank stopped where.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# neuron_compile, torch._dynamo and the functional collectives are imported by the cases that use them: the
# 'hang' case starts (and is killed) seconds sooner without them.

log = logging.getLogger(__name__)

CASES: dict[str, Callable[[int, int], dict[str, Any]]] = {}
STEPS = 3


def case(fn: Callable[[int, int], dict[str, Any]]) -> Callable[[int, int], dict[str, Any]]:
    CASES[fn.__name__] = fn
    return fn


# ------------------------------------------------------------------------------------------ helpers

def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _max_param_diff(a: nn.Module, b: nn.Module) -> float:
    diffs = [(_local(p.detach()).float() - _local(q.detach()).float()).abs().max().item()
             for p, q in zip(a.parameters(), b.parameters(), strict=True)]
    return max(diffs)


def _train(model: nn.Module, step_fn: Callable[[nn.Module], torch.Tensor], params: nn.Module | None = None,
           lr: float = 0.1) -> list[float]:
    """Three SGD steps; the losses (this rank's) as floats."""
    opt = torch.optim.SGD((params or model).parameters(), lr=lr)
    losses = []
    for _ in range(STEPS):
        loss = step_fn(model)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _compile_stats(start_records: int) -> dict[str, Any]:
    """Graphs compiled by the backend since ``start_records``: count per kind, segments, compile seconds."""
    from neuron_compile import metrics
    from neuron_compile.collective_runner import collective_graphs

    recs = metrics.get_compile_metrics()[start_records:]
    graphs = collective_graphs()
    return {
        "graphs": {k: sum(1 for r in recs if r["kind"] == k) for k in ("forward", "backward", "inference")},
        "segments": [r["segments"] for r in recs],
        "compile_s": round(sum(r["total_ms"] for r in recs) / 1000, 3),
        "collective_graphs": [g.to_json() for g in graphs],
    }


def _compare(eager: list[float], compiled: list[float], m_eager: nn.Module, m_compiled: nn.Module,
             start_records: int, elapsed: float) -> dict[str, Any]:
    return {"eager_losses": eager, "neuron_losses": compiled,
            "max_param_diff": _max_param_diff(m_eager, m_compiled), "neuron_run_s": round(elapsed, 3),
            **_compile_stats(start_records)}


def _begin() -> int:
    from neuron_compile import metrics
    from neuron_compile.collective_runner import clear_collective_graphs

    torch._dynamo.reset()
    clear_collective_graphs()
    return len(metrics.get_compile_metrics())


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Attention(nn.Module):
    """Multi-head causal self-attention; heads are inferred from the (possibly sharded) projection width,
    so the same code runs whole or with its heads split across ranks by tensor parallelism."""

    def __init__(self, d: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = MLP(d, 4 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def _batch(rank: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)  # a different batch per rank: gradients must be reduced
    return torch.randn(*shape, generator=g)


# ------------------------------------------------------------------------------------------ training

@case
def ddp(rank: int, world: int) -> dict[str, Any]:
    """DDP over a compiled MLP stack. Its 2 MB of parameters fill two 1 MB gradient buckets (the smallest bucket
    Dynamo's DDP optimizer accepts: DDP's first bucket is 1 MB), so Dynamo splits the graph per bucket."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 16))
    x, y = _batch(rank, 8, 512), _batch(rank + 7, 8, 16)

    def step(m: nn.Module) -> torch.Tensor:
        return F.mse_loss(m(x), y)

    m_eager, m_neuron = copy.deepcopy(base), copy.deepcopy(base)
    eager = _train(DDP(m_eager, bucket_cap_mb=1), step)
    start = _begin()
    t = time.perf_counter()
    compiled = DDP(torch.compile(m_neuron, backend="neuron"), bucket_cap_mb=1)
    losses = _train(compiled, step)
    return _compare(eager, losses, m_eager, m_neuron, start, time.perf_counter() - t)


def _fsdp_model() -> tuple[nn.Module, nn.Module]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    base = nn.Sequential(Block(32), Block(32), nn.Linear(32, 32))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out = []
    for _ in range(2):
        m = copy.deepcopy(base)
        for blk in m[:2]:
            fully_shard(blk, mp_policy=mp)
        fully_shard(m, mp_policy=mp)
        out.append(m)
    return out[0], out[1]


def _fsdp(rank: int, per_block: bool) -> dict[str, Any]:
    m_eager, m_neuron = _fsdp_model()
    x, y = _batch(rank, 4, 8, 32), _batch(rank + 7, 4, 8, 32)

    def step(m: nn.Module) -> torch.Tensor:
        return F.mse_loss(m(x).float(), y)

    eager = _train(m_eager, step)
    start = _begin()
    t = time.perf_counter()
    if per_block:
        for blk in m_neuron[:2]:
            blk.compile(backend="neuron")
        losses = _train(m_neuron, step)
    else:
        losses = _train(torch.compile(m_neuron, backend="neuron"), step, params=m_neuron)
    return _compare(eager, losses, m_eager, m_neuron, start, time.perf_counter() - t)


@case
def fsdp2_blocks(rank: int, world: int) -> dict[str, Any]:
    """FSDP2: fully_shard per block (bf16 parameters, fp32 reduction), each block compiled."""
    return _fsdp(rank, per_block=True)


@case
def fsdp2_whole(rank: int, world: int) -> dict[str, Any]:
    """FSDP2 as above, the whole model compiled."""
    return _fsdp(rank, per_block=False)


def _tp(rank: int, module: nn.Module, plan: dict[str, Any], x: torch.Tensor) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m_eager, m_neuron = copy.deepcopy(module), copy.deepcopy(module)
    for m in (m_eager, m_neuron):
        parallelize_module(m, mesh, plan)

    def step(m: nn.Module) -> torch.Tensor:
        return m(x).square().mean()

    eager = _train(m_eager, step)
    start = _begin()
    t = time.perf_counter()
    losses = _train(torch.compile(m_neuron, backend="neuron"), step, params=m_neuron)
    return _compare(eager, losses, m_eager, m_neuron, start, time.perf_counter() - t)


@case
def tp_mlp(rank: int, world: int) -> dict[str, Any]:
    """DTensor tensor parallelism: ColwiseParallel up-projection, RowwiseParallel down-projection."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), MLP(16, 64))  # the first layer is replicated: its input grad is reduced
    plan = {"1.up": ColwiseParallel(), "1.down": RowwiseParallel()}
    return _tp(rank, model, plan, torch.randn(4, 16))


@case
def tp_attention(rank: int, world: int) -> dict[str, Any]:
    """DTensor tensor parallelism on attention: q/k/v column-parallel (heads split), output row-parallel."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), Attention(32, head_dim=8))
    plan = {"1.q": ColwiseParallel(), "1.k": ColwiseParallel(), "1.v": ColwiseParallel(), "1.o": RowwiseParallel()}
    return _tp(rank, model, plan, torch.randn(2, 8, 32))


# ----------------------------------------------------------------------------------------- collectives

def _functional(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    h = x @ w
    red = fc.all_reduce(h, "sum", group)
    other = torch.tanh(x).sum(dim=0)  # does not need the all_reduce: runs while it is in flight
    gathered = fc.all_gather_single(h.relu(), 0, group)
    scattered = fc.reduce_scatter_single(h * 2, "sum", 0, group)
    swapped = fc.all_to_all_single(h + 1, None, None, group)
    src = fc.broadcast(h - 1, 1, group)
    avg = fc.all_reduce(h, "avg", group)
    return red * 0.5 + other, gathered.sum(dim=1), scattered, swapped, src, avg.max()


@case
def collectives(rank: int, world: int) -> dict[str, Any]:
    """all_reduce / all_gather / reduce_scatter / all_to_all / broadcast inside one compiled region."""
    x, w = _batch(rank, 4, 8), torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    want = _functional(x, w)
    start = _begin()
    got = torch.compile(_functional, backend="neuron")(x, w)
    got2 = torch.compile(_functional, backend="neuron")(x, w)  # second call: the cached graph runs again
    diffs = [(a - b).abs().max().item() for a, b in zip(want, got, strict=True)]
    diffs2 = [(a - b).abs().max().item() for a, b in zip(want, got2, strict=True)]
    from neuron_compile.collective_runner import collective_graphs
    from neuron_compile.comm_cost import graph_overlap

    graph = collective_graphs()[0]
    return {"max_diffs": diffs, "max_diffs_second_call": diffs2, "steps": [s.describe() for s in graph.steps],
            "comm_cost": graph_overlap(graph, "trn2"), **_compile_stats(start)}


# ------------------------------------------------------------------------------------------- bad input

def _error(exc: BaseException) -> dict[str, Any]:
    """The exception chain (Dynamo wraps a backend's error in BackendCompilerFailed) and our own error in it."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = getattr(e, "inner_exception", None) or e.__cause__
    from neuron_compile import NeuronCompileError

    ours = next((c for c in chain if isinstance(c, NeuronCompileError)), exc)
    return {"chain": [type(c).__name__ for c in chain], "type": type(ours).__name__, "message": str(ours),
            "failures": list(getattr(ours, "failures", []))}


@case
def rank_agreement(rank: int, world: int) -> dict[str, Any]:
    """Rank 1's graph holds a refused op; rank 0's compiles. Both must raise the same error."""
    import torch.distributed._functional_collectives as fc


    def f(x: torch.Tensor) -> torch.Tensor:
        y = fc.all_reduce(x * 2, "sum", dist.group.WORLD)
        if rank == 1:
            y = y + torch.linalg.eigh(y.reshape(2, 2)).eigenvectors.abs().sum()  # refused (vectors): only rank 1 fails
        return y + 1

    start = _begin()
    t = time.perf_counter()
    try:
        torch.compile(f, backend="neuron")(torch.rand(4) + 1)
    except Exception as exc:
        return {"error": _error(exc), "seconds": round(time.perf_counter() - t, 3), **_compile_stats(start)}
    return {"error": None, "seconds": round(time.perf_counter() - t, 3)}


@case
def strict_refusal(rank: int, world: int) -> dict[str, Any]:
    """A collective the backend cannot lower (a bitwise-or reduction) is refused by name in strict mode on every
    rank; with fallback='eager' the same graph runs it in PyTorch and matches eager."""
    import torch.distributed._functional_collectives as fc


    def f(x: torch.Tensor) -> torch.Tensor:
        return fc.all_reduce(x + 1, "bor", dist.group.WORLD) * 2

    x = torch.arange(6, dtype=torch.int32) * (rank + 1)
    out: dict[str, Any] = {}
    _begin()
    try:
        torch.compile(f, backend="neuron")(x)
        out["strict"] = None
    except Exception as exc:
        out["strict"] = _error(exc)
    torch._dynamo.reset()
    got = torch.compile(f, backend="neuron", options={"fallback": "eager"})(x)
    out["fallback_equal"] = bool(torch.equal(got, f(x)))
    return out


@case
def unsupported_group(rank: int, world: int) -> dict[str, Any]:
    """A collective on a process group whose backend compiled collectives cannot use is refused by name."""
    import torch.distributed._functional_collectives as fc
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the 'fake' backend)

    group = dist.new_group(ranks=list(range(world)), backend="fake")

    def f(x: torch.Tensor) -> torch.Tensor:
        return fc.all_reduce(x * 2, "sum", group) + 1

    _begin()
    try:
        torch.compile(f, backend="neuron")(torch.ones(4))
    except Exception as exc:
        return {"error": _error(exc), "group": group.group_name}
    return {"error": None, "group": group.group_name}


@case
def agreement_timeout(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 never compiles the graph rank 0 compiles: rank 0 stops after the agreement timeout, naming rank 1.
    (Runs last: the ranks' compile sequence numbers differ afterwards.)"""
    import torch.distributed._functional_collectives as fc


    def f(x: torch.Tensor) -> torch.Tensor:
        return fc.all_reduce(x * 3, "sum", dist.group.WORLD)

    if rank != 0:
        return {"skipped": True}
    _begin()
    t = time.perf_counter()
    try:
        from neuron_compile.config import config

        with config.patch(rank_agreement_timeout=3.0):
            torch.compile(f, backend="neuron")(torch.ones(4))
    except Exception as exc:
        return {"error": _error(exc), "seconds": round(time.perf_counter() - t, 3)}
    return {"error": None}


@case
def hang(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 stops answering (the launcher must kill the job and name rank 1)."""
    if rank == 1:
        time.sleep(3600)
    return {}


# ------------------------------------------------------------------------------------------------ main

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("cases", nargs="+", choices=sorted(CASES))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rank_env = int(os.environ["RANK"])
    (args.out / f"rank{rank_env}.pid").write_text(str(os.getpid()))  # the launcher kills a hung rank by pid
    if set(args.cases) != {"hang"}:
        import neuron_compile  # noqa: F401  (registers backend="neuron")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict[str, Any] = {"rank": rank, "world": world, "cases": {}}
    progress = args.out / f"rank{rank}.progress"
    for name in args.cases:
        progress.write_text(name)
        t = time.perf_counter()
        try:
            res = CASES[name](rank, world)
        except Exception as exc:  # a case that should not raise: the test shows this
            res = {"crashed": _error(exc), "traceback": traceback.format_exc()}
        res["case_s"] = round(time.perf_counter() - t, 3)
        results["cases"][name] = res
        progress.write_text(f"after {name}")
        # Each case ends together on every rank, so a slow case cannot bleed into the next one's timing.
        dist.barrier()
    progress.write_text("done")
    (args.out / f"rank{rank}.json.tmp").write_text(json.dumps(results, indent=1))
    os.replace(args.out / f"rank{rank}.json.tmp", args.out / f"rank{rank}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
