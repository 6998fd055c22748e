"""Convolutions one conv kernel can't hold (lowering/decomp_bigconv.py): ViT/CLIP patch embeddings as a matmul of
the patches, other large kernels as sums over blocks of taps; forward and every gradient against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cnn_helpers import api_checker, check_grads, close, families, unsupported


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))


# (x shape, weight shape, stride, padding, dilation, groups): each too large for one conv kernel before this
PATCHES = [
    ((2, 3, 64, 64), (768, 3, 16, 16), 16),  # ViT-B/16 patch embedding
    ((1, 3, 70, 67), (192, 3, 16, 16), 16),  # rows and columns past the last whole patch
    ((2, 3, 64, 64), (64, 3, 32, 32), 32),  # ViT-B/32
    ((2, 4, 450), (256, 4, 200), 200),  # 1-D: two windows and a ragged tail
]
TAP_BLOCKS = [
    ((1, 8, 40, 40), (128, 8, 17, 17), 2, 3, 1, 1),  # large kernel with stride and padding
    ((1, 128, 30, 30), (128, 1, 15, 15), 1, 7, 1, 128),  # depthwise 15 x 15
    ((1, 4, 50, 50), (128, 4, 15, 15), 1, 4, 2, 1),  # dilated
    ((1, 64, 20, 20), (256, 32, 14, 14), 3, 5, 1, 2),  # grouped
    ((2, 3, 300), (128, 3, 300), 1, 10, 1, 1),  # 1-D: blocks of columns of the one kernel row
]


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, stride: Any, padding: Any = 0, dilation: Any = 1,
          groups: int = 1) -> torch.Tensor:
    conv = F.conv1d if x.dim() == 3 else F.conv2d
    return conv(x, w, b, stride, padding, dilation, groups)


def _args(xs: tuple[int, ...], ws: tuple[int, ...], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    fan_in = ws[1] * int(torch.tensor(ws[2:]).prod())
    return [torch.randn(xs).to(dtype), (torch.randn(ws) / fan_in ** 0.5).to(dtype), torch.randn(ws[0]).to(dtype)]


@pytest.mark.parametrize("case", PATCHES, ids=[f"patches_{i}" for i in range(len(PATCHES))])
def test_patch_embedding_is_a_matmul(case: tuple[Any, ...]) -> None:
    xs, ws, stride = case
    kernels = check_grads(lambda x, w, b: _conv(x, w, b, stride), *_args(xs, ws))
    assert "conv" not in families(kernels) and "conv_wgrad" not in families(kernels)
    assert families(kernels).count("matmul") >= 3  # forward, grad_input, grad_weight


@pytest.mark.parametrize("case", TAP_BLOCKS, ids=[f"blocks_{i}" for i in range(len(TAP_BLOCKS))])
def test_large_kernel_sums_blocks_of_taps(case: tuple[Any, ...]) -> None:
    xs, ws, stride, padding, dilation, groups = case
    kernels = check_grads(lambda x, w, b: _conv(x, w, b, stride, padding, dilation, groups), *_args(xs, ws))
    fam = families(kernels)
    assert fam.count("conv") >= 4 and fam.count("conv_wgrad") >= 2  # >= 2 blocks, each forward + both gradients


def test_bf16_patch_embedding_and_blocks() -> None:
    kernels = check_grads(lambda x, w, b: _conv(x, w, b, 32), *_args((2, 3, 64, 96), (256, 3, 32, 32), torch.bfloat16),
                          dtype=torch.bfloat16)
    assert "conv" not in families(kernels)
    check_grads(lambda x, w, b: _conv(x, w, b, 1, 7), *_args((1, 8, 24, 24), (128, 8, 15, 15), torch.bfloat16),
                dtype=torch.bfloat16)


class PatchEmbed(nn.Module):
    """A ViT's stem: patches, flattened tokens, a class token and position embeddings."""

    def __init__(self, size: int = 64, patch: int = 16, dim: int = 384) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.proj(x).flatten(2).transpose(1, 2)
        return self.norm(torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1) + self.pos)


def test_vit_stem_inference_and_training() -> None:
    torch.manual_seed(0)
    m = PatchEmbed()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        close(torch.compile(m, backend="neuron")(x), m(x), "eval")
    torch._dynamo.reset()
    ref = PatchEmbed()
    ref.load_state_dict(m.state_dict())
    torch.compile(m, backend="neuron")(x).square().mean().backward()
    ref(x).square().mean().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        close(p.grad, q.grad, f"grad of {name}")


def test_rendered_kernels_pass_the_api_checker() -> None:
    from neuron_compile import backend as B

    check_grads(lambda x, w, b: _conv(x, w, b, 2, 3), *_args((1, 8, 40, 40), (128, 8, 17, 17)))
    for g in B.compiled_graphs():
        for name, src in g["sources"]:
            assert api_checker().check_source_against_api(src) == [], name


def test_a_band_too_wide_for_all_kernel_rows_takes_one_row_at_a_time() -> None:
    """Three input rows of 9000 fp32 values exceed a kernel's SBUF budget, one row doesn't: blocks of one kernel row."""
    kernels = check_grads(lambda x, w, b: _conv(x, w, b, 1, 1), *_args((1, 3, 6, 9000), (4, 3, 3, 3)))
    assert families(kernels).count("conv") >= 6


def test_a_kernel_that_fits_stays_one_conv() -> None:
    kernels = check_grads(lambda x, w, b: _conv(x, w, b, 4), *_args((2, 3, 32, 32), (96, 3, 4, 4)))
    assert families(kernels).count("conv") == 2 and "matmul" not in families(kernels)


@pytest.mark.parametrize("xs,ws,stride,output_padding", [
    ((2, 96, 4, 5), (96, 128, 16, 16), 16, 0),  # tokens back to a feature map
    ((1, 64, 3, 3), (64, 128, 16, 16), 16, (5, 0)),  # output padding: those rows hold only the bias
    ((2, 32, 6), (32, 128, 300), 300, 7),  # 1-D
])
def test_unpatchify_is_a_matmul(xs: tuple[int, ...], ws: tuple[int, ...], stride: int, output_padding: Any) -> None:
    conv_t = F.conv_transpose1d if len(xs) == 3 else F.conv_transpose2d
    x, w = torch.randn(xs), torch.randn(ws) / ws[0] ** 0.5
    kernels = check_grads(lambda x, w, b: conv_t(x, w, b, stride, 0, output_padding), x, w, torch.randn(ws[1]))
    assert "conv" not in families(kernels) and "conv_wgrad" not in families(kernels)


@pytest.mark.parametrize("fn,xs,ws,why", [
    (lambda x, w: F.conv2d(x, w, padding=1), (1, 3, 4, 30000), (4, 3, 3, 3),  # a row too wide for even one tap
     "do not fit the SBUF budget of one kernel; split the input along its width"),
    (lambda x, w: F.conv_transpose2d(x, w, stride=8), (1, 64, 5, 5), (64, 128, 16, 16),  # not an unpatchify
     "transposed convolution with a 16x16 kernel: its weight taps do not fit the SBUF budget"),
])
def test_what_stays_too_large_is_refused_by_name(fn: Any, xs: tuple[int, ...], ws: tuple[int, ...], why: str) -> None:
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="neuron")(torch.randn(xs), torch.randn(ws))
    msg = str(unsupported(info.value))
    assert f"aten.convolution.default(float32{list(xs)}, float32{list(ws)}" in msg
    assert why in msg
