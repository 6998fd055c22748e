"""Matmul epilogue engines (codegen/render_matmul.py ``epilogue_engines``): PSUM readers on VectorE,
SBUF-only elementwise work balanced onto GpSimd, values unchanged."""

from __future__ import annotations

import re

import torch

from neuron_compile import backend
from neuron_compile.config import config


def test_residual_add_after_the_bias_add_runs_on_gpsimd_with_eager_values() -> None:
    torch.manual_seed(0)
    x, w, bias, r = torch.randn(256, 96), torch.randn(96, 640), torch.randn(640), torch.randn(256, 640)

    def f(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return r + (x @ w + bias)

    torch._dynamo.reset()
    with config.patch(cache=False, target="trn2"), torch.no_grad():
        got = torch.compile(f, backend="neuron", dynamic=False)(x, w, bias, r)
    torch.testing.assert_close(got, f(x, w, bias, r), rtol=1e-4, atol=1e-4)
    g = backend.compiled_graphs()[-1]
    (src,) = [s for name, s in g["sources"] if "mm" in name]
    tts = re.findall(r"nisa\.tensor_tensor\(.*", src)
    assert len(tts) == 2, tts
    # the bias add reads the PSUM accumulator: never GpSimd; the residual add reads SBUF tiles only
    (acc,) = re.findall(r"(\w+) = acc\[", src)  # the epilogue's name for the PSUM tile
    reads_psum = [t for t in tts if re.search(rf"data[12]={acc}\b", t)]
    assert len(reads_psum) == 1 and "gpsimd" not in reads_psum[0], tts
    assert any("engine=nisa.engine.gpsimd" in t for t in tts), tts
