"""Names of the matmul planner under their former module (tests and older imports read ``Tiles`` and ``operands``
here). The kernel is ``templates/matmul.nki.j2``; its plan is :mod:`neuron_compile.codegen.plan_matmul`."""

from __future__ import annotations

import logging

from neuron_compile.codegen.plan_matmul import (
    ITEMSIZE,
    Operand,
    Tiles,
    geometry,
    matmul_op,
    moving_tile,
    operands,
    transpose_rows,
)

log = logging.getLogger(__name__)

__all__ = ["ITEMSIZE", "Operand", "Tiles", "geometry", "matmul_op", "moving_tile", "operands", "transpose_rows"]
