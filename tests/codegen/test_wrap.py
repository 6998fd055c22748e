"""The frame around a rendered kernel body: its syntax check, once per distinct kernel, and its error."""

from __future__ import annotations

import pytest
import torch
from neuron_compile.codegen import render
from neuron_compile.lowering.graph import GraphLowering
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.errors import TemplateRenderError


def _kernels(n_layers: int) -> list:
    def f(x: torch.Tensor) -> tuple[torch.Tensor]:
        for _ in range(n_layers):  # identical kernels, one per "layer"
            x = torch.sigmoid(x.sin()).cumsum(0)
        return (x,)

    x = torch.randn(4, 8)
    return list(GraphLowering(make_fx(f)(x), [x]).run().kernels)


def test_identical_kernels_are_syntax_checked_once() -> None:
    kernels = _kernels(3)
    names = [k.name for k in kernels]
    assert len(set(names)) == len(names) >= 6
    render._check_syntax.cache_clear()
    sources = [render.render_kernel(k) for k in kernels]
    info = render._check_syntax.cache_info()
    assert (info.misses, info.hits) == (2, len(kernels) - 2)  # the elementwise and the scan kernel
    for k, src in zip(kernels, sources, strict=True):
        assert f"def {k.name}(" in src


def test_invalid_python_names_the_kernel_and_line() -> None:
    kernel = _kernels(1)[0]
    with pytest.raises(TemplateRenderError) as info:
        render._wrap(kernel, "    x = (1,")
    message = str(info.value)
    assert message.startswith(f"template {kernel.family}.nki.j2 rendered invalid Python for kernel {kernel.name} at "
                              "line ")
    assert "x = (1," in message
    with pytest.raises(TemplateRenderError):  # a failure is not remembered as a success
        render._wrap(kernel, "    x = (1,")
