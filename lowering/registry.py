"""The registry of lowering rules: one source of truth for "supported" and "lowered".

Rules are registered with :func:`register_lowering`, keyed on exact ATen ``OpOverload``s. The
partitioner asks :func:`unsupported_reason` whether a node can be lowered, and the lowering calls
the same rule, so the two can never disagree. Registering an overload twice raises.

Rule kinds:

- ``pointwise``: ``fn(ctx, node, args) -> TileVal``, called inside a fused loop kernel.
- ``reduction``: the same signature; uses ``ctx.reduce`` and may combine several reductions.
- ``view``: ``fn(node, view) -> View | None``; a pure view costs nothing (None: needs a copy).
- ``matmul``/``copy``/``gather``: anchors of their own kernel families (see ``lowering.graph``).
- ``alias``: the node's value is its first argument (detach, alias, clone in a view-free context).
- ``attention``: the fused ``neuron_compile::attention`` node (``lowering/attention.py``), lowered like
  ``copy``/``gather`` anchors: ``fn(gl, node)`` emits its own kernel.
- ``conv``: convolution, pooling and resampling (``lowering/ops/conv.py``, ``lowering/ops/pool.py``):
  template kernels, emitted like ``attention`` anchors.
- ``collective``: ``_c10d_functional`` collectives and ``wait_tensor`` (``lowering/ops/collectives.py``):
  ``fn(node) -> CollectiveSpec``; the graph is cut there and the runner issues them through
  ``torch.distributed`` (``neuron_compile.collective_runner``). ``getitem`` of a coalesced collective lowers.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from neuron_compile.lowering.intmath import int_scalars_in_range
from torch._ops import OpOverload

from neuron_compile.errors import LoweringError

log = logging.getLogger(__name__)

KINDS = ("pointwise", "reduction", "view", "matmul", "copy", "gather", "alias", "constant", "attention", "conv",
         "collective")


@dataclass(frozen=True)
class LoweringRule:
    op: OpOverload
    fn: Callable[..., Any]
    family: str
    kind: str
    check: Callable[[torch.fx.Node], str | None] | None
    doc: str

    @property
    def name(self) -> str:
        return qualified_name(self.op)


_RULES: dict[OpOverload, LoweringRule] = {}


def qualified_name(op: Any) -> str:
    """``aten.add.Tensor`` for an OpOverload, ``operator.getitem`` etc. otherwise."""
    if isinstance(op, OpOverload):
        ns, name = op.name().split("::", 1)
        base, _, overload = name.partition(".")
        return f"{ns}.{base}.{overload or 'default'}"
    return f"{getattr(op, '__module__', '')}.{getattr(op, '__name__', repr(op))}".lstrip(".")


def register_lowering(*ops: OpOverload, family: str, kind: str = "pointwise",
                      check: Callable[[torch.fx.Node], str | None] | None = None
                      ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the lowering of every overload in ``ops``."""
    if kind not in KINDS:
        raise ValueError(f"unknown lowering kind {kind!r}; expected one of {KINDS}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        for op in ops:
            if not isinstance(op, OpOverload):
                raise TypeError(f"register_lowering takes ATen OpOverloads, got {op!r} (pick an overload, e.g. .default)")
            if op in _RULES:
                raise LoweringError(f"duplicate lowering for {qualified_name(op)}: already registered by "
                                    f"{_RULES[op].fn.__module__}.{_RULES[op].fn.__name__}")
            _RULES[op] = LoweringRule(op, fn, family, kind, check, doc)
        return fn

    return deco


def lookup(target: Any) -> LoweringRule | None:
    _ensure_loaded()
    rule = _RULES.get(target) if isinstance(target, OpOverload) else None
    if rule is not None and rule.kind == "pointwise":
        from neuron_compile.config import config

        if config.test_break_op and config.test_break_op == rule.name:
            return _broken(rule)
    return rule


_WARNED_BROKEN: set[str] = set()


def _broken(rule: LoweringRule) -> LoweringRule:
    """TEST ONLY (``NEURON_COMPILE_TEST_BREAK_OP``): the rule's result shifted by +1.0, a wrong lowering."""

    def fn(ctx: Any, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
        val = rule.fn(ctx, node, *args, **kwargs)
        return ctx.b.binary("add", val, 1.0)

    if rule.name not in _WARNED_BROKEN:
        _WARNED_BROKEN.add(rule.name)
        log.warning("NEURON_COMPILE_TEST_BREAK_OP: lowering of %s is deliberately broken (test-only knob)", rule.name)
    return LoweringRule(rule.op, fn, rule.family, rule.kind, rule.check, rule.doc)


def rules() -> dict[OpOverload, LoweringRule]:
    _ensure_loaded()
    return dict(_RULES)


_DECLINED: dict[Any, Callable[[torch.fx.Node], str | None]] = {}


def register_declined(why: Callable[[torch.fx.Node], str | None], *ops: Any) -> None:
    """Why a decomposition left ``ops`` in the graph (a case it declines): the refusal says so instead of
    "no lowering rule"."""
    for op in ops:
        _DECLINED[op] = why


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """None when ``node`` lowers; otherwise a short reason (no rule, or the rule's own check).

    ``operator.getitem`` of a multi-output op (sort, topk, ...) lowers with its producer: the producer's
    rule defines the value of every ``getitem`` user (see :func:`is_tuple_item`).
    """
    if is_tuple_item(node):
        producer = node.args[0]
        return None if lookup(producer.target) is not None else "item of an unsupported op"
    rule = lookup(node.target)
    if rule is None:
        why = _DECLINED.get(node.target)
        return (why(node) if why is not None else None) or "no lowering rule"
    why = rule.check(node) if rule.check is not None else None
    if why is None and rule.family in _VALUE_SCALARS:
        why = int_scalars_in_range(node, narrow=rule.family == "elementwise")
    return why


# Families whose scalar arguments are values (operands, fills), which integer ops hold as int32; the others' scalar
# arguments are sizes, dims and slice bounds (a slice's end is often 2**63 - 1).
_VALUE_SCALARS = frozenset(("elementwise", "constant"))


def is_tuple_item(node: torch.fx.Node) -> bool:
    """``operator.getitem(producer, i)`` selecting one result of a multi-output op."""
    return node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node)


_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import neuron_compile.lowering.ops  # noqa: F401  (registers every rule)
