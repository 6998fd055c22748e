"""Graph rewrites before partitioning (lowering/graph_passes.py): fewer kernels, identical values."""

from __future__ import annotations

import torch
from neuron_compile.lowering.graph_passes import embedding_of_arange_to_slice
from torch import fx

from neuron_compile import backend
from neuron_compile.config import config

aten = torch.ops.aten


class PosEmb(torch.nn.Module):
    def __init__(self, start: int, end: int) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(50, 16)
        self.pos = torch.nn.Embedding(40, 16)
        self.start, self.end = start, end

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(self.start, self.end))


def _compile(m: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, list]:
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(m, backend="neuron", dynamic=False)(idx)
    return got, list(backend.compiled_graphs()[-1]["plan"].kernels)


def test_position_embedding_is_a_slice_view_and_bit_identical() -> None:
    torch.manual_seed(0)
    m = PosEmb(3, 35).eval()
    idx = torch.randint(0, 50, (2, 32))
    got, kernels = _compile(m, idx)
    with torch.no_grad():
        assert torch.equal(got, m(idx))
    names = [k.name for k in kernels]
    assert sum(k.family == "gather" for k in kernels) == 1, names  # only the token embedding gathers
    assert not any("arange" in n for n in names), names
    with config.patch(fuse=False):
        _, unfused = _compile(m, idx)
    assert len(unfused) > len(kernels)


def _graph(start: int, end: int, step: int, rows: int) -> fx.GraphModule:
    g = fx.Graph()
    w = g.placeholder("w")
    w.meta["val"] = torch.empty(rows, 8)
    r = g.call_function(aten.arange.start_step, (start, end, step))
    e = g.call_function(aten.embedding.default, (w, r))
    g.output(e)
    return fx.GraphModule(torch.nn.Module(), g)


def test_rewrite_only_exact_cases_and_never_mutates_the_input() -> None:
    gm = _graph(2, 10, 1, 16)
    new = embedding_of_arange_to_slice(gm)
    assert new is not gm and aten.embedding.default in [n.target for n in gm.graph.nodes]
    (sl,) = [n for n in new.graph.nodes if n.op == "call_function"]
    assert sl.target == aten.slice.Tensor and sl.args[1:] == (0, 2, 10, 1)
    w = torch.randn(16, 8)
    assert torch.equal(new(w), torch.nn.functional.embedding(torch.arange(2, 10), w))
    for start, end, step, rows in [(0, 20, 1, 16), (0, 10, 2, 16)]:  # out of range (must still fail), step 2
        gm = _graph(start, end, step, rows)
        assert embedding_of_arange_to_slice(gm) is gm
