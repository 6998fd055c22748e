"""Lowering rules, one module per op family; importing this package registers them all."""

from neuron_compile.lowering.ops import (  # noqa: F401
    attention,
    constant,
    conv,
    conv_grad,
    elementwise,
    index,
    matmul,
    movement,
    pool,
    reduction,
    resample,
    scan,
)
