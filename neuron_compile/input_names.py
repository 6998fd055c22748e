"""Graph inputs named as the user's code names them (Dynamo's sources: ``L['x']``, a module's parameter), for
messages: compile-time refusals and the run-time InputRangeError of a forward or inference graph."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from neuron_compile.errors import InputRangeError


def input_names(gm: fx.GraphModule) -> list[str]:
    """Per graph input, where Dynamo took it from (``L['x']``, ``G['c']``, a module's parameter), '' if unknown."""
    names = []
    for node in gm.graph.find_nodes(op="placeholder"):
        name = getattr(getattr(node.meta.get("grapharg"), "source", None), "name", None)
        try:
            name = name() if callable(name) else name  # a property, or a method in some torch versions
        except Exception:  # a source kind without a name
            name = None
        names.append(f"{name} " if isinstance(name, str) else "")
    return names


def naming_inputs(runner: Callable[..., Any], names: Sequence[str]) -> Callable[..., Any]:
    """``runner`` of a forward or inference graph (its inputs are Dynamo's, in order), whose InputRangeError names
    the offending input as the user's code does (``L['x']``) besides its position."""
    if not any(names):
        return runner

    def run(*args: Any) -> Any:
        try:
            return runner(*args)
        except InputRangeError as exc:
            # the very argument (not a same-shaped intermediate of an eager fallback's subgraph)
            at = next((j for j, a in enumerate(args[:len(names)]) if a is exc.tensor and names[j]), None)
            if at is None:
                raise
            named = InputRangeError(str(exc).replace(" input of the compiled graph (", f" input {names[at]}of the "
                                                     "compiled graph (", 1))
            named.tensor = exc.tensor
            raise named from None

    run.__dict__.update(runner.__dict__)  # neuron_constants, neuron_complex_io (the warm start reads them)
    return run
