"""Recognise scaled-dot-product attention in an ATen graph and replace it by one fused node.

Input: the (decomposed) ATen graph AOTAutograd hands the backend. ``F.scaled_dot_product_attention``
arrives as its math decomposition (``bmm(q*s, (k^T)*s)`` -> ``+ mask`` -> ``amax/sub/exp/sum/div`` ->
fully-masked-row guard -> ``bmm(p, v)`` -> output layout permute/clone), and the written-out
``softmax(q @ k^T / c + causal where) @ v`` lowers to the same ops. :func:`fuse_attention` finds every
such subgraph, checks every node of it (targets, arguments, reduced dims, shapes, single users of
every intermediate value) and, on a copy of the graph, replaces it by one
``neuron_compile::attention`` node, lowered by ``lowering/ops/attention.py`` into an
:class:`~neuron_compile.lowering.ir.AttentionKernel`. Anything that does not match exactly is left
alone and lowers through the ordinary rules (the fallback). Masks built from constants (arange /
compare / where) are evaluated at compile time: a top-left causal mask becomes ``causal=True``; any
other mask is read as an additive input.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

# -- the fused op (only ever seen by our own lowering; the eager kernel documents its semantics) -----------

_LIB = torch.library.Library("neuron_compile", "FRAGMENT")
_LIB.define("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal, int batch, int heads, "
            "bool k_rows, int[] out_perm) -> Tensor")


def _attention_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     causal: bool, batch: int, heads: int, k_rows: bool, out_perm: list[int]) -> torch.Tensor:
    """softmax(scale * q k^T (+ mask, causal)) v in fp32; rows with every score -inf give 0 (SDPA's guard)."""
    kk = k if k_rows else k.transpose(-2, -1)
    s = torch.matmul(q.float(), kk.float().transpose(-2, -1)) * scale
    if mask is not None:
        s = s + mask.float()
    if causal:
        n_q, n_k = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril().logical_not(), -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.matmul(p, v.float())


_LIB.impl("attention", _attention_eager, "CompositeExplicitAutograd")
ATTENTION_OP = torch.ops.neuron_compile.attention.default

# -- matching -----------------------------------------------------------------------------------------------

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_MULS = (aten.mul.Scalar, aten.mul.Tensor)
_DIVS = (aten.div.Scalar, aten.div.Tensor)
# Ops a compile-time mask may be built from (evaluated with torch on CPU).
_CONST_OPS = {aten.arange.start_step, aten.arange.default, aten.arange.start, aten.full.default,
              aten.scalar_tensor.default, aten.unsqueeze.default, aten.sub.Tensor, aten.add.Tensor, aten.le.Scalar,
              aten.lt.Scalar, aten.ge.Scalar, aten.gt.Scalar, aten.le.Tensor, aten.lt.Tensor, aten.ge.Tensor,
              aten.gt.Tensor, aten.eq.Scalar, aten.logical_and.default, aten.logical_not.default,
              aten.bitwise_not.default, aten.where.self, aten.expand.default, aten.view.default, aten.ones.default,
              aten.zeros.default, aten.tril.default, aten.triu.default, aten.slice.Tensor, aten.mul.Tensor}
_CONST_LIMIT = 1 << 26


@dataclass
class Match:
    """One matched attention subgraph: its nodes (all replaced), sources and parameters."""

    final: fx.Node
    nodes: list[fx.Node]
    q: fx.Node
    k: fx.Node
    v: fx.Node
    k_rows: bool  # k source laid out [.., Sk, D] (True) or [.., D, Sk]
    mask: fx.Node | None
    scale: float
    causal: bool
    batch: int
    heads: int
    out_perm: list[int] = field(default_factory=list)


def _call(n: Any, *targets: Any) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _shape(n: fx.Node) -> tuple[int, ...]:
    val = n.meta.get("val")
    return tuple(int(s) for s in val.shape) if isinstance(val, torch.Tensor) else ()


def _dtype(n: fx.Node) -> torch.dtype | None:
    val = n.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _sole_user(n: Any, user: fx.Node) -> bool:
    return isinstance(n, fx.Node) and len(n.users) == 1 and user in n.users


def _scalar(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _is_last_dim(dims: Any, rank: int) -> bool:
    if isinstance(dims, int):
        dims = [dims]
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] % rank == rank - 1


class _Fail(Exception):
    """The subgraph differs from the attention pattern (the reason is logged at DEBUG)."""


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise _Fail(why)


def _flatten_of(n: fx.Node, user: fx.Node, nodes: list[fx.Node]) -> fx.Node:
    """``view(expand(x, [B, H, a, b]), [B*H, a, b])`` -> x (expand optional); else ``n`` itself."""
    if not (_call(n, *_VIEWS) and _sole_user(n, user)):
        return n
    src = n.args[0]
    out, ins = _shape(n), _shape(src)
    if len(out) != 3 or len(ins) != 4 or ins[0] * ins[1] != out[0] or ins[2:] != out[1:]:
        return n
    nodes.append(n)
    # ``reshape`` of a non-viewable (e.g. head-transposed) operand arrives as clone(contiguous) + view: a
    # value-preserving copy, absorbed so the kernel reads the strided source directly.
    if _call(src, aten.clone.default) and _sole_user(src, n) and set(src.kwargs) <= {"memory_format"} \
            and src.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format \
            and _shape(src.args[0]) == ins:
        nodes.append(src)
        user, src = src, src.args[0]
    else:
        user = n
    if _call(src, aten.expand.default) and _sole_user(src, user) and _shape(src.args[0]) == ins:
        nodes.append(src)
        return src.args[0]
    return src


def _peel_operand(n: fx.Node, user: fx.Node, nodes: list[fx.Node], transpose_ok: bool
                  ) -> tuple[fx.Node, float, bool]:
    """Walk back from a bmm operand through flatten/expand, scalar scaling, an fp32 upcast and (for k) a
    transpose of the last two dims; every node passed must have that single user. -> (source, scale, transposed)."""
    scale, transposed = 1.0, False
    cur = _flatten_of(n, user, nodes)
    if cur is not n:
        user = nodes[-1]
    while _sole_user(cur, user):
        if _call(cur, aten.expand.default):
            pass
        elif _call(cur, *_MULS) and _scalar(cur.args[1]) is not None:
            scale *= _scalar(cur.args[1])  # type: ignore[operator]
        elif _call(cur, *_DIVS) and _scalar(cur.args[1]):
            scale /= _scalar(cur.args[1])  # type: ignore[operator]
        elif _call(cur, aten._to_copy.default) and set(cur.kwargs) == {"dtype"} \
                and cur.kwargs["dtype"] == torch.float32 and _dtype(cur.args[0]) in (torch.bfloat16, torch.float16):
            pass  # an exact upcast: the kernel reads the low-precision source and accumulates in fp32
        elif _call(cur, aten.transpose.int) and transpose_ok and not transposed:
            rank = len(_shape(cur))
            if sorted(d % rank for d in cur.args[1:3]) != [rank - 2, rank - 1]:
                break
            transposed = True
        else:
            break
        nodes.append(cur)
        user, cur = cur, cur.args[0]
    _need(isinstance(cur, fx.Node) and isinstance(cur.meta.get("val"), torch.Tensor), "operand is not a tensor")
    return cur, scale, transposed


def _const_eval(n: Any, memo: dict[fx.Node, Any]) -> Any:
    """Value of a node computed only from constants (raises _Fail otherwise)."""
    if not isinstance(n, fx.Node):
        if isinstance(n, (list, tuple)):
            return type(n)(_const_eval(x, memo) for x in n)
        return n
    if n in memo:
        return memo[n]
    _need(n.op == "call_function" and n.target in _CONST_OPS, f"{n.name} is not a compile-time constant")
    _need(math.prod(_shape(n)) <= _CONST_LIMIT, "constant mask too large")
    args = [_const_eval(a, memo) for a in n.args]
    kwargs = {k: _const_eval(v, memo) for k, v in n.kwargs.items()}
    memo[n] = n.target(*args, **kwargs)
    return memo[n]


def _is_const(n: Any) -> bool:
    try:
        _const_eval(n, {})
    except (_Fail, RuntimeError, TypeError, ValueError):
        return False
    return True


def _causal_keep(sq: int, sk: int) -> torch.Tensor:
    return torch.ones(sq, sk, dtype=torch.bool).tril()


def _const_matrix(n: Any, sq: int, sk: int) -> torch.Tensor | None:
    """A constant broadcast over the batch dims to (sq, sk), or None."""
    val = _const_eval(n, {}) if isinstance(n, fx.Node) else torch.tensor(n)
    if not isinstance(val, torch.Tensor) or any(s != 1 for s in val.shape[:-2]):
        return None
    try:
        return val.reshape(val.shape[-2:] if val.dim() >= 2 else val.shape).expand(sq, sk)
    except RuntimeError:
        return None


def _all_neg_inf(n: Any) -> bool:
    if isinstance(n, fx.Node):
        if not _is_const(n):
            return False
        val = _const_eval(n, {})
    else:
        val = torch.tensor(n)
    return bool(val.numel() > 0 and torch.all(val == -math.inf))


def _match_softmax(x: fx.Node, user: fx.Node, nodes: list[fx.Node]) -> tuple[fx.Node, bool]:
    """The softmax (plus SDPA's fully-masked-row guard) producing ``x``; -> (its input Z, guarded)."""
    guarded = False
    div = x
    if _call(x, aten.where.self):
        _need(_sole_user(x, user), "softmax output has other users")
        cond, zero, div = x.args
        _need(_call(zero, aten.full_like.default) and zero.args[0] is div and _scalar(zero.args[1]) == 0.0
              and _sole_user(zero, x), "guard: not where(..., full_like(p, 0), p)")
        _need(_call(cond, aten.logical_not.default) and _sole_user(cond, x), "guard condition")
        anyn = cond.args[0]
        _need(_call(anyn, aten.any.dim) and _sole_user(anyn, cond) and len(anyn.args) >= 3 and anyn.args[2] is True,
              "guard any(dim=-1, keepdim)")
        notn = anyn.args[0]
        _need(_call(notn, aten.logical_not.default) and _sole_user(notn, anyn), "guard inner not")
        eqn = notn.args[0]
        _need(_call(eqn, aten.eq.Scalar) and eqn.args[1] == -math.inf and _sole_user(eqn, notn), "guard eq -inf")
        _need(_is_last_dim(anyn.args[1], len(_shape(anyn.args[0]))), "guard reduces the last dim")
        nodes += [x, zero, cond, anyn, notn, eqn]
        guarded = True
        _need(set(div.users) == {x, zero}, "probabilities have other users")
    else:
        _need(_sole_user(x, user), "softmax output has other users")
    _need(_call(div, aten.div.Tensor), "softmax: no div")
    exp, total = div.args
    _need(_call(exp, aten.exp.default) and _call(total, aten.sum.dim_IntList) and total.args[0] is exp, "softmax: exp/sum")
    rank = len(_shape(exp))
    _need(_is_last_dim(total.args[1], rank) and len(total.args) >= 3 and total.args[2] is True
          and not total.kwargs, "softmax: sum(dim=-1, keepdim)")
    _need(set(exp.users) == {total, div} and _sole_user(total, div), "softmax: exp/sum have other users")
    sub = exp.args[0]
    _need(_call(sub, aten.sub.Tensor) and _sole_user(sub, exp) and len(sub.args) == 2 and not sub.kwargs,
          "softmax: sub")
    z, amax = sub.args
    _need(_call(amax, aten.amax.default) and amax.args[0] is z and _is_last_dim(amax.args[1], rank)
          and len(amax.args) >= 3 and amax.args[2] is True and _sole_user(amax, sub), "softmax: amax(dim=-1)")
    users = {amax, sub} | ({nodes[-1]} if guarded else set())
    _need(isinstance(z, fx.Node) and set(z.users) == users, "scores have other users")
    if guarded:
        _need(nodes[-1].args[0] is z, "guard tests other scores")
    nodes += [div, exp, total, sub, amax]
    return z, guarded


SBUF_FRACTION = 150 / 192  # of the target's usable SBUF per partition an attention kernel may keep resident (150 KiB
# of trn1's 192; the rest for the compiler's own tiles): 162.5 KiB on trn2 (208 usable), 187.5 on trn3 (240)


def sbuf_budget(target: str | None = None) -> int:
    """Bytes per partition an attention kernel may keep resident on ``target`` (default: ``config.target``)."""
    from neuron_compile.config import config
    from neuron_compile.simulator.targets import LIMITS

    return int(LIMITS[target or config.target].sbuf_partition_bytes * SBUF_FRACTION)


def key_step(compute_dtype: str) -> int:
    """Keys per online-softmax step. A step's scores take one PSUM tile (a 2 KiB bank per 512 fp32 scores) and its
    transposed probabilities another (a bank per 1024 keys in bf16, per 512 in fp32); with two P V accumulators
    they must fit PSUM's 8 banks per partition: 4 + 2 + 2 in bf16/fp16, 3 + 3 + 2 in fp32."""
    return 2048 if compute_dtype in ("bfloat16", "float16") else 1536


def sbuf_bytes(sq: int, sk: int, d: int, dv: int, csize: int, osize: int, step: int, masked: bool) -> int:
    """Per-partition SBUF the kernel keeps live for one (b, h): Q/K/V rows, Q^T/K^T, output rows, and two of each
    step tile (its scaled scores and, with a mask, the mask's columns in fp32; P and transposed P: a step's tiles
    are live while the next step's are written)."""
    nq, nk = -(-sq // 128), -(-sk // 128)
    resident = (nq * d + nk * d + nk * dv + sq + sk) * csize + nq * dv * osize
    return resident + 2 * step * (4 + (4 if masked else 0) + 2 * csize) + dv * 4


def match_attention(pv: fx.Node) -> Match:
    """Match the attention subgraph whose ``p @ v`` bmm is ``pv`` (raises _Fail with a reason)."""
    _need(_call(pv, aten.bmm.default), "not a bmm")
    nodes: list[fx.Node] = [pv]
    p_in, v_in = pv.args
    # output side: unflatten view, optional downcast, optional permute -> clone -> permute layout
    final, perm = pv, []
    o4 = next(iter(pv.users)) if len(pv.users) == 1 else None
    if _call(o4, *_VIEWS) and len(_shape(o4)) == 4 and _shape(o4)[2:] == _shape(pv)[1:]:
        nodes.append(o4)
        final = o4
    nxt = next(iter(final.users)) if len(final.users) == 1 else None
    if _call(nxt, aten._to_copy.default) and set(nxt.kwargs) == {"dtype"} \
            and nxt.kwargs["dtype"] in (torch.bfloat16, torch.float16) and _dtype(final) == torch.float32:
        nodes.append(nxt)
        final = nxt
    p1 = next(iter(final.users)) if len(final.users) == 1 else None
    if _call(p1, aten.permute.default) and len(p1.users) == 1:
        cl = next(iter(p1.users))
        p2 = next(iter(cl.users)) if len(cl.users) == 1 else None
        if _call(cl, aten.clone.default) and set(cl.kwargs) <= {"memory_format"} \
                and cl.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format \
                and _call(p2, aten.permute.default):
            a, b = [d % len(_shape(final)) for d in p1.args[1]], [d % len(_shape(final)) for d in p2.args[1]]
            if [a[i] for i in b] == list(range(len(a))):
                nodes += [p1, cl, p2]
                final, perm = p2, a
    # probabilities -> softmax -> mask -> scaled scores -> q k^T
    x = _flatten_of(p_in, pv, nodes)
    z, guarded = _match_softmax(x, nodes[-1] if x is not p_in else pv, nodes)
    mask, causal, y = None, False, z
    sq, sk = _shape(z)[-2:]
    if _call(z, aten.add.Tensor) and len(z.args) == 2 and not z.kwargs:
        a, b = z.args
        y, m = (a, b) if _leads_to_scores(a) else (b, a)
        _need(isinstance(m, fx.Node) and _leads_to_scores(y), "add: no scores operand")
        const = _const_matrix(m, sq, sk) if _is_const(m) else None
        keep = _causal_keep(sq, sk)
        if const is not None and torch.equal(const, torch.where(keep, 0.0, -math.inf).to(const.dtype)):
            causal = True
        else:
            _need(_dtype(m) in (torch.float32, torch.bfloat16, torch.float16) and _dtype(z) == torch.float32
                  and len(_shape(m)) <= len(_shape(z)), "mask dtype/rank")  # the mask DMA converts to fp32
            try:
                torch.broadcast_shapes(_shape(m), _shape(z))
            except RuntimeError:
                raise _Fail("mask does not broadcast to the scores") from None
            _need(torch.broadcast_shapes(_shape(m), _shape(z)) == torch.Size(_shape(z)), "mask broadcasts scores")
            _need(guarded, "additive mask without SDPA's fully-masked-row guard")
            mask = m
        nodes.append(z)
    elif _call(z, aten.where.self):
        cond, a, b = z.args
        keep = _causal_keep(sq, sk)
        if _leads_to_scores(a) and _all_neg_inf(b):
            y, want = a, keep
        elif _leads_to_scores(b) and _all_neg_inf(a):
            y, want = b, keep.logical_not()
        else:
            raise _Fail("where: not a -inf mask of the scores")
        _need(_is_const(cond), "where mask is not a compile-time constant")
        const = _const_matrix(cond, sq, sk)
        _need(const is not None and const.dtype == torch.bool and torch.equal(const, want), "where mask is not causal")
        causal = True
        nodes.append(z)
    scale = 1.0
    cur, user = y, (z if y is not z else None)
    while True:
        _need(user is None or _sole_user(cur, user), f"{cur.name} has users outside the attention subgraph")
        if not (_call(cur, *_MULS, *_DIVS) and _scalar(cur.args[1])):
            break
        scale = scale * _scalar(cur.args[1]) if cur.target in _MULS else scale / _scalar(cur.args[1])  # type: ignore
        nodes.append(cur)
        user, cur = cur, cur.args[0]
    s4 = cur
    if _call(s4, *_VIEWS) and len(_shape(s4)) == 4:
        nodes.append(s4)
        user, cur = s4, s4.args[0]
    qk = cur
    _need(_call(qk, aten.bmm.default) and (user is None or _sole_user(qk, user)), "scores are not one bmm")
    nodes.append(qk)
    four_d = len(_shape(z)) == 4
    batch, heads = (_shape(z)[0], _shape(z)[1]) if four_d else (_shape(z)[0], 1)
    _need(len(_shape(qk)) == 3 and _shape(qk)[0] == batch * heads, "scores batch")
    q, qs, q_t = _peel_operand(qk.args[0], qk, nodes, False)
    k, ks, k_t = _peel_operand(qk.args[1], qk, nodes, True)
    v, vs, v_t = _peel_operand(v_in, pv, nodes, False)
    _need(vs == 1.0, "v is scaled")
    scale *= qs * ks
    _need(scale > 0 and math.isfinite(scale), "scale must be positive (the row max is taken before scaling)")
    dts = {_dtype(q), _dtype(k), _dtype(v)}
    _need(len(dts) == 1 and dts <= {torch.float32, torch.bfloat16, torch.float16}, f"q/k/v dtypes {dts}")
    d, dv = _shape(q)[-1], _shape(v)[-1]
    _need(_shape(k)[-1 if k_t else -2] == d and _shape(k)[-2 if k_t else -1] == sk and _shape(q)[-2] == sq
          and _shape(v)[-2] == sk, "q/k/v shapes")
    _need(d <= 128 and dv <= 512, f"head dims d={d} (<= 128) dv={dv} (<= 512)")
    csize = 2 if dts <= {torch.bfloat16, torch.float16} else 4
    osize = 2 if _dtype(final) in (torch.bfloat16, torch.float16) else 4
    need = sbuf_bytes(sq, sk, d, dv, csize, osize, key_step("bfloat16" if csize == 2 else "float32"), mask is not None)
    _need(need <= sbuf_budget(), f"needs {need} B of SBUF per partition (> {sbuf_budget()})")
    _need(len(set(nodes)) == len(nodes), "node visited twice")
    inner = set(nodes) - {final}
    for n in inner:  # every intermediate value stays inside the subgraph
        _need(all(u in inner or u is final for u in n.users), f"{n.name} is used outside the attention subgraph")
    return Match(final, nodes, q, k, v, k_t, mask, scale, causal, batch, heads, perm)


def _leads_to_scores(n: Any) -> bool:
    """Does ``n`` reach a bmm through scalar scaling / views only (the raw scores)?"""
    while isinstance(n, fx.Node):
        if _call(n, aten.bmm.default):
            return True
        if _call(n, *_MULS, *_DIVS, *_VIEWS) and (n.target in _VIEWS or _scalar(n.args[1]) is not None):
            n = n.args[0]
            continue
        return False
    return False


def find_attention(gm: fx.GraphModule) -> list[Match]:
    """Every attention subgraph of ``gm`` (constant masks are evaluated with real tensors, outside fake mode)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    out: list[Match] = []
    with unset_fake_temporarily():
        for node in gm.graph.nodes:
            if not _call(node, aten.bmm.default):
                continue
            try:
                out.append(match_attention(node))
            except _Fail as exc:
                log.debug("attention pattern not matched at %s: %s", node.name, exc)
    return out


def fuse_attention(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with every matched attention subgraph replaced by one attention node (or ``gm``)."""
    matches = find_attention(gm)
    if not matches:
        return gm
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(gm.graph, remap)
    graph.output(out)
    for m in matches:
        final = remap[m.final]
        with graph.inserting_before(final):
            new = graph.call_function(ATTENTION_OP, (
                remap[m.q], remap[m.k], remap[m.v], remap[m.mask] if m.mask is not None else None, m.scale, m.causal,
                m.batch, m.heads, m.k_rows, m.out_perm))
        new.meta = dict(final.meta)
        new.meta["stack_trace"] = m.final.meta.get("stack_trace") or next(
            (n.meta["stack_trace"] for n in m.nodes if n.meta.get("stack_trace")), None)
        final.replace_all_uses_with(new)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for n in sorted((remap[x] for x in m.nodes), key=lambda n: -order[n]):
            graph.erase_node(n)
        log.debug("attention: fused %d nodes into %s (causal=%s, mask=%s, scale=%g)", len(m.nodes), new.name,
                  m.causal, m.mask is not None, m.scale)
    graph.eliminate_dead_code()
    new_gm = fx.GraphModule(gm, graph)
    return new_gm


__all__ = ["ATTENTION_OP", "Match", "find_attention", "fuse_attention", "match_attention"]
