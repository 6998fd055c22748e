"""The ATen graphs the backend receives, for benchmarks and tests that lower kernels without running them.

``aten_graphs(fn, *inputs)`` compiles ``fn`` with Dynamo + AOTAutograd and this package's decomposition
table (as ``backend="neuron"`` does, inference mode) and returns every forward graph with its example
inputs. The captured graphs run eagerly, or, with ``execute=False``, return empty tensors of the right
shapes and strides (for models whose eager run would dominate the measurement).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def aten_graphs(fn: Callable[..., Any], *inputs: Any, execute: bool = True
                ) -> list[tuple[torch.fx.GraphModule, list[Any]]]:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from neuron_compile.lowering.decompositions import decompositions

    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def fw(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append((gm, list(example_inputs)))
        if execute:
            return make_boxed_func(gm.forward)
        (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in out_node.args[0]]

        def empty(args: list[Any]) -> list[Any]:
            args.clear()
            return [torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype)
                    if isinstance(v, torch.Tensor) else v for v in vals]

        empty._boxed_call = True  # type: ignore[attr-defined]
        return empty

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=fw, decompositions=decompositions(), keep_inference_input_mutations=False)
    with torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=False)(*inputs)
    return graphs
