"""Kernel body of the fused attention family from an :class:`AttentionKernel`, through its templates.

:mod:`plan_attention` chooses the variant and computes its plan (plain data, the launch grid included); the
variant's template, ``templates/attention_{standard,transposed,unshifted}.nki.j2`` (shared pieces in
``_attention_macros.nki.j2``), writes the body, which ``attention.nki.j2`` (the frame) wraps into the kernel. The
body stays a string of its own because the code generator compares the unshifted kernel (one core: it branches on
an on-chip check) with the exact one spread over the launch grid before wrapping.
"""

from __future__ import annotations

import logging
from typing import Any

from neuron_compile.codegen.plan_attention import (
    BANK_KEYS,
    attention_plan,
    exact_plan,
    plan,
    split_grid,
    unshifted_group,
)
from neuron_compile.codegen.render import environment
from neuron_compile.lowering.ir import AttentionKernel

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

__all__ = ["attention_body", "attention_plan", "attention_body_grid", "exact_attention_body"]  # attention_plan: explain


def _render(k: AttentionKernel, p: dict[str, Any]) -> str:
    """The body of variant ``p["variant"]`` (no final newline: the frame's body block ends the line)."""
    text = environment().get_template(f"attention_{p['variant']}.nki.j2").render(k=k, p=p, pmax=PMAX, bank=BANK_KEYS)
    return text.removesuffix("\n")


def attention_body(k: AttentionKernel) -> str:
    """The unshifted kernel with the exact one as its checked rerun when it applies, else the exact one (one core)."""
    return _render(k, plan(k))


def exact_attention_body(k: AttentionKernel, grid: int = 1) -> str:
    """Softmax with the row max: the transposed-scores kernel (heads of 32/64/96, no mask) or the standard one, its
    batches spread over ``split_grid(k, grid)`` programs."""
    return _render(k, exact_plan(k, grid))


def attention_body_grid(k: AttentionKernel, grid: int) -> tuple[str, int]:
    """(body, launch grid) on a logical core of ``grid`` physical cores. The unshifted kernel branches on an on-chip
    check, and both cores of a logical core must take the same runtime path (NKI 0.6 runtime loops), so it runs on
    one core; the exact kernel spreads its batches over the grid: take whichever the cost model estimates faster."""
    from neuron_compile.codegen.render import _estimate, _wrap  # imports this module

    split = split_grid(k, grid)
    if not unshifted_group(k):
        return exact_attention_body(k, split), split
    one = attention_body(k)
    if split == 1:
        return one, 1
    two = exact_attention_body(k, split)
    if _estimate(k, _wrap(k, one, 1)) <= _estimate(k, _wrap(k, two, split)):
        return one, 1
    return two, split
