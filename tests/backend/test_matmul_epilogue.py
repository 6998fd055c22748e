"""Matmul epilogue engines (codegen/render_matmul.py ``epilogue_engines``): PSUM readers on VectorE,
SBUF-only elementwise work balanced onto GpSimd, values unchanged."""

from __future__ import annotations

import re

import pytest
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
    # the add reading the PSUM accumulator: never GpSimd; the residual + bias add (once per row group, SBUF tiles
    # only) on GpSimd
    (acc,) = re.findall(r"(\w+) = acc\[", src)  # the epilogue's name for the PSUM tile
    reads_psum = [t for t in tts if re.search(rf"data[12]={acc}\b", t)]
    assert len(reads_psum) == 1 and "gpsimd" not in reads_psum[0], tts
    assert any("engine=nisa.engine.gpsimd" in t for t in tts), tts


def test_residual_and_bias_add_once_per_row_group_ragged_bf16() -> None:
    """``r + (x @ w + b)`` as ``acc + (r + b)``: ``r + b`` per row group (fp32, GpSimd, a ragged last group of 72
    rows), then one VectorE add per tile reading the accumulator; bf16 results as eager's within bf16 rounding."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(200, 96, generator=g).to(torch.bfloat16), torch.randn(96, 640, generator=g).to(torch.bfloat16)
    bias, r = torch.randn(640, generator=g).to(torch.bfloat16), torch.randn(200, 640, generator=g).to(torch.bfloat16)

    def f(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return r + (x @ w + bias)

    torch._dynamo.reset()
    with config.patch(cache=False, target="trn2"), torch.no_grad():
        got = torch.compile(f, backend="neuron", dynamic=False)(x, w, bias, r)
    want = r.float() + (x.float() @ w.float() + bias.float())
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)
    (src,) = [s for name, s in backend.compiled_graphs()[-1]["sources"] if "mm" in name]
    pre = re.findall(r"nisa\.tensor_tensor\(dst=(\w+)b_grp\[0:Q, .*data1=(\w+)_grp\[0:Q.*engine=nisa\.engine\.gpsimd\)", src)
    assert len(pre) == 1 and pre[0][0] == pre[0][1], src
    (acc,) = re.findall(r"(\w+) = acc\[", src)
    assert re.search(rf"nisa\.tensor_tensor\(dst=\w+, data1={acc}, data2={pre[0][0]}b, op=nl\.add\)", src), src


CHAINS_READING_TWICE = {
    "mm_square": (lambda a, b: (lambda h: h * h)(a @ b), ((48, 32), (32, 64))),
    "mm_square_plus": (lambda a, b: (lambda h: h * h + h)(a @ b), ((48, 32), (32, 64))),
    "linear_square_sum": (lambda a, w, c: (lambda h: (h * h).sum(-1))(torch.nn.functional.linear(a, w, c)),
                          ((16, 32), (40, 32), (40,))),
    "bmm_square": (lambda a, b: (lambda h: h * h)(torch.bmm(a, b)), ((3, 16, 32), (3, 32, 24))),
    "conv_square_plus": (lambda x, w: (lambda h: h * h + h)(torch.nn.functional.conv2d(x, w, padding=1)),
                         ((2, 8, 10, 10), (16, 8, 3, 3))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(CHAINS_READING_TWICE))
def test_an_epilogue_reading_the_product_twice_matches_eager(name: str, dtype: torch.dtype) -> None:
    """``h * h`` after a matmul / conv: an engine instruction takes at most one PSUM operand (the simulator
    rejects two), so the sum is evicted before the square; a conv's fused epilogue stops before it."""
    fn, shapes = CHAINS_READING_TWICE[name]
    g = torch.Generator().manual_seed(7)
    args = [torch.randn(*s, generator=g).to(dtype) for s in shapes]
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(fn, backend="neuron", dynamic=False)(*args)
    want = fn(*[a.float() for a in args]).to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()))
