"""Backward ops as the traced vector-Jacobian product of their forward's decomposition.

Some ATen backward ops have no decomposition while their forward has one onto ops we lower (grid_sampler_2d/3d's
gathers, replication padding with negative, cropping pads). Their backward is then the vjp of that forward
decomposition: :func:`traced_vjp` traces ``torch.func.vjp`` of the forward with fresh fake tensors of the same
shapes, dtypes and strides, outside the trace in progress (its modes, tracing context and dispatch-key state set aside, so autograd
runs normally), functionalized, and replays the traced ATen ops on the real arguments, where the outer trace
records (and further decomposes) them like any other op. The gradients are then autograd's formulas for the
decomposition: the same as eager's analytic backward wherever the decomposition is differentiable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten


def _clean_dispatch_keys() -> tuple[Any, Any]:
    """The thread-local dispatch-key sets of code running outside any dispatch (the defaults a thread starts with):
    backend selection and view tracking on, autocast off."""
    keys = torch._C.DispatchKey
    exclude = torch._C.DispatchKeySet(keys.Undefined)
    for name in dir(keys):
        if name.startswith("Autocast"):
            exclude = exclude.add(getattr(keys, name))
    return torch._C.DispatchKeySet(keys.BackendSelect).add(keys.ADInplaceOrView), exclude


def trace_apart(fn: Callable[..., Any], like: Sequence[torch.Tensor],
                decomposition_table: dict[Any, Callable[..., Any]] | None = None) -> torch.fx.GraphModule:
    """``fn`` traced by make_fx on fresh fake tensors shaped like ``like``, outside the trace in progress (its modes,
    tracing context and dispatch-key state set aside, so autograd and decompositions run normally)."""
    include, exclude = _clean_dispatch_keys()
    # no tracing context either: make_fx would take the outer trace's fake mode (and its shape env) from it
    with _disable_current_modes(), unset_fake_temporarily(), torch._C._ForceDispatchKeyGuard(include, exclude), \
            torch._guards.tracing(None):
        examples = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) for t in like]
        return make_fx(fn, decomposition_table=decomposition_table, tracing_mode="fake")(*examples)


def splice_traced(gm: torch.fx.GraphModule, node: torch.fx.Node, fn: Callable[..., Any],
                  decomposition_table: dict[Any, Callable[..., Any]] | None = None) -> None:
    """``node`` of ``gm`` replaced by the ops of ``fn`` (called with the node's arguments, its tensors traced apart
    by :func:`trace_apart`); the trace's tensor literals become buffers of ``gm``, its nodes keep ``node``'s source
    line, and ``getitem`` users of a tuple result take the matching output."""
    inputs = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node)]

    def call(*tensors: torch.Tensor) -> Any:
        env = dict(zip(inputs, tensors, strict=True))
        args = [env.get(a, a) if isinstance(a, torch.fx.Node) else a for a in node.args]
        kwargs = {k: env.get(v, v) if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
        return fn(*args, **kwargs)

    sub = trace_apart(call, [a.meta["val"] for a in inputs], decomposition_table)
    env: dict[torch.fx.Node, Any] = {}
    placeholders = iter(inputs)
    trace = node.meta.get("stack_trace")
    outs: Any = None
    with gm.graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(placeholders)
            elif n.op == "get_attr":
                name = f"_traced_constant_{len(gm.graph.nodes)}"
                gm.register_buffer(name, getattr(sub, n.target))
                env[n] = gm.graph.get_attr(name)
                env[n].meta = dict(n.meta)
            elif n.op == "call_function":
                env[n] = gm.graph.node_copy(n, lambda x: env[x])
                env[n].meta["stack_trace"] = trace
            elif n.op == "output":
                outs = n.args[0]
    if isinstance(outs, (list, tuple)):
        for user in list(node.users):
            user.replace_all_uses_with(env[outs[user.args[1]]])
            gm.graph.erase_node(user)
    else:
        node.replace_all_uses_with(env[outs])
    gm.graph.erase_node(node)


def traced_vjp(forward: Callable[..., torch.Tensor], primals: Sequence[torch.Tensor], cotangent: torch.Tensor,
               wanted: Sequence[bool], constants: Sequence[torch.Tensor] = ()) -> list[torch.Tensor | None]:
    """The gradients of ``forward(*primals, *constants)`` (a decomposition onto ATen ops) against ``cotangent``:
    one per primal, None where ``wanted`` is False. ``constants`` are the other tensors forward reads (integer
    targets, class weights): never differentiated, and passed in rather than closed over, since the trace runs
    on tensors of its own."""
    n = len(primals)

    def vjp(go: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _, pull = torch.func.vjp(lambda *ps: forward(*ps, *xs[n:]), *xs[:n])
        return pull(go)

    gm = trace_apart(torch.func.functionalize(vjp, remove="mutations"), (cotangent, *primals, *constants))
    for node in gm.graph.nodes:  # replayed values may have other strides than the trace's (the outer trace's
        if node.target in (aten.view.default, aten._unsafe_view.default):  # decompositions): reshape copies
            node.target = aten.reshape.default  # where a view cannot be taken
    gm.recompile()
    grads = gm(cotangent, *primals, *constants)
    return [g if want else None for g, want in zip(grads, wanted, strict=True)]


def _on_or_past_the_clip(grid: torch.Tensor, sizes: Sequence[int], padding_mode: int,
                         align_corners: bool) -> torch.Tensor:
    """Where eager's bilinear/nearest backward zeroes the grid's gradient: a border- or reflection-padded source
    coordinate (after reflecting) at or past [0, size - 1]. Eager counts the borders themselves as out of bounds,
    where the decomposition's clamp would pass the gradient. ``sizes`` are (W, H[, D]), as the grid's last dim."""
    from neuron_compile.lowering.decomp_grid3d import source_coordinate

    parts = []
    for k, size in enumerate(sizes):
        u = source_coordinate(grid[..., k], size, padding_mode, align_corners)
        parts.append((u <= 0) | (u >= size - 1))
    return torch.stack(parts, -1)


def _grid_sampler_backward(grad: torch.Tensor, x: torch.Tensor, grid: torch.Tensor, interpolation_mode: int,
                           padding_mode: int, align_corners: bool, output_mask: Sequence[bool]) -> Any:
    """grid_sampler_2d/3d_backward (every interpolation and padding mode) as the vjp of the forward's
    decomposition (torch's in 2-D, lowering/decomp_grid3d.py's in 3-D): the input's gradient scattered to the
    sampled corners, the grid's through the weights (cut where eager clips a coordinate, borders included)."""
    from neuron_compile.lowering.decomp_grid3d import grid_sampler_3d
    from torch._decomp.decompositions import _grid_sampler_2d

    sizes = tuple(reversed(x.shape[2:]))

    def forward(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if padding_mode != 0 and interpolation_mode != 2:  # bicubic pads its taps, not the coordinate
            g = torch.where(_on_or_past_the_clip(g.detach(), sizes, padding_mode, align_corners), g.detach(), g)
        if a.dim() == 5:
            return grid_sampler_3d(a, g, interpolation_mode, padding_mode, align_corners)
        return _grid_sampler_2d(a, g, interpolation_mode=interpolation_mode, padding_mode=padding_mode,
                                align_corners=align_corners)

    return tuple(traced_vjp(forward, (x, grid), grad, output_mask))


def replication_pad_backward_by_vjp(go: torch.Tensor, x: torch.Tensor, padding: Sequence[int]) -> torch.Tensor:
    """replication_padNd_backward with negative (cropping) pads: the vjp of the forward's decomposition."""
    from torch._decomp import decomposition_table

    op = {1: aten.replication_pad1d, 2: aten.replication_pad2d, 3: aten.replication_pad3d}[len(padding) // 2]
    pad = decomposition_table[op.default]
    grad = traced_vjp(lambda a: pad(a, list(padding)), (x,), go, (True,))[0]
    assert grad is not None
    return grad


VJP: dict[Any, Callable[..., Any]] = {
    aten.grid_sampler_2d_backward.default: _grid_sampler_backward,
    aten.grid_sampler_3d_backward.default: _grid_sampler_backward,
}
