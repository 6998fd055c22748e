"""The matmul kernel's plan (codegen/plan_matmul.py) is plain data and templates/matmul.nki.j2 writes every NKI line;
the launch grid spreads M blocks over the programs of a logical core only when there are enough of them, and the
split kernel computes what eager PyTorch does."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from neuron_compile.codegen.plan_matmul import Tiles, matmul_plan
from neuron_compile.codegen.render import launch_grid, render_kernel
from neuron_compile.lowering.ir import LoopKernel
from neuron_compile.lowering.ops import matmul as mm_rules

import neuron_compile.backend as backend
from neuron_compile.config import config

log = logging.getLogger(__name__)

# an NKI statement or call: what only the templates may write
NKI_TEXT = re.compile(r"nisa\.|nl\.ndarray|\.ap\(|\bfor \w+ in |\brange\(|program_id")


def _leaves(x: Any) -> Iterator[Any]:
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        yield from _leaves(dataclasses.asdict(x))
    else:
        yield x


def _compile(fn: Callable[..., Any], *xs: torch.Tensor, tiles: Tiles | None = None,
             **knobs: Any) -> tuple[Any, list[LoopKernel]]:
    """Compile and run ``fn`` (trn2 limits), every matmul kernel forced to ``tiles`` when given; its matmul kernels."""
    torch._dynamo.reset()  # a fresh compile per knob setting (Dynamo would reuse the graph of equal inputs)
    backend.reset()
    orig = mm_rules.candidates
    mm_rules._TUNED.clear()
    if tiles is not None:
        mm_rules.candidates = lambda kernel, target: [tiles]  # type: ignore[assignment]
    try:
        with config.patch(cache=False, target="trn2", **knobs), torch.no_grad():
            out = torch.compile(fn, backend="neuron", dynamic=False)(*xs)
    finally:
        mm_rules.candidates = orig  # type: ignore[assignment]
        mm_rules._TUNED.clear()
    kernels = [k for k in backend.compiled_graphs()[-1]["plan"].kernels
               if isinstance(k, LoopKernel) and any(op.opcode == "matmul" for op in k.ops)]
    assert kernels, "no matmul kernel compiled"
    return out, kernels


def test_plan_is_plain_data_without_nki_text() -> None:
    """Numbers, names, dtypes and offset expressions only, for an epilogue with bias, residual and a fused LayerNorm
    and for transposed operands (TensorE transposes): no NKI statement is built in Python."""
    g = torch.Generator().manual_seed(0)
    x, w, b, r = (torch.randn(*s, generator=g) for s in ((200, 96), (160, 96), (160,), (200, 160)))

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(F.gelu(F.linear(x, w, b)) + r, (160,))

    out, kernels = _compile(fn, x, w, b, r, fuse_matmul_norm=True)
    torch.testing.assert_close(out, fn(x, w, b, r), rtol=1e-4, atol=1e-4)
    with config.patch(target="trn2"):
        for k in kernels:
            plan = matmul_plan(k, 2)
            texts = [v for v in _leaves(plan) if isinstance(v, str)]
            assert texts, "the plan names its operands"
            bad = [v for v in texts if NKI_TEXT.search(v)]
            assert not bad, f"{k.name}: NKI text computed in Python: {bad[:3]}"
    assert any(plan["evict"]["row_ops"] for plan in (matmul_plan(k, 2) for k in kernels)), "LayerNorm not fused"


@pytest.mark.parametrize(("lnc", "tiles", "grid"), [
    (2, Tiles(128, 512, 2, False, False), 2),  # 3 M blocks over 2 programs
    (1, Tiles(128, 512, 2, False, False), 1),  # one core per logical core: no split
    (2, Tiles(384, 512, 2, False, False), 1),  # one M block: nothing to spread
])
def test_launch_grid_splits_m_blocks(lnc: int, tiles: Tiles, grid: int) -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(300, 256, generator=g), torch.randn(256, 200, generator=g)
    out, kernels = _compile(torch.mm, a, b, tiles=tiles, lnc=lnc)
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    (k,) = kernels
    with config.patch(target="trn2", lnc=lnc):
        src = render_kernel(k)
        assert launch_grid(k) == grid
    if grid > 1:
        assert f"LAUNCH_GRID = {grid}" in src
        assert "for m0 in range(0 + nl.program_id(0) * 128, 300, 128 * nl.num_programs(0)):" in src
    else:
        assert "LAUNCH_GRID" not in src and "program_id" not in src
        assert f"for m0 in range(0, 300, {min(tiles.bm, 384)}):" in src


def test_batched_matmul_runs_on_one_core() -> None:
    """The M blocks of a batched GEMM sit inside the batch loop: the kernel is not split."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(3, 300, 64, generator=g), torch.randn(3, 64, 96, generator=g)
    out, (k,) = _compile(torch.bmm, a, b, tiles=Tiles(128, 512, 1, False, False), lnc=2)
    torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-4, atol=1e-4)
    with config.patch(target="trn2", lnc=2):
        assert launch_grid(k) == 1
        assert "program_id" not in render_kernel(k)
