"""torchvision's C++ ops that compile as tensor math: ``roi_align`` (:mod:`~neuron_compile.lowering.decomp_roi`) and
``deform_conv2d`` (:mod:`~neuron_compile.lowering.decomp_deform`).

They are custom ops with their own autograd, so, like ``F.interpolate``
(:func:`neuron_compile.lowering.decomp_conv.rewrite_interpolate`), the Dynamo graph's calls are pointed at the
decompositions before AOTAutograd traces the graph, and AOTAutograd derives their gradients. A call the
decomposition does not cover (arguments not as torchvision's Python wrapper passes them, or shapes torchvision
would reject) is left on the op, which is then refused by name with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from neuron_compile.lowering.decomp_deform import deform_conv2d
from neuron_compile.lowering.decomp_roi import roi_align
from neuron_compile.lowering.registry import register_declined
from torch import fx


def _fake(arg: Any) -> Any:
    """The tensor a graph argument stands for: Dynamo's example value, or AOTAutograd's ``val``."""
    if not isinstance(arg, fx.Node):
        return None
    return arg.meta.get("example_value", arg.meta.get("val"))


def _why_not_roi_align(node: fx.Node) -> str | None:
    ratio = node.args[5] if len(node.args) > 5 else node.kwargs.get("sampling_ratio")
    if isinstance(ratio, int) and not node.kwargs:
        return None
    return ("compiled when called with positional arguments and an int sampling_ratio (as torchvision.ops.roi_align "
            "calls it); call torchvision.ops.roi_align, or run this op eagerly")


def _why_not_deform_conv2d(node: fx.Node) -> str | None:
    usage = "call torchvision.ops.deform_conv2d (or DeformConv2d), or run this op eagerly"
    if node.kwargs or len(node.args) != 14 or not all(isinstance(a, int) for a in node.args[5:14]):
        return f"compiled when called with positional arguments and int settings, as torchvision's wrapper does; {usage}"
    x, weight, offset, mask, bias = (_fake(a) for a in node.args[:5])
    if any(not isinstance(t, torch.Tensor) for t in (x, weight, offset, mask, bias)):
        return f"its tensor arguments' shapes are not known at compile time; {usage}"
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups, use_mask = node.args[5:14]
    problem = _deform_shape_problem(tuple(x.shape), tuple(weight.shape), tuple(offset.shape), tuple(mask.shape),
                                    (stride_h, stride_w, pad_h, pad_w, dil_h, dil_w), groups, offset_groups,
                                    bool(use_mask))
    return None if problem is None else f"{problem} (torchvision rejects this call too)"


def _deform_shape_problem(x: tuple[int, ...], weight: tuple[int, ...], offset: tuple[int, ...], mask: tuple[int, ...],
                          settings: tuple[int, ...], groups: int, offset_groups: int, use_mask: bool) -> str | None:
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w = settings
    if len(x) != 4 or len(weight) != 4 or len(offset) != 4 or (use_mask and len(mask) != 4):
        return "input, weight, offset and mask must be 4-D"
    if min(stride_h, stride_w, dil_h, dil_w, groups, offset_groups) <= 0 or min(pad_h, pad_w) < 0:
        return "stride, dilation and group counts must be positive and padding non-negative"
    kh, kw = weight[2:]
    out_h = (x[2] + 2 * pad_h - (dil_h * (kh - 1) + 1)) // stride_h + 1
    out_w = (x[3] + 2 * pad_w - (dil_w * (kw - 1) + 1)) // stride_w + 1
    checks = [
        (weight[1] * groups == x[1] and weight[0] % groups == 0, "weight's channels do not match input / groups"),
        (x[1] % offset_groups == 0, "input channels are not a multiple of the offset groups"),
        (tuple(offset) == (x[0], 2 * offset_groups * kh * kw, out_h, out_w),
         f"offset must be [{x[0]}, {2 * offset_groups * kh * kw}, {out_h}, {out_w}], got {list(offset)}"),
        (not use_mask or tuple(mask) == (x[0], offset_groups * kh * kw, out_h, out_w),
         f"mask must be [{x[0]}, {offset_groups * kh * kw}, {out_h}, {out_w}], got {list(mask)}"),
        (out_h > 0 and out_w > 0, "the output would be empty"),
    ]
    return next((why for ok, why in checks if not ok), None)


def _targets() -> dict[Any, tuple[Callable[..., Any], Callable[[fx.Node], str | None], Any]]:
    """torchvision op (packet and overload) -> (decomposition, why a call is not covered, overload)."""
    ops = getattr(torch.ops, "torchvision", None)
    table = {"roi_align": (roi_align, _why_not_roi_align), "deform_conv2d": (deform_conv2d, _why_not_deform_conv2d)}
    targets = {}
    for name, (decomposition, why_not) in table.items():
        if ops is None or not hasattr(ops, name):
            continue
        packet = getattr(ops, name)
        register_declined(why_not, packet.default)
        targets[packet] = targets[packet.default] = (decomposition, why_not, packet.default)
    return targets


def rewrite_torchvision_ops(gm: fx.GraphModule) -> fx.GraphModule:
    """Point the Dynamo graph's torchvision op calls at their decompositions (in place)."""
    targets = _targets()
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in targets:
            continue
        decomposition, why_not, overload = targets[node.target]
        node.target = decomposition if why_not(node) is None else overload  # the overload is refused, with why
        changed = True
    if changed:
        gm.recompile()
    return gm
