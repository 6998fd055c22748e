"""Row groups: R rows per partition per DMA in resident reduction kernels (codegen/render.py).

Numerics are bit-identical to one row per partition (same instructions per row), the rendered DMAs move
``[P, R, F]`` tiles, row values live in ``(P, R)`` tiles, and the cost model picks R.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from neuron_compile.codegen import render
from neuron_compile.codegen.render import LoopRenderer, render_kernel

from neuron_compile import backend
from neuron_compile.config import config
from neuron_compile.costmodel import estimate
from neuron_compile.instruction_stream import source_stream
from neuron_compile.nki_api.checker import check_source_against_api


@pytest.fixture(autouse=True)
def single_core() -> Iterator[None]:
    """These tests pin single-core row-group code (LNC=1); tests/backend/test_ops.py runs every op on both cores."""
    with config.patch(lnc=1):
        yield


def _layernorm(width: int) -> torch.nn.Module:
    m = torch.nn.LayerNorm(width).eval()
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-1, 1)
    return m


CASES = {
    "layernorm": (lambda: _layernorm(768), (1024, 768)),
    "softmax": (lambda: (lambda x: torch.softmax(x, -1)), (512, 300)),
    "rmsnorm": (lambda: (lambda x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)), (256, 64)),
    "max_shift": (lambda: (lambda x: x - x.amax(-1, keepdim=True)), (2, 256, 96)),
}


def _run(fn, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(fn, backend="neuron", dynamic=False)(x)
    g = backend.compiled_graphs()[-1]
    return got, list(g["plan"].kernels)


@pytest.mark.parametrize("name", list(CASES))
def test_row_groups_bit_identical_to_one_row(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, shape = CASES[name]
    fn = make()
    torch.manual_seed(0)
    x = torch.randn(*shape)
    grouped, kernels = _run(fn, x)
    sources = [render_kernel(k) for k in kernels]
    assert any("_rows = nl.ndarray((P, " in s and "for q in range(" in s for s in sources), sources
    for s in sources:
        assert check_source_against_api(s) == []
    torch.testing.assert_close(grouped, fn(x), rtol=2e-5, atol=2e-5)
    monkeypatch.setattr(LoopRenderer, "row_group_options", lambda self: [])
    single, kernels1 = _run(fn, x)
    assert not any("_rows" in render_kernel(k) for k in kernels1)
    assert torch.equal(grouped, single)


def test_layernorm_dma_moves_r_rows_and_cost_model_picks_r() -> None:
    _, kernels = _run(_layernorm(768), torch.randn(1024, 768))
    (k,) = kernels
    options = LoopRenderer(k).row_group_options()
    assert options and options[0] == 2 and all(1024 % (128 * r) == 0 for r in options)
    args = [(a.numel, a.dtype) for a in k.inputs]

    def est(rows: int) -> float:
        body = LoopRenderer(k, rows=rows).body()
        return estimate(source_stream(render._wrap(k, body), k.name, args), config.target).time_ns

    costs = {r: est(r) for r in (1, *options)}
    best = min(costs, key=costs.__getitem__)
    assert best > 1 and costs[best] < costs[1]
    src = render_kernel(k)
    # the renderer's choice (R, engines per row, rows per store) is at least as good as the best plain R
    assert estimate(source_stream(src, k.name, args), config.target).time_ns <= costs[best]
    chosen = [r for r in options if f"for p0 in range(0, 1024, {128 * r}):" in src]
    assert len(chosen) == 1, src
    # one load per group of R rows (plus gamma/beta, hoisted)
    assert f"pattern=[[{768 * chosen[0]}, P], [768, {chosen[0]}], [1, F]], offset=p0 * 768" in src
    assert src.count("nisa.dma_copy(") == 4
    assert f"r2_rows = nl.ndarray((P, {chosen[0]}), dtype=nl.float32" in src


def test_no_row_groups_when_rows_do_not_divide_or_do_not_fit() -> None:
    _, kernels = _run(_layernorm(768), torch.randn(200, 768))  # 200 rows: not a multiple of 256
    assert LoopRenderer(kernels[0]).row_group_options() == []
    _, kernels = _run(_layernorm(768), torch.randn(1024, 768))
    # peak 3 tiles (the row + gamma, beta: the statistics pass keeps no centred copy) fits; +1 row does not
    with config.patch(row_resident_bytes=3 * 768 * 4 + 64):
        r = LoopRenderer(kernels[0])
        assert r.resident and r.row_group_options() == []
        assert "_rows" not in render_kernel(kernels[0])
    _, kernels = _run(lambda t: t * 2.0 + 1.0, torch.randn(256, 64))  # pointwise: streamed in big chunks instead
    assert kernels[0].family == "pointwise" and LoopRenderer(kernels[0]).row_group_options() == []
