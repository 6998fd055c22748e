"""The analytic instruction stream (no execution) equals the simulator's trace, kernel by kernel."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from neuron_compile import backend, costmodel
from neuron_compile.instruction_stream import count_instructions, kernel_stream, kernel_streams, source_stream
from neuron_compile.simulator import trace

log = logging.getLogger(__name__)

bf16 = torch.bfloat16
CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]]]] = {
    "chain": (lambda x: ((x * 2 + 1).relu() - 0.5).abs(), lambda: [torch.randn(300, 700)]),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: [torch.randn(130, 3000)]),
    "layernorm": (lambda x: F.layer_norm(x, (96,)), lambda: [torch.randn(4, 50, 96)]),
    "layernorm_row_groups": (lambda x: F.layer_norm(x, (96,)), lambda: [torch.randn(4, 64, 96)]),  # R rows per DMA
    "matmul_epilogue": (lambda a, b: F.gelu(a @ b) + 1, lambda: [torch.randn(200, 300), torch.randn(300, 600)]),
    "bf16_linear_dma_transpose": (lambda x, w: F.linear(x, w), lambda: [torch.randn(272, 384, dtype=bf16),
                                                                       torch.randn(256, 384, dtype=bf16)]),
    "bf16_bmm": (lambda a, b: torch.bmm(a, b), lambda: [torch.randn(3, 64, 200, dtype=bf16),
                                                       torch.randn(3, 200, 100, dtype=bf16)]),
    "cat_cumsum": (lambda x, y: torch.cat([x, y], 0).cumsum(-1), lambda: [torch.randn(5, 40), torch.randn(3, 40)]),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, lambda: [torch.randn(50, 32), torch.randint(0, 50, (2, 70))]),
    # the template families of the sort and conv branches (the whole kernel is their template)
    "topk": (lambda x: torch.topk(x, 5, dim=-1), lambda: [torch.randn(20, 100)]),
    "searchsorted": (lambda s, x: torch.searchsorted(s, x), lambda: [torch.randn(8, 64).sort(-1).values,
                                                                    torch.randn(8, 30)]),
    "scatter_add": (lambda i, v: torch.zeros(16, 40).scatter_add(1, i, v),
                    lambda: [torch.randint(0, 40, (16, 40)), torch.randn(16, 40)]),
    "embedding_bag": (lambda w, i, o: F.embedding_bag(i, w, o, mode="sum"),
                      lambda: [torch.randn(30, 16), torch.randint(0, 30, (20,)), torch.tensor([0, 5, 12])]),
    "gather_lines": (lambda x, i: torch.gather(x, 0, i), lambda: [torch.randn(50), torch.randint(0, 50, (30,))]),
    "conv_pool_resample": (lambda x, w: F.interpolate(F.max_pool2d(F.conv2d(x, w, padding=1).relu(), 2),
                                                      scale_factor=2.0, mode="nearest"),
                           lambda: [torch.randn(2, 3, 12, 12), torch.randn(8, 3, 3, 3)]),
}


def traced_and_plan(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    with trace() as tr, torch.no_grad():
        compiled(*inputs)
    (stats,) = backend.compiled_graphs()
    return stats["plan"], tr.by_kernel()


@pytest.mark.parametrize("case", sorted(CASES))
def test_stream_matches_trace(case: str) -> None:
    fn, make = CASES[case]
    plan, runs = traced_and_plan(fn, make())
    assert [name for name, _ in runs] == [plan.kernels[c.kernel].name for c in plan.calls]
    for call, (name, recs) in zip(plan.calls, runs, strict=True):
        analytic = kernel_stream(plan.kernels[call.kernel])
        assert analytic == Counter(recs), name  # same records (shapes, strides, dtypes, bytes), same counts
        assert costmodel.first_order(analytic).time_ns == pytest.approx(costmodel.estimate(recs).time_ns)
        # loops skipped or fast-forwarded: the same counts, and the same schedule as scheduling every instruction
        full = kernel_stream(plan.kernels[call.kernel], timeline=True)
        assert full == analytic, name
        assert costmodel.estimate(analytic).time_ns == pytest.approx(costmodel.estimate(full).time_ns, rel=0.03)


def test_conv_weight_gradient_stream_matches_trace() -> None:
    """The backward graph's conv_wgrad kernel (only a backward has one): stream == trace, skipped == scheduled."""
    x, w = torch.randn(2, 3, 10, 10), torch.randn(4, 3, 3, 3, requires_grad=True)
    out = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="neuron", dynamic=False)(x, w)
    with trace() as tr:
        out.square().sum().backward()
    plan = backend.compiled_graphs()[-1]["plan"]
    assert "conv_wgrad" in {k.family for k in plan.kernels}
    runs = tr.by_kernel()
    assert [name for name, _ in runs] == [plan.kernels[c.kernel].name for c in plan.calls]
    for call, (name, recs) in zip(plan.calls, runs, strict=True):
        analytic = kernel_stream(plan.kernels[call.kernel])
        assert analytic == Counter(recs), name
        full = kernel_stream(plan.kernels[call.kernel], timeline=True)
        assert costmodel.estimate(analytic).time_ns == pytest.approx(costmodel.estimate(full).time_ns, rel=0.03)
    assert w.grad is not None
    torch.testing.assert_close(w.grad, torch.ops.aten.convolution_backward(
        2 * F.conv2d(x, w.detach(), padding=1), x, w.detach(), None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1,
        (False, True, False))[1], rtol=1e-4, atol=1e-4)


def test_identical_kernels_are_costed_once() -> None:
    """One kernel per transformer layer: kernels that differ only by name share one stream (explain, benchmarks)."""
    fn, make = CASES["softmax"]
    plan, _ = traced_and_plan(fn, make())
    k = plan.kernels[0]
    twin = dataclasses.replace(k, name="k7_twin")
    a, b = kernel_streams([k, twin])
    assert a is b
    alone = kernel_stream(twin)
    assert a == alone and costmodel.estimate(a).time_ns == pytest.approx(costmodel.estimate(alone).time_ns)
    other = dataclasses.replace(k, inputs=tuple(dataclasses.replace(x, numel=x.numel // 2) for x in k.inputs))
    assert kernel_streams([k, other])[1] is not a  # different arguments: costed on their own


def test_families_covered() -> None:
    families = set()
    for fn, make in CASES.values():
        torch._dynamo.reset()
        backend.reset()
        plan, _ = traced_and_plan(fn, make())
        families |= {k.family for k in plan.kernels}
    assert {"pointwise", "reduction", "matmul", "copy", "scan", "gather", "sort", "search", "scatter", "line_gather",
            "conv", "pool", "resample"} <= families, families


def test_counts_scale_without_execution() -> None:
    src = '''
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def k(in0):
    out0 = nl.ndarray((4096 * 4096,), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    for p0 in range(0, 4096, 128):
        for f0 in range(0, 4096, 2048):
            t = nl.ndarray((128, 2048), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=in0.ap(pattern=[[4096, 128], [1, 2048]], offset=p0 * 4096 + f0))
            nisa.activation(dst=t, op=nl.exp, data=t)
            nisa.dma_copy(dst=out0.ap(pattern=[[4096, 128], [1, 2048]], offset=p0 * 4096 + f0), src=t)
    return out0
'''
    counts = source_stream(src, "k", [(4096 * 4096, "bfloat16")])
    assert count_instructions(counts) == {("dma", "dma_copy"): 128, ("scalar", "activation"): 64}
    assert len(counts) == 3  # identical tiles collapse into one record each


def test_unmodelled_instruction_is_named() -> None:
    src = '''
import nki.isa as nisa


def k(in0):
    nisa.nc_stream_shuffle(dst=in0, src=in0, shuffle_mask=[0])
'''
    with pytest.raises(NotImplementedError, match="nisa.nc_stream_shuffle is not modelled"):
        source_stream(src, "k", [(4, "float32")])


@pytest.mark.parametrize("case", ["causal_attention", "mlp"])
def test_fast_forward_matches_scheduling_every_iteration(case: str) -> None:
    """Big kernels (LNC=2, two programs): iterations fast-forwarded by their period leave the allocator in the state
    scheduling every iteration leaves (an iteration's PSUM banks and SBUF buffers are assigned as it runs, and the
    last one before the tail is scheduled), so the loop-skipping estimate equals the full schedule. Before, the
    attention kernel's tail iteration found other PSUM banks free and waited on evictions: +4% (+29 us)."""
    from neuron_compile.backend import build_artifacts
    from neuron_compile.capture import aten_graphs
    from neuron_compile.config import config

    if case == "causal_attention":
        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        inputs = [torch.randn(1, 16, 1024, 128, dtype=bf16) for _ in range(3)]
    else:
        fn = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(bf16)
        inputs = [torch.randn(1024, 1024, dtype=bf16)]
    with config.patch(target="trn2", lnc=0):
        ((gm, ins),) = aten_graphs(fn, *inputs)
        _, _, plan = build_artifacts(gm, ins)
        for k in plan.kernels:
            fast = kernel_stream(k)
            full = kernel_stream(k, exact=True)
            assert fast == full, k.name
            assert len(fast.schedules) == 2 and sum(s.skipped for s in fast.schedules) > 0, k.name
            # the MLP's DMA-transposed loops still fast-forward ~1% low (the tuner's pick; 1.6% on the benchmark's
            # MLP): within the 3% the other stream tests allow, tightened here to 2%
            rel = 0.005 if case == "causal_attention" else 0.02
            assert costmodel.estimate(fast).time_ns == pytest.approx(costmodel.estimate(full).time_ns, rel=rel), k.name
