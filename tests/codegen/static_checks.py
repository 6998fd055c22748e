"""Static hardware/API rules for rendered NKI kernel source, beyond the name check of ``neuron_compile.nki_api.checker``.

:func:`check_kernel_rules` parses a kernel's source and reports (as a list of messages, empty when
clean): kernel outputs not allocated in ``nl.shared_hbm``; ``nisa.*`` calls that don't pass ``dst=``
when the API's first parameter is ``dst``; on-chip tiles whose partition dim may exceed 128 or
whose PSUM tile exceeds PSUM's 16 KiB per partition; ``nc_matmul`` operands whose K/M may exceed 128
or whose moving free size N (the product of its free dims) may exceed 512, and a whole-tile ``nc_matmul`` dst wider
than one 2 KiB PSUM bank (a view's bank is checked by the simulator at run time). Tile extents are bounded
statically: int literals, names assigned a bounded expression (``min``/``max``, ``+``, ``*``, ``//``, minus a
constant; sizes are non-negative), tuple assignments, views of tiles kept in a list (``ts.append(t)``;
``ts[i][...]``) and stepped slices ``x:x + (n - 1) * s + 1:s`` (n elements); anything else is reported as
unbounded.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass

from neuron_compile import nki_api
from neuron_compile.simulator_limits import GEMM_MOVING_FMAX, GEMM_STATIONARY_FMAX, PMAX, PSUM_BANK_FMAX

PSUM_BANKS = 8  # a PSUM tile may span banks (NKI 0.4+); a matmul writes within one

log = logging.getLogger(__name__)

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "uint8": 1, "int8": 1, "int16": 2,
             "uint32": 4, "uint16": 2}


def dst_first_isa_ops() -> frozenset[str]:
    """``nki.isa`` functions whose first parameter is ``dst`` (from the NKI 0.6 listing)."""
    return nki_api.dst_first_isa_ops()


@dataclass(frozen=True)
class Tile:
    name: str
    line: int
    dims: tuple[int | None, ...]  # static upper bound per dim (None: unbounded)
    buffer: str  # "sbuf" | "psum" | "shared_hbm" | ...
    dtype: str


def _attr_name(node: ast.expr | None, module: str = "nl") -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == module:
        return node.attr
    return None


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


class _Collector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.bounds: dict[str, int | None] = {}  # scalar name -> static upper bound
        self.tiles: dict[str, list[Tile]] = {}
        self.lists: dict[str, list[str]] = {}
        self.constants: dict[str, int] = {}  # names assigned an int literal once
        self.seen: set[str] = set()  # list name -> names of the tiles appended to it
        self.calls: list[ast.Call] = []
        self.returns: list[str] = []

    def bound(self, node: ast.expr) -> int | None:
        """A static upper bound of a size expression (names are sizes, so >= 0), or None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return self.bounds.get(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return -node.operand.value
        if isinstance(node, ast.BinOp):
            left, right = self.bound(node.left), self.bound(node.right)
            if isinstance(node.op, ast.Sub):  # a - c for a constant c; anything else is not bounded
                exact = self.exact(node.right)
                return None if left is None or exact is None else left - exact
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.FloorDiv) and isinstance(node.right, ast.Constant) and right > 0:
                return left // right
            return None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            bounds = [self.bound(a) for a in node.args]
            known = [b for b in bounds if b is not None]
            if node.func.id == "min":
                return min(known) if known else None
            return max(known) if known and len(known) == len(bounds) else None
        return None

    def exact(self, node: ast.expr) -> int | None:
        """The value of an int literal, or of a name only ever assigned one (``LO_W = -4``)."""
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        value = self.bound(node) if isinstance(node, (ast.Constant, ast.UnaryOp)) else None
        return value

    def visit_Assign(self, node: ast.Assign) -> None:
        target = node.targets[0] if len(node.targets) == 1 else None
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                and len(target.elts) == len(node.value.elts):  # N, H, W = 2, 1, 40
            for name, value in zip(target.elts, node.value.elts, strict=True):
                if isinstance(name, ast.Name):
                    self.visit_Assign(ast.Assign(targets=[name], value=value, lineno=node.lineno))
            return
        if isinstance(target, ast.Name) and isinstance(node.value, ast.List) and not node.value.elts:
            self.lists[target.id] = []
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.Call) and _attr_name(value.func) == "ndarray":
                self._tile(name, value)
            elif isinstance(value, ast.Name) and value.id in self.tiles:  # q_rows = q_next: the same tile(s)
                self.tiles.setdefault(name, []).extend(self.tiles[value.id])
            else:
                self.bounds[name] = self.bound(value)
                literal = self.exact(value) if isinstance(value, (ast.Constant, ast.UnaryOp)) else None
                if literal is not None and name not in self.seen:
                    self.constants[name] = literal
                else:
                    self.constants.pop(name, None)
                self.seen.add(name)
        self.generic_visit(node)

    def _tile(self, name: str, call: ast.Call) -> None:
        shape = call.args[0] if call.args else _kw(call, "shape")
        elts = shape.elts if isinstance(shape, ast.Tuple) else []
        dims = tuple(self.bound(e) for e in elts) if elts else (None,)
        buffer = _attr_name(_kw(call, "buffer")) or "?"
        dtype = _attr_name(_kw(call, "dtype")) or "?"
        self.tiles.setdefault(name, []).append(Tile(name, call.lineno, dims, buffer, dtype))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and isinstance(func.value, ast.Name) \
                and func.value.id in self.lists and len(node.args) == 1 and isinstance(node.args[0], ast.Name):
            self.lists[func.value.id].append(node.args[0].id)  # tiles = []; tiles.append(t): tiles[i] is a t
        self.calls.append(node)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.depth = getattr(self, "depth", 0) + 1
        self.generic_visit(node)
        self.depth -= 1

    def visit_Return(self, node: ast.Return) -> None:
        if getattr(self, "depth", 1) > 1:  # a nested function (a loop body) returns a register, not an output
            return
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        self.returns += [v.id for v in values if isinstance(v, ast.Name)]
        self.generic_visit(node)


def _fmt(dims: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def check_kernel_rules(source: str) -> list[str]:
    """Problems of one rendered kernel against the output, ``dst=`` and tile-size rules (empty: clean)."""
    tree = ast.parse(source)
    col = _Collector()
    col.visit(tree)
    problems: list[str] = []
    if not col.returns:
        problems.append("kernel returns no named output")
    for out in col.returns:
        allocs = col.tiles.get(out, [])
        if not allocs or any(t.buffer != "shared_hbm" for t in allocs):
            where = ", ".join(f"line {t.line}: nl.{t.buffer}" for t in allocs) or "never allocated"
            problems.append(f"output {out} must be allocated in nl.shared_hbm ({where})")
    for tiles in col.tiles.values():
        for t in tiles:
            if t.buffer not in ("sbuf", "psum"):
                continue
            if t.dims[0] is None or t.dims[0] > PMAX:
                problems.append(f"line {t.line}: tile {t.name}{_fmt(t.dims)} in nl.{t.buffer}: partition dim "
                                f"not statically <= {PMAX}")
            if t.buffer == "psum":
                free = 1
                for d in t.dims[1:]:
                    free = free * d if d is not None and free is not None else None  # type: ignore[operator]
                nbytes = None if free is None else free * _ITEMSIZE.get(t.dtype, 4)
                if nbytes is None or nbytes > PSUM_BANKS * PSUM_BANK_FMAX * 4:
                    problems.append(f"line {t.line}: PSUM tile {t.name}{_fmt(t.dims)} {t.dtype}: free bytes per "
                                    f"partition not statically <= PSUM's {PSUM_BANKS * PSUM_BANK_FMAX * 4} B")
    isa_dst = dst_first_isa_ops()
    for call in col.calls:
        op = _attr_name(call.func, "nisa")
        if op is None:
            continue
        if op in isa_dst and _kw(call, "dst") is None:
            problems.append(f"line {call.lineno}: nisa.{op} must pass its destination as dst=")
        if op == "nc_matmul":
            problems += _matmul_problems(col, call)
    return problems + hygiene_problems(tree)


def hygiene_problems(tree: ast.AST) -> list[str]:
    """Habits the real compiler may not share with the simulator: ``del`` statements (NKI frees tiles by
    scope and liveness, not by deleting names), ``nl.while_loop`` bodies that return anything but their
    own register (the documented form loads or moves the next condition into it and returns it), loop variables
    named like a tile (the loop shadows it), and
    ``.ap(vector_offset=...)`` patterns whose indirect pair stride is not the base's row stride (our HBM
    arguments are flat, so 1: the documented element start is ``offset + idx * prod(shape[1:])``)."""
    problems: list[str] = []
    bodies: dict[str, ast.FunctionDef] = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    tiles = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _attr_name(getattr(n.value, "func", None))
             == "ndarray" for t in n.targets if isinstance(t, ast.Name)}
    dicts = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
             for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        problems += _subset_problems(node, dicts)
        if isinstance(node, ast.Delete):
            problems.append(f"line {node.lineno}: del statement (tile lifetimes follow NKI's scoping)")
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id in tiles:
            problems.append(f"line {node.lineno}: loop variable {node.target.id} is also a tile's name (it shadows "
                            "the tile inside the loop)")
        if not isinstance(node, ast.Call):
            continue
        if _attr_name(node.func) == "while_loop" and len(node.args) == 2 and isinstance(node.args[1], ast.Name):
            body = bodies.get(node.args[1].id)
            if body is not None:
                reg = body.args.args[0].arg if body.args.args else None
                for ret in (n for n in ast.walk(body) if isinstance(n, ast.Return)):
                    if not (isinstance(ret.value, ast.Name) and ret.value.id == reg):
                        problems.append(f"line {ret.lineno}: nl.while_loop body {body.name} must return its own "
                                        f"register {reg!r}")
        if isinstance(node.func, ast.Attribute) and node.func.attr == "ap" and _kw(node, "vector_offset") is not None:
            pattern = _kw(node, "pattern") or (node.args[0] if node.args else None)
            first = pattern.elts[0] if isinstance(pattern, ast.List) and pattern.elts else None
            stride = first.elts[0] if isinstance(first, ast.List) and first.elts else None
            if not (isinstance(stride, ast.Constant) and stride.value == 1):
                problems.append(f"line {node.lineno}: .ap(vector_offset=...) indirect pair stride "
                                f"{ast.unparse(stride) if stride is not None else '?'} is not the flat argument's "
                                "row stride 1")
    return problems


def _str_key(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _subset_problems(node: ast.AST, dicts: set[str]) -> list[str]:
    """Python the NKI compiler's meta-programming subset does not accept ("NKI language guide", the supported
    subset; the simulator runs any Python): ``is`` / ``is not`` (compare with ``==``) and dicts keyed by anything
    but string literals (a literal's keys, and subscripts, ``get`` / ``pop`` / ``in`` on a name bound to a dict)."""
    where = f"line {getattr(node, 'lineno', '?')}"
    if isinstance(node, ast.Compare):
        if any(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops):
            return [f"{where}: 'is' / 'is not' comparison (NKI's Python subset has no identity test: use ==)"]
        if any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) and not _str_key(node.left) \
                and any(isinstance(c, ast.Name) and c.id in dicts for c in node.comparators):
            return [f"{where}: dict membership test with a non-string key (NKI dicts take string keys only)"]
    if isinstance(node, ast.Dict) and not all(_str_key(k) for k in node.keys):
        return [f"{where}: dict literal with a non-string key (NKI dicts take string keys only)"]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in dicts \
            and not _str_key(node.slice):
        return [f"{where}: dict {node.value.id} indexed by a non-string key (NKI dicts take string keys only)"]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") \
            and isinstance(node.func.value, ast.Name) and node.func.value.id in dicts \
            and not (node.args and _str_key(node.args[0])):
        return [f"{where}: dict {node.func.value.id}.{node.func.attr} with a non-string key (NKI dicts take string "
                "keys only)"]
    return []


def _product(dims: tuple[int | None, ...]) -> int | None:
    total = 1
    for d in dims:
        if d is None:
            return None
        total *= d
    return total


def _slice_dims(col: _Collector, node: ast.Subscript, full: tuple[int | None, ...]) -> tuple[int | None, ...]:
    """Static bounds of a view ``t[a:b, i, c:c + F]`` of a tile of bounds ``full``: slices keep a dim, other
    indices drop it.

    A slice is bounded by its dim's own bound, and more tightly when it starts at 0 / nothing (bound of its
    stop) or is ``x:x + n`` (bound of n); a stepped slice ``x:x + (n - 1) * s + 1:s`` is bounded by n.
    """
    index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    dims: list[int | None] = []
    for axis, ix in enumerate(index):
        if not isinstance(ix, ast.Slice):
            continue
        whole = full[axis] if axis < len(full) else None
        dims.append(_slice_bound(col, ix, whole))
    return tuple(dims)


def _terms(node: ast.expr) -> list[ast.expr]:
    """The additive terms of ``a + b + c`` (left-associated), as written."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _slice_bound(col: _Collector, ix: ast.Slice, whole: int | None) -> int | None:
    lo, hi = ix.lower, ix.upper
    bound = None
    if hi is None:
        bound = None if lo is not None else whole
    elif lo is None or (isinstance(lo, ast.Constant) and lo.value == 0):
        stop, step = col.bound(hi), col.exact(ix.step) if ix.step is not None else 1
        bound = None if stop is None or not step or step < 0 else -(-stop // step)
    else:
        rest = _terms(hi)
        for term in _terms(lo):  # hi = lo + span
            match = next((t for t in rest if ast.dump(t) == ast.dump(term)), None)
            if match is None:
                rest = []
                break
            rest.remove(match)
        if rest and ix.step is not None and len(rest) == 2 and ast.dump(rest[1]) == ast.dump(ast.Constant(1)) \
                and isinstance(rest[0], ast.BinOp) and isinstance(rest[0].op, ast.Mult) \
                and isinstance(rest[0].left, ast.BinOp) and isinstance(rest[0].left.op, ast.Sub) \
                and ast.dump(rest[0].left.right) == ast.dump(ast.Constant(1)):
            bound = col.bound(rest[0].left.left)  # x:x + (n - 1) * s + 1:s has n elements
        elif rest and ix.step is None:
            total = [col.bound(t) for t in rest]
            bound = None if None in total else sum(total)  # type: ignore[arg-type]
    return whole if bound is None else bound  # a slice past the tile's extent is reported, not clamped


def _matmul_problems(col: _Collector, call: ast.Call) -> list[str]:
    problems = []
    node = _kw(call, "dst")
    if isinstance(node, ast.Name):  # a whole tile: within one bank (views of PSUM tiles are checked at run time)
        for t in col.tiles.get(node.id, []):
            size = _product(t.dims[1:]) if len(t.dims) > 1 else None
            if size is None or size * _ITEMSIZE.get(t.dtype, 4) > PSUM_BANK_FMAX * 4:
                problems.append(f"line {call.lineno}: nisa.nc_matmul dst={t.name}{_fmt(t.dims)}: free bytes per "
                                f"partition not statically <= one {PSUM_BANK_FMAX * 4} B PSUM bank")
    limits = {"stationary": (PMAX, GEMM_STATIONARY_FMAX), "moving": (PMAX, GEMM_MOVING_FMAX)}
    for arg, (kmax, fmax) in limits.items():
        node = _kw(call, arg)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id in col.lists:
            # a view of a tile held in a list: tiles[i][a:b, ...]
            members = [t for name in col.lists[node.value.value.id] for t in col.tiles.get(name, [])]
            tiles = [Tile(t.name, call.lineno, _slice_dims(col, node, t.dims), t.buffer, t.dtype) for t in members]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and col.tiles.get(node.value.id):
            # a view of an allocated tile: its extents come from the slice bounds
            tiles = [Tile(node.value.id, call.lineno, _slice_dims(col, node, t.dims), t.buffer, t.dtype)
                     for t in col.tiles[node.value.id]]
        else:
            tiles = col.tiles.get(node.id, []) if isinstance(node, ast.Name) else []
        if not tiles:
            problems.append(f"line {call.lineno}: nisa.nc_matmul {arg}= is not a tile allocated in this kernel")
        for t in tiles:
            k, f = t.dims[0] if t.dims else None, _product(t.dims[1:]) if len(t.dims) > 1 else None
            if k is None or k > kmax or f is None or f > fmax:
                problems.append(f"line {call.lineno}: nisa.nc_matmul {arg}={t.name}{_fmt(t.dims)}: needs "
                                f"K <= {kmax} and free size (the product of the free dims) <= {fmax} statically")
    return problems
