"""Static check of NKI kernel source against the public NKI 0.6 API of :mod:`neuron_compile.nki_api`.

:func:`check_source_against_api` parses kernel source text with :mod:`ast`, resolves the names bound
by ``import nki`` / ``import nki.language as nl`` / ``import nki.isa as nisa`` (and the ``from nki
import ...`` forms), and reports every ``nki.X`` / ``nl.X`` / ``nisa.X`` attribute (including nested
ones such as ``nl.tile_size.pmax`` and ``nisa.engine.vector``) and every keyword argument of an API
call that is not a public, non-removed, non-deprecated name of NKI 0.6. Input: source text; output:
a list of human-readable problems (empty when the source is clean). Used by the code generator's
tests, the simulator's tests and the conformance suite; the API listing ships with the package.
"""

from __future__ import annotations

import ast
import functools
import logging
from dataclasses import dataclass, field

from neuron_compile.nki_api import api

log = logging.getLogger(__name__)

_SUBMODULES = {"language": "nki.language", "isa": "nki.isa", "collectives": "nki.collectives",
               "typing": "nki.typing"}
# Modules that re-export another module's names (``from nki.isa.constants import dge_mode``).
_REEXPORTS = {"nki.isa.constants": "nki.isa"}
# Method names of NkiTensor / NkiInstruction whose keyword arguments are checked even though the
# receiver's type is unknown statically (these names are distinctive enough in kernel source).
_METHOD_OWNERS = ("NkiTensor", "NkiInstruction")
# Keyword arguments whose value must be an API constant, never a string/int literal (rejected since 0.3.0).
_ENUM_KEYWORDS = {"buffer", "engine", "dge_mode", "oob_mode", "reduce_cmd", "perf_mode", "dma_engine"}


@dataclass(frozen=True)
class _Entry:
    module: str
    qualname: str
    kind: str
    deprecated: bool
    note: str
    params: tuple[str, ...] | None  # None: not callable / unknown
    var_keyword: bool
    var_positional: bool
    positional_limit: int
    kwargs_notes: tuple[tuple[str, str], ...] = ()
    alias_of: str = ""


@dataclass
class _ApiIndex:
    entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    methods: dict[str, _Entry] = field(default_factory=dict)
    removed_hints: dict[str, str] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)


@functools.lru_cache(maxsize=1)
def _load_index() -> _ApiIndex:
    data = api()
    index = _ApiIndex()
    for raw in data["entries"]:
        params: tuple[str, ...] | None = None
        var_kw = var_pos = False
        limit = 0
        if raw["params"] is not None:
            names = []
            for name, kind, _default in raw["params"]:
                if kind == "var_keyword":
                    var_kw = True
                elif kind == "var_positional":
                    var_pos = True
                else:
                    names.append(name)
                    if kind in ("positional_only", "positional_or_keyword"):
                        limit += 1
            params = tuple(names)
        entry = _Entry(
            module=raw["module"],
            qualname=raw["qualname"],
            kind=raw["kind"],
            deprecated=raw["deprecated"] is not None,
            note=raw["deprecated"] or "",
            params=params,
            var_keyword=var_kw,
            var_positional=var_pos,
            positional_limit=limit,
            kwargs_notes=tuple(sorted(raw["kwargs_notes"].items())),
            alias_of=str(raw["alias_of"] or ""),
        )
        index.entries[(entry.module, entry.qualname)] = entry
        if "." not in entry.qualname:
            index.modules.add(entry.module)
    for (_module, qualname), entry in index.entries.items():
        owner, _, meth = qualname.partition(".")
        if owner in _METHOD_OWNERS and meth:
            if entry.alias_of:
                entry = index.entries.get((entry.module, entry.alias_of), entry)
            index.methods[meth] = entry
    for item in data["removed"]:
        index.removed_hints[item["name"]] = f"{item['status']}; use {item['use']}"
    return index


def _removed_hint(index: _ApiIndex, needle: str) -> str:
    for name, hint in index.removed_hints.items():
        if needle in name:
            return f" ({name}: {hint})"
    return ""


def _entry_problem(entry: _Entry, dotted: str) -> str | None:
    if entry.deprecated:
        return f"{dotted}: deprecated in NKI 0.6" + (f" ({entry.note})" if entry.note else "")
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, index: _ApiIndex) -> None:
        self.index = index
        self.problems: list[tuple[int, str]] = []
        # local name -> module ("nki", "nki.language", ...) or "module:qualname" for from-imports
        self.aliases: dict[str, str] = {}

    def _report(self, node: ast.AST, message: str) -> None:
        line = int(getattr(node, "lineno", 0))
        self.problems.append((line, f"line {line}: {message}"))

    # imports -----------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            name = alias.name
            if name.split(".")[0] == "neuronxcc":
                self._report(node, f"import {name}: legacy API{_removed_hint(self.index, 'neuronxcc')}")
                continue
            if name.split(".")[0] != "nki":
                continue
            if alias.asname is None:
                self.aliases["nki"] = "nki"
                if name != "nki":
                    self._check_module_path(node, name)
            elif self._check_module_path(node, name):
                self.aliases[alias.asname] = _REEXPORTS.get(name, name)

    def _check_module_path(self, node: ast.AST, name: str) -> bool:
        if name == "nki" or name in self.index.modules:
            return True
        self._report(node, f"module {name} is not a public NKI 0.6 module")
        return False

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] == "neuronxcc":
            self._report(
                node, f"from {module} import ...: legacy API{_removed_hint(self.index, 'neuronxcc')}"
            )
            return
        if module.split(".")[0] != "nki" or not self._check_module_path(node, module):
            return
        module = _REEXPORTS.get(module, module)
        for alias in node.names:
            local = alias.asname or alias.name
            if module == "nki" and alias.name in _SUBMODULES:
                self.aliases[local] = _SUBMODULES[alias.name]
                continue
            entry = self.index.entries.get((module, alias.name))
            if entry is None:
                hint = _removed_hint(self.index, alias.name)
                self._report(node, f"{module}.{alias.name}: not a public name of NKI 0.6{hint}")
                continue
            problem = _entry_problem(entry, f"{module}.{alias.name}")
            if problem:
                self._report(node, problem)
            self.aliases[local] = f"{module}:{alias.name}"

    # attribute chains ----------------------------------------------------------------------------
    def _chain(self, node: ast.expr) -> list[str] | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            parts.append(node.id)
            return parts[::-1]
        return None

    def _resolve(self, node: ast.AST, chain: list[str]) -> _Entry | None:
        """Check an alias-rooted attribute chain; return the API entry it names (if any)."""
        target = self.aliases.get(chain[0])
        if target is None:
            return None
        if ":" in target:  # a from-imported API name used as a root, e.g. `engine.vector`
            module, qual = target.split(":", 1)
            rest = chain[1:]
        else:
            module, qual, rest = target, "", chain[1:]
            if module == "nki" and rest and rest[0] in _SUBMODULES:
                module, rest = _SUBMODULES[rest[0]], rest[1:]
            if not rest:
                return None  # the module object itself
            qual, rest = rest[0], rest[1:]
            if module == "nki.isa" and qual == "constants":  # nisa.constants.X re-exports nisa.X
                if not rest:
                    return None
                qual, rest = rest[0], rest[1:]
        dotted = f"{module}.{qual}"
        if qual.startswith("_"):
            self._report(node, f"{dotted}: private name, not public API")
            return None
        entry = self.index.entries.get((module, qual))
        if entry is None:
            self._report(node, f"{dotted}: not a public name of NKI 0.6{_removed_hint(self.index, qual)}")
            return None
        problem = _entry_problem(entry, dotted)
        if problem:
            self._report(node, problem)
        if not rest:
            return entry
        owner = qual
        if entry.kind == "constant" and qual == "tile_size":
            owner = "_TileSize"
        elif entry.kind not in ("enum", "class"):
            return None  # attribute of a value (e.g. a dtype): not described by the API listing
        sub = self.index.entries.get((module, f"{owner}.{rest[0]}"))
        if sub is None:
            self._report(node, f"{dotted}.{rest[0]}: not a public name of NKI 0.6")
            return None
        problem = _entry_problem(sub, f"{dotted}.{rest[0]}")
        if problem:
            self._report(node, problem)
        return sub

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = self._chain(node)
        if chain is not None and chain[0] in self.aliases:
            self._resolve(node, chain)
            return
        self.generic_visit(node)

    # calls ---------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        entry: _Entry | None = None
        func = node.func
        chain = self._chain(func)
        label = ".".join(chain) if chain else "<call>"
        if chain is not None and chain[0] in self.aliases:
            if len(chain) == 1:
                target = self.aliases[chain[0]]
                if ":" in target:
                    module, qual = target.split(":", 1)
                    entry = self.index.entries.get((module, qual))
            else:
                entry = self._resolve(func, chain)
        else:
            self.visit(func)
            if isinstance(func, ast.Attribute) and func.attr in self.index.methods:
                entry = self.index.methods[func.attr]
                label = f"NkiTensor-like .{func.attr}"
        if entry is not None and entry.params is not None:
            self._check_arguments(node, entry, label)
        for arg in node.args:
            self.visit(arg)
        for kw in node.keywords:
            self.visit(kw.value)

    def _check_arguments(self, node: ast.Call, entry: _Entry, label: str) -> None:
        assert entry.params is not None
        n_positional = sum(1 for a in node.args if not isinstance(a, ast.Starred))
        if not entry.var_positional and n_positional > entry.positional_limit:
            self._report(
                node, f"{label}: {n_positional} positional arguments, at most {entry.positional_limit}"
            )
        notes = dict(entry.kwargs_notes)
        for kw in node.keywords:
            if kw.arg is None:
                self._report(node, f"{label}: **mapping keyword arguments cannot be checked")
                continue
            if kw.arg in notes:
                self._report(node, f"{label}({kw.arg}=...): {notes[kw.arg]}")
            elif kw.arg not in entry.params and not entry.var_keyword:
                hint = _removed_hint(self.index, f"{kw.arg}=")
                self._report(node, f"{label}: keyword {kw.arg}= is not a parameter of {entry.qualname}{hint}")
            if kw.arg == "engine" and entry.qualname == "dma_copy" and not _hwdge(node):
                self._report(node, f"{label}(engine=...): only valid with dge_mode=nisa.dge_mode.hwdge (the engine "
                                   "names the sequencer driving the hardware DGE)")
            if kw.arg in _ENUM_KEYWORDS and isinstance(kw.value, ast.Constant) and kw.value.value is not None:
                self._report(
                    node,
                    f"{label}({kw.arg}={kw.value.value!r}): literal strings/ints for enums are rejected since "
                    f"0.3.0; use the nl./nisa. constant",
                )


def _hwdge(call: ast.Call) -> bool:
    """Whether ``call`` passes ``dge_mode=<...>.hwdge``."""
    return any(kw.arg == "dge_mode" and isinstance(kw.value, ast.Attribute) and kw.value.attr == "hwdge"
               for kw in call.keywords)


def check_source_against_api(source: str) -> list[str]:
    """Return the problems found in NKI kernel ``source`` (empty list when it only uses current API)."""
    checker = _Checker(_load_index())
    checker.visit(ast.parse(source))
    return [message for _line, message in sorted(checker.problems, key=lambda item: item[0])]
