"""Matmul tile configurations: every code path of ``codegen/render_matmul.py`` is numerically right.

The autotuner normally picks one configuration per kernel; here each test forces one (streamed or
resident blocks, K-split blocks with SBUF partial sums, TensorE transposes on or off, small/odd
block sizes that leave ragged M, N and K edges) and compares the simulated result (trn2 limits) with eager PyTorch. Also checks the
autotuner's choice is recorded in the kernel IR and that its candidates respect PSUM and SBUF.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from neuron_compile.codegen.render_matmul import Tiles
from neuron_compile.lowering.ops import matmul as mm_rules

import neuron_compile.backend
from neuron_compile.config import config

log = logging.getLogger(__name__)

# (bm, bn, kb, transpose A, transpose B, resident, split, direct transposes)
CONFIGS = [
    Tiles(128, 512, 1, True, True, False),
    Tiles(256, 1024, 2, False, False, False),
    Tiles(384, 512, 2, True, False, True),
    Tiles(128, 1024, 1, False, True, True),
    Tiles(256, 1024, 1, True, True, False, True),  # K split in 128-chunks: ragged last chunk
    Tiles(1024, 512, 2, False, True, False, True),  # 16 tiles per block > 7 PSUM tiles
    Tiles(128, 512, 4, True, False, False, True),  # one chunk: no partial sums
    Tiles(384, 512, 1, True, True, True, False, True),  # resident, both transposed straight into SBUF
    Tiles(640, 1024, 1, True, True, False, True, True),  # split + direct transposes, ragged 512-row groups
    Tiles(256, 512, 2, True, True, False, False, True),  # streamed + direct transposes
]


def _run_forced(tiles: Tiles, fn: Callable[..., Any], *xs: torch.Tensor) -> Any:
    """Compile ``fn`` with every matmul kernel using ``tiles`` (clamped to the shape), run it on trn2."""
    orig = mm_rules.candidates
    mm_rules._TUNED.clear()
    mm_rules.candidates = lambda kernel, target: [tiles]  # type: ignore[assignment]
    try:
        with config.patch(target="trn2"):
            out = torch.compile(fn, backend="neuron", dynamic=False)(*xs)
    finally:
        mm_rules.candidates = orig  # type: ignore[assignment]
        mm_rules._TUNED.clear()
    return out


def _chosen_tiles() -> list[tuple[Any, ...]]:
    graphs = neuron_compile.backend.compiled_graphs()
    plan = graphs[-1]["plan"]
    return [op.attr("tiles") for k in plan.kernels for op in getattr(k, "ops", ()) if op.opcode == "matmul"]


@pytest.mark.parametrize("tiles", CONFIGS, ids=lambda t: "-".join(map(str, t.to_attr())))
def test_mm_ragged_all_paths(tiles: Tiles) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 260, generator=g), torch.randn(260, 1100, generator=g)
    got = _run_forced(tiles, torch.mm, a, b)
    torch.testing.assert_close(got, a @ b, atol=2e-4, rtol=2e-4)
    assert _chosen_tiles() == [tiles.to_attr()]


@pytest.mark.parametrize("tiles", CONFIGS, ids=lambda t: "-".join(map(str, t.to_attr())))
def test_linear_bias_gelu_bf16_all_paths(tiles: Tiles) -> None:
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(200, 600).to(torch.bfloat16)
    x = torch.randn(140, 200, generator=g).to(torch.bfloat16)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(lin(x))

    with torch.no_grad():
        got = _run_forced(tiles, fn, x)
        want = fn(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("tiles", CONFIGS[:2], ids=lambda t: "-".join(map(str, t.to_attr())))
def test_bmm_transposed_operand(tiles: Tiles) -> None:
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(3, 130, 140, generator=g), torch.randn(3, 70, 140, generator=g)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b.transpose(1, 2)) * 0.5 + 1.0

    got = _run_forced(tiles, fn, a, b)
    torch.testing.assert_close(got, fn(a, b), atol=2e-4, rtol=2e-4)



@pytest.mark.parametrize("tiles", [None, *CONFIGS], ids=lambda t: "autotuned" if t is None else
                         "-".join(map(str, t.to_attr())))
def test_batched_bmm_frees_its_psum_between_batches(tiles: Tiles | None) -> None:
    """q @ k^T of 2 x 700 x 64: 6 x 2 output tiles, so up to 7 PSUM accumulators plus a transpose bank, allocated
    again for the second batch element. The first element's tiles must be gone by then (they were kept alive by the
    ``acc`` list: SimulatorConstraintError, live PSUM > 16 KiB, for the autotuned kernel in every dtype)."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(2, 700, 64, generator=g), torch.randn(2, 700, 64, generator=g)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b.transpose(1, 2)) * 0.125

    if tiles is None:
        with config.patch(target="trn2"):
            got = torch.compile(fn, backend="neuron", dynamic=False)(a, b)
    else:
        got = _run_forced(tiles, fn, a, b)
    torch.testing.assert_close(got, fn(a, b), atol=2e-4, rtol=2e-4)
    src = "".join(src for graph in neuron_compile.backend.compiled_graphs() for _, src in graph["sources"])
    assert "del " not in src, src  # PSUM lifetimes follow the iteration (no del statements)

def test_autotuner_choice_is_in_the_ir_and_candidates_fit() -> None:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(600, 700, generator=g), torch.randn(700, 900, generator=g)
    mm_rules._TUNED.clear()
    with config.patch(target="trn2"):
        got = torch.compile(torch.mm, backend="neuron", dynamic=False)(a, b)
    torch.testing.assert_close(got, a @ b, atol=5e-4, rtol=5e-4)
    (chosen,) = _chosen_tiles()
    plan = neuron_compile.backend.compiled_graphs()[-1]["plan"]
    kernel = plan.kernels[0]
    cands = mm_rules.candidates(kernel, "trn2")
    # blocks are candidates; the epilogue row groups (rg, sg) are tuned afterwards for the best of them
    assert replace(Tiles.from_attr(chosen), rg=1, sg=0) in cands
    assert len(cands) > 1
    for t in cands:
        assert t.bm % 128 == 0 and t.kb >= 1
        if not t.resident and not t.split:  # every tile of a streamed block owns a PSUM accumulator
            assert (t.bm // 128) * -(-t.bn // 512) <= mm_rules.MAX_ACCUMULATORS


@pytest.mark.parametrize(("m", "k", "n", "scored"), [(96, 200, 64, False), (130, 200, 64, True), (96, 700, 64, True)],
                         ids=["single-block", "two-m-blocks", "long-k"])
def test_single_block_gemms_take_strided_streamed_tiles_without_scoring(m: int, k: int, n: int, scored: bool) -> None:
    """A GEMM one block holds (M <= 128, N <= 512, K <= 512) takes streamed tiles with strided loads unscored; any
    larger one is scored as before. Both match eager."""
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    calls: list[Tiles] = []
    orig = mm_rules._score
    mm_rules._TUNED.clear()
    mm_rules._score = lambda kernel, tiles, target, budget_ns=math.inf: (  # type: ignore[assignment]
        calls.append(tiles) or orig(kernel, tiles, target, budget_ns))
    try:
        with config.patch(target="trn2", cache=False):
            got = torch.compile(torch.mm, backend="neuron", dynamic=False)(a, b)
    finally:
        mm_rules._score = orig  # type: ignore[assignment]
        mm_rules._TUNED.clear()
    torch.testing.assert_close(got, a @ b, atol=5e-4, rtol=5e-4)
    (chosen,) = _chosen_tiles()
    assert bool(calls) == scored, calls
    if not scored:
        t = Tiles.from_attr(chosen)
        assert not (t.ta or t.tb or t.resident or t.split or t.direct) and t.rg == 1


def test_large_k_candidates_include_split_blocks_within_sbuf() -> None:
    """K = 4096: K-split blocks are offered, each with its operand chunks and fp32 partials within budget."""
    from neuron_compile.simulator.targets import LIMITS

    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(256, 4096, generator=g), torch.randn(4096, 640, generator=g)
    got = _run_forced(Tiles(256, 1024, 8, True, False, False, True), torch.mm, a, b)
    torch.testing.assert_close(got, a @ b, atol=2e-3, rtol=2e-3)
    kernel = neuron_compile.backend.compiled_graphs()[-1]["plan"].kernels[0]
    split = [t for t in mm_rules.candidates(kernel, "trn2") if t.split]
    assert split
    budget = LIMITS["trn2"].sbuf_partition_bytes * mm_rules.SBUF_BUDGET_FRACTION
    for t in split:
        assert t.kb * (t.bm + t.bn) * 4 + t.bm // 128 * t.bn * 4 <= budget, t


def _last_matmul_plan() -> dict:
    """The LNC=2 template plan of the matmul kernel of the graph compiled last."""
    from neuron_compile.codegen.plan_matmul import matmul_plan

    kernel = next(k for k in neuron_compile.backend.compiled_graphs()[-1]["plan"].kernels
                  if any(op.opcode == "matmul" for op in getattr(k, "ops", ())))
    return matmul_plan(kernel, 2)


def _assert_matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """``got`` (computed in ``dtype``) against the fp32 reference ``want``: fp32 to 2e-4, bf16 to 3e-2 (relative)."""
    tol = 2e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want, atol=tol * 10, rtol=tol)


# resident blocks with A transposed straight into SBUF and K a multiple of 128: A's row tiles are pipelined (each
# transposed between the matmuls of the row tile before it, in groups of K tiles), the B block double-buffered.
# 700 rows: M blocks of 256 with a ragged last one (188 rows: a 60-row tile); K 640: a last K group of one tile.
PIPELINED_A = [
    Tiles(256, 512, 1, True, False, True, False, True),  # B loaded as is
    Tiles(256, 512, 1, True, True, True, False, True),  # B transposed straight into SBUF too (its own PSUM bank)
    Tiles(384, 1024, 1, True, True, True, False, True, rg=2),  # two moving tiles per block: transposes at j == 0
]


@pytest.mark.parametrize("tiles", PIPELINED_A, ids=lambda t: "-".join(map(str, t.to_attr())))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_resident_pipelined_a_transposes(tiles: Tiles, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(700, 640, generator=g).to(dtype)
    w = (torch.randn(1100, 640, generator=g) / 8).to(dtype)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w.t() if tiles.tb else x @ w.t().contiguous()

    got = _run_forced(tiles, fn, x, w)
    want = (x.float() @ w.float().t())
    _assert_matches(got, want, dtype)
    plan = _last_matmul_plan()
    assert plan["pipe_a"] and plan["psum_banks"] <= 8
    src = "".join(src for graph in neuron_compile.backend.compiled_graphs() for _, src in graph["sources"])
    assert "a_tp[h][0:128, q, 0:NR]" in src and "if j == 0 and NR > 0:" in src


# direct transposes of several K tiles per chunk: rotating PSUM slots (two per one-bank tile, SPLIT_TRANSPOSE_BANKS
# tiles for split and resident blocks, consecutive slots in different banks), double-buffered operand chunks and
# row staging. K 1100: chunks of 512, a ragged last one (76).
ROTATING_SLOTS = [
    Tiles(256, 1024, 4, True, True, False, True, True),  # split, both operands transposed straight into SBUF
    Tiles(384, 512, 4, False, True, True, False, True),  # resident, B transposed straight into SBUF per block
    Tiles(256, 512, 4, True, True, False, False, True),  # streamed: two slots
]


@pytest.mark.parametrize("tiles", ROTATING_SLOTS, ids=lambda t: "-".join(map(str, t.to_attr())))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_direct_transposes_rotate_psum_slots(tiles: Tiles, dtype: torch.dtype) -> None:
    from neuron_compile.codegen.plan_matmul import SPLIT_TRANSPOSE_BANKS

    g = torch.Generator().manual_seed(7)
    x = torch.randn(520, 1100, generator=g).to(dtype)
    w = (torch.randn(900, 1100, generator=g) / 16).to(dtype)
    got = _run_forced(tiles, lambda x, w: x @ w.t(), x, w)
    want = x.float() @ w.float().t()
    _assert_matches(got, want, dtype)
    plan = _last_matmul_plan()
    slots = 2 * SPLIT_TRANSPOSE_BANKS if (tiles.resident or tiles.split) else 2
    assert [bank["slots"] for bank in plan["banks"]] == [slots] and plan["psum_banks"] <= 8


# resident blocks whose one N block holds all of N: B is loaded (and transposed) once, before the M loop, and the A
# blocks are double-buffered. 700 rows: several M blocks per core and a ragged last one; N 300 within one block.
B_ONCE = [
    Tiles(256, 512, 1, True, True, True, False, True),  # A pipelined, B transposed straight into SBUF once
    Tiles(128, 512, 2, True, True, True),  # both through the HBM scratch
    Tiles(256, 512, 1, False, False, True),  # both loaded as they are (strided)
]


@pytest.mark.parametrize("tiles", B_ONCE, ids=lambda t: "-".join(map(str, t.to_attr())))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_resident_single_n_block_loads_b_once(tiles: Tiles, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(8)
    x = torch.randn(700, 640, generator=g).to(dtype)
    w = (torch.randn(300, 640, generator=g) / 8).to(dtype)
    bias = torch.randn(300, generator=g).to(dtype)

    def fn(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.t() + bias) if tiles.tb else x @ w.t().contiguous() + bias

    got = _run_forced(tiles, fn, x, w, bias)
    want = fn(x.float(), w.float(), bias.float())
    _assert_matches(got, want, dtype)
    assert _last_matmul_plan()["b_once"]
    src = "".join(src for graph in neuron_compile.backend.compiled_graphs() for _, src in graph["sources"])
    body = src[src.index("def "):]
    # one B block, allocated before the M loop; an A block allocated per M block
    assert body.count("b_blk = nl.ndarray") == 1 and body.index("b_blk = nl.ndarray") < body.index("for m0 in"), src
    assert body.index("a_blk = nl.ndarray") > body.index("for m0 in"), src
    # the bias (the same columns for every M block) is loaded by the program's first M block only
    loads = [line.strip() for line in body.splitlines() if "src=in2.ap(pattern=[[0, 128]" in line]
    assert len(loads) == 1, src
    lines = [line.strip() for line in body.splitlines()]
    at = next(i for i, line in enumerate(lines) if "src=in2.ap(pattern=[[0, 128]" in line)
    assert lines[at - 3].startswith("if m0 == "), src


# one M block, several N blocks (200 rows), or several M blocks (300 rows) with B, the larger operand, transposed on
# TensorE: the two cores of the logical core take alternate N blocks (split_n); a B scratch pass transposes only the
# program's own N blocks. N 1100 in blocks of 512 (a ragged last one), K 640.
SPLIT_N = [
    (200, Tiles(256, 512, 1, True, True, True, False, True)),  # resident, A pipelined: during each core's first N block
    (200, Tiles(256, 512, 2, True, True, False)),  # streamed, both through the HBM scratch
    (200, Tiles(256, 512, 1, True, True, False, True, True)),  # split K, both transposed straight into SBUF
    (300, Tiles(128, 512, 2, True, True, False)),  # three M blocks: B's scratch pass split between the cores
    (300, Tiles(128, 512, 1, True, True, True, False, True, sb=True)),  # A straight into SBUF, B through the scratch
]


@pytest.mark.parametrize(("rows", "tiles"), SPLIT_N, ids=lambda t: "-".join(map(str, t.to_attr()))
                         if isinstance(t, Tiles) else str(t))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemm_spreads_n_blocks_over_the_cores(rows: int, tiles: Tiles, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(9)
    x = torch.randn(rows, 640, generator=g).to(dtype)
    w = (torch.randn(1100, 640, generator=g) / 8).to(dtype)
    bias = torch.randn(1100, generator=g).to(dtype)
    got = _run_forced(tiles, lambda x, w, bias: torch.nn.functional.gelu(x @ w.t() + bias), x, w, bias)
    want = torch.nn.functional.gelu(x.float() @ w.float().t() + bias.float())
    _assert_matches(got, want, dtype)
    plan = _last_matmul_plan()
    assert plan["split_n"] and not plan["split_m"] and plan["grid"] == 2, plan["grid"]
    src = "".join(src for graph in neuron_compile.backend.compiled_graphs() for _, src in graph["sources"])
    assert "for n0 in range(nl.program_id(0) * 512, 1100, 512 * nl.num_programs(0)):" in src, src
    if any(s["name"] == "b_t" for s in plan["scratch"]):
        assert "for nb0 in range(nl.program_id(0) * 512, 1100, 512 * nl.num_programs(0)):" in src, src


# resident blocks, A transposed straight into SBUF, B through the HBM scratch (sb): the scratch is filled during each
# program's first M block (B's N blocks transposed straight into the SBUF block, used there and stored), the later M
# blocks read it back, and the next M block's first A row tile is loaded during the block before. Cores split the M
# blocks (1100 rows, N 700: five M blocks, a ragged 76-row last one) or the N blocks (700 rows, N 1100); K 640.
B_FILL = [(1100, 700, Tiles(256, 512, 1, True, True, True, False, True, rg=2, sb=True)),
          (700, 1100, Tiles(256, 512, 1, True, True, True, False, True, sb=True))]


@pytest.mark.parametrize(("rows", "n", "tiles"), B_FILL, ids=lambda t: "-".join(map(str, t.to_attr()))
                         if isinstance(t, Tiles) else str(t))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_b_scratch_filled_during_the_first_m_block(rows: int, n: int, tiles: Tiles, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(10)
    x = torch.randn(rows, 640, generator=g).to(dtype)
    w = (torch.randn(n, 640, generator=g) / 8).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    got = _run_forced(tiles, lambda x, w, bias: torch.nn.functional.gelu(x @ w.t() + bias), x, w, bias)
    want = torch.nn.functional.gelu(x.float() @ w.float().t() + bias.float())
    _assert_matches(got, want, dtype)
    plan = _last_matmul_plan()
    assert plan["b_fill"] is not None and plan["pipe_a"] and plan["psum_banks"] <= 8
    assert plan["split_m"] == (rows > n) and plan["grid"] == 2
    src = "".join(src for graph in neuron_compile.backend.compiled_graphs() for _, src in graph["sources"])
    first = "0 + nl.program_id(0) * 256" if plan["split_m"] else "0"
    assert f"if m0 == {first}:" in src and "b_t_rows" not in src, src  # no scratch pass before the blocks
    assert "a_next = nl.ndarray" in src and "if NX > 0:" in src, src


def test_tile_search_budget_stops_losing_candidates_and_keeps_the_choice() -> None:
    """A candidate whose schedule passes the budget (the fourth best so far, then the best) stops there and scores
    inf; the search picks the same tiles as scoring every candidate to its end (bf16 Linear + GELU, 700 x 640 x 1100,
    several M and N blocks)."""
    from neuron_compile.instruction_stream import kernel_time_ns

    g = torch.Generator().manual_seed(11)
    lin = torch.nn.Linear(640, 1100).to(torch.bfloat16)
    x = torch.randn(700, 640, generator=g).to(torch.bfloat16)
    picks, budgets = [], []
    orig = mm_rules._score
    for budgeted in (True, False):
        mm_rules._TUNED.clear()
        mm_rules._score = (lambda kernel, tiles, target, budget_ns=math.inf, budgeted=budgeted: (  # type: ignore
            budgets.append(budget_ns) or orig(kernel, tiles, target, budget_ns if budgeted else math.inf)))
        try:
            with config.patch(target="trn2", cache=False), torch.no_grad():
                got = torch.compile(lambda x: torch.nn.functional.gelu(lin(x)), backend="neuron", dynamic=False)(x)
        finally:
            mm_rules._score = orig  # type: ignore[assignment]
            mm_rules._TUNED.clear()
        with torch.no_grad():
            _assert_matches(got, torch.nn.functional.gelu(x.float() @ lin.weight.float().t() + lin.bias.float()),
                            torch.bfloat16)
        picks.append(_chosen_tiles())
    assert picks[0] == picks[1], picks
    assert any(b < math.inf for b in budgets)  # the budget was in force for some candidates
    kernel = next(k for k in neuron_compile.backend.compiled_graphs()[-1]["plan"].kernels
                  if any(op.opcode == "matmul" for op in getattr(k, "ops", ())))
    with config.patch(target="trn2"):
        full = kernel_time_ns(kernel, "trn2")
        assert kernel_time_ns(kernel, "trn2", full * 1.01) == full  # within the budget: the same time
        assert kernel_time_ns(kernel, "trn2", full * 0.5) == math.inf  # passed it: stopped


def test_cached_choice_with_row_groups_serves_the_next_gemm_of_its_signature() -> None:
    """The search refines its best blocks with epilogue row groups (rg, sg), which the candidate list doesn't hold:
    a cached choice counts as legal when its blocks are a candidate, so the next GEMM of the same signature (a
    repeated layer) takes it without searching again (GPT-2 small searched each of its 12 layers' GEMMs anew); a
    cached choice whose blocks aren't a candidate is searched again."""
    from neuron_compile.capture import aten_graphs
    from neuron_compile.pipeline import build_artifacts

    lin = torch.nn.Linear(512, 512).to(torch.bfloat16)
    x, r = torch.randn(1024, 512, dtype=torch.bfloat16), torch.randn(1024, 512, dtype=torch.bfloat16)
    with config.patch(target="trn2", cache=False), torch.no_grad():
        (gm, ins), = aten_graphs(lambda x, r: lin(x) + r, x, r, execute=False)
        kernel = next(k for k in build_artifacts(gm, ins)[2].kernels
                      if any(op.opcode == "matmul" for op in getattr(k, "ops", ())))
        sig = mm_rules._signature(kernel, "trn2")
        base = next(t for t in mm_rules.candidates(kernel, "trn2") if t.bm >= 512 and t.rg == 1)
        refined = replace(base, rg=4, sg=2)
        searches: list[int] = []
        orig = mm_rules._search
        mm_rules._search = lambda k, c, t: searches.append(1) or orig(k, c, t)  # type: ignore[assignment]
        try:
            mm_rules._TUNED.clear()
            mm_rules._TUNED[sig] = refined
            tuned = mm_rules.tune(kernel)
            assert not searches
            assert [op.attr("tiles") for op in tuned.ops if op.opcode == "matmul"] == [refined.to_attr()]
            mm_rules._TUNED[sig] = replace(refined, bm=99 * 128)  # blocks no candidate has: searched again
            mm_rules.tune(kernel)
            assert searches == [1]
        finally:
            mm_rules._search = orig  # type: ignore[assignment]
            mm_rules._TUNED.clear()
