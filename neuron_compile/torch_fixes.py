"""Corrections to PyTorch's tracing-time kernels that disagree with eager.

Some ATen ops are traced through Python kernels that torch registers for its dispatcher's Meta and Autograd
keys (its decompositions). Where such a kernel gives a result eager does not, every ``torch.compile``
backend inherits the difference, shapes included: Dynamo's fake tensors and AOTAutograd's trace both run it
before a backend sees the graph. Each correction here replaces the registered kernel, is installed once when the
backend loads, and applies only where the installed torch still shows the defect (its probe), so a fixed
torch is left alone. Eager is never affected: these kernels run only while a trace is in progress.

- ``multilabel_margin_loss_forward``: torch's decomposition counts the target slots after the first ``-1``
  (they gather class 0) and returns a ``[1]`` loss for a 1-D input with ``reduction="none"`` where eager's is
  0-d. It is replaced by a decomposition that follows eager: the loss sums ``max(0, 1 - (x[y_j] - x[i]))`` over
  the target slots ``j`` before the first ``-1`` and the classes ``i`` not among them, divided by the class
  count.
- ``multi_margin_loss``: for a 1-D input with ``reduction="none"`` the decomposition returns ``[1]`` where eager's
  loss has the target's shape (0-d for a 0-d target); wrapped to take that shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey

aten = torch.ops.aten


def multilabel_margin_loss_forward(x: torch.Tensor, target: torch.Tensor, reduction: int) -> Any:
    """(loss, is_target) as eager's multilabel_margin_loss_forward computes them (see the module docstring)."""
    rows, rows_t = torch.atleast_2d(x), torch.atleast_2d(target)
    torch._check(x.dim() <= 2 and rows.shape[1] != 0,
                 lambda: f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {x.shape}")
    torch._check(target.shape == x.shape, lambda: f"inconsistent target size: {target.shape} for input of size: "
                                                 f"{x.shape}")
    classes = rows.shape[1]
    idx = torch.arange(classes, device=x.device)
    end = torch.amin(torch.where(rows_t == -1, idx, classes), dim=-1, keepdim=True)
    slot = idx < end  # [B, slots]: target slots before the first -1
    u = torch.gather(rows, -1, torch.where(slot, rows_t, 0))  # x[y_j]
    is_target = torch.any(idx == torch.where(slot, rows_t, -1).unsqueeze(-1), dim=1)  # [B, classes]
    z = torch.clamp_min(1.0 - u.unsqueeze(-1) + rows.unsqueeze(1), 0) / classes  # [B, slot j, class i]
    z = torch.where(slot.unsqueeze(-1) & ~is_target.unsqueeze(1), z, 0)
    loss = z.sum(dim=(1, 2))
    if reduction == 1:  # mean
        loss = loss.mean()
    elif reduction == 2:  # sum
        loss = loss.sum()
    elif x.dim() < 2:
        loss = loss.reshape(())
    return loss, is_target.to(x.dtype).reshape(target.shape)


def _replace_with(fn: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda kernel: functools.wraps(kernel)(lambda *a, **k: fn(*a, **k))


def _multilabel_margin_wrong() -> bool:
    kernel = aten.multilabel_margin_loss_forward.default.py_kernels.get(DispatchKey.Meta)
    if kernel is None:
        return False
    x = torch.tensor([0.1, 0.2, 0.4, 0.8])
    target = torch.tensor([3, 0, -1, 1])
    expected = torch.ops.aten.multilabel_margin_loss_forward(x, target, 0)[0]  # eager's own kernel
    got = kernel(x, target, 0)[0]
    return got.shape != expected.shape or not torch.allclose(got.reshape(-1), expected.reshape(-1))


def _target_shaped(kernel: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(kernel)
    def fixed(x: torch.Tensor, target: torch.Tensor, p: Any = 1, margin: Any = 1, weight: Any = None,
              reduction: int = 1) -> torch.Tensor:
        loss = kernel(x, target, p, margin, weight, reduction)
        return loss.reshape(target.shape) if reduction == 0 and loss.shape != target.shape else loss

    return fixed


def _multi_margin_shape_wrong() -> bool:
    kernel = aten.multi_margin_loss.default.py_kernels.get(DispatchKey.Meta)
    if kernel is None:
        return False
    x, target = torch.empty(3, device="meta"), torch.zeros((), dtype=torch.long, device="meta")
    return kernel(x, target, 1, 1.0, None, 0).shape != target.shape


# (op, dispatch keys whose Python kernels are replaced, kernel -> replacement, probe: True while torch shows the
# defect)
FIXES: list[tuple[Any, tuple[DispatchKey, ...], Callable[..., Any], Callable[[], bool]]] = [
    (aten.multilabel_margin_loss_forward.default, (DispatchKey.Meta, DispatchKey.Autograd),
     _replace_with(multilabel_margin_loss_forward), _multilabel_margin_wrong),
    (aten.multi_margin_loss.default, (DispatchKey.Meta, DispatchKey.Autograd), _target_shaped,
     _multi_margin_shape_wrong),
]

_installed: list[Any] = []


def install() -> list[str]:
    """Apply every correction whose defect the installed torch shows (once per process); the ops corrected."""
    if not _installed:
        for op, keys, wrap, probe in FIXES:
            if not probe():
                continue
            for key in keys:
                kernel = op.py_kernels.get(key)
                if kernel is not None:
                    op.py_kernels[key] = wrap(kernel)
            op._dispatch_cache.clear()
            _installed.append(op)
        _installed.append(None)  # marks the installation done even when nothing needed a correction
    return [str(op) for op in _installed if op is not None]
