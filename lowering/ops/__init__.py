"""Lowering rules, one module per op family; importing this package registers them all."""

from neuron_compile.lowering.ops import (  # noqa: F401
    attention,
    checks,
    collectives,
    constant,
    conv,
    conv_grad,
    elementwise,
    elementwise_math,
    index,
    matmul,
    movement,
    pool,
    random,
    reduction,
    resample,
    scan,
    scatter,
    sort,
)
