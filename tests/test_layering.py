"""One-way layering: the compile pipeline (the core) never imports the evaluation tools built on it.

The core is capture → lowering → codegen → cache → runtime, driven by ``neuron_compile.backend`` and
``neuron_compile.pipeline``, with the simulator, cost model and compile record. The tools (eager fallback,
numeric check mode, debug dumps, metrics reports, ``explain``, the CLIs) import from the core and attach to it
through hooks (``compile_record.add_finish_hook``, ``backend.set_partial_compiler``); ``neuron_compile.entry``
is where they are wired in. The test reads every ``import`` in every core module, function-level ones
included (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"lowering": "neuron_compile.lowering", "codegen": "neuron_compile.codegen", "cache": "neuron_compile.cache"}
TOOLS = {f"neuron_compile.{m}" for m in ("check", "debug", "fallback", "metrics", "explain", "evaluate_cli", "cli",
                                         "entry", "__main__")}
TOP = "neuron_compile"  # the package's facade: imports tools lazily to offer them (get_fallback_ops, explain)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    paths = [*ROOT.glob("neuron_compile/**/*.py"), *(p for d in PACKAGES for p in ROOT.glob(f"{d}/**/*.py"))]
    for path in paths:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[0] in PACKAGES:
            parts = PACKAGES[parts[0]].split(".") + parts[1:]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(TOP):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(TOP)}
    return out - {TOP}  # `from neuron_compile import x` names the submodule x, not the package facade


MODULES = _modules()
CORE = sorted(m for m in MODULES if m not in TOOLS and m != TOP)


def test_the_tools_exist() -> None:  # a renamed tool must be renamed here too, or the check below goes blind
    assert TOOLS <= set(MODULES), sorted(TOOLS - set(MODULES))
    assert {"neuron_compile.backend", "neuron_compile.pipeline", "neuron_compile.compile_record",
            "neuron_compile.codegen.render", "neuron_compile.lowering.graph", "neuron_compile.runtime"} <= set(CORE)


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_tool(module: str) -> None:
    wrong = sorted(_imports(MODULES[module], set(MODULES)) & TOOLS)
    assert not wrong, (f"{module} (core) imports {wrong}: the tools sit above the compile pipeline. Emit what "
                       "they need through neuron_compile.compile_record (add_finish_hook) or a registration "
                       "function the tool calls when imported (see neuron_compile.entry)")


def test_backend_and_its_pipeline_form_no_import_cycle() -> None:
    known = set(MODULES)
    graph = {m: _imports(p, known) for m, p in MODULES.items()}

    def reach(start: str) -> set[str]:
        seen, stack = set(), [start]
        while stack:
            for nxt in graph.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    for module in ("neuron_compile.backend", "neuron_compile.pipeline", "neuron_compile.compile_record",
                   "neuron_compile.runtime"):
        cycle = sorted(m for m in reach(module) if module in reach(m) and m != module)
        assert not cycle, f"{module} is in an import cycle with {cycle}"
