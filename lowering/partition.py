"""Partition an ATen graph into fused kernels.

Nodes are visited in graph order. A pointwise node joins the group of one of its producers when
the shapes relate (the group's iteration space can be refined to cover both), a reduction joins a
group whose values all have its input's shape, and elementwise consumers of a matmul join it as an
epilogue. View ops that keep a group's value layout are absorbed; others are resolved to strided
views of a stored buffer. A node may only join a group created after every group it reads from,
which keeps the kernel order a valid schedule.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
from neuron_compile.lowering import space as sp
from neuron_compile.lowering.dtypes import NARROW_FLOATS
from neuron_compile.lowering.registry import is_tuple_item, lookup
from torch import fx

log = logging.getLogger(__name__)


def node_shape(node: fx.Node) -> tuple[int, ...]:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return tuple(int(s) for s in val.shape)
    return ()


@dataclass
class Group:
    id: int
    kind: str  # 'pointwise' | 'reduction' | 'matmul' | 'copy' | 'gather'
    space: tuple[int, ...]
    red: tuple[int, ...] = ()  # reduced dims of `space` (reduction groups)
    members: list[fx.Node] = field(default_factory=list)
    refined: bool = False  # space was refined past the first member's shape
    reason: str = ""  # why this group starts a new kernel (explain reports)

    def kept(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.space)) if d not in self.red)


@dataclass
class Partition:
    groups: list[Group]
    group_of: dict[fx.Node, Group]
    absorbed: set[fx.Node]  # view nodes folded into their input's group
    inlined: dict[fx.Node, float] = field(default_factory=dict)  # scalar constants folded into consumers
    widened: set[fx.Node] = field(default_factory=set)  # exact fp32 casts read by matmuls from their narrow source


def reduce_dims_of(node: fx.Node) -> tuple[int, ...] | None:
    """Reduced dims of a reduction node's first input (normalized, sorted)."""
    x = node.args[0]
    rank = len(node_shape(x)) if isinstance(x, fx.Node) else 0
    dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    if dims is None or dims == []:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % rank if rank else 0 for d in dims}))


class Partitioner:
    def __init__(self, gm: fx.GraphModule, fuse: bool = True) -> None:
        self.gm = gm
        self.fuse = fuse
        self.groups: list[Group] = []
        self.group_of: dict[fx.Node, Group] = {}
        self.absorbed: set[fx.Node] = set()
        self.inlined: dict[fx.Node, float] = {}
        self.widened: set[fx.Node] = set()

    def run(self) -> Partition:
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            if is_tuple_item(node):
                continue  # an item of a multi-output op: its producer's rule defines the value
            rule = lookup(node.target)
            assert rule is not None, f"unsupported node {node} reached the partitioner"
            kind = rule.kind
            if self.fuse and widened_matmul_operand(node):
                self.widened.add(node)  # no kernel: the matmuls load the narrow source (see the function)
                continue
            value = self._inlinable_constant(node)
            if value is not None:
                self.inlined[node] = value
                log.debug("%s (%s): constant %r folded into its elementwise consumers", node.name, node.target, value)
                continue
            if kind in ("view", "alias"):
                self._view(node)
            elif kind in ("pointwise", "constant"):
                self._pointwise(node)
            elif kind == "reduction":
                self._reduction(node)
            elif kind == "matmul":
                self._new(node, "matmul", node_shape(node), reason="a matmul starts its own kernel")
            else:
                self._new(node, kind, node_shape(node), reason=f"{kind} ops run as their own kernel")
            if log.isEnabledFor(logging.DEBUG):
                self._log_decision(node)
        return Partition(self.groups, self.group_of, self.absorbed, self.inlined, self.widened)

    def _log_decision(self, node: fx.Node) -> None:
        """One DEBUG line per node: which kernel group it went to, and why a new group started."""
        g = self.group_of.get(node)
        if g is None:
            log.debug("%s (%s): view of a stored buffer (no kernel)", node.name, node.target)
        elif g.members[0] is node:
            log.debug("%s (%s): starts kernel group %d [%s]: %s", node.name, node.target, g.id, g.kind,
                      getattr(g, "reason", "") or "first op")
        else:
            how = "absorbed as a view" if node in self.absorbed else "fused"
            log.debug("%s (%s): %s into kernel group %d [%s]", node.name, node.target, how, g.id, g.kind)

    def _inlinable_constant(self, node: fx.Node) -> float | None:
        """A filled constant (full, scalar_tensor) read only by elementwise ops becomes an immediate operand."""
        if node.target not in _FILL_CONSTANTS or not self.fuse:
            return None
        value = node.args[1] if node.target in (_aten.full.default, _aten.full_like.default) else node.args[0]
        if not isinstance(value, (int, float, bool)):
            return None
        for user in node.users:
            rule = lookup(user.target) if user.op == "call_function" else None
            if rule is None or rule.kind != "pointwise":
                return None
        from neuron_compile.lowering.ops.constant import as_stored

        return as_stored(node, value)

    # -- helpers -----------------------------------------------------------------------------
    def _new(self, node: fx.Node, kind: str, space: tuple[int, ...], red: tuple[int, ...] = (),
             reason: str = "") -> Group:
        g = Group(len(self.groups), kind, tuple(space), red, reason=reason)
        g.members.append(node)
        self.groups.append(g)
        self.group_of[node] = g
        return g

    def producer_groups(self, node: fx.Node) -> set[int]:
        """Groups whose stored output ``node``'s value is read from (through views)."""
        out: set[int] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            g = self.group_of.get(n)
            if g is not None:
                out.add(g.id)
                continue
            if n in self.inlined:  # a filled constant (zeros_like(x)): x's shape, not its value
                continue
            if n.op == "call_function":
                stack.extend(a for a in n.all_input_nodes)
        return out

    def _can_join(self, node: fx.Node, g: Group) -> bool:
        for inp in node.all_input_nodes:
            if self.group_of.get(inp) is g:
                continue
            if any(pid >= g.id for pid in self.producer_groups(inp)):
                return False
        return True

    def _candidates(self, node: fx.Node) -> list[Group]:
        seen: list[Group] = []
        for inp in node.all_input_nodes:
            g = self.group_of.get(inp)
            if g is not None and g not in seen and g.kind in ("pointwise", "reduction", "matmul"):
                seen.append(g)
        return sorted(seen, key=lambda g: -g.id)

    # -- node kinds ----------------------------------------------------------------------------
    def _pointwise(self, node: fx.Node) -> None:
        shape = node_shape(node)
        if self.fuse:
            for g in self._candidates(node):
                if self._can_join(node, g) and self._fits(node, shape, g):
                    g.members.append(node)
                    self.group_of[node] = g
                    return
            # A node whose inputs are all stored already (graph inputs, outputs of earlier kernels) may run in
            # any later kernel: join the latest loop kernel when the shapes line up instead of starting a new
            # one (x.abs() beside a chain on x; independent ops on a matmul's result, one after another). A
            # matmul kernel takes only nodes on graph inputs: its epilogue is tuned for the matmul's own chain.
            last = self.groups[-1] if self.groups else None
            if last is not None and last.kind in ("pointwise", "reduction", "matmul") \
                    and (last.kind != "matmul" or not self.producer_groups(node)) \
                    and self._can_join(node, last) and self._fits(node, shape, last):
                last.members.append(node)
                self.group_of[node] = last
                return
        self._new(node, "pointwise", shape, reason=self._why_not(node, shape))

    def _fits(self, node: fx.Node, shape: tuple[int, ...], g: Group) -> bool:
        """Can a pointwise node of ``shape`` live in ``g`` with its in-group inputs broadcasting right?"""
        if g.kind == "reduction" or g.red:
            role = classify(shape, g)
            if role is None:
                return False
            for inp in node.all_input_nodes:
                if self.group_of.get(inp) is g:
                    irole = classify(node_shape(inp), g)
                    if irole is None or (role == "row" and irole == "full"):
                        return False
                    if not broadcast_consistent(node_shape(inp), irole, shape, role, g):
                        return False
            return True
        # pointwise / matmul groups: every in-group value is full over the space.
        for inp in node.all_input_nodes:
            if self.group_of.get(inp) is g and math.prod(node_shape(inp)) != math.prod(shape):
                return False
        if math.prod(shape) != math.prod(g.space):
            return False
        refined = sp.refine(g.space, shape)
        if refined is None:
            return False
        if g.kind == "matmul" and not _keeps_matmul_dims(g, refined):
            return False
        # In-group inputs must line up element-for-element (same numel, no broadcasting).
        for inp in node.all_input_nodes:
            if self.group_of.get(inp) is g and sp.refine(refined, node_shape(inp)) is None:
                return False
        if refined != tuple(d for d in g.space if d != 1):
            g.refined = True
        if g.kind == "matmul":
            refined = _batch_of_one(refined, shape)
        g.space = refined if refined else g.space
        return True

    def _reduction(self, node: fx.Node) -> None:
        x = node.args[0]
        red = reduce_dims_of(node)
        xshape = node_shape(x) if isinstance(x, fx.Node) else ()
        if red is None:
            red = ()
        if self.fuse and isinstance(x, fx.Node):
            g = self.group_of.get(x)
            if g is not None and self._can_join(node, g):
                if g.kind in ("reduction", "matmul") and g.red and g.space == xshape and g.red == red \
                        and classify(xshape, g) == "full":
                    g.members.append(node)
                    self.group_of[node] = g
                    return
                if g.kind == "reduction" and g.space == xshape and g.red == red and classify(xshape, g) == "full":
                    g.members.append(node)
                    self.group_of[node] = g
                    return
                if g.kind == "matmul" and not g.red and self._row_of_matmul(node, g, xshape, red):
                    g.red = red
                    g.members.append(node)
                    self.group_of[node] = g
                    return
                if g.kind == "pointwise" and not g.refined and g.space == xshape and all(
                        node_shape(m) == xshape for m in g.members if m not in self.absorbed):
                    g.kind = "reduction"
                    g.red = red
                    g.members.append(node)
                    self.group_of[node] = g
                    return
        self._new(node, "reduction", xshape, red, reason=self._why_not(node, xshape, reduction=True))

    def _row_of_matmul(self, node: fx.Node, g: Group, xshape: tuple[int, ...], red: tuple[int, ...]) -> bool:
        """A reduction over the whole output row of a matmul group (its N dim, N <= MATMUL_ROW_MAX) may join it:
        the epilogue holds complete rows (the tuner gives such kernels one N block), so row statistics and
        the ops after them (a LayerNorm after a residual add) run there instead of in a kernel that reads
        the stored row back. Every in-group value so far must be full over the space."""
        from neuron_compile.config import config

        if not config.fuse_matmul_norm or not xshape or g.space != xshape or red != (len(xshape) - 1,):
            return False
        n = node_shape(g.members[0])[-1]
        if xshape[-1] != n or n > MATMUL_ROW_MAX:
            return False
        return all(math.prod(node_shape(m)) == math.prod(g.space) for m in g.members)

    def _why_not(self, node: fx.Node, shape: tuple[int, ...], reduction: bool = False) -> str:
        """One line on why ``node`` could not join an existing kernel (only called when it didn't)."""
        if not self.fuse:
            return "fusion is disabled (config.fuse)"
        cands = self._candidates(node)
        if not cands:
            return "no input comes from a fusable loop kernel"
        g = cands[0]
        if not self._can_join(node, g):
            return f"an input comes from a kernel after group {g.id} (joining would reorder kernels)"
        if reduction:
            return f"reduction of {shape} does not match the producer's {g.kind} space {g.space}"
        return f"shape {shape} does not fit the producer's {g.kind} space {g.space}"

    def _view(self, node: fx.Node) -> None:
        """Absorb a view into its input's group when it keeps the group's layout."""
        if not self.fuse:
            return
        inp = node.args[0]
        if not isinstance(inp, fx.Node):
            return
        g = self.group_of.get(inp)
        if g is None or g.kind not in ("pointwise", "reduction", "matmul"):
            return
        rule = lookup(node.target)
        if rule is None or rule.family != "movement" or node.target not in _LAYOUT_VIEWS:
            return
        shape, ishape = node_shape(node), node_shape(inp)
        if g.kind == "reduction" or g.red:
            role, irole = classify(shape, g), classify(ishape, g)
            ok = role is not None and role == irole and [d for d in shape if d != 1] == [d for d in ishape if d != 1]
        else:
            refined = sp.refine(g.space, shape)
            ok = refined is not None and math.prod(shape) == math.prod(g.space)
            if ok and g.kind == "matmul":
                refined = _batch_of_one(refined, shape)
                ok = _keeps_matmul_dims(g, refined)
            if ok:
                g.refined = g.refined or refined != tuple(d for d in g.space if d != 1)
                g.space = refined
        if ok:
            g.members.append(node)
            self.group_of[node] = g
            self.absorbed.add(node)


_aten = torch.ops.aten
_CASTS = (_aten._to_copy.default, torch.ops.prims.convert_element_type.default)
_MATMULS = (_aten.mm.default, _aten.bmm.default)


def widened_matmul_operand(node: fx.Node) -> bool:
    """A cast of a bf16/fp16/fp8 value to fp32 read only as matmul operands (``mm(a.float(), w.float())``,
    ``_scaled_mm``'s decomposition): the matmuls read the narrow value instead, with no cast kernel in between.
    Exact: every such value is an fp32 value, and TensorE's products of two bf16 (or fp16) values are exact in
    its fp32 accumulation, as eager's fp32 products of them are."""
    src = node.args[0] if node.args else None
    if node.target not in _CASTS or not isinstance(src, fx.Node) or set(node.kwargs) - {"dtype", "layout", "device"}:
        return False
    val, sval = node.meta.get("val"), src.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(sval, torch.Tensor) or val.dtype != torch.float32 \
            or sval.dtype not in NARROW_FLOATS or val.shape != sval.shape:
        return False
    return bool(node.users) and all(u.op == "call_function" and u.target in _MATMULS and node not in u.args[2:]
                                    and not u.kwargs for u in node.users)


_FILL_CONSTANTS = {_aten.full.default, _aten.scalar_tensor.default, _aten.full_like.default}
MATMUL_ROW_MAX = 2048  # widest matmul output row a reduction may join (one N block, held in SBUF)
_LAYOUT_VIEWS: set[object] = set()  # filled by lowering.ops.movement: reshape-like views (view, unsqueeze, ...)


def _batch_of_one(refined: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """A matmul group's space for a value of ``shape``: ``refined``, or ``shape`` itself when it only adds leading
    1s ((M, N) as (1, M, N), a batch of one), so the ops and reductions after it (a LayerNorm over the rows) index
    the dims they name, as with a batch of two."""
    lead = len(shape) - len(refined)
    return shape if lead > 0 and shape[lead:] == refined and set(shape[:lead]) == {1} else refined


def _keeps_matmul_dims(g: Group, refined: tuple[int, ...]) -> bool:
    """A matmul group's space may split M and N but never merge across them."""
    mm = g.members[0]
    out = node_shape(mm)
    return sp.coarsen_map(out, refined) is not None


def classify(shape: tuple[int, ...], g: Group) -> str | None:
    """'full' if ``shape`` is the group's space, 'row' if it is the space with the reduced dims removed/kept as 1."""
    space = g.space
    if shape == space:
        return "full"
    if [d for d in shape if d != 1] == [d for d in space if d != 1] and not g.red:
        return "full"
    keepdim = tuple(1 if d in g.red else s for d, s in enumerate(space))
    if shape == keepdim:
        return "row"
    if shape == tuple(space[d] for d in g.kept()):
        return "row"
    if [d for d in shape if d != 1] == [space[d] for d in g.kept() if space[d] != 1] and len(shape) <= len(space):
        return "row"
    return None


def shape_map(shape: tuple[int, ...], role: str, g: Group) -> sp.DimMap | None:
    """For each dim of ``shape`` (a value of ``role`` in ``g``), the space dims it covers."""
    if role == "full":
        return sp.coarsen_map(shape, g.space)
    keepdim = tuple(1 if d in g.red else s for d, s in enumerate(g.space))
    if shape == keepdim:
        return tuple(() if d in g.red or s == 1 else (d,) for d, s in enumerate(g.space))
    return sp.project_map(shape, g.space, g.kept())


def broadcast_consistent(ishape: tuple[int, ...], irole: str, oshape: tuple[int, ...], orole: str, g: Group) -> bool:
    """Does torch's right-aligned broadcasting of ``ishape`` into ``oshape`` match the in-group layout?"""
    imap, omap = shape_map(ishape, irole, g), shape_map(oshape, orole, g)
    if imap is None or omap is None or len(ishape) > len(oshape):
        return False
    off = len(oshape) - len(ishape)
    for i, cov in enumerate(imap):
        if ishape[i] != 1 and cov != omap[off + i]:
            return False
    return True
