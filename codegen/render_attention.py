"""Kernel body of the fused attention family from an :class:`AttentionKernel`, through its templates.

:mod:`plan_attention` chooses the variant and computes its plan (plain data); the variant's template,
``templates/attention_{standard,transposed,unshifted}.nki.j2`` (shared pieces in ``_attention_macros.nki.j2``),
writes the body, which ``attention.nki.j2`` (the frame) wraps into the kernel. The body stays a string of
its own because the code generator may spread its batch loop over the cores of a logical core
(``render._spmd``) and compares the unshifted kernel with the exact one before wrapping.
"""

from __future__ import annotations

import logging
from typing import Any

from neuron_compile.codegen.plan_attention import BANK_KEYS, attention_plan, exact_plan, plan
from neuron_compile.codegen.render import environment
from neuron_compile.lowering.ir import AttentionKernel

from neuron_compile.simulator_limits import PMAX

log = logging.getLogger(__name__)

__all__ = ["attention_body", "attention_plan", "exact_attention_body"]  # attention_plan: for explain


def _render(k: AttentionKernel, p: dict[str, Any]) -> str:
    """The body of variant ``p["variant"]`` (no final newline: the frame's body block ends the line)."""
    text = environment().get_template(f"attention_{p['variant']}.nki.j2").render(k=k, p=p, pmax=PMAX, bank=BANK_KEYS)
    return text.removesuffix("\n")


def attention_body(k: AttentionKernel) -> str:
    """The unshifted kernel with the exact one as its checked rerun when it applies, else the exact one."""
    return _render(k, plan(k))


def exact_attention_body(k: AttentionKernel) -> str:
    """Softmax with the row max: the transposed-scores kernel (heads of 32/64/96, no mask) or the standard one."""
    return _render(k, exact_plan(k))
