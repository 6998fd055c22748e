"""Decompositions of the CNN / diffusion ops onto the conv, pool and resample kernel families.

- ``convolution_backward`` -> a transposed convolution (grad_input: the same implicit GEMM as the forward),
  ``neuron_compile::conv_weight_grad`` (grad_weight, :class:`~neuron_compile.lowering.ir.ConvWgradKernel`)
  and a sum over (N, spatial) (grad_bias, an ordinary reduction kernel).
- ``max_pool2d_with_indices`` -> ``neuron_compile::max_pool`` + ``max_pool_index`` (indices only where used),
  its backward -> ``neuron_compile::max_pool_backward``, which recomputes the argmax from the input instead of
  reading stored indices (training keeps no index tensor; eager's tie and NaN rules are reproduced).

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


_LIB.define("max_pool(Tensor x, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) "
            "-> Tensor")
_LIB.define("max_pool_index(Tensor x, int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
            "bool ceil_mode) -> Tensor")
_LIB.define("max_pool_backward(Tensor grad_output, Tensor x, int[] kernel_size, int[] stride, int[] padding, "
            "int[] dilation, bool ceil_mode) -> Tensor")


def _max_pool_eager(x: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                    dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    return aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _max_pool_index_eager(x: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                          dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    return aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[1]


def _max_pool_backward_eager(go: torch.Tensor, x: torch.Tensor, kernel_size: list[int], stride: list[int],
                             padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    """The gradient routed to each window's argmax (recomputed from ``x``: first maximum, NaN wins)."""
    idx = aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[1]
    return aten.max_pool2d_with_indices_backward.default(go, x, kernel_size, stride, padding, dilation, ceil_mode,
                                                         idx)


_LIB.impl("max_pool", _max_pool_eager, "CompositeExplicitAutograd")
_LIB.impl("max_pool_index", _max_pool_index_eager, "CompositeExplicitAutograd")
_LIB.impl("max_pool_backward", _max_pool_backward_eager, "CompositeExplicitAutograd")
MAX_POOL = torch.ops.neuron_compile.max_pool.default
MAX_POOL_INDEX = torch.ops.neuron_compile.max_pool_index.default
MAX_POOL_BACKWARD = torch.ops.neuron_compile.max_pool_backward.default


def _pool_args(x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any) -> tuple[list[int], ...]:
    def two(v: Any, default: list[int]) -> list[int]:
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        v = v or default
        return v * 2 if len(v) == 1 else v

    ks = two(kernel_size, [1])
    return ks, two(stride, ks), two(padding, [0]), two(dilation, [1])


def _max_pool2d_with_indices(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                             dilation: Any = 1, ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices as two ops: training needs only the values (the backward recomputes the argmax)."""
    ks, st, pad, dil = _pool_args(x, kernel_size, stride, padding, dilation)
    return MAX_POOL(x, ks, st, pad, dil, ceil_mode), MAX_POOL_INDEX(x, ks, st, pad, dil, ceil_mode)


def _max_pool2d_with_indices_backward(go: torch.Tensor, x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any,
                                      dilation: Any, ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    ks, st, pad, dil = _pool_args(x, kernel_size, stride, padding, dilation)
    return MAX_POOL_BACKWARD(go, x, ks, st, pad, dil, ceil_mode)


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
    return {aten.convolution_backward.default: _convolution_backward,
            aten.max_pool2d_with_indices.default: _max_pool2d_with_indices,
            aten.max_pool2d_with_indices_backward.default: _max_pool2d_with_indices_backward}
