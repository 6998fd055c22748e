"""Lower a partitioned ATen graph to a :class:`~neuron_compile.lowering.ir.Plan`.

Walks the groups chosen by :mod:`lowering.partition` in order and builds one kernel each: for fused
loop kernels it maps every node onto the group's iteration space, turns external inputs into
strided loads, calls the registered rule of every member through a :class:`ProgramBuilder`, stores
the values used outside the group, and canonicalizes the space for the templates. Views outside
groups are resolved to strided views of buffers (a copy kernel is inserted only when a reshape
cannot be a view). Graph outputs become strided views of buffers.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from neuron_compile.lowering import index_algebra as ia
from neuron_compile.lowering import intguard, mathlib, tileopt
from neuron_compile.lowering import space as sp
from neuron_compile.lowering.attention import fuse_attention
from neuron_compile.lowering.builder import ProgramBuilder, TileVal
from neuron_compile.lowering.conv_fusion import fuse_conv_epilogue
from neuron_compile.lowering.dtypes import OPERAND_TILE, storage_dtype
from neuron_compile.lowering.graph_checks import insert_device_checks
from neuron_compile.lowering.graph_degenerate import rewrite_degenerate
from neuron_compile.lowering.graph_passes import (
    drop_value_copies,
    embedding_of_arange_to_slice,
    mlp_hidden_feature_major,
    shift_aranges,
    split_full_reductions,
)
from neuron_compile.lowering.intmath import convert_wide_int_operands, is_int_compute
from neuron_compile.lowering.ir import (
    Access,
    ArgSpec,
    BufferRef,
    CopyKernel,
    DeviceCheck,
    InputSpec,
    Kernel,
    KernelCall,
    LoopKernel,
    OutputSpec,
    Plan,
    RandomSpec,
    TileOp,
)
from neuron_compile.lowering.ops.movement import algebra_step
from neuron_compile.lowering.partition import Group, Partitioner, classify, node_shape, shape_map
from neuron_compile.lowering.registry import is_tuple_item, lookup, qualified_name
from neuron_compile.lowering.value_ranges import drop_proven_checks
from neuron_compile.lowering.views import View, contiguous_strides, dense
from torch import fx
from torch._prims_common import is_non_overlapping_and_dense_or_false

from neuron_compile.config import config
from neuron_compile.errors import LoweringError, source_line

log = logging.getLogger(__name__)


def node_dtype(node: fx.Node) -> torch.dtype:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else torch.float32


class GraphLowering:
    def __init__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> None:
        self.gm = gm
        self.example_inputs = example_inputs
        self.buffers: list[BufferRef] = []
        self.kernels: list[Kernel] = []
        self.calls: list[KernelCall] = []
        self.views: dict[fx.Node, View] = {}
        self.literals: dict[fx.Node, Any] = {}
        self.constants: list[tuple[str, tuple[int, ...], list[Any]]] = []
        self.inputs: list[InputSpec] = []
        self.buffer_nodes: dict[int, str] = {}  # kernel result buffer -> the graph node it holds (check mode)
        self.checks: list[DeviceCheck] = []  # device-side assertions (lowering.ops.checks)
        self.randoms: list[RandomSpec] = []  # random buffers the runner draws (lowering.ops.random)
        self.copy_reasons: dict[str, str] = {}  # copy kernel -> why its view needed one (index algebra)

    # -- entry ---------------------------------------------------------------------------------
    def run(self) -> Plan:
        # out-of-range indices and integer division by zero raise like eager (device-side flags)
        self.gm = insert_device_checks(self.gm)
        self.gm = drop_proven_checks(self.gm)  # checks of aranges and literals in range, wraps that never apply
        self.gm = convert_wide_int_operands(self.gm)  # int8 > tensor(300) compares with 44, as torch does
        self.gm = rewrite_degenerate(self.gm)  # size-1/empty reductions, empty matmuls, flattened argmax
        if config.fuse:  # scaled-dot-product attention subgraphs -> one fused node (lowering/attention.py)
            self.gm = fuse_attention(self.gm)
            self.gm = shift_aranges(self.gm)  # arange(s, e) + c: an arange, no add kernel
            self.gm = embedding_of_arange_to_slice(self.gm)  # position embeddings: a view, not 2 kernels
            self.gm = drop_value_copies(self.gm)  # a tensor literal read by a gather: no copy kernel first
            self.gm = split_full_reductions(self.gm)  # all/any/amax/amin of a whole tensor: 128 partitions first
            self.gm = mlp_hidden_feature_major(self.gm)  # MLP hidden stored K-major for the 2nd matmul
            self.gm = fuse_conv_epilogue(self.gm)  # conv + bias / folded BatchNorm / activation / residual
        self._placeholders()
        part = Partitioner(self.gm, fuse=config.fuse).run()
        self.part = part
        reasons: dict[str, str] = {}
        for g in part.groups:
            first = len(self.kernels)
            self._emit_group(g)
            reasons.update((k.name, g.reason) for k in self.kernels[first:])
        outputs = self._outputs()
        self._check_calls()
        summary = {
            "kernels": [{"name": k.name, "family": k.family, "ops": list(getattr(k, "source_ops", ())),
                         "reason": self.copy_reasons.get(k.name) or reasons.get(k.name, "")} for k in self.kernels],
            "ops": sorted({qualified_name(n.target) for n in self.gm.graph.nodes if n.op == "call_function"}),
            "buffer_nodes": dict(self.buffer_nodes),
        }
        return Plan(tuple(self.kernels), tuple(self.buffers), tuple(self.calls), tuple(self.inputs),
                    tuple(outputs), tuple(self.constants), summary, tuple(self.checks), tuple(self.randoms))

    def _check_calls(self) -> None:
        """Each call runs the kernel its index names, with that kernel's arguments, and each kernel result buffer
        names the kernel that writes it: a rule that took its kernel index before resolving its inputs (which may
        emit a copy kernel first) fails here, at compile time, not as a wrong call at run time."""
        writers = {b: c.kernel for c in self.calls for b in c.results}
        for i, k in enumerate(self.kernels):
            if not k.name.startswith(f"k{i}_"):
                raise LoweringError(f"internal: kernel {i} is named {k.name}")
        for c in self.calls:
            k = self.kernels[c.kernel]
            if len(c.args) != len(k.inputs) or len(c.results) != len(k.outputs):
                raise LoweringError(f"internal: {k.name} takes {len(k.inputs)} inputs and {len(k.outputs)} outputs, "
                                    f"called with {len(c.args)} and {len(c.results)}")
        for b, ref in enumerate(self.buffers):
            if ref.kind == "kernel" and b in writers and writers[b] != ref.index:
                raise LoweringError(f"internal: buffer {b} names kernel {ref.index} but {self.kernels[writers[b]].name}"
                                    f" writes it")

    def _placeholders(self) -> None:
        phs = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(phs):
            val = node.meta.get("val", self.example_inputs[i] if i < len(self.example_inputs) else None)
            if isinstance(val, torch.Tensor):
                nd = storage_dtype(val.dtype)
                shape = tuple(int(s) for s in val.shape)
                strides = tuple(int(s) for s in val.stride())
                if not dense(shape, strides):
                    strides = contiguous_strides(shape)  # the runner passes a contiguous copy
                numel = _storage_extent(shape, strides)
                self.inputs.append(InputSpec(shape, strides, str(val.dtype).replace("torch.", ""), nd or "float32",
                                             True, bool(node.users)))
                buf = self._buffer(BufferRef("input", i, 0, numel, nd or "float32"))
                self.views[node] = View(buf, shape, strides, 0, val.dtype)
            else:
                self.inputs.append(InputSpec((), (), type(val).__name__, "", False, bool(node.users)))
                self.literals[node] = val

    def _buffer(self, ref: BufferRef) -> int:
        self.buffers.append(ref)
        return len(self.buffers) - 1

    # -- views -----------------------------------------------------------------------------------
    def view_of(self, node: fx.Node) -> View:
        if node in self.views:
            return self.views[node]
        if node in self.part.widened:  # an exact fp32 cast only matmuls read: they read its narrow source
            src = self.view_of(node.args[0])
            return View(src.buffer, src.shape, src.strides, src.offset, node_dtype(node))
        if is_tuple_item(node):
            raise LoweringError(f"{node.name}: item {node.args[1]} of {node.args[0].name} ({node.args[0].target}) "
                                f"was not defined by its producer's lowering")
        rule = lookup(node.target)
        if rule is None or rule.kind not in ("view", "alias"):
            raise LoweringError(f"value of {node.name} ({node.target}) was never stored")
        found = self._compose_view(node)
        if isinstance(found, View):
            self.views[node] = found
            return found
        # No strided access of any buffer reaches this view (index algebra): materialize its input
        # contiguously, then view that. The reason goes to the debug log and to explain's kernel list.
        if rule.kind == "alias":  # an alias of a view that needs a copy: the input's own copy
            view = self.view_of(node.args[0])
            self.views[node] = view
            return view
        reason = found[2]
        name = f"k{len(self.kernels)}_copy"
        layout = getattr(rule.fn, "copy_layout", None)  # a rule that reads its input in a layout of its own
        view = rule.fn(node, self.copy_contiguous(self.view_of(node.args[0]), f"{node.name}_contig",
                                                  layout(node) if layout is not None else None))
        assert isinstance(view, View), view
        self.copy_reasons[name] = f"{node.name} ({qualified_name(node.target)}) needs a copy: {reason}"
        log.debug("%s", self.copy_reasons[name])
        self.views[node] = view
        return view

    def _compose_view(self, node: fx.Node) -> View | tuple[View, ia.IndexedView | None, str]:
        """``node``'s view without copying anything: a :class:`View`, or (the nearest buffer view, the
        composed index-algebra view over it or None, why it is not one strided access).

        A view chain that leaves the affine world (a reshape of a permuted tensor) is followed in the
        index algebra; when a later view makes the composed access affine again (flatten then unflatten)
        the result addresses the original buffer and no copy is made.
        """
        if node in self.views:
            return self.views[node]
        rule = lookup(node.target)
        if is_tuple_item(node) or rule is None or rule.kind not in ("view", "alias"):
            return self.view_of(node)
        base = self._compose_view(node.args[0])
        if rule.kind == "alias":
            return base
        if isinstance(base, View):
            out = rule.fn(node, base)
            if isinstance(out, View):
                self.views[node] = out
                return out
            composed = algebra_step(node, ia.source(base.shape, base.strides, base.offset))
            return base, composed, out.reason if isinstance(out, ia.NotAffine) else f"{node.target} is not a view"
        root, iv, reason = base
        step = algebra_step(node, iv) if iv is not None else None
        if step is not None and step.affine:
            log.debug("%s: view chain is one strided access again (%s): no copy", node.name, step.index)
            view = View(root.buffer, step.shape, step.strides or (), step.offset, root.torch_dtype)
            self.views[node] = view
            return view
        return root, step, reason if step is None else step.reason

    def copy_contiguous(self, src: View, name: str, strides: tuple[int, ...] | None = None) -> View:
        """``src`` copied into a buffer of its own, contiguously or in the dense layout ``strides``."""
        kernel_index = len(self.kernels)
        out_numel = src.numel
        nd = storage_dtype(src.torch_dtype) or "float32"
        out_buf = self._buffer(BufferRef("kernel", kernel_index, 0, out_numel, nd))
        dst = View(out_buf, src.shape, strides or contiguous_strides(src.shape), 0, src.torch_dtype)
        self.emit_copy(f"k{kernel_index}_copy", [(src, dst)], [out_buf], ("aten.clone.default",))
        return dst

    def emit_copy(self, name: str, pairs: list[tuple[View, View]], results: list[int], source_ops: tuple[str, ...],
                  src_dtype: str = "") -> None:
        """One CopyKernel doing HBM->HBM DMAs; ``pairs`` are (src view, dst view) of equal shape (``src_dtype``: the
        sources' bytes read as that dtype, a bitcast)."""
        args: list[int] = []
        copies = []
        for src, dst in pairs:
            if src.buffer not in args:
                args.append(src.buffer)
            shape = dst.shape
            canon = sp.canonicalize(shape or (1,), ["keep"] * max(len(shape), 1),
                                    [src.strides or (0,), dst.strides or (0,)], part_role="keep", free_role="keep",
                                    split_limit=config.free_tile)
            s_strides = sp.canonical_strides(canon, src.strides or (0,))
            d_strides = sp.canonical_strides(canon, dst.strides or (0,))
            copies.append((args.index(src.buffer), Access(args.index(src.buffer), src.offset, s_strides),
                           results.index(dst.buffer), Access(results.index(dst.buffer), dst.offset, d_strides),
                           canon.space))
        kernel = CopyKernel(name, "copy", tuple(ArgSpec(self.buffers[b].numel, self.buffers[b].dtype) for b in args),
                            tuple(ArgSpec(self.buffers[b].numel, self.buffers[b].dtype) for b in results),
                            tuple(copies), source_ops, src_dtype)
        self.kernels.append(kernel)
        self.calls.append(KernelCall(len(self.kernels) - 1, tuple(args), tuple(results)))

    # -- groups ------------------------------------------------------------------------------------
    def _emit_group(self, g: Group) -> None:
        if self._alias_clone(g):
            return
        if g.kind in ("pointwise", "reduction", "matmul"):
            LoopGroupEmitter(self, g).emit()
        else:
            node = g.members[0]
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.numel() == 0:  # nothing to compute or move
                buf = self._buffer(BufferRef("empty", 0, 0, 0, storage_dtype(val.dtype) or "float32"))
                self.views[node] = View(buf, node_shape(node), contiguous_strides(node_shape(node)), 0, val.dtype)
                return
            rule = lookup(node.target)
            assert rule is not None
            rule.fn(self, node)

    def _alias_clone(self, g: Group) -> bool:
        """A lone contiguous ``clone`` of an already contiguous kernel result is that result (no copy).

        The graph is functional, so sharing the buffer is safe as long as the clone is not a graph
        output (the caller may mutate outputs) and its source is a kernel result (not a graph input).
        """
        own = [n for n in g.members if n not in self.part.absorbed]  # absorbed views follow lazily
        if g.kind != "pointwise" or len(own) != 1:
            return False
        node = own[0]
        if node.target is not torch.ops.aten.clone.default or not isinstance(node.args[0], fx.Node) \
                or node.kwargs.get("memory_format", torch.contiguous_format) != torch.contiguous_format \
                or any(u.op != "call_function" for u in node.users):
            return False
        src = node.args[0]
        if src in self.literals or src in self.part.inlined:
            return False
        view = self.view_of(src)
        if self.buffers[view.buffer].kind != "kernel" or view.torch_dtype != node_dtype(node) \
                or view.shape != node_shape(node) \
                or any(s != c for s, c, n in zip(view.strides, contiguous_strides(view.shape), view.shape, strict=True) if n > 1):
            return False
        self.views[node] = view
        log.debug("%s: contiguous clone of a kernel result aliases it (no copy kernel)", node.name)
        return True

    def new_output(self, node: fx.Node, kernel_index: int, slot: int) -> tuple[int, View]:
        shape = node_shape(node)
        dtype = node_dtype(node)
        nd = storage_dtype(dtype) or "float32"
        buf = self._buffer(BufferRef("kernel", kernel_index, slot, max(math.prod(shape), 1), nd))
        view = View(buf, shape, contiguous_strides(shape), 0, dtype)
        self.views[node] = view
        self.buffer_nodes[buf] = node.name
        return buf, view

    def _outputs(self) -> list[OutputSpec]:
        out_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        result = []
        for arg in out_node.args[0]:
            if isinstance(arg, fx.Node) and arg in self.literals:
                result.append(OutputSpec(None, literal=self.literals[arg]))
            elif isinstance(arg, fx.Node):
                v = self.view_of(arg)
                result.append(OutputSpec(v.buffer, v.shape, v.strides, v.offset, str(v.torch_dtype).replace("torch.", ""),
                                         layout=_eager_layout(arg, v)))
            else:
                result.append(OutputSpec(None, literal=arg))
        return result


def _eager_layout(node: fx.Node, view: View) -> tuple[int, ...] | None:
    """The strides eager gives ``node``'s value when they are a dense layout other than the view's (a
    channels_last result, a permuted one): the runner returns the output in that layout."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.numel() <= 1 or tuple(val.shape) != tuple(view.shape):
        return None
    strides = tuple(int(s) for s in val.stride())
    if strides == tuple(view.strides) or not is_non_overlapping_and_dense_or_false(val):
        return None
    return strides


class LoopGroupEmitter:
    """Builds one LoopKernel from a pointwise / reduction / matmul group."""

    def __init__(self, gl: GraphLowering, g: Group) -> None:
        self.gl = gl
        self.g = g
        self.b = ProgramBuilder()
        self.values: dict[fx.Node, TileVal] = {}
        self.args: list[int] = []  # buffer ids of kernel inputs
        self.loads: dict[tuple[int, int, tuple[int, ...], str], TileVal] = {}
        self.accesses: list[tuple[int, ...]] = []  # every stride vector over the space (for canonicalization)

    def member_role(self, node: fx.Node) -> str:
        if self.g.kind != "reduction" and not self.g.red:
            return "full"
        return classify(node_shape(node), self.g) or "full"

    def consumer_shape(self, consumer: fx.Node) -> tuple[tuple[int, ...], str]:
        """The shape (and role) a member's tensor arguments broadcast to: its input space for reductions."""
        rule = lookup(consumer.target)
        if rule is not None and rule.kind == "reduction":
            return self.g.space, "full"
        return node_shape(consumer), self.member_role(consumer)

    def load(self, node: fx.Node, consumer: fx.Node) -> TileVal:
        view = self.gl.view_of(node)
        cshape, crole = self.consumer_shape(consumer)
        cmap = shape_map(cshape, crole, self.g)
        if cmap is None:
            raise LoweringError(f"{consumer.name}: shape {cshape} does not map onto kernel space {self.g.space}")
        over_c = sp.broadcast_strides(view.shape, view.strides, cshape)
        strides = sp.to_space(over_c, cshape, cmap, self.g.space)
        kind = "full"
        if self.g.red and all(strides[d] == 0 for d in self.g.red):
            kind = "row"
        if view.buffer not in self.args:
            self.args.append(view.buffer)
        arg = self.args.index(view.buffer)
        src_dtype = self.gl.buffers[view.buffer].dtype
        # Integer consumers keep integer inputs exact: the DMA loads int32 (fp32 tiles only hold 24 bits).
        dtype = "int32" if src_dtype in _INT_STORAGE and is_int_compute(consumer) else "float32"
        key = (arg, view.offset, strides, kind, dtype)
        if key not in self.loads:
            self.accesses.append(strides)
            self.loads[key] = self.b.emit("load", kind, (), {"access": (arg, view.offset, strides),
                                                            "src_dtype": src_dtype}, dtype=dtype, phase=0)
        return self.loads[key]

    def _emit_empty(self) -> None:
        """A group over zero elements needs no kernel: its values are empty buffers (a reduction over an
        empty dim would produce a filled result, which is refused rather than guessed)."""
        for node in self.g.members:
            shape = node_shape(node)
            if math.prod(shape) != 0:
                raise LoweringError(f"{node.name} ({node.target}): a reduction over an empty dimension is not "
                                    f"supported by the neuron backend; avoid zero-sized inputs here")
            dtype = node_dtype(node)
            buf = self.gl._buffer(BufferRef("empty", 0, 0, 0, storage_dtype(dtype) or "float32"))
            self.gl.views[node] = View(buf, shape, contiguous_strides(shape), 0, dtype)

    def iota_along_reduced(self, node: fx.Node) -> TileVal:
        """A full tile holding each element's index along the (single) reduced dim."""
        if len(self.g.red) != 1:
            raise LoweringError(f"{node.name}: an index along several reduced dims is not supported")
        coeffs = tuple(1 if d == self.g.red[0] else 0 for d in range(len(self.g.space)))
        return self.b.emit("iota", "full", (), {"coeffs": (0, coeffs)}, phase=0)

    def iota_for(self, node: fx.Node, start: int, step: int) -> TileVal:
        """A full tile of ``start + step * i`` over a 1-D node's only dim (arange)."""
        shape = node_shape(node)
        cmap = shape_map(shape, self.member_role(node), self.g)
        if cmap is None:
            raise LoweringError(f"{node.name}: shape {shape} does not map onto kernel space {self.g.space}")
        coeffs = sp.to_space([step] * len(shape) if len(shape) == 1 else [step], shape, cmap, self.g.space)
        return self.b.emit("iota", "full", (), {"coeffs": (int(start), coeffs)}, phase=0)

    def map_arg(self, a: Any, consumer: fx.Node) -> Any:
        if isinstance(a, fx.Node):
            if self.gl.part.group_of.get(a) is self.g:
                return self.values[a]
            if a in self.gl.part.inlined:
                return self.gl.part.inlined[a]
            if a in self.gl.literals:
                return self.gl.literals[a]
            return self.load(a, consumer)
        if isinstance(a, (list, tuple)):
            return type(a)(self.map_arg(x, consumer) for x in a)
        return a

    def _constant_operands_as_tiles(self, node: fx.Node, args: list[Any]) -> list[Any]:
        """A node whose tensor operands are all folded constants (a graph constant, a ``full``) gets them as fill
        tiles: the rules take a constant beside a tile, and on their own they would have to fold every op (a
        cast's rounding, a float's floor) in Python."""
        tensor_args = [i for i, a in enumerate(node.args) if isinstance(a, fx.Node)]
        if not tensor_args or any(isinstance(args[i], TileVal) for i in tensor_args):
            return args
        if not all(isinstance(args[i], (int, float, bool)) for i in tensor_args):
            return args
        out, b = list(args), self.b
        mode = b.int_mode
        for i in tensor_args:
            b.int_mode = is_int_compute(node.args[i])  # the operand's own dtype (a cast's input may be a float)
            out[i] = b.fill(args[i], self.member_role(node))
        b.int_mode = mode
        return out

    def emit(self) -> None:
        g, b = self.g, self.b
        kernel_index = len(self.gl.kernels)
        if math.prod(g.space) == 0:
            self._emit_empty()
            return
        guards: list[tuple[fx.Node, TileVal, str]] = []  # marks of results the kernels can't get right, and why
        for node in g.members:
            rule = lookup(node.target)
            assert rule is not None
            b.node = node
            b.int_mode = is_int_compute(node)
            if node in self.gl.part.absorbed or rule.kind == "alias":
                self.values[node] = self.values[node.args[0]] if self.gl.part.group_of.get(node.args[0]) is g \
                    else self.load(node.args[0], node)
                continue
            if rule.kind == "matmul":
                self.values[node] = self._matmul(node)
                continue
            args = [self.map_arg(a, node) for a in node.args]
            kwargs = {k: self.map_arg(v, node) for k, v in node.kwargs.items()}
            args = self._constant_operands_as_tiles(node, args)
            val = rule.fn(self, node, *args, **kwargs)
            if not isinstance(val, TileVal):
                val = b.fill(val, self.member_role(node))
            elif node_dtype(node) in mathlib.NARROW_INTS and val.dtype == "int32" and rule.kind == "pointwise":
                b.int_mode = True
                val = mathlib.wrap_int(b, val, node_dtype(node))  # torch wraps 8/16-bit integers
            elif intguard.guarded(node):
                ovf = intguard.overflow(b, rule.fn, self, node, args, kwargs, val)
                if ovf is not None:
                    guards.append((node, ovf, intguard.overflow_message(qualified_name(node.target), source_line(node))))
            elif node.target in mathlib.TRIG_GUARDED:  # float only; its operand is a tile (constants as fills)
                guards.append((node, mathlib.beyond_trig_reduction(b, args[0]),
                               mathlib.trig_guard_message(qualified_name(node.target), source_line(node))))
            self.values[node] = val
        # Loading an operand may have emitted a copy kernel (a reshape that is not a view): this kernel's
        # index is only known now.
        kernel_index = len(self.gl.kernels)
        # Stores: values used outside the group (or as graph outputs).
        results: list[int] = []
        widened = self._widened_stores()
        for node in g.members:
            if node in widened:  # read back from its narrow source's buffer (exact: widening is lossless)
                src = self.gl.views[widened[node]]
                self.gl.views[node] = View(src.buffer, src.shape, src.strides, src.offset, node_dtype(node))
                continue
            if node not in widened.values() and all(self.gl.part.group_of.get(u) is g for u in node.users):
                continue  # consumed only inside the kernel (graph outputs are users outside any group)
            buf, view = self.gl.new_output(node, kernel_index, len(results))
            results.append(buf)
            role = self.member_role(node)
            cmap = shape_map(view.shape, role, g)
            assert cmap is not None
            strides = sp.to_space(view.strides, view.shape, cmap, g.space)
            self.accesses.append(strides)
            val = self.values[node]
            if role == "full" and val.kind == "row" and any(strides[d] for d in g.red):
                # a value constant along the reduced dims (computed from broadcast inputs) stored at full size
                val = b.broadcast_to(val, "full")
            dst_dtype = self.gl.buffers[buf].dtype
            if dst_dtype == "float8_e4m3fn" and isinstance(val, TileVal) and not b.rounded_via(val, dst_dtype):
                val = b.saturate_e4m3fn(val)  # a value computed in fp32 (a matmul's): torch saturates it
            b.emit("store", val.kind, (val,), {"access": (len(results) - 1, 0, strides), "dst_dtype": dst_dtype},
                   phase=val.phase)
        for node, mark, why in guards:
            self._store_flag(node, mark, why, kernel_index, results)
        self._finish(kernel_index, results)

    def _store_flag(self, node: fx.Node, mark: TileVal, why: str, kernel_index: int, results: list[int]) -> None:
        """Store ``mark`` (1.0 where ``node``'s result is not eager's) as a uint8 buffer the runner checks: it raises
        DeviceAssertionError(``why``) when any is set."""
        shape = node_shape(node)
        buf = self.gl._buffer(BufferRef("kernel", kernel_index, len(results), max(math.prod(shape), 1), "uint8"))
        results.append(buf)
        cmap = shape_map(shape, self.member_role(node), self.g)
        assert cmap is not None
        strides = sp.to_space(contiguous_strides(shape), shape, cmap, self.g.space)
        self.accesses.append(strides)
        if self.member_role(node) == "full" and mark.kind == "row" and any(strides[d] for d in self.g.red):
            mark = self.b.broadcast_to(mark, "full")
        self.b.emit("store", mark.kind, (mark,), {"access": (len(results) - 1, 0, strides), "dst_dtype": "uint8"},
                    phase=mark.phase)
        self.gl.checks.append(DeviceCheck(buf, 0, why, "assert", whole=True))

    def _widened_stores(self) -> dict[fx.Node, fx.Node]:
        """fp32 ``_to_copy`` members of a bf16/fp16 member whose outside users are all elementwise
        loads: those users read the narrow value instead (half the bytes stored and loaded; the
        rounding to the narrow dtype happened in the kernel either way). Maps copy -> source."""
        g, out = self.g, {}
        for node in g.members:
            src = node.args[0] if node.args else None
            if node.target is not torch.ops.aten._to_copy.default or not isinstance(src, fx.Node) \
                    or self.gl.part.group_of.get(src) is not g or src in self.gl.part.absorbed \
                    or node in self.gl.part.absorbed or set(node.kwargs) - {"dtype", "layout", "device"} \
                    or node_dtype(node) != torch.float32 or node_dtype(src) not in (torch.bfloat16, torch.float16) \
                    or node_shape(node) != node_shape(src) or self.member_role(node) != self.member_role(src):
                continue
            outside = [u for u in node.users if self.gl.part.group_of.get(u) is not g]
            if not outside:
                continue
            ok = True
            for u in outside:
                rule = lookup(u.target) if u.op == "call_function" else None
                ug = self.gl.part.group_of.get(u)
                if rule is None or rule.kind not in ("pointwise", "reduction") or ug is None \
                        or ug.kind not in ("pointwise", "reduction", "matmul") or u in self.gl.part.absorbed:
                    ok = False
                    break
            if ok:
                out[node] = src
        return out

    def _matmul(self, node: fx.Node) -> TileVal:
        a_node, b_node = node.args[0], node.args[1]
        av, bv = self.gl.view_of(a_node), self.gl.view_of(b_node)
        out_shape = node_shape(node)
        cmap = sp.coarsen_map(out_shape, self.g.space)
        assert cmap is not None
        # out[..., m, n] = sum_k a[..., m, k] * b[..., k, n]
        a_over_out = list(sp.broadcast_strides(av.shape[:-1], av.strides[:-1], out_shape[:-1])) + [0]
        b_batch = sp.broadcast_strides(bv.shape[:-2], bv.strides[:-2], out_shape[:-2]) if len(out_shape) > 2 else []
        b_over_out = list(b_batch) + [0, bv.strides[-1]]
        a_sp = sp.to_space(a_over_out, out_shape, cmap, self.g.space)
        b_sp = sp.to_space(b_over_out, out_shape, cmap, self.g.space)
        for v in (av, bv):
            if v.buffer not in self.args:
                self.args.append(v.buffer)
        self.accesses += [a_sp, b_sp]
        k = av.shape[-1]
        attrs = {"a": (self.args.index(av.buffer), av.offset, a_sp), "ak": av.strides[-1],
                 "b": (self.args.index(bv.buffer), bv.offset, b_sp), "bk": bv.strides[-2], "k": k,
                 **self._operand_dtypes(av, bv)}
        return self.b.emit("matmul", "full", (), attrs, phase=0)

    def _operand_dtypes(self, av: View, bv: View) -> dict[str, str | None]:
        """The operands' tile dtypes: their storage dtypes, FP8 loaded as bfloat16 (a converting DMA, exact: every
        FP8 value is a bfloat16 one), so TensorE transposes and DMA transposes keep their 16-bit forms; TensorE
        multiplies both at one rate (cFP8 = BF16 on trn2; trn3's 2x FP8 needs double-row tiles). A narrow buffer
        read as fp32 (``mm(a.float(), w.float())``) keeps its narrow dtype when the other operand's matches (TensorE
        pairs fp32 only with fp32)."""
        narrow = [OPERAND_TILE.get(self.gl.buffers[v.buffer].dtype) for v in (av, bv)]
        if narrow[0] is not None and narrow[0] == narrow[1]:
            return {"a_dtype": narrow[0], "b_dtype": narrow[1]}
        return {"a_dtype": storage_dtype(av.torch_dtype), "b_dtype": storage_dtype(bv.torch_dtype)}

    def _roles(self) -> tuple[list[str], str, str]:
        g = self.g
        if g.kind == "reduction":
            return ["red" if d in g.red else "keep" for d in range(len(g.space))], "keep", "red"
        if g.kind == "matmul":
            out_shape = node_shape(g.members[0])
            cmap = sp.coarsen_map(out_shape, g.space)
            assert cmap is not None
            roles = ["batch"] * len(g.space)
            for d in cmap[-1]:
                roles[d] = "n"
            if len(out_shape) >= 2:
                for d in cmap[-2]:
                    roles[d] = "m"
            return roles, "m", "n"
        return ["keep"] * len(g.space), "keep", "keep"

    def _finish(self, kernel_index: int, results: list[int]) -> None:
        g = self.g
        roles, part_role, free_role = self._roles()
        space = g.space if g.space else (1,)
        if not g.space:
            roles = ["keep"]
            self.accesses = [tuple(s) or (0,) for s in self.accesses]
        iota_sets = [op.attr("coeffs")[1] for op in self.b.ops if op.opcode == "iota"]
        # A lone (flattened) dim splits into [rows, free] with free tiles large enough for >= 2 KiB DMAs.
        split_limit = config.free_tile if g.kind == "matmul" else max(config.free_tile, sp.STREAM_FREE_ELEMS)
        canon = sp.canonicalize(space, roles, [*self.accesses, *iota_sets], part_role=part_role,
                                free_role=free_role, split_limit=split_limit,
                                split_above=config.free_tile)

        def remap(access: tuple[int, int, tuple[int, ...]]) -> tuple[int, int, tuple[int, ...]]:
            arg, off, strides = access
            strides = tuple(strides) if strides else (0,) * len(space)
            return arg, off, sp.canonical_strides(canon, strides)

        ops = []
        # Matmul epilogues keep the builder's fp32 tiles (codegen/plan_matmul.py sizes its own buffers); loop kernels
        # hold tiles in the storage dtype where no value changes. Every kernel drops ops no store reads.
        # A matmul kernel with a row reduction (a LayerNorm in its epilogue) gets the loop kernels' peephole
        # rewrites (x - row -> x + (-row), sum of squares -> activation accumulator); others keep their ops.
        if g.kind == "matmul":
            program = tileopt.fold_centering(tileopt.store_rounds_as_is(tileopt.optimize(self.b.ops, set()))) \
                if g.red else self.b.ops
        else:
            program = tileopt.narrow_tiles(tileopt.optimize(self.b.ops, set()))
        program = tileopt.eliminate_dead(program)
        for op in program:
            attrs = dict(op.attrs)
            for key in ("access", "a", "b"):
                if key in attrs:
                    attrs[key] = remap(attrs[key])
            if op.opcode == "iota":
                base, coeffs = attrs["coeffs"]
                attrs["coeffs"] = (base, sp.canonical_strides(canon, coeffs or (0,) * len(space)))
            if op.opcode == "matmul":
                attrs["ak"], attrs["bk"] = attrs["ak"], attrs["bk"]
            ops.append(TileOp(op.out, op.opcode, op.kind, op.dtype, op.args, tuple(sorted(attrs.items())), op.phase))
        n_phases = max((op.phase for op in ops), default=0) + 1
        free_tile = 512 if g.kind == "matmul" else config.free_tile
        source = tuple(qualified_name(n.target) for n in g.members)
        name = f"k{kernel_index}_{_short(g)}"
        kernel = LoopKernel(
            name, g.kind, canon.space, canon.n_outer, canon.reduce_dims, free_tile, 128,
            tuple(ArgSpec(self.gl.buffers[b].numel, self.gl.buffers[b].dtype) for b in self.args),
            tuple(ArgSpec(self.gl.buffers[b].numel, self.gl.buffers[b].dtype) for b in results),
            tuple(ops), n_phases, source)
        if g.kind == "matmul":
            from neuron_compile.lowering.ops.matmul import tune

            kernel = tune(kernel)
        self.gl.kernels.append(kernel)
        self.gl.calls.append(KernelCall(kernel_index, tuple(self.args), tuple(results)))


_INT_STORAGE = ("int32", "int16", "int8", "uint8")


def _short(g: Group) -> str:
    names = []
    for n in g.members:
        rule = lookup(n.target)
        if rule is None or rule.kind in ("view", "alias"):
            continue
        base = str(n.target).split(".")[1] if "." in str(n.target) else str(n.target)
        base = base.strip("_")
        if base not in names:
            names.append(base)
    return "_".join(names[:3]) or g.kind


def _storage_extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    if not shape:
        return 1
    if any(s == 0 for s in shape):
        return 1
    return 1 + sum((sz - 1) * st for sz, st in zip(shape, strides, strict=True))
