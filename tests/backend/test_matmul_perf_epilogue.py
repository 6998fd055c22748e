"""Matmul epilogue DMAs (codegen/render_matmul.py ``eviction_loops``): row-varying epilogue operands
(a bf16 residual) arrive in their storage dtype, one DMA per group of row tiles, and results leave
in one store per group; values equal eager PyTorch (simulated on trn2)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from neuron_compile.codegen.plan_matmul import DT_A, DT_B
from neuron_compile.codegen.render import render_kernel
from neuron_compile.codegen.render_matmul import Tiles
from neuron_compile.lowering.ops import matmul as mm_rules

import neuron_compile.backend
from neuron_compile.config import config
from neuron_compile.costmodel import estimate
from neuron_compile.instruction_stream import kernel_stream


def _run_forced(tiles: Tiles, fn: Callable[..., Any], *xs: torch.Tensor) -> Any:
    orig = mm_rules.candidates
    mm_rules._TUNED.clear()
    mm_rules.candidates = lambda kernel, target: [tiles]  # type: ignore[assignment]
    try:
        with config.patch(target="trn2", cache=False), torch.no_grad():
            torch._dynamo.reset()
            out = torch.compile(fn, backend="neuron", dynamic=False)(*xs)
    finally:
        mm_rules.candidates = orig  # type: ignore[assignment]
        mm_rules._TUNED.clear()
    return out


def _mm_kernel() -> Any:
    plan = neuron_compile.backend.compiled_graphs()[-1]["plan"]
    (k,) = [k for k in plan.kernels if k.family == "matmul"]
    return k


def _dmas(k: Any) -> list[tuple[Any, int]]:
    with config.patch(target="trn2"):
        return [(rec, n) for rec, n in kernel_stream(k).items() if rec.engine == "dma"]


def _residual_linear(m: int, k: int, n: int, seed: int) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / math.sqrt(k)).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16)
    r = torch.randn(m, n, generator=g).to(torch.bfloat16)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return r + torch.nn.functional.linear(x, w, b)

    return fn, (x, w, b, r)


# (bm, bn, kb, ta, tb, resident, split, direct, rg): ragged row groups (600 rows = 4 tiles + 88 rows)
GROUPED = [
    Tiles(384, 512, 1, True, True, True, False, True, 2),
    Tiles(768, 512, 2, True, True, False, False, True, 4),
    Tiles(640, 512, 1, True, True, False, True, True, 3),
    Tiles(256, 512, 1, False, True, False, False, False, 8),
    Tiles(640, 512, 1, True, True, True, False, True, 4, 2),  # stores per 2 row tiles, residual per 4
    Tiles(640, 1024, 1, True, True, False, True, True, 5, 2),  # split, 5-tile loads, ragged store groups
    Tiles(256, 512, 1, True, True, False, True, True, 2, 1, True),  # split, A direct, B via the HBM scratch
    Tiles(256, 1024, 2, True, True, True, False, True, 2, 0, True),  # resident, A direct, B via the HBM scratch
]


@pytest.mark.parametrize("tiles", GROUPED, ids=lambda t: "-".join(map(str, t.to_attr())))
def test_bf16_residual_loads_in_storage_dtype_and_one_store_per_row_group(tiles: Tiles) -> None:
    fn, xs = _residual_linear(600, 200, 640, seed=0)
    got = _run_forced(tiles, fn, *xs)
    want = fn(*xs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=2e-2)
    k = _mm_kernel()
    dmas = _dmas(k)
    # no DMA converts bf16 <-> fp32 (the residual and the bias stay bf16; engines convert on read)
    assert all(len(set(rec.dtypes)) == 1 for rec, _ in dmas), [rec for rec, _ in dmas if len(set(rec.dtypes)) > 1]
    # one store per (row group, N block), the ragged 88-row tile of a group riding in its own DMA
    bm, bn = min(tiles.bm, 640), min(tiles.bn, 1024)
    sg = tiles.sg or tiles.rg
    groups = sum(math.ceil(min(bm, 600 - m0) / (128 * sg)) for m0 in range(0, 600, bm))
    ragged = sum(1 for m0 in range(0, 600, bm) if min(bm, 600 - m0) % 128)
    n_blocks = math.ceil(640 / bn)
    stores = sum(n for rec, n in dmas if rec.buffers[0] == "shared_hbm")  # results (not the B^T scratch)
    assert stores <= (groups + ragged) * n_blocks, stores
    # the residual rows of a group arrive in one DMA, like the stores
    residual = sum(n for rec, n in dmas if rec.buffers[0] == "sbuf" and rec.shapes[0][-1] == min(bn, 640)
                   and len(rec.shapes[0]) == 3 and rec.dtypes[0] == "bfloat16" and rec.partitions == 128)
    assert residual >= 1


def _capture_kernel(fn: Callable[..., Any], *xs: torch.Tensor) -> Any:
    """The tuned matmul kernel of ``fn`` (compiled for trn2, estimated only: nothing is simulated)."""
    from neuron_compile.backend import build_artifacts
    from neuron_compile.capture import aten_graphs

    graphs = aten_graphs(fn, *xs)
    ((gm, ins),) = graphs
    with config.patch(target="trn2", cache=False):
        _, _, plan = build_artifacts(gm, ins)
    (k,) = [k for k in plan.kernels if k.family == "matmul"]
    return k


def test_autotuned_gpt2_attention_projection_groups_epilogue_dmas() -> None:
    """GPT-2 attention projection + residual (4096 x 768 x 768, bf16): the tuner groups row tiles, no DMA
    converts, at most one store per row tile, and grouping beats per-tile epilogue DMAs for the same blocks."""
    from neuron_compile.lowering.ops.matmul import _with_tiles

    fn, xs = _residual_linear(4096, 768, 768, seed=1)
    k = _capture_kernel(fn, *xs)
    t = Tiles.from_attr(next(op.attr("tiles") for op in k.ops if op.opcode == "matmul"))
    with config.patch(target="trn2"):
        ns = estimate(kernel_stream(k), "trn2").time_ns
        ns1 = estimate(kernel_stream(_with_tiles(k, replace(t, rg=1))), "trn2").time_ns
        dmas = [(rec, n) for rec, n in kernel_stream(k).items() if rec.engine == "dma"]
    assert t.rg > 1 and ns < ns1, (t, ns, ns1)
    assert all(len(set(rec.dtypes)) == 1 for rec, _ in dmas)
    stores = sum(n for rec, n in dmas if rec.buffers[0] == "shared_hbm")  # results (not the B^T scratch)
    assert stores <= 4096 // 128 // (t.sg or t.rg) * math.ceil(768 / t.bn), stores
    loads = sum(n for rec, n in dmas if rec.buffers[0] == "sbuf")
    with config.patch(target="trn2"):
        loads1 = sum(n for rec, n in kernel_stream(_with_tiles(k, replace(t, rg=1))).items()
                     if rec.engine == "dma" and rec.buffers[0] == "sbuf")
    assert loads < loads1, (loads, loads1)  # grouped epilogue loads: fewer DMAs than one per row tile


def test_gpt2_qkv_projection_transposes_its_weight_once() -> None:
    """QKV projection (4096 x 768 -> 2304, bf16, bias): resident blocks with PE transposes; the weight is transposed
    once per M block the tuner chose (32 + 18 x blocks row tiles x 6 K tiles)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4096, 768, generator=g).to(torch.bfloat16)
    lin = torch.nn.Linear(768, 2304).to(torch.bfloat16)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return lin(x)

    k = _capture_kernel(fn, x)
    t = Tiles.from_attr(next(op.attr("tiles") for op in k.ops if op.opcode == "matmul"))
    with config.patch(target="trn2"):
        stream = kernel_stream(k)
    transposes = sum(n for rec, n in stream.items() if rec.instruction == "nc_transpose")
    assert t.resident and t.direct, t
    # an operand the DMA engines transpose (Tiles.dt) has no TensorE transposes, and DMA transposes instead
    assert (sum(n for rec, n in stream.items() if rec.instruction == "dma_transpose") > 0) == bool(t.dt), t
    # x's row tiles are transposed once; the weight once per M block the tuner chose (once in all with the scratch)
    x_tiles = 0 if t.dt & DT_A else 4096 // 128
    blocks = 0 if t.dt & DT_B else 1 if t.sb else 4096 // t.bm
    assert transposes == (x_tiles + blocks * 2304 // 128) * 6, (transposes, t)
    # x's rows to transpose arrive one row tile of all of K per DMA (pipelined: each while the row tile before it
    # accumulates), each row tile once: 32 of them
    if not t.dt & DT_A:
        row_loads = [(rec.shapes[0], n) for rec, n in stream.items() if rec.engine == "dma"
                     and rec.buffers[0] == "sbuf" and len(rec.shapes[0]) == 2 and rec.shapes[0][-1] == 768]
        assert dict(row_loads).get((128, 768)) == 4096 // 128, row_loads


def test_gpt2_mlp_down_projection_transposes_its_weight_once() -> None:
    """MLP down-projection + residual (4096 x 3072 -> 768, bf16): blocks of fewer than 4096 rows take x^T straight
    from PE transposes; the weight is transposed once through the HBM scratch, once per core when one N block holds
    all of it (resident blocks load B once, before the M loop), or once per row block."""
    fn, xs = _residual_linear(4096, 3072, 768, seed=3)
    k = _capture_kernel(fn, *xs)
    t = Tiles.from_attr(next(op.attr("tiles") for op in k.ops if op.opcode == "matmul"))
    with config.patch(target="trn2"):
        stream = kernel_stream(k)
    transposes = sum(n for rec, n in stream.items() if rec.instruction == "nc_transpose")
    assert t.direct and t.bm < 4096, t
    # an operand the DMA engines transpose (Tiles.dt) has no TensorE transposes, and DMA transposes instead
    x_tiles = 0 if t.dt & DT_A else 4096 // 128
    assert (sum(n for rec, n in stream.items() if rec.instruction == "dma_transpose") > 0) == bool(t.dt), t
    # x's row tiles once each; the weight fewer times than once per M block when it goes through the scratch
    per_block = (x_tiles + 4096 // t.bm * 768 // 128) * (3072 // 128)
    if t.dt & DT_B:
        assert transposes == x_tiles * (3072 // 128), (transposes, t)  # no TensorE transposes of the weight
    elif t.resident and t.bn >= 768:  # B once per core (program of the launch grid)
        assert transposes == (x_tiles + len(stream.schedules) * 768 // 128) * (3072 // 128), (transposes, t)
        assert len(stream.schedules) < 4096 // t.bm, t
    else:
        assert transposes < per_block if t.sb else transposes == per_block, (transposes, t)


def test_row_loads_never_queue_behind_a_store_waiting_for_its_data() -> None:
    """GPT-2's out-projection + residual + LayerNorm (4096 x 768 -> 768): x's pipelined row tiles and the residual
    groups load from the sync engine's DMA queue, results store from ScalarE's. On one queue the DMA trigger of the
    next row tile sat behind the previous tile's store, which waits for that tile's whole epilogue: TensorE idled
    ~2.5 us a tile (101 -> 95 us estimated for the kernel)."""
    from neuron_compile.codegen.render import render_kernel

    from neuron_compile.instruction_stream import source_stream

    g = torch.Generator().manual_seed(5)
    proj = torch.nn.Linear(768, 768).to(torch.bfloat16)
    ln = torch.nn.LayerNorm(768).to(torch.bfloat16)
    x, y = (torch.randn(4096, 768, generator=g).to(torch.bfloat16) for _ in range(2))

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + proj(y)
        return h, ln(h)

    mm_rules._TUNED.clear()
    with config.patch(target="trn2", cache=False), torch.no_grad():
        torch._dynamo.reset()
        got = torch.compile(fn, backend="neuron", dynamic=False)(x, y)
        h = x.float() + torch.nn.functional.linear(y.float(), proj.weight.float(), proj.bias.float())
        want = torch.nn.functional.layer_norm(h.bfloat16().float(), (768,), ln.weight.float(), ln.bias.float())
    torch.testing.assert_close(got[0].float(), h, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(got[1].float(), want, atol=3e-2, rtol=2e-2)
    k = _mm_kernel()
    src = render_kernel(k)
    stores = [line for line in src.splitlines() if "nisa.dma_copy(dst=out" in line]
    loads = [line for line in src.splitlines() if "nisa.dma_copy(dst=" in line
             and ("dst=a_rows[" in line or "dst=a_next[" in line or "_grp[" in line)]
    assert stores and all("engine=nisa.engine.scalar" in line for line in stores), stores
    assert loads and all("engine=nisa.engine.sync" in line for line in loads), loads
    args = [(a.numel, a.dtype) for a in k.inputs]
    with config.patch(target="trn2"):
        split = estimate(source_stream(src, k.name, args), "trn2").time_ns
        one = src.replace(", engine=nisa.engine.sync", "").replace(", engine=nisa.engine.scalar)", ")")
        assert "engine=nisa.engine.s" not in "".join(line for line in one.splitlines() if "dma_copy" in line)
        shared = estimate(source_stream(one, k.name, args), "trn2").time_ns
    assert split < 0.95 * shared, (split, shared)


@pytest.mark.parametrize("norm", [True, False], ids=["layer_norm", "bias_only"])
def test_row_tile_transposes_leave_psum_on_scalar_when_the_epilogue_is_vectors(norm: bool) -> None:
    """A LayerNorm epilogue keeps VectorE busy (statistics, normalisation) and ScalarE idle: x's row-tile transposes
    are evicted by ScalarE alone (GPT-2's out-projection + LayerNorm 94.6 -> 89.9 us estimated). With a bias only,
    TensorE is the busy engine and VectorE's faster copies keep taking every other group."""
    g = torch.Generator().manual_seed(6)
    proj = torch.nn.Linear(768, 768).to(torch.bfloat16)
    ln = torch.nn.LayerNorm(768).to(torch.bfloat16)
    x = torch.randn(1024, 768, generator=g).to(torch.bfloat16)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return ln(proj(x)) if norm else proj(x)

    # resident blocks, x transposed on TensorE straight into SBUF: its row tiles pipelined
    got = _run_forced(Tiles(512, 1024, 6, True, True, True, False, True, 2), fn, x)
    with torch.no_grad():
        h = torch.nn.functional.linear(x.float(), proj.weight.float(), proj.bias.float())
        want = torch.nn.functional.layer_norm(h.bfloat16().float(), (768,), ln.weight.float(), ln.bias.float()) \
            if norm else h
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=2e-2)
    src = render_kernel(_mm_kernel())
    assert "nc_transpose(dst=a_tp[" in src, src  # x's row tiles are transposed on TensorE in this configuration
    assert "activation(dst=a_blk[" in src
    assert ("tensor_copy(dst=a_blk[" in src) == (not norm)
