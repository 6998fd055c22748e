"""Fuse a convolution's elementwise consumers into its PSUM eviction (graph pass before partitioning).

Input: the ATen graph; output: a copy in which every ``convolution -> chain`` is one
``neuron_compile::conv_fused`` node, lowered by :mod:`lowering.ops.conv` into a ConvKernel with an epilogue.
The chain follows single users while each op is elementwise with the running value and either a
per-channel operand (``[C, 1, 1]``-like: the conv bias, BatchNorm's mean / scale / shift), a Python scalar,
a full tensor of the output's shape (a residual) or nothing (relu, silu, gelu, sigmoid, tanh, clamp).

Folding: the leading per-channel affine ops (and scalar scales) collapse into ``value = a * acc + b`` with
``a``, ``b`` per-channel vectors computed by a few new ``[C]``-sized nodes (BatchNorm in eval:
``a = w / sqrt(var + eps)``, ``b = beta - mean * a``), so the eviction is one ScalarE
``activation(func, acc, scale=a, bias=b)`` straight out of PSUM; the rest (a residual add, the final
relu) runs on the staged output tile before its store.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

_LIB = torch.library.Library("neuron_compile", "FRAGMENT")
_LIB.define("conv_fused(Tensor x, Tensor w, Tensor? bias, Tensor[] cols, Tensor[] fulls, int[] stride, int[] padding, "
            "int[] dilation, bool transposed, int[] output_padding, int groups, str epilogue) -> Tensor")

_ACTS = {aten.relu.default: "relu", aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh",
         aten.silu.default: "silu"}
_BINARY = {aten.add.Tensor: "add", aten.sub.Tensor: "subtract", aten.mul.Tensor: "multiply",
           aten.div.Tensor: "divide"}


def _apply(v: torch.Tensor, steps: list[list[Any]], cols: list[torch.Tensor], fulls: list[torch.Tensor]
           ) -> torch.Tensor:
    """The epilogue on a conv result ``v`` (eager semantics of ``conv_fused``)."""
    shape = [1, -1] + [1] * (v.dim() - 2)
    for kind, *rest in steps:
        if kind == "act":
            v = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": torch.nn.functional.silu,
                 "gelu": torch.nn.functional.gelu,
                 "gelu_apprx_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[rest[0]](v)
            continue
        op, arg = rest
        other = cols[arg].reshape(shape) if kind == "col" else fulls[arg] if kind == "tensor" else arg
        v = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
             "maximum": torch.clamp_min, "minimum": torch.clamp_max}[op](v, other)
    return v


def _conv_fused_eager(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, cols: list[torch.Tensor],
                      fulls: list[torch.Tensor], stride: list[int], padding: list[int], dilation: list[int],
                      transposed: bool, output_padding: list[int], groups: int, epilogue: str) -> torch.Tensor:
    spec = json.loads(epilogue)
    acc = aten.convolution.default(x, w, None, stride, padding, dilation, transposed, output_padding, groups)
    acc = acc.float()
    func, a, b = spec["evict"]
    shape = [1, -1] + [1] * (acc.dim() - 2)
    if a is not None:
        acc = acc * (cols[a].float().reshape(shape) if isinstance(a, int) else float(a["scalar"]))
    if b is not None:
        acc = acc + cols[b].float().reshape(shape)
    acc = _apply(acc, [["act", func]] if func != "copy" else [], cols, fulls)
    return _apply(acc, spec["post"], cols, [f.float() for f in fulls]).to(x.dtype)


_LIB.impl("conv_fused", _conv_fused_eager, "CompositeExplicitAutograd")
CONV_FUSED = torch.ops.neuron_compile.conv_fused.default


def _val(n: Any) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _is_col(n: Any, out: torch.Tensor) -> bool:
    """A per-channel operand: broadcasts to the output with only the channel dim (dim 1) of size > 1."""
    v = _val(n)
    if v is None or v.dim() > out.dim() or v.dtype != out.dtype:
        return False
    shape = [1] * (out.dim() - v.dim()) + list(v.shape)
    return shape[1] == out.shape[1] and all(s == 1 for d, s in enumerate(shape) if d != 1)


def _chain(conv: fx.Node) -> list[tuple[fx.Node, tuple[Any, ...]]]:
    """The fusable single-user chain after ``conv``: (node, step) with step (kind, op, operand)."""
    out = _val(conv)
    if out is None or out.dim() not in (3, 4):
        return []
    chain: list[tuple[fx.Node, tuple[Any, ...]]] = []
    cur = conv
    while len(cur.users) == 1:
        (u,) = cur.users
        uv = _val(u)
        if u.op != "call_function" or uv is None or tuple(uv.shape) != tuple(out.shape) or uv.dtype != out.dtype:
            break
        if u.target in _ACTS and u.args[0] is cur:
            step: tuple[Any, ...] = ("act", _ACTS[u.target])
        elif u.target == aten.gelu.default and u.args[0] is cur:
            step = ("act", "gelu_apprx_tanh" if u.kwargs.get("approximate", "none") == "tanh" else "gelu")
        elif u.target == aten.clamp.default and u.args[0] is cur and len(u.args) == 3 \
                and all(isinstance(a, (int, float)) for a in u.args[1:]):
            chain.append((u, ("scalar", "maximum", float(u.args[1]))))
            step = ("scalar", "minimum", float(u.args[2]))
        elif u.target in _BINARY and len(u.args) == 2 and not u.kwargs:
            a, b = u.args
            op = _BINARY[u.target]
            other = b if a is cur else a
            if other is cur:
                break  # h * h: the chain value on both sides is not an epilogue step
            if a is not cur and op in ("subtract", "divide"):
                break  # o - x and o / x: not an epilogue step
            if isinstance(other, (int, float)) and not isinstance(other, bool):
                if op == "divide":
                    op, other = "multiply", 1.0 / float(other)
                step = ("scalar", op, float(other))
            elif _is_col(other, out):
                step = ("col", op, other)
            elif _val(other) is not None and tuple(_val(other).shape) == tuple(out.shape) \
                    and _val(other).dtype == out.dtype and op != "divide":
                step = ("tensor", op, other)
            else:
                break
        else:
            break
        chain.append((u, step))
        cur = u
    return chain


class _Folder:
    """Builds ``a``, ``b`` (per-channel) so that the folded prefix is ``a * acc + b``; new nodes go before ``at``."""

    def __init__(self, graph: fx.Graph, at: fx.Node, channels: int, dtype: torch.dtype) -> None:
        self.graph, self.at, self.c, self.dtype = graph, at, channels, dtype
        self.a: fx.Node | float | None = None
        self.b: fx.Node | None = None

    def _col(self, n: fx.Node) -> fx.Node:
        return self._op(aten.view.default, n, [self.c])

    def _op(self, target: Any, *args: Any) -> fx.Node:
        with self.graph.inserting_before(self.at):
            node = self.graph.call_function(target, args)
        node.meta["val"] = torch.empty(self.c, dtype=self.dtype, device="meta")
        return node

    def step(self, op: str, other: fx.Node | float) -> None:
        col = self._col(other) if isinstance(other, fx.Node) else other
        if op in ("add", "subtract"):
            assert isinstance(col, fx.Node)
            if self.b is None:
                self.b = col if op == "add" else self._op(aten.mul.Tensor, col, -1.0)
            else:
                self.b = self._op(aten.add.Tensor if op == "add" else aten.sub.Tensor, self.b, col)
            return
        target = aten.mul.Tensor if op == "multiply" else aten.div.Tensor
        if isinstance(col, float):
            scale = col if op == "multiply" else 1.0 / col
            self.a = scale if self.a is None else (self.a * scale if isinstance(self.a, float)
                                                   else self._op(aten.mul.Tensor, self.a, scale))
            if self.b is not None:
                self.b = self._op(aten.mul.Tensor, self.b, scale)
            return
        if self.a is None:
            self.a = col if op == "multiply" else self._op(aten.reciprocal.default, col)
        elif isinstance(self.a, float):
            self.a = self._op(target, self._op(aten.full.default, [self.c], self.a), col)
        else:
            self.a = self._op(target, self.a, col)
        if self.b is not None:
            self.b = self._op(target, self.b, col)


def _fitting(conv: fx.Node, chain: list[tuple[fx.Node, tuple[Any, ...]]]) -> list[tuple[fx.Node, tuple[Any, ...]]]:
    """``chain`` up to its first full-size operand (a residual) that would not fit the conv kernel's SBUF budget
    (each is staged beside the output tile: a wide input's band leaves no room for them)."""
    from neuron_compile.lowering.ops.conv import fits_with

    n_full = 0
    for i, (_, step) in enumerate(chain):
        if step[0] == "tensor":
            n_full += 1
            if not fits_with(conv, n_full):
                return chain[:i]
    return chain


def fuse_conv_epilogue(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with each convolution and its fusable chain replaced by one conv_fused node (or ``gm``)."""
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == aten.convolution.default]
    if not any(_chain(c) for c in convs):
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    for conv0 in convs:
        conv = remap[conv0]
        chain = _fitting(conv, _chain(conv))
        if not chain:
            continue
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
        out = _val(conv)
        assert out is not None
        last = chain[-1][0]
        cols: list[fx.Node] = []
        fulls: list[fx.Node] = []
        folder = _Folder(graph, last, out.shape[1], out.dtype)
        if bias is not None:
            folder.step("add", bias)
        k = 0
        while k < len(chain) and (chain[k][1][0] == "col" or (chain[k][1][0] == "scalar"
                                                            and chain[k][1][1] == "multiply")):
            folder.step(chain[k][1][1], chain[k][1][2])
            k += 1
        func = "copy"
        if k < len(chain) and chain[k][1][0] == "act":
            func = chain[k][1][1]
            k += 1
        a_ref: Any = None
        if isinstance(folder.a, fx.Node):
            cols.append(folder.a)
            a_ref = len(cols) - 1
        elif isinstance(folder.a, float):
            a_ref = {"scalar": folder.a}
        b_ref = None
        if folder.b is not None:
            cols.append(folder.b if folder.b is not bias else folder._col(bias))
            b_ref = len(cols) - 1
        post: list[list[Any]] = []
        for _, (kind, *rest) in chain[k:]:
            if kind == "act":
                post.append(["act", rest[0]])
            elif kind == "scalar":
                post.append(["scalar", rest[0], rest[1]])
            elif kind == "col":
                col = folder._col(rest[1])
                if rest[0] == "divide":  # no divide instruction: multiply by the reciprocal column
                    col = folder._op(aten.reciprocal.default, col)
                cols.append(col)
                post.append(["col", "multiply" if rest[0] == "divide" else rest[0], len(cols) - 1])
            else:
                fulls.append(rest[1])
                post.append(["tensor", rest[0], len(fulls) - 1])
        spec = json.dumps({"evict": [func, a_ref, b_ref], "post": post}, sort_keys=True)
        with graph.inserting_before(last):
            fused = graph.call_function(CONV_FUSED, (x, w, None, cols, fulls, stride, padding, dilation, transposed,
                                                     output_padding, groups, spec))
        fused.meta = dict(last.meta)
        fused.meta["conv_source"] = [str(n.target) for n in [conv, *(n for n, _ in chain)]]
        last.replace_all_uses_with(fused)
        for n, _ in reversed(chain):
            graph.erase_node(n)
        graph.erase_node(conv)
        log.debug("conv epilogue: %s + %d ops fused (%s)", conv.name, len(chain), spec)
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)


def spec_of(node: fx.Node) -> dict[str, Any]:
    return json.loads(node.args[11])


__all__ = ["CONV_FUSED", "fuse_conv_epilogue", "spec_of"]
