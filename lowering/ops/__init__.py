"""Lowering rules, one module per op family; importing this package registers them all."""

from neuron_compile.lowering.ops import constant, elementwise, index, matmul, movement, reduction, scan  # noqa: F401
