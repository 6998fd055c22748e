"""Kernel body of the fused attention family from an :class:`AttentionKernel`, through its templates.

:mod:`plan_attention` chooses the variant and computes its plan (plain data, the launch grid included); the
variant's template, ``templates/attention_{standard,transposed,unshifted}.nki.j2`` (shared pieces in
``_attention_macros.nki.j2``), writes the body, which ``attention.nki.j2`` (the frame) wraps into the kernel. On
a logical core of two physical cores every variant spreads its batches over both; the unshifted kernel's programs
exchange their on-chip check (``nisa.sendrecv``) so both take the same runtime path.
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


def attention_body(k: AttentionKernel, grid: int = 1) -> str:
    """The unshifted kernel with the exact one as its checked rerun when it applies, else the exact one; batches
    spread over ``split_grid(k, grid)`` programs."""
    return _render(k, plan(k, grid))


def exact_attention_body(k: AttentionKernel, grid: int = 1) -> str:
    """Softmax with the row max: the transposed-scores kernel (heads of 32/64/96, no mask) or the standard one, its
    batches spread over ``split_grid(k, grid)`` programs."""
    return _render(k, exact_plan(k, grid))


def attention_body_grid(k: AttentionKernel, grid: int) -> tuple[str, int]:
    """(body, launch grid) on a logical core of ``grid`` physical cores: the unshifted kernel when it applies, else
    the exact one, batches spread over the grid. The unshifted kernel branches on an on-chip check, and both cores
    of a logical core must take the same runtime path (NKI 0.6 runtime loops): its programs exchange their flags
    (nisa.sendrecv) and rerun together."""
    split = split_grid(k, grid)
    return attention_body(k, split), split
