"""Which loops of a rendered kernel the instruction-stream recorder may skip (:mod:`instruction_stream`).

:class:`LoopDriver` rewrites every ``for v in range(...)`` of a kernel's source to go through the recorder's loop
driver, flagged with whether iterations that repeat their predecessor may be skipped outright.
"""

from __future__ import annotations

import ast

_MUTATORS = frozenset(("append", "extend", "insert", "pop", "remove", "update", "setdefault", "add", "clear"))
_STOP = (ast.Return, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal, ast.Delete,
         ast.AugAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.While, ast.Try)


class _Walker:
    """``list(ast.walk(node))`` (another order), memoised for one transform of one tree: nested loops re-read the
    statements of their inner loops, so walking each subtree once keeps the loop check linear per level."""

    def __init__(self) -> None:
        self.walks: dict[int, list[ast.AST]] = {}  # id(node) -> the node and its descendants (the tree is alive)

    def __call__(self, node: ast.AST) -> list[ast.AST]:
        out = self.walks.get(id(node))
        if out is None:
            out = [node]
            for child in ast.iter_child_nodes(node):
                out.extend(self(child))
            self.walks[id(node)] = out
        return out

    def names(self, node: ast.AST) -> set[str]:
        return {n.id for n in self(node) if isinstance(n, ast.Name)}


def _index_only(name: str, loads: dict[str, list[ast.Name]], inside: set[int], own: ast.Assign,
                walk: _Walker) -> bool:
    """Every read of ``name`` in the loop body (``loads``: its Name loads by id; ``inside``: ids of nodes within a
    subscript index) but its own update is inside a subscript index (``acc[t % 7]``): skipping iterations then only
    changes which buffer of a list a later iteration uses."""
    own_reads = {id(m) for m in walk(own.value)}
    return all(id(n) in inside or id(n) in own_reads for n in loads.get(name, ()))


def _skippable(loop: ast.For, walk: _Walker) -> bool:
    """Whether iterations of ``loop`` that issue what their predecessor issued may be skipped outright (not run):
    no side effect a later statement could see (no container mutation, no ``x = f(x)`` counter, no control flow
    out of the body), and the loop variable reaches no branch but a comparison with 0 of a monotone expression
    (``k0 == 0``, ``KF > 0``: true or false over a prefix or a suffix of the range, and the first iterations and
    the last ``TAIL`` always run). Periodic uses (``%``) and any other comparison keep every iteration running
    (the scheduler still fast-forwards identical ones)."""
    if not isinstance(loop.target, ast.Name):
        return False
    tainted, periodic = {loop.target.id}, set()
    body = [n for stmt in loop.body for n in walk(stmt)]
    # one pass: refuse on side effects, and collect loads, subscript indices, assignments and tests
    inside: set[int] = set()
    loads: dict[str, list[ast.Name]] = {}
    assign_nodes: list[ast.Assign] = []
    checked: list[ast.AST] = []  # subscripts of literal tuples/lists, ifs and comparisons
    for n in body:
        kind = type(n)
        if kind is ast.Name:
            if isinstance(n.ctx, ast.Load):
                loads.setdefault(n.id, []).append(n)
        elif kind is ast.Subscript:
            inside.update(id(m) for m in walk(n.slice))
            checked.append(n)
        elif kind is ast.Assign:
            assign_nodes.append(n)
        elif kind is ast.Call:
            if isinstance(n.func, ast.Attribute) and n.func.attr in _MUTATORS:
                return False
        elif kind in (ast.If, ast.IfExp, ast.Compare):
            checked.append(n)
        elif isinstance(n, _STOP):
            return False
    assigns: list[tuple[list[str], set[str], bool, bool]] = []  # targets, names read, min() clamp, has %
    for n in assign_nodes:
        if any(not isinstance(t, ast.Name) for t in n.targets):
            return False
        names = walk.names(n.value)
        targets = [t.id for t in n.targets if isinstance(t, ast.Name)]
        for t in targets:
            if t in names and not _index_only(t, loads, inside, n, walk):
                return False  # a loop-carried value computed from itself (a counter) used beyond list indices
        clamp = isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name) and n.value.func.id == "min"
        has_mod = any(isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) for m in walk(n.value))
        assigns.append((targets, names, clamp, has_mod))
    extents: set[str] = set()  # min(C, X - v) clamps: constant but for the last iterations
    changed = True
    while changed:  # names computed from the loop variable
        changed = False
        for targets, names, clamp, has_mod in assigns:
            used = names & tainted
            if not used:
                continue
            ext = clamp or used <= extents
            mod = not ext and (bool(used & periodic) or has_mod)
            for t in targets:
                if t not in tainted or (mod and t not in periodic) or (not ext and t in extents):
                    tainted.add(t)
                    if ext and t not in periodic:
                        extents.add(t)
                    else:
                        extents.discard(t)
                    if mod:
                        periodic.add(t)
                    changed = True
    for n in checked:
        if isinstance(n, ast.Subscript) and isinstance(n.value, (ast.Tuple, ast.List)) and walk.names(n.slice) & tainted:
            return False  # a choice among literal values (e.g. an engine per iteration)
        tests = [n.test] if isinstance(n, (ast.If, ast.IfExp)) else [n] if isinstance(n, ast.Compare) else []
        for t in tests:
            used = walk.names(t)
            if not used & tainted or used & tainted <= extents:
                continue  # a test on clamped extents changes at most for the last iterations
            if used & periodic or any(isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) for m in walk(t)):
                continue  # periodic: iterations repeat in blocks (the loop driver finds the block length)
            zero = isinstance(t, ast.Compare) and len(t.comparators) == 1 and \
                isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value == 0
            if not zero:
                return False
    return True


class LoopDriver:
    """``for v in range(...)`` -> ``for v in __nc_loop__(range(...), safe)`` (the recorder's loop driver). One
    instance per tree; :meth:`visit` rewrites the tree in place (outer loops are judged before their inner loops
    are rewritten) and returns it."""

    def __init__(self) -> None:
        self.walk = _Walker()

    def visit(self, tree: ast.AST) -> ast.AST:
        for node in self.walk(tree):  # pre-order: an outer loop before the loops it holds
            if not isinstance(node, ast.For):
                continue
            safe = _skippable(node, self.walk)
            it = node.iter
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
                node.iter = ast.copy_location(ast.Call(ast.Name("__nc_loop__", ast.Load()),
                                                       [it, ast.Constant(safe)], []), it)
        return tree
