"""Decompositions of the CNN / diffusion ops onto the conv, pool and resample kernel families.

- ``convolution_backward`` -> a transposed convolution (grad_input: the same implicit GEMM as the forward),
  ``neuron_compile::conv_weight_grad`` (grad_weight, :class:`~neuron_compile.lowering.ir.ConvWgradKernel`)
  and a sum over (N, spatial) (grad_bias, an ordinary reduction kernel).

The ``neuron_compile::*`` ops are defined here with an eager implementation (their semantics; also what
FakeTensor tracing runs) and are only ever seen by our own lowering rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)
aten = torch.ops.aten

_LIB = torch.library.Library("neuron_compile", "FRAGMENT")
_LIB.define("conv_weight_grad(Tensor input, Tensor grad_output, int[] weight_size, int[] stride, int[] padding, "
            "int[] dilation, int groups) -> Tensor")


def _conv_weight_grad_eager(x: torch.Tensor, go: torch.Tensor, weight_size: list[int], stride: list[int],
                            padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """grad_weight of ``go = conv(x, w)`` (not transposed) for a weight of ``weight_size``."""
    w = torch.empty(weight_size, dtype=x.dtype, device=x.device)
    return aten.convolution_backward.default(go, x, w, None, stride, padding, dilation, False,
                                             [0] * len(stride), groups, [False, True, False])[1]


_LIB.impl("conv_weight_grad", _conv_weight_grad_eager, "CompositeExplicitAutograd")
CONV_WEIGHT_GRAD = torch.ops.neuron_compile.conv_weight_grad.default


def _convolution_backward(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias_sizes: Any, stride: list[int],
                          padding: list[int], dilation: list[int], transposed: bool, output_padding: list[int],
                          groups: int, output_mask: list[bool]) -> tuple[Any, Any, Any]:
    """convolution_backward as two convolutions' worth of kernels: the grad_input is a convolution running
    the other way (transposed <-> not), the grad_weight a correlation of the input with grad_output."""
    nsp = x.dim() - 2
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            gi = aten.convolution.default(go, w, None, stride, padding, dilation, False, [0] * nsp, groups)
        else:
            # the output_padding that makes the transposed convolution come back to the input's size
            op = [x.shape[2 + i] - ((go.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
                                    + dilation[i] * (w.shape[2 + i] - 1) + 1) for i in range(nsp)]
            gi = aten.convolution.default(go, w, None, stride, padding, dilation, True, op, groups)
    if output_mask[1]:
        if transposed:  # y = conv_transpose(x, w) is the grad_input of x = conv(y, w): swap the roles
            gw = CONV_WEIGHT_GRAD(go, x, list(w.shape), stride, padding, dilation, groups)
        else:
            gw = CONV_WEIGHT_GRAD(x, go, list(w.shape), stride, padding, dilation, groups)
    if output_mask[2]:
        gb = aten.sum.dim_IntList(go, [0, *range(2, go.dim())])
    return gi, gw, gb


def conv_decompositions() -> dict[Any, Callable[..., Any]]:
    return {aten.convolution_backward.default: _convolution_backward}
