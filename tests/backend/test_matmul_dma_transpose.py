"""Operands transposed by the DMA engines (``nisa.dma_transpose``, NC-v3+) straight into the GEMM's SBUF blocks.

A Linear's input ``x [M, K]`` and weight ``W [N, K]`` have their contraction dim contiguous: TensorE used to
transpose every 128x128 tile of them (the MLP benchmark: 4-5% of TensorE time, plus the PSUM evictions). On
trn2/trn3 the HW-DGE transpose writes the row tiles straight into the SBUF blocks (A's pipelined row tiles, B's
blocks); rows not in groups of 16 (the transpose's row groups), 4-byte dtypes and trn1 keep the PE transposes. Every case runs the generated kernel on the simulator (whose ``dma_transpose`` checks the documented
HW-DGE shapes) and compares with eager PyTorch.
"""

from __future__ import annotations

import logging

import pytest
import torch
from neuron_compile.codegen.plan_matmul import DT_A, DT_B
from neuron_compile.codegen.render_matmul import Tiles
from neuron_compile.lowering.ops import matmul as mm_rules

import neuron_compile.backend
from neuron_compile.config import config

log = logging.getLogger(__name__)

RESIDENT_DIRECT = Tiles(256, 512, 1, True, True, True, False, True, dt=DT_A | DT_B)  # resident, both by DMA


def _compile(target: str, fn, *xs: torch.Tensor, tiles: Tiles | None = RESIDENT_DIRECT) -> tuple[torch.Tensor, str]:
    orig = mm_rules.candidates
    mm_rules._TUNED.clear()
    torch._dynamo.reset()  # the same function again with other tiles: capture it again
    if tiles is not None:
        mm_rules.candidates = lambda kernel, target: [tiles]  # type: ignore[assignment]
    try:
        with config.patch(target=target), torch.no_grad():
            out = torch.compile(fn, backend="neuron", dynamic=False)(*xs)
    finally:
        mm_rules.candidates = orig  # type: ignore[assignment]
        mm_rules._TUNED.clear()
    graph = neuron_compile.backend.compiled_graphs()[-1]
    return out, "".join(src for _, src in graph["sources"])


@pytest.mark.parametrize(("m", "n"), [(272, 1100), (640, 400), (1024, 1100), (16, 300)],
                         ids=["ragged-m", "one-n-block", "m-blocks-per-core", "one-row-group"])
def test_linear_bf16_transposes_its_input_by_dma(m: int, n: int) -> None:
    g = torch.Generator().manual_seed(m)
    lin = torch.nn.Linear(384, n).to(torch.bfloat16)
    x = torch.randn(m, 384, generator=g).to(torch.bfloat16)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(lin(x))

    got, src = _compile("trn2", fn, x)
    assert "nisa.dma_transpose(" in src and "dge_mode=nisa.dge_mode.hwdge" in src
    assert "a_tp" not in src  # no TensorE transposes of A left
    assert ("nc_transpose" in src) == (n % 16 != 0)  # B's too when its rows come in groups of 16
    with torch.no_grad():
        want = torch.nn.functional.gelu(torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float()))
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=2e-2)


def test_rows_not_in_groups_of_16_keep_the_pe_transposes() -> None:
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(200, 256, generator=g).to(torch.bfloat16), torch.randn(300, 256, generator=g).to(torch.bfloat16)
    got, src = _compile("trn2", torch.nn.functional.linear, x, w)
    assert "dma_transpose" not in src and "nc_transpose(dst=a_tp" in src
    torch.testing.assert_close(got.float(), x.float() @ w.float().T, atol=3e-2, rtol=2e-2)


def test_trn1_has_no_hw_dge_transpose() -> None:
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(256, 256, generator=g).to(torch.bfloat16), torch.randn(300, 256, generator=g).to(torch.bfloat16)
    got, src = _compile("trn1", torch.nn.functional.linear, x, w)
    assert "dma_transpose" not in src
    torch.testing.assert_close(got.float(), x.float() @ w.float().T, atol=3e-2, rtol=2e-2)


def test_fp32_input_keeps_the_pe_transposes() -> None:
    """The HW-DGE transpose moves 2-byte elements only."""
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(256, 256, generator=g), torch.randn(300, 256, generator=g)
    got, src = _compile("trn2", torch.nn.functional.linear, x, w)
    assert "dma_transpose" not in src
    torch.testing.assert_close(got, x @ w.T, atol=2e-4, rtol=2e-4)


def test_autotuner_weighs_dma_against_pe_transposes() -> None:
    """The DMA transposes are a candidate dimension (Tiles.dt), not a rule: they free TensorE but load the DMA
    queues (a GPT-2 layer's K=768 GEMMs are faster with TensorE transposing), so the cost model picks per shape.
    Forced off, the same tiles keep the PE transposes."""
    from neuron_compile.backend import build_artifacts
    from neuron_compile.capture import aten_graphs

    x, w = torch.randn(512, 384).to(torch.bfloat16), torch.randn(640, 384).to(torch.bfloat16)
    ((gm, ins),) = aten_graphs(torch.nn.functional.linear, x, w, execute=False)
    with config.patch(target="trn2"):
        _, _, plan = build_artifacts(gm, ins)
    (kernel,) = plan.kernels
    on_trn2 = mm_rules.candidates(kernel, "trn2")
    direct = {replace_dt(t) for t in on_trn2 if t.direct and t.ta and t.tb}
    assert direct and all(replace_dt(t, mask) in on_trn2 for t in direct for mask in (DT_A, DT_B, DT_A | DT_B))
    assert not any(t.dt for t in mm_rules.candidates(kernel, "trn1"))
    want = x.float() @ w.float().T
    got, src = _compile("trn2", torch.nn.functional.linear, x, w, tiles=replace_dt(RESIDENT_DIRECT))
    assert "dma_transpose" not in src and "nc_transpose" in src
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=2e-2)
    # one operand each: A's row tiles by DMA with B's block on TensorE, and the reverse
    got, src = _compile("trn2", torch.nn.functional.linear, x, w, tiles=replace_dt(RESIDENT_DIRECT, DT_A))
    assert "dma_transpose" in src and "a_tp" not in src and "nc_transpose(dst=tr_tp" in src
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=2e-2)
    got, src = _compile("trn2", torch.nn.functional.linear, x, w, tiles=replace_dt(RESIDENT_DIRECT, DT_B))
    assert "dma_transpose" in src and "nc_transpose(dst=a_tp" in src and "tr_tp" not in src
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=2e-2)


def replace_dt(t: Tiles, dt: int = 0) -> Tiles:
    from dataclasses import replace

    return replace(t, dt=dt)
