"""Complex tensors as pairs of real numbers: the graph pass that lets complex rotary embeddings compile.

NeuronCores have no complex dtype. Meta's Llama reference code, torchtitan, DeepSeek-V2 and others apply rotary
position embeddings as a complex product (``torch.polar``, ``view_as_complex``, ``x * freqs_cis``,
``view_as_real``). :func:`as_real_pairs` rewrites an ATen graph so that every complex value of shape ``S`` is a
real tensor of shape ``S + [2]`` (``view_as_real``'s layout: real part, imaginary part), every complex op becomes
real arithmetic on the pairs (a complex product is four real products), and complex graph inputs and outputs are
converted at the boundary (``torch.view_as_real`` in, ``torch.view_as_complex`` out, no copy either way).

All or nothing: a graph with one complex op outside the supported set (complex products, quotients, sums,
conjugates, views, ``polar``, ``abs``, casts, and the FFTs of :mod:`lowering.complex_fft`) is left as it was, so the
usual refusal names that op. The arithmetic follows eager's to the special values: division is Smith's algorithm as
c10::complex divides, and a product with a real (or add's alpha) is a complex product by r + 0i.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from neuron_compile.lowering import complex_math, complex_more
from neuron_compile.lowering.complex_fft import FFT_OPS, FFTUnsupported, fft_op
from neuron_compile.lowering.complex_more import ComplexUnsupported, _val, is_complex
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

log = logging.getLogger(__name__)
aten = torch.ops.aten
MORE = {**complex_more.RULES, **complex_math.RULES}  # op -> rule(rewriter, node) -> its pair node
TAKES_KWARGS = complex_more.TAKES_KWARGS | complex_math.TAKES_KWARGS  # rules that read the node's keyword arguments

REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}


class _Unsupported(Exception):
    """A complex op the pass has no real form for: the graph is left unchanged."""


@dataclass
class RealPairs:
    """The rewritten graph and which of its inputs / outputs were complex."""

    gm: fx.GraphModule
    complex_inputs: list[int]
    complex_outputs: list[int]

    def wrap(self, runner: Callable[..., Any]) -> Callable[..., Any]:
        """``runner`` (compiled from ``gm``) called with complex inputs and giving complex outputs."""
        return with_complex_io(runner, self.complex_inputs, self.complex_outputs)


def with_complex_io(runner: Callable[..., Any], complex_inputs: list[int], complex_outputs: list[int]
                    ) -> Callable[..., Any]:
    """``runner`` of a real-pair graph, taking and giving complex tensors at those positions (``neuron_complex_io``
    says which, so that a warm start rebuilds the same wrapper around the cached graph)."""
    ins, outs = set(complex_inputs), set(complex_outputs)

    def with_complex(*args: Any) -> Any:
        args = tuple(torch.view_as_real(a.resolve_conj()) if i in ins else a for i, a in enumerate(args))
        results = runner(*args)
        return type(results)(torch.view_as_complex(r.contiguous()) if i in outs else r
                             for i, r in enumerate(results))

    with_complex.neuron_complex_io = (list(complex_inputs), list(complex_outputs))  # type: ignore[attr-defined]
    return with_complex


def _pair_input(v: torch.Tensor) -> torch.Tensor:
    """The meta value of a complex input's pairs: ``view_as_real`` of it, its strides and storage offset kept (the
    runner passes ``view_as_real`` of the argument, and an ``as_strided`` of it counts from its storage)."""
    with unset_fake_temporarily():
        return torch.view_as_real(_meta(v))


def has_complex(gm: fx.GraphModule) -> bool:
    return any(is_complex(n) for n in gm.graph.nodes)


def _meta(v: Any) -> Any:
    """A meta tensor like ``v``, its strides and storage offset kept (an as_strided of a view reads them)."""
    if isinstance(v, torch.Tensor):
        if v.device.type == "meta" and not isinstance(v, FakeTensor):
            return v
        extent = 0 if 0 in v.shape else 1 + sum((n - 1) * st for n, st in zip(v.shape, v.stride(), strict=True))
        base = torch.empty(v.storage_offset() + extent, dtype=v.dtype, device="meta")
        return base.as_strided(tuple(v.shape), tuple(v.stride()), v.storage_offset())
    if isinstance(v, (list, tuple)):  # the items of split / unbind
        return type(v)(_meta(x) for x in v)
    return v


class _Rewriter:
    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm, self.graph, self.env = gm, fx.Graph(), {}

    def emit(self, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        """A new node with its meta value computed on meta tensors."""
        node = self.graph.call_function(target, args, kwargs)
        with unset_fake_temporarily():
            margs = fx.node.map_arg(args, lambda a: _meta(a.meta["val"]))
            mkw = fx.node.map_arg(kwargs, lambda a: _meta(a.meta["val"]))
            node.meta["val"] = _meta(target(*margs, **mkw))
        return node

    def part(self, x: fx.Node, i: int) -> fx.Node:
        return self.emit(aten.select.int, x, -1, i)

    def pair(self, re: fx.Node, im: fx.Node) -> fx.Node:
        parts = [self.emit(aten.unsqueeze.default, v, -1) for v in (re, im)]
        return self.emit(aten.cat.default, parts, -1)

    def real_only(self, x: fx.Node) -> fx.Node:
        """A real tensor as a complex pair (imaginary part 0)."""
        return self.pair(x, self.emit(aten.full_like.default, x, 0.0))

    def as_pair(self, v: fx.Node) -> fx.Node:
        """An operand of the original graph as a pair: a complex one's, or a real one as r + 0i."""
        return self.env[v] if is_complex(v) else self.real_only(self.env[v])

    def run(self) -> RealPairs:
        ins: list[int] = []
        outs: list[int] = []
        placeholders = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                new = self.graph.placeholder(node.name)
                new.meta = dict(node.meta)
                if is_complex(node):
                    ins.append(placeholders)
                    new.meta["val"] = _pair_input(_val(node))
                self.env[node] = new
                placeholders += 1
            elif node.op == "output":
                results = node.args[0]
                flat = list(results) if isinstance(results, (list, tuple)) else [results]
                outs = [i for i, r in enumerate(flat) if is_complex(r)]
                mapped = [self.emit(aten.clone.default, self.env[r], memory_format=torch.contiguous_format)
                          if i in outs else (self.env[r] if isinstance(r, fx.Node) else r) for i, r in enumerate(flat)]
                self.graph.output(type(results)(mapped) if isinstance(results, (list, tuple)) else mapped[0])
            elif node.op == "get_attr" and is_complex(node):  # a complex graph constant: its pairs as a buffer
                with unset_fake_temporarily():
                    value = torch.view_as_real(getattr(self.gm, node.target).resolve_conj()).clone()
                name = f"{node.target}_pairs"
                self.gm.register_buffer(name, value, persistent=False)
                self.env[node] = self.graph.get_attr(name)
                self.env[node].meta["val"] = _meta(value)
            elif node.op == "call_function" and (is_complex(node) or any(is_complex(a) for a in node.all_input_nodes)):
                try:
                    new = self.complex_op(node)
                except Exception as exc:  # the refusal names this node (its own rule may accept it as real)
                    exc.complex_node = node  # type: ignore[attr-defined]
                    raise
                new.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
                self.env[node] = new
            else:
                self.env[node] = self.graph.node_copy(node, lambda a: self.env[a])
        return RealPairs(fx.GraphModule(self.gm, self.graph), ins, outs)

    def dim(self, node: fx.Node, d: int, extra: int = 0) -> int:
        """A dim of a complex value as a non-negative dim of its pair tensor (``extra``: the op adds dims)."""
        return d % (_val(node).dim() + extra)

    def complex_op(self, node: fx.Node) -> fx.Node:  # noqa: C901 (one case per op)
        t, a, kw = node.target, node.args, node.kwargs
        env = self.env

        def x(i: int = 0) -> fx.Node:
            return env[a[i]]

        def operand(v: Any) -> tuple[str, Any]:
            if isinstance(v, fx.Node):
                return ("complex", env[v]) if is_complex(v) else ("real", env[v])
            if isinstance(v, complex):
                return "scalar_c", v
            return "scalar", v

        if t == aten.view_as_complex.default or t == aten.view_as_real.default:
            return x()
        if t == aten.complex.default:  # the parts broadcast against each other
            shape = list(_val(node).shape)
            return self.pair(*(self.emit(aten.expand.default, x(i), shape) for i in (0, 1)))
        if t == aten.polar.default:
            r, th = x(0), x(1)
            return self.pair(self.emit(aten.mul.Tensor, r, self.emit(aten.cos.default, th)),
                             self.emit(aten.mul.Tensor, r, self.emit(aten.sin.default, th)))
        if t in (aten.clone.default, aten.alias.default, aten.detach.default, aten.resolve_conj.default,
                 aten.resolve_neg.default, aten.lift_fresh_copy.default):
            fmt = kw.get("memory_format") if t == aten.clone.default else None  # a contiguous clone stays one
            return self.emit(aten.clone.default, x(), **({"memory_format": fmt} if fmt is not None else {}))
        if t == aten._to_copy.default:
            dtype = kw.get("dtype", _val(node).dtype)
            if not is_complex(node):  # eager keeps the real part (ComplexWarning); a bool is "either part nonzero"
                z = x()
                if dtype == torch.bool:
                    return self.emit(aten.logical_or.default, *(self.emit(aten.ne.Scalar, self.part(z, i), 0.0)
                                                                for i in (0, 1)))
                return self.emit(aten._to_copy.default, self.part(z, 0), dtype=dtype)
            src = x() if is_complex(a[0]) else self.real_only(x())
            return self.emit(aten._to_copy.default, src, dtype=REAL_OF[dtype])
        if t in (aten.real.default, aten.imag.default):
            return self.emit(aten.clone.default, self.part(x(), 0 if t == aten.real.default else 1))
        if t in (aten.full.default, aten.full_like.default, aten.scalar_tensor.default) and is_complex(node):
            shape = list(_val(node).shape)
            value = complex(a[0] if t == aten.scalar_tensor.default else a[1])
            real_kw = {"dtype": REAL_OF[_val(node).dtype], "device": _val(node).device}
            return self.pair(self.emit(aten.full.default, shape, value.real, **real_kw),
                             self.emit(aten.full.default, shape, value.imag, **real_kw))
        if t in (aten._conj.default, aten.conj_physical.default, aten._conj_physical.default, aten.conj.default):
            return self.pair(self.part(x(), 0), self.emit(aten.neg.default, self.part(x(), 1)))
        if t in (aten.mul.Scalar, aten.div.Scalar) and is_complex(a[0]) and not isinstance(a[1], complex):
            return self.binary(aten.mul.Tensor if t == aten.mul.Scalar else aten.div.Tensor, ("complex", x()),
                               ("scalar", a[1]))
        if t == aten.mul.Scalar and isinstance(a[1], complex):
            return self.times_complex_scalar(x(), is_complex(a[0]), a[1])
        if t in (aten.neg.default, aten._neg_view.default):
            return self.emit(aten.neg.default, x())
        if t == aten.reciprocal.default:  # eager's 1 / z: (1 + 0i) / z
            return self.divide(("scalar", 1.0), ("complex", x()))
        if t == aten.abs.default:
            return self.hypot(x())
        if t in (aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor) and len(a) == 2 \
                and kw.get("alpha", 1) == 1:
            return self.binary(t, operand(a[0]), operand(a[1]))
        if t in (aten.add.Tensor, aten.sub.Tensor) and len(a) == 2:  # x + alpha * y: eager scales y first
            alpha = kw["alpha"]
            if not isinstance(a[1], fx.Node):
                return self.binary(t, operand(a[0]), operand(a[1] * alpha))
            if not is_complex(a[1]) and not isinstance(alpha, complex):
                return self.binary(t, operand(a[0]), ("real", self.emit(aten.mul.Tensor, x(1), alpha)))
            scaled = self.binary(aten.mul.Tensor, operand(a[1]), operand(alpha))
            return self.binary(t, operand(a[0]), ("complex", scaled))
        if t in (aten.add.Scalar, aten.sub.Scalar) and len(a) == 2 and kw.get("alpha", 1) == 1:  # the same kernel
            return self.binary(aten.add.Tensor if t == aten.add.Scalar else aten.sub.Tensor, operand(a[0]),
                               operand(a[1]))
        if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            return self.emit(aten.view.default, self.emit(aten.clone.default, x(), memory_format=torch.contiguous_format)
                             if t != aten.view.default else x(), [*a[1], 2])
        if t == aten.expand.default:
            return self.emit(aten.expand.default, x(), [*a[1], 2])
        if t == aten.unsqueeze.default:
            return self.emit(aten.unsqueeze.default, x(), self.dim(a[0], a[1], extra=1))
        if t == aten.squeeze.dim:
            return self.emit(aten.squeeze.dim, x(), self.dim(a[0], a[1]))
        if t == aten.squeeze.dims:
            return self.emit(aten.squeeze.dims, x(), [self.dim(a[0], d) for d in a[1]])
        if t == aten.permute.default:
            n = _val(a[0]).dim()
            return self.emit(aten.permute.default, x(), [d % n for d in a[1]] + [n])
        if t == aten.transpose.int:
            return self.emit(aten.transpose.int, x(), self.dim(a[0], a[1]), self.dim(a[0], a[2]))
        if t == aten.t.default:
            return self.emit(aten.transpose.int, x(), 0, 1) if _val(a[0]).dim() == 2 else x()
        if t == aten.slice.Tensor:
            return self.emit(aten.slice.Tensor, x(), self.dim(a[0], a[1] if len(a) > 1 else 0), *a[2:])
        if t == aten.select.int:
            return self.emit(aten.select.int, x(), self.dim(a[0], a[1]), a[2])
        if t == aten.where.self and is_complex(node):
            cond = self.emit(aten.unsqueeze.default, x(0), -1)
            picks = [self.as_pair(v) for v in a[1:3]]
            return self.emit(t, cond, *picks)
        if t == aten.slice_scatter.default:
            dst, src = (self.as_pair(v) for v in a[:2])
            return self.emit(t, dst, src, self.dim(a[0], a[2] if len(a) > 2 else 0), *a[3:])
        if t == aten.cat.default:
            parts = [self.as_pair(p) for p in a[0]]
            return self.emit(t, parts, (a[1] if len(a) > 1 else 0) % _val(node).dim())
        if t in (aten.sum.default, aten.mean.default, aten.sum.dim_IntList, aten.mean.dim) \
                and kw.get("dtype", _val(node).dtype) == _val(node).dtype:  # dtype= the result's own: no cast
            kw = {}
        if t in (aten.sum.default, aten.mean.default) and len(a) == 1 and not kw:
            t, a = (aten.sum.dim_IntList if t == aten.sum.default else aten.mean.dim), (a[0], None)
        if t in (aten.sum.dim_IntList, aten.mean.dim) and len(a) >= 2 and not kw:
            # no dims (None or []) reduces every dim of the complex value, never the pair dim; a 0-d value is its own sum
            dims = a[1] or list(range(_val(a[0]).dim()))
            if not dims or _val(a[0]).dim() == 0:  # a 0-d value (dims [0] or [-1] name it) is its own sum
                return self.emit(aten.clone.default, x())
            return self.emit(t, x(), [self.dim(a[0], d) for d in dims], *a[2:])
        if t in FFT_OPS:
            dtype = _val(a[0]).dtype
            try:
                return fft_op(self, node, REAL_OF.get(dtype, dtype))
            except FFTUnsupported as exc:
                raise _Unsupported(str(exc)) from exc
        rule = MORE.get(t)
        if rule is not None:
            if kw and t not in TAKES_KWARGS:
                raise _Unsupported(f"{t} with {sorted(kw)}")
            try:
                return rule(self, node)
            except ComplexUnsupported as exc:
                raise _Unsupported(str(exc)) from exc
        raise _Unsupported(f"{t}")

    def hypot(self, z: fx.Node) -> fx.Node:
        """|z| as torch computes it (hypot): max * sqrt(1 + (min / max)^2), no overflow or underflow in between;
        0 for 0, inf when either part is infinite (even beside a NaN)."""
        emit = self.emit
        ar, ai = (emit(aten.abs.default, self.part(z, i)) for i in (0, 1))
        hi, lo = emit(aten.maximum.default, ar, ai), emit(aten.minimum.default, ar, ai)
        q = emit(aten.div.Tensor, lo, hi)
        h = emit(aten.mul.Tensor, hi, emit(aten.sqrt.default, emit(aten.add.Tensor, emit(aten.mul.Tensor, q, q), 1.0)))
        h = emit(aten.where.self, emit(aten.eq.Scalar, hi, 0.0), emit(aten.full_like.default, h, 0.0), h)
        inf = emit(aten.logical_or.default, emit(aten.isinf.default, ar), emit(aten.isinf.default, ai))
        return emit(aten.where.self, inf, emit(aten.full_like.default, h, float("inf")), h)

    def times_real(self, z: fx.Node, r: tuple[str, Any]) -> fx.Node:
        """A complex pair ``z`` = a + bi times a real r, as eager multiplies by r + 0i: (a r - b 0) + (a 0 + b r) i.
        The 0 terms are -0/+0 (leaving each product as it is) but NaN where a part is inf or NaN."""
        emit = self.emit
        kind, v = r
        scaled = emit(aten.mul.Tensor, z, emit(aten.unsqueeze.default, v, -1)) if kind == "real" \
            else emit(aten.mul.Scalar, z, v)
        a0, b0 = (emit(aten.mul.Scalar, self.part(z, i), 0.0) for i in (0, 1))
        return emit(aten.add.Tensor, scaled, self.pair(emit(aten.neg.default, b0), a0))

    def times_complex_scalar(self, z: fx.Node, z_complex: bool, c: complex) -> fx.Node:
        """``z * c`` for a complex Python scalar ``c``: (zr + i zi)(cr + i ci), or a real ``z`` times ``c``."""
        mul = aten.mul.Scalar
        if not z_complex:
            return self.pair(self.emit(mul, z, c.real), self.emit(mul, z, c.imag))
        zr, zi = self.part(z, 0), self.part(z, 1)
        return self.pair(self.emit(aten.sub.Tensor, self.emit(mul, zr, c.real), self.emit(mul, zi, c.imag)),
                         self.emit(aten.add.Tensor, self.emit(mul, zr, c.imag), self.emit(mul, zi, c.real)))

    def parts(self, operand: tuple[str, Any]) -> tuple[Any, Any]:
        """The real and imaginary parts of a binary operand: nodes, or Python numbers (a scalar, a real's 0)."""
        kind, v = operand
        if kind == "complex":
            return self.part(v, 0), self.part(v, 1)
        if kind == "real":
            return v, 0.0
        c = complex(v)
        return c.real, c.imag

    def arith(self, op: str, x: Any, y: Any) -> Any:
        """x op y (op: '+', '-', '*', '/') for nodes and Python numbers, as the Tensor or Scalar overload."""
        if not isinstance(x, fx.Node) and not isinstance(y, fx.Node):
            return {"+": x + y, "-": x - y, "*": x * y}[op] if op != "/" else x / y
        if not isinstance(x, fx.Node):  # number op node
            if op == "-":
                return self.emit(aten.add.Scalar, self.emit(aten.neg.default, y), x)
            if op == "/":
                return self.emit(aten.mul.Scalar, self.emit(aten.reciprocal.default, y), x)
            x, y = y, x
        if not isinstance(y, fx.Node):
            return self.emit({"+": aten.add.Scalar, "-": aten.sub.Scalar, "*": aten.mul.Scalar,
                              "/": aten.div.Scalar}[op], x, y)
        return self.emit({"+": aten.add.Tensor, "-": aten.sub.Tensor, "*": aten.mul.Tensor, "/": aten.div.Tensor}[op],
                         x, y)

    def divide(self, lhs: tuple[str, Any], rhs: tuple[str, Any]) -> fx.Node:
        """``lhs / rhs`` with a complex divisor, by Smith's algorithm as c10::complex divides: the divisor is scaled
        by its larger part (no overflow or underflow in |rhs|^2), and a divisor of 0 gives each part over |0|
        (inf or NaN, as eager)."""
        emit, f = self.emit, self.arith
        a, b = self.parts(lhs)
        c, d = self.parts(rhs)
        like = next((v for v in (c, d, a, b) if isinstance(v, fx.Node)), None)
        if like is None:
            raise _Unsupported("a scalar divided by a complex scalar")
        c, d = (v if isinstance(v, fx.Node) else emit(aten.full_like.default, like, v) for v in (c, d))
        abs_c, abs_d = emit(aten.abs.default, c), emit(aten.abs.default, d)
        rat = f("/", d, c)  # |c| >= |d|
        scl = emit(aten.reciprocal.default, f("+", c, f("*", d, rat)))
        re1, im1 = f("*", f("+", a, f("*", b, rat)), scl), f("*", f("-", b, f("*", a, rat)), scl)
        rat = f("/", c, d)  # |c| < |d|
        scl = emit(aten.reciprocal.default, f("+", d, f("*", c, rat)))
        re2, im2 = f("*", f("+", f("*", a, rat), b), scl), f("*", f("-", f("*", b, rat), a), scl)
        zero = emit(aten.logical_and.default, emit(aten.eq.Scalar, abs_c, 0.0), emit(aten.eq.Scalar, abs_d, 0.0))
        first = emit(aten.ge.Tensor, abs_c, abs_d)
        re = emit(aten.where.self, zero, f("/", a, abs_c), emit(aten.where.self, first, re1, re2))
        im = emit(aten.where.self, zero, f("/", b, abs_d), emit(aten.where.self, first, im1, im2))
        return self.pair(re, im)

    def binary(self, t: Any, lhs: tuple[str, Any], rhs: tuple[str, Any]) -> fx.Node:
        """+, -, *, / with at least one complex side: on the pairs."""
        (lk, lv), (rk, rv) = lhs, rhs
        if t == aten.mul.Tensor and "scalar_c" in (lk, rk) and {lk, rk} <= {"scalar_c", "complex", "real"}:
            (zk, zv), c = ((lk, lv), rv) if rk == "scalar_c" else ((rk, rv), lv)
            return self.times_complex_scalar(zv, zk == "complex", c)
        if t == aten.mul.Tensor and lk == "complex" and rk == "complex":
            ar, ai, br, bi = self.part(lv, 0), self.part(lv, 1), self.part(rv, 0), self.part(rv, 1)
            mul, emit = aten.mul.Tensor, self.emit
            re = emit(aten.sub.Tensor, emit(mul, ar, br), emit(mul, ai, bi))
            im = emit(aten.add.Tensor, emit(mul, ar, bi), emit(mul, ai, br))
            return self.pair(re, im)
        if t == aten.div.Tensor and rk in ("complex", "scalar_c") and lk in ("complex", "real", "scalar", "scalar_c"):
            return self.divide(lhs, rhs)
        if t == aten.div.Tensor and lk == "complex" and rk in ("real", "scalar"):
            return self.divide(lhs, rhs)  # eager divides by r + 0i, not part by part (inf / 2 is inf + NaN i)
        if t == aten.mul.Tensor and {lk, rk} <= {"complex", "real", "scalar"}:
            return self.times_real(*((lv, (rk, rv)) if lk == "complex" else (rv, (lk, lv))))
        if t in (aten.add.Tensor, aten.sub.Tensor) and {lk, rk} <= {"complex", "real", "scalar", "scalar_c"} \
                and ("complex" in (lk, rk) or {lk, rk} == {"real", "scalar_c"}):
            # eager adds alpha * y, alpha = 1 + 0i, by a complex product: y's parts gain y's other part times 0 (NaN
            # where that part is inf or NaN); x only promotes (x + 0i)
            xr, xi = self.parts(lhs)
            yr, yi = self.parts(rhs)
            yr, yi = self.arith("-", yr, self.arith("*", yi, 0.0)), self.arith("+", self.arith("*", yr, 0.0), yi)
            op = "+" if t == aten.add.Tensor else "-"
            re, im = self.arith(op, xr, yr), self.arith(op, xi, yi)

            def like() -> fx.Node:  # a part's shape for a part that came out a number (real +- c: re is a node)
                return self.part(lv if lk == "complex" else rv, 0) if "complex" in (lk, rk) else re

            return self.pair(*(v if isinstance(v, fx.Node) else self.emit(aten.full_like.default, like(), v)
                               for v in (re, im)))
        raise _Unsupported(f"{t} of {lk} and {rk}")


def as_real_pairs(gm: fx.GraphModule) -> RealPairs | None:
    """``gm`` with its complex values as real pairs, or None when it has none or one can't be rewritten."""
    if not has_complex(gm):
        return None
    try:
        return _Rewriter(gm).run()
    except Exception as exc:  # an op without a real form, or a view the pair layout can't take: refused as is
        log.debug("complex graph left as it is: %s", exc)
        node = getattr(exc, "complex_node", None)
        if node is not None:  # the op to name in the refusal (see pipeline.unsupported_nodes)
            why = str(exc) if isinstance(exc, _Unsupported) else f"{type(exc).__name__}: {exc}"
            gm.meta[PAIRS_FAILURE] = (node, why)
        return None


PAIRS_FAILURE = "neuron_complex_pairs_failure"  # gm.meta key: (the node the pair rewrite stopped at, why)
