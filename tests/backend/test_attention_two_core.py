"""The unshifted attention kernel on both cores of an LNC=2 logical core (issue 14 (c)).

Program r takes batches r, r + 2, ... (one batch: its head groups r, r + 2, ...); before the runtime branch the two programs exchange their "a row failed" flags
(``nisa.sendrecv``) so both take the same path, and on a failure both rerun the exact kernel on their own batches.
Every kernel here runs on the simulator (its two programs as threads, simulator/lnc.py) against eager PyTorch.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from neuron_compile.codegen.plan_attention import plan
from neuron_compile.codegen.render import launch_grid, render_kernel
from neuron_compile.lowering.ir import AttentionKernel

import neuron_compile.backend
from neuron_compile.config import config
from neuron_compile.instruction_stream import kernel_stream
from neuron_compile.simulator import trace

sys.path.insert(0, str(Path(__file__).parent.parent / "codegen"))
from static_checks import check_kernel_rules  # noqa: E402

from neuron_compile.nki_api.checker import check_source_against_api  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def check_first_always() -> Iterator[None]:
    """Every kernel of two units or more per program checks its first unit on its own, however short its pass."""
    with config.patch(attention_check_first_flops=0):
        yield


def _qkv(b: int, h: int, sq: int, sk: int, d: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(b * 1000 + h * 100 + sq + sk + d)
    return [torch.randn(b, h, s, d, generator=g).to(dtype) for s in (sq, sk, sk)]


def _sdpa(causal: bool) -> Callable[..., torch.Tensor]:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _run(fn: Callable[..., Any], *inputs: torch.Tensor, unshifted: bool = True
         ) -> tuple[torch.Tensor, AttentionKernel, str, int, Any]:
    """Compile and run on the simulator (trn2, LNC=2) under a trace: output, attention kernel, source, grid, trace."""
    torch._dynamo.reset()
    with config.patch(target="trn2", lnc=2, attention_unshifted=unshifted), trace() as t:
        out = torch.compile(fn, backend="neuron", dynamic=False)(*inputs)
        (kern,) = [k for k in neuron_compile.backend.compiled_graphs()[-1]["plan"].kernels
                   if isinstance(k, AttentionKernel)]
        src, grid = render_kernel(kern), launch_grid(kern)
    return out, kern, src, grid, t


def _exact_passes(t: Any) -> int:
    """Row-max reductions of the exact kernels (VectorE tensor_reduce reading scores in PSUM): the unshifted pass has
    none (its guard's tensor_reduce reads SBUF)."""
    return sum(1 for r in t.records if r.instruction == "tensor_reduce" and r.buffers[1] == "psum")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(3, 2, 200, 200, 64), (2, 3, 130, 77, 32), (4, 1, 600, 600, 128),
                                   (1, 4, 300, 300, 64), (4, 2, 608, 608, 128), (3, 2, 400, 608, 128)],
                         ids=["odd-batch-ragged", "sq>sk", "two-per-core-d128", "one-batch-heads-split",
                              "d128-dma-transpose", "odd-batch-sq<sk-dma-transpose"])
def test_two_core_unshifted_matches_eager(dtype: torch.dtype, causal: bool, shape: tuple[int, ...]) -> None:
    b, h, sq, sk, d = shape
    q, k, v = _qkv(b, h, sq, sk, d, dtype)
    fn = _sdpa(causal)
    out, kern, src, grid, t = _run(fn, q, k, v)
    ref = fn(q, k, v)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert grid == 2 and plan(kern, 2)["variant"] == "unshifted" and plan(kern, 2)["grid"] == 2
    checks = 2 if plan(kern, 2)["check_first"] else 1  # the first unit's own check, when a program has two units
    assert t.count("sendrecv") == 2 * checks and t.count("register_load") == 2 * checks  # per program
    assert _exact_passes(t) == 0  # moderate scores: no rerun on either core
    # bf16 heads of 128, rows a multiple of 16, a later head group on a core: its Q^T and K^T by DMA transpose
    dma_t = dtype == torch.bfloat16 and d == 128 and sq % 16 == 0
    assert plan(kern, 2)["dma_t"] is dma_t and (t.count("dma_transpose") > 0) is dma_t


def test_lnc2_chooses_the_two_core_unshifted_kernel() -> None:
    """attention_body_grid on LNC=2: the unshifted kernel, batches split over nl.program_id(0), the flags exchanged
    before the register load, the exact rerun split the same way; valid NKI 0.6 by the static checks."""
    q, k, v = _qkv(2, 4, 256, 256, 64, torch.bfloat16)
    _, kern, src, grid, _ = _run(_sdpa(True), q, k, v)
    assert grid == 2 and "LAUNCH_GRID = 2" in src
    assert src.count("for b in range(nl.program_id(0), 2, nl.num_programs(0)):") == 2  # the pass and the rerun
    send = src.index("nisa.sendrecv(src=bad_any, dst=bad_peer, send_to_rank=1 - nl.program_id(0), "
                     "recv_from_rank=1 - nl.program_id(0), pipe_id=0)")
    assert send < src.index("nisa.register_load(dst=rerun, src=bad_i)") < src.index("nl.while_loop(rerun,")
    assert check_kernel_rules(src) == []
    assert check_source_against_api(src) == []
    # one batch: its heads are split over the cores (one head per group here), the flags exchanged
    _, kern1, src1, grid1, _ = _run(_sdpa(True), *_qkv(1, 2, 200, 200, 64, torch.bfloat16))
    assert grid1 == 2 and plan(kern1, 2)["variant"] == "unshifted" and plan(kern1, 2)["group"] == 1
    assert src1.count("for hg in range((nl.program_id(0) - b * 2) % nl.num_programs(0) * 1, 2, ") == 2
    assert "sendrecv" in src1 and check_kernel_rules(src1) == [] and check_source_against_api(src1) == []
    # one batch of one head: nothing to split, one core, no exchange
    _, kern2, src2, grid2, _ = _run(_sdpa(True), *_qkv(1, 1, 200, 200, 64, torch.bfloat16))
    assert grid2 == 1 and "sendrecv" not in src2


@pytest.mark.parametrize("batches", [2, 3])
def test_one_cores_failure_reruns_both(batches: int) -> None:
    """Scores of several hundred on program 1's batches only (batch 1): only program 1's guard fails, yet both
    programs rerun the exact kernel (each its own batches: as many row-max passes as the exact kernel alone makes on
    two cores), and the output is eager's."""
    q, k, v = _qkv(batches, 2, 200, 200, 64, torch.float32)
    q[1], k[1] = q[1] * 12.0, k[1] * 12.0
    fn = _sdpa(True)
    out, _, _, grid, t = _run(fn, q, k, v)
    assert grid == 2 and t.count("register_load") == 2
    _, _, _, grid_e, t_exact = _run(fn, q, k, v, unshifted=False)
    assert grid_e == 2 and _exact_passes(t) == _exact_passes(t_exact) > 0
    torch.testing.assert_close(out, fn(q, k, v), atol=1e-3, rtol=1e-3)
    assert torch.isfinite(out).all()


def test_one_batch_split_heads_failure_reruns_both() -> None:
    """One batch, its two heads on the two cores: scores of several hundred in head 1 (program 1's) only; both
    programs rerun the exact kernel on their own head and the output is eager's."""
    q, k, v = _qkv(1, 2, 200, 200, 64, torch.float32)
    q[:, 1], k[:, 1] = q[:, 1] * 12.0, k[:, 1] * 12.0
    fn = _sdpa(True)
    out, kern, _, grid, t = _run(fn, q, k, v)
    assert grid == 2 and plan(kern, 2)["group"] == 1 and t.count("register_load") == 2
    _, _, _, grid_e, t_exact = _run(fn, q, k, v, unshifted=False)
    assert grid_e == 2 and _exact_passes(t) == _exact_passes(t_exact) > 0
    torch.testing.assert_close(out, fn(q, k, v), atol=1e-3, rtol=1e-3)


def test_one_cores_failure_reruns_both_bf16() -> None:
    """The same in bf16, where no two implementations agree at such scores: the output equals the exact kernel's."""
    q, k, v = _qkv(2, 2, 200, 200, 64, torch.bfloat16)
    q[1], k[1] = q[1] * 12.0, k[1] * 12.0
    fn = _sdpa(True)
    out, _, _, _, t = _run(fn, q, k, v)
    exact, _, _, _, t_exact = _run(fn, q, k, v, unshifted=False)
    assert _exact_passes(t) == _exact_passes(t_exact) > 0
    assert torch.equal(out, exact)


def test_stream_equals_the_two_program_trace() -> None:
    """The cost model's stream of the two-core kernel (both programs, the branch not taken) is the simulator's trace."""
    q, k, v = _qkv(3, 2, 300, 300, 64, torch.bfloat16)
    _, kern, _, _, t = _run(_sdpa(True), q, k, v)
    with config.patch(target="trn2", lnc=2):
        stream = kernel_stream(kern)
    assert stream == Counter(t.records)
    assert len(stream.schedules) == 2 and all(len(s.sync_ns) == 1 for s in stream.schedules)


@pytest.mark.parametrize(("hot", "rest"), [(0, False), (1, False), (2, True)], ids=["core0-first", "core1-first",
                                                                                       "core0-second"])
def test_first_unit_check_agrees_across_cores(hot: int, rest: bool) -> None:
    """Four batches, two per program (program r: batches r, r + 2), each checks its first batch on its own and the
    two exchange that flag too. Scores of several hundred in batch ``hot``: in either program's first batch both
    programs skip the rest of the pass and run the exact kernel (TensorE idle between the two checks); in a second
    batch both run the rest and then rerun. Eager's values either way."""
    q, k, v = _qkv(4, 1, 200, 200, 64, torch.float32)
    q[hot], k[hot] = q[hot] * 12.0, k[hot] * 12.0
    fn = _sdpa(True)
    out, kern, src, grid, t = _run(fn, q, k, v)
    assert grid == 2 and plan(kern, 2)["check_first"]
    assert t.count("sendrecv") == 4 and t.count("register_load") == 4
    # the trace holds program 0's records, then program 1's: per program, its first check and its rerun's
    loads = [i for i, r in enumerate(t.records) if r.instruction == "register_load"]
    for first, rerun in (loads[0:2], loads[2:4]):
        assert any(r.instruction == "nc_matmul" for r in t.records[first + 1:rerun]) is rest
    assert _exact_passes(t) > 0
    torch.testing.assert_close(out, fn(q, k, v), atol=1e-3, rtol=1e-3)
