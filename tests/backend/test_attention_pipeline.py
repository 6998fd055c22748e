"""Attention kernels as the plan lays them out over time and cores (issue 14 (c)).

``codegen/plan_attention.py`` writes the LNC split of the exact kernel's batch loop (``grid``) and whether the next
head group's rows load while this group computes (``prefetch``); the templates software-pipeline the key loop
(scores two key tiles ahead), the standard kernel's key steps and the transposed kernel's query blocks. Every kernel
here runs on the simulator (both programs of a launch grid) against eager PyTorch; the plan fields are checked
against the rendered source and the SBUF budget.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from neuron_compile.codegen.plan_attention import (
    exact_plan,
    plan,
    prefetch_fits,
    rows_bytes,
    sbuf_bytes_u,
    split_grid,
    transposed_ahead_bytes,
)
from neuron_compile.codegen.render import launch_grid, render_kernel
from neuron_compile.lowering.attention import sbuf_budget
from neuron_compile.lowering.ir import AttentionKernel

import neuron_compile.backend
from neuron_compile.backend import build_artifacts
from neuron_compile.capture import aten_graphs
from neuron_compile.config import config

sys.path.insert(0, str(Path(__file__).parent.parent / "codegen"))
from static_checks import check_kernel_rules  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _compile(fn: Callable[..., Any], lnc: int, unshifted: bool, *inputs: torch.Tensor
             ) -> tuple[AttentionKernel, str, int]:
    """Compile and run ``fn`` on the simulator, check it against eager, return its attention kernel, the kernel's
    source and launch grid (rendered under the same knobs)."""
    with config.patch(target="trn2", lnc=lnc, attention_unshifted=unshifted):
        out = torch.compile(fn, backend="neuron", dynamic=False)(*inputs)
        kernels = [k for k in neuron_compile.backend.compiled_graphs()[-1]["plan"].kernels
                   if isinstance(k, AttentionKernel)]
        assert len(kernels) == 1
        src, grid = render_kernel(kernels[0]), launch_grid(kernels[0])
    ref = fn(*inputs)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[ref.dtype], rtol=TOL[ref.dtype])
    assert check_kernel_rules(src) == []
    return kernels[0], src, grid


def _qkv(b: int, h: int, s: int, d: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(b * 1000 + h * 100 + s + d)
    return [torch.randn(b, h, s, d, generator=g).to(dtype) for _ in range(3)]


@pytest.mark.parametrize(("d", "variant"), [(128, "standard"), (64, "transposed")])
def test_exact_kernel_splits_batches_over_the_launch_grid(d: int, variant: str) -> None:
    """LNC=2, three batches: the plan's grid puts batches 0, 2 on program 0 and batch 1 on program 1 (both run on the
    simulator), the next head group's rows load one group ahead, and the output equals eager."""
    k, src, grid = _compile(_sdpa, 2, False, *_qkv(3, 2, 200, d, torch.float32))
    p = exact_plan(k, 2)
    assert (p["variant"], p["grid"], grid) == (variant, 2, 2)
    assert "LAUNCH_GRID = 2" in src
    assert "for b in range(nl.program_id(0), 3, nl.num_programs(0)):" in src
    assert p["prefetch"] and "q_next" in src and "b1 = b if hg + " in src


def test_one_batch_splits_heads_over_the_cores() -> None:
    """One batch of two heads: a head group each (lnc_cap), program i takes head groups i, i + 2, ...; one batch of
    one head: nothing to split, so the launch grid is 1 and no program ids."""
    k, src, grid = _compile(_sdpa, 2, False, *_qkv(1, 2, 130, 128, torch.bfloat16))
    assert split_grid(k, 2) == 2 and exact_plan(k, 2)["grid"] == 2 and exact_plan(k, 2)["group"] == 1 and grid == 2
    assert "for hg in range((nl.program_id(0) - b * 2) % nl.num_programs(0) * 1, 2, " in src
    assert check_kernel_rules(src) == []
    k1, src1, grid1 = _compile(_sdpa, 2, False, *_qkv(1, 1, 130, 128, torch.bfloat16))
    assert split_grid(k1, 2) == 1 and exact_plan(k1, 2)["grid"] == 1 and grid1 == 1
    assert "program_id" not in src1 and "LAUNCH_GRID" not in src1


def test_lnc1_renders_no_program_ids() -> None:
    k, src, grid = _compile(_sdpa, 1, False, *_qkv(2, 2, 140, 128, torch.float32))
    assert grid == 1 and exact_plan(k)["grid"] == 1 and "program_id" not in src


@pytest.mark.parametrize("shape", [(1, 1, 700), (2, 1, 300)], ids=["one-group", "two-batches"])
def test_prefetch_only_when_there_is_a_next_group(shape: tuple[int, int, int]) -> None:
    """A kernel whose only head group covers every head of its single batch has nothing to load ahead; with two
    batches the second group's rows are loaded while the first computes. 700 keys: the standard kernel's pipelined
    steps hold two 512-key chunks each."""
    b, h, s = shape
    k, src, _ = _compile(_sdpa, 1, False, *_qkv(b, h, s, 128, torch.float32))
    p = exact_plan(k)
    assert p["prefetch"] == (b * h > p["group"])
    assert ("q_next" in src) == p["prefetch"]


def test_unshifted_kernel_with_prefetch_matches_eager() -> None:
    """The unshifted kernel (one core: it branches on its on-chip check) with two head groups: rows loaded one group
    ahead, scores two key tiles ahead (a single key tile included: 100 keys)."""
    for s in (100, 600):
        k, src, grid = _compile(_sdpa, 1, True, *_qkv(2, 2, s, 64, torch.bfloat16))
        p = plan(k)
        assert p["variant"] == "unshifted" and grid == 1
        assert p["prefetch"] and "q_next" in src and "st_n2" in src


def test_prefetch_is_counted_in_the_sbuf_budget() -> None:
    """Heads of 2048 x 128 bf16 (issue 14 (c)): the unshifted kernel keeps a group that fits two copies of its rows,
    and the prefetch test adds exactly one group's Q/K/V rows."""
    q = _qkv(2, 4, 2048, 128, torch.bfloat16)
    with config.patch(target="trn2", lnc=1):
        gm, ins = aten_graphs(_sdpa, *q)[0]
        kern = next(x for x in build_artifacts(gm, ins)[2].kernels if isinstance(x, AttentionKernel))
        p = plan(kern)
    assert rows_bytes(kern) == 16 * (128 + 128 + 128) * 2
    assert p["prefetch"]
    assert sbuf_bytes_u(kern, p["group"]) + p["group"] * rows_bytes(kern) <= sbuf_budget("trn2")
    assert prefetch_fits(kern, p["group"], sbuf_bytes_u(kern, p["group"]))
    # the largest group that fits without the second copy is bigger: the plan gave it up to load ahead (the second
    # copy: the next group's rows and the Q^T / K^T made from them)
    g2 = 2 * p["group"]
    assert sbuf_bytes_u(kern, g2) <= sbuf_budget("trn2") < sbuf_bytes_u(kern, g2) + g2 * rows_bytes(kern) + \
        transposed_ahead_bytes(kern, g2)
