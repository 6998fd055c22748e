"""``F.linear_cross_entropy``'s chunked custom ops (``torch_nn`` namespace) as a linear layer and a cross entropy.

PyTorch computes the fused loss in batch chunks so that the ``[N, classes]`` logits never exist whole. Both ops
are restated here on ops we lower, with the logits and the softmax in ``acc_dtype``:

- ``_linear_cross_entropy_batch_chunked`` (``reduction`` mean or sum) returns the loss together with the
  gradients of the input, the linear weight and the linear bias (its backward only scales them). The gradients
  are the traced vjp of the same loss (:func:`neuron_compile.lowering.decomp_vjp.traced_vjp`); a gradient the op
  is not asked for is an empty tensor, as eager's.
- ``_linear_cross_entropy_batch_chunked_no_reduction`` returns the per-sample loss; its backward is PyTorch's own
  (traced onto ATen ops).

Class weights, ``ignore_index`` and label smoothing follow ``F.cross_entropy``. The ops exist once
``torch.nn.modules.linear_cross_entropy`` is imported, so the table is looked up at every compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from neuron_compile.lowering.decomp_moe import registered
from neuron_compile.lowering.decomp_vjp import traced_vjp


def _loss(reduction: str, ignore_index: int, label_smoothing: float, acc: torch.dtype, bias: bool,
          ) -> Callable[..., torch.Tensor]:
    """The loss of (input, linear weight[, linear bias], target[, class weights])."""
    def loss(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        b, rest = (rest[0].to(acc), rest[1:]) if bias else (None, rest)
        target, weight = rest[0], (rest[1].to(acc) if len(rest) > 1 else None)
        logits = F.linear(x.to(acc), w.to(acc), b)
        return F.cross_entropy(logits, target, weight, reduction=reduction, ignore_index=ignore_index,
                               label_smoothing=label_smoothing)

    return loss


def _chunked(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
             weight: torch.Tensor | None, reduction: str, ignore_index: int, label_smoothing: float,
             batch_chunk_size: int, acc_policy: str, acc_dtype: torch.dtype, allow_retain_graph: bool,
             input_grad: bool, weight_grad: bool, bias_grad: bool) -> Any:
    acc = acc_dtype or torch.float32
    loss_fn = _loss(reduction, ignore_index, label_smoothing, acc, bias is not None)
    primals = (x, w) if bias is None else (x, w, bias)
    constants = (target,) if weight is None else (target, weight)
    loss = loss_fn(*primals, *constants)
    wanted = (input_grad, weight_grad, bias_grad)[:len(primals)]
    grads: list[Any] = [None] * 3
    if any(wanted):
        grads[:len(primals)] = traced_vjp(loss_fn, primals, torch.ones((), dtype=acc), wanted, constants)
    empty = ((0, 0), (0, 0), (0,))
    out = [torch.zeros(e, dtype=x.dtype) if g is None else g.to(x.dtype) for g, e in zip(grads, empty, strict=True)]
    return (loss.to(x.dtype), *out)


def _chunked_no_reduction(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
                          weight: torch.Tensor | None, ignore_index: int, batch_chunk_size: int, acc_policy: str,
                          acc_dtype: torch.dtype) -> torch.Tensor:
    loss_fn = _loss("none", ignore_index, 0.0, acc_dtype or torch.float32, bias is not None)
    tensors = [t for t in (x, w, bias, target, weight) if t is not None]
    return loss_fn(*tensors).to(x.dtype)


def loaded() -> dict[Any, Callable[..., Any]]:
    """The decompositions of the chunked ops, when PyTorch has registered them (else an empty table)."""
    return registered("torch_nn", (("_linear_cross_entropy_batch_chunked", _chunked),
                                   ("_linear_cross_entropy_batch_chunked_no_reduction", _chunked_no_reduction)))
