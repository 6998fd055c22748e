"""Graph rewrites before partitioning (lowering/graph_passes.py): fewer kernels, identical values."""

from __future__ import annotations

import pytest
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


def _only_the_token_gather(m: torch.nn.Module) -> tuple[torch.Tensor, list]:
    """``m`` compiled on random tokens: bit-identical to eager, and only the token embedding gathers (the
    position rows are a slice: no iota, no add, no gather kernel)."""
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (2, 32))
    got, kernels = _compile(m, idx)
    with torch.no_grad():
        assert torch.equal(got, m(idx))
    names = [k.name for k in kernels]
    assert sum(k.family == "gather" for k in kernels) == 1, names
    assert not any("arange" in n or "_add_" in n for n in names[:-1]), names
    return idx, kernels


def test_position_embedding_is_a_slice_view_and_bit_identical() -> None:
    torch.manual_seed(0)
    m = PosEmb(3, 35).eval()
    idx, kernels = _only_the_token_gather(m)
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


# -- MLP hidden activations feature-major ------------------------------------------------------------------

class MLP(torch.nn.Module):
    def __init__(self, d: int, h: int, act: torch.nn.Module, keep_hidden: bool = False) -> None:
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(d, h), act, torch.nn.Linear(h, d)
        self.keep_hidden = keep_hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        hidden = self.act(self.up(x))
        out = self.down(hidden) + x
        return (out, hidden) if self.keep_hidden else out


def _matmul_operands(kernels: list) -> list[tuple[bool, bool]]:
    from neuron_compile.codegen.render_matmul import operands

    return [tuple(op.transposable() for op in operands(k)) for k in kernels if k.family == "matmul"]



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("act", [torch.nn.GELU(), torch.nn.GELU(approximate="tanh"), torch.nn.ReLU()],
                         ids=["gelu", "gelu_tanh", "relu"])
def test_mlp_hidden_is_computed_feature_major(dtype: torch.dtype, act: torch.nn.Module) -> None:
    """h = act(x W1^T + b1) feeding only h W2^T is computed as h^T = act(W1 x^T + b1[:, None]): the second
    matmul's left operand is then K-major (no TensorE transposes of h); values equal eager; the per-row bias
    is loaded once per row, not broadcast by DMA."""
    from neuron_compile.instruction_stream import kernel_stream

    torch.manual_seed(0)
    m = MLP(96, 384, act).to(dtype).eval()
    x = torch.randn(2, 300, 96).to(dtype)  # 600 rows: ragged 128-row tiles
    got, kernels = _compile(m, x)
    tol = {torch.bfloat16: 3e-2, torch.float16: 4e-3}.get(dtype, 1e-4)
    torch.testing.assert_close(got.float(), m(x).float(), atol=tol, rtol=tol)
    assert len(kernels) == 2 and _matmul_operands(kernels)[1] == (False, True)  # A = h^T^T: already K-major
    for k in kernels:
        for rec in kernel_stream(k):
            if rec.engine == "dma" and len(rec.shapes[1]) > 1:
                assert rec.strides[1][-1] != 0 or rec.shapes[1][-1] == 1, rec  # no element-broadcast DMA


def test_mlp_hidden_used_elsewhere_keeps_its_layout() -> None:
    """A hidden activation that is also returned keeps the row-major layout (the rewrite needs a single user)."""
    from neuron_compile.lowering.graph_passes import mlp_hidden_feature_major

    m = MLP(64, 256, torch.nn.GELU(), keep_hidden=True).eval()
    x = torch.randn(600, 64)
    got, kernels = _compile(m, x)
    torch.testing.assert_close(got[0], m(x)[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], m(x)[1], atol=1e-4, rtol=1e-4)
    assert _matmul_operands(kernels)[1] == (True, True)
    gm = fx.symbolic_trace(torch.nn.Linear(4, 4))
    assert mlp_hidden_feature_major(gm) is gm  # nothing to rewrite: the graph is returned as is


def _reduce_kernels(fn, *xs: torch.Tensor) -> tuple[object, list]:
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(fn, backend="neuron", dynamic=False)(*xs)
    plan = backend.compiled_graphs()[-1]["plan"]
    return got, [k for k in plan.kernels if k.family == "reduction"]


@pytest.mark.parametrize("case", ["index_check", "index_check_fails", "amax", "amin_nonfinite", "any_none"])
def test_full_reductions_run_over_128_partitions_first(case: str) -> None:
    """all / any / amax / amin of a whole tensor: 128 partitions reduce a row each, then one reduces their 128
    results (one partition doing all of GPT-2's 4096-token index check took 42.9 us; 16 us in three kernels)."""
    g = torch.Generator().manual_seed(7)
    if case.startswith("index_check"):
        x = torch.randint(0, 100, (4, 1024), generator=g)
        if case == "index_check_fails":
            x[3, 1000] = 100

        def fn(x: torch.Tensor) -> torch.Tensor:
            return ((x >= 0) & (x < 100)).all()
    elif case == "amax":
        x = torch.randn(64, 512, generator=g)

        def fn(x: torch.Tensor) -> torch.Tensor:
            return x.amax()
    elif case == "amin_nonfinite":
        x = torch.randn(4096, generator=g)
        x[17], x[4000] = float("-inf"), float("inf")

        def fn(x: torch.Tensor) -> torch.Tensor:
            return torch.amin(x)
    else:
        x = -torch.rand(32, 128, generator=g)

        def fn(x: torch.Tensor) -> torch.Tensor:
            return (x > 0).any()
    got, kernels = _reduce_kernels(fn, x)
    want = fn(x)
    assert got.shape == want.shape == () and got.dtype == want.dtype and torch.equal(got, want), (got, want)
    # the last reduction reads 128 values; none reduces the whole tensor on one partition
    from neuron_compile.lowering.graph_passes import SPLIT_REDUCTION_MIN

    assert len(kernels) >= 2, kernels
    assert all(k.space[-1] < SPLIT_REDUCTION_MIN for k in kernels), [k.space for k in kernels]


def test_small_or_partial_reductions_are_left_alone() -> None:
    from neuron_compile.lowering.graph_passes import split_full_reductions

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x.amax(), y.amax(dim=1), y.t().amax()  # too small; one dim; a transposed (non-contiguous) view

    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def grab(gm: fx.GraphModule, _inputs: object) -> fx.GraphModule:
        graphs.append(gm)
        return gm

    aot_function(fn, fw_compiler=grab)(torch.randn(1024), torch.randn(64, 512))
    (gm,) = graphs
    assert split_full_reductions(gm) is gm


class ShiftedPosEmb(PosEmb):
    """Hugging Face's position ids: ``arange(T) + past_seen_tokens``, then ``unsqueeze(0)``."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = (torch.arange(idx.shape[1]) + self.start).unsqueeze(0)
        return self.tok(idx) + self.pos(pos)


@pytest.mark.parametrize("past", [0, 3])
def test_shifted_reshaped_position_ids_are_a_slice_view(past: int) -> None:
    from neuron_compile.lowering.graph_passes import shift_aranges

    torch.manual_seed(0)
    _only_the_token_gather(ShiftedPosEmb(past, 0).eval())
    g = fx.Graph()  # arange(2, 9) - 3 == arange(-1, 6); an alpha or a float shift is left alone
    r = g.call_function(aten.arange.start_step, (2, 9, 1), {"dtype": torch.int64})
    r.meta["val"] = torch.arange(2, 9)
    outs = []
    for target, args, kwargs in [(aten.sub.Tensor, (r, 3), {}), (aten.add.Tensor, (r, 3), {"alpha": 2}),
                                 (aten.add.Tensor, (r, 0.5), {})]:
        n = g.call_function(target, args, kwargs)
        n.meta["val"] = target(r.meta["val"], *args[1:], **kwargs)
        outs.append(n)
    g.output(tuple(outs))
    gm = fx.GraphModule(torch.nn.Module(), g)
    new = shift_aranges(gm)
    shifted, alpha, fractional = next(n for n in new.graph.nodes if n.op == "output").args[0]
    assert shifted.target == aten.arange.start_step and shifted.args == (-1, 6, 1)
    assert alpha.target == aten.add.Tensor and fractional.target == aten.add.Tensor
    assert [torch.equal(a, b) for a, b in zip(new(), gm(), strict=True)] == [True] * 3
