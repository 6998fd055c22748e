"""Convolution lowerings against eager PyTorch: the implicit-GEMM conv kernel, its weight gradient and fusion.

Forward and backward (grad_input, grad_weight, grad_bias) through ``torch.compile(backend="neuron")`` on the
bundled simulator over the parameter grid (stride, padding incl. 'same', dilation, groups / depthwise, bias,
odd sizes, batch 1 and > 1, channels > 128 and not multiples of 128, 1x1), transposed convolutions
(output_padding, groups, dilation), bf16 autocast, channels_last inputs, an empty batch, the conv + BatchNorm
(eval) + activation + residual epilogue fusion. Rendered kernels use only current NKI names (3-D convolutions:
``test_conv3d.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cnn_helpers import api_checker, check_grads, close, families

from neuron_compile import backend as B

log = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))


# (N, C_in, H, W, C_out, kernel, stride, padding, dilation, groups, bias)
CONV2D = [
    (2, 4, 9, 9, 6, 3, 1, 1, 1, 1, True),
    (1, 3, 11, 7, 5, 3, 2, 1, 1, 1, False),
    (2, 4, 10, 10, 6, (3, 2), (2, 1), (0, 1), 1, 1, True),
    (2, 4, 9, 9, 6, 3, 1, 2, 2, 1, True),
    (2, 4, 8, 8, 8, 3, 1, 1, 1, 2, True),
    (2, 8, 9, 9, 8, 3, 2, 1, 1, 8, False),  # depthwise
    (2, 4, 9, 9, 8, 3, 1, 1, 1, 4, True),  # depthwise, channel multiplier 2
    (2, 6, 7, 7, 4, 1, 1, 0, 1, 1, True),  # 1x1
    (1, 130, 6, 6, 140, 3, 1, 1, 1, 1, True),  # channels > 128, not multiples of 128
    (2, 3, 17, 17, 8, 7, 2, 3, 1, 1, False),  # ResNet-stem-like
    (3, 5, 5, 5, 4, 5, 1, 0, 1, 1, True),  # kernel = input
]


@pytest.mark.parametrize("case", CONV2D, ids=[f"conv2d_{i}" for i in range(len(CONV2D))])
def test_conv2d_forward_backward(case: tuple[Any, ...]) -> None:
    n, cin, h, w, cout, k, stride, padding, dilation, groups, bias = case
    ks = k if isinstance(k, tuple) else (k, k)
    x = torch.randn(n, cin, h, w)
    weight = torch.randn(cout, cin // groups, *ks) / (cin // groups * ks[0] * ks[1]) ** 0.5
    args = [x, weight] + ([torch.randn(cout)] if bias else [])

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    kernels = check_grads(fn, *args)
    assert families(kernels).count("conv") == 2  # forward and grad_input
    assert families(kernels).count("conv_wgrad") == 1


@pytest.mark.parametrize("padding,k", [("same", 3), ("same", 4), ("valid", 3)])
def test_conv_padding_strings(padding: str, k: int) -> None:
    x, w = torch.randn(2, 3, 9, 8), torch.randn(4, 3, k, k)
    check_grads(lambda x, w: F.conv2d(x, w, padding=padding), x, w)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (3, 2, 1, 1), (2, 1, 2, 2), (1, 1, 1, 6)])
def test_conv1d(stride: int, padding: int, dilation: int, groups: int) -> None:
    x, w, b = torch.randn(3, 6, 20), torch.randn(12, 6 // groups, 4), torch.randn(12)
    check_grads(lambda x, w, b: F.conv1d(x, w, b, stride, padding, dilation, groups), x, w, b)


# (C_in, C_out, kernel, stride, padding, output_padding, dilation, groups)
CONVT = [
    (4, 3, 3, 2, 1, 1, 1, 1),
    (4, 6, 2, 3, 0, 0, 2, 2),
    (6, 6, 4, 2, 1, 0, 1, 6),  # depthwise upsampling
    (4, 5, 3, 1, 1, 0, 1, 1),
    (3, 4, 1, 3, 0, 2, 1, 1),  # kernel smaller than the stride: outputs that only get the bias
]


@pytest.mark.parametrize("case", CONVT, ids=[f"convT_{i}" for i in range(len(CONVT))])
def test_conv_transpose2d(case: tuple[int, ...]) -> None:
    cin, cout, k, stride, padding, out_pad, dilation, groups = case
    x, w, b = torch.randn(2, cin, 5, 6), torch.randn(cin, cout // groups, k, k), torch.randn(cout)
    kernels = check_grads(lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, out_pad, groups, dilation),
                          x, w, b)
    assert "conv_wgrad" in families(kernels)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conv_transpose_output_padding_past_the_stride(dims: int) -> None:
    """An output_padding of at least the stride (allowed up to the dilation) leaves the convolution running back
    over grad_output with more windows than the input has positions: the gradients are cut / padded to the input
    (eager's shapes; a shape error in the backward before)."""
    conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[dims - 1]
    first = 1 if dims == 1 else 0  # the 1-D case takes the second dim's geometry, the one with extra windows
    stride, padding, out_pad, dilation, k = ((3, 2, 2)[first:first + dims], (1, 2, 0)[first:first + dims],
                                             (2, 3, 1)[first:first + dims], (4, 4, 2)[first:first + dims],
                                             (4, 5, 2)[first:first + dims])
    x = torch.randn(2, 2, *[4] * dims)
    w = torch.randn(2, 2, *k)
    check_grads(lambda x, w, b: conv(x, w, b, stride, padding, out_pad, 2, dilation), x, w, torch.randn(4))


def test_conv_transpose1d() -> None:
    x, w = torch.randn(2, 4, 9), torch.randn(4, 3, 3)
    check_grads(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1), x, w)


@pytest.mark.parametrize("transposed", [False, True])
def test_bf16_autocast(transposed: bool) -> None:
    x = torch.randn(2, 16, 8, 8)
    if transposed:
        w = torch.randn(16, 8, 3, 3) / 12

        def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return F.conv_transpose2d(x, w, stride=2)
    else:
        w = torch.randn(24, 16, 3, 3) / 12

        def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return F.conv2d(x, w, padding=1)

    kernels = check_grads(fn, x, w, dtype=torch.bfloat16, autocast=True)
    conv = next(k for k in kernels if k.family == "conv")
    assert conv.compute_dtype == "bfloat16"


def test_channels_last_input() -> None:
    x = torch.randn(2, 8, 7, 7).to(memory_format=torch.channels_last)
    w = torch.randn(6, 8, 3, 3)
    check_grads(lambda x, w: F.conv2d(x, w, padding=1), x, w)


def test_empty_batch() -> None:
    x, w, b = torch.randn(0, 4, 7, 7), torch.randn(6, 4, 3, 3), torch.randn(6)
    got = torch.compile(lambda x, w, b: F.conv2d(x, w, b, padding=1), backend="neuron")(x, w, b)
    assert got.shape == (0, 6, 7, 7)


def test_empty_batch_weight_gradient_is_zero() -> None:
    x, w = torch.randn(0, 4, 7, 7), torch.randn(6, 4, 3, 3, requires_grad=True)
    out = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="neuron")(x, w)
    out.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_large_width_streams_rows() -> None:
    """A 40 x 300 plane of 140 channels exceeds the SBUF budget: stages hold a band of rows, not the plane."""
    x, w = torch.randn(1, 140, 40, 300), torch.randn(8, 140, 3, 3) / 30
    with torch.no_grad():
        got = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="neuron")(x, w)
    close(got, F.conv2d(x, w, padding=1), "wide conv")
    conv = next(k for g in B.compiled_graphs() for k in g["plan"].kernels if k.family == "conv")
    assert conv.block[1] < 40


# -- fusion ----------------------------------------------------------------------------------------------


class ConvBNAct(nn.Module):
    def __init__(self, c: int, act: Callable[[torch.Tensor], torch.Tensor], residual: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = act
        self.residual = residual
        self.bn.running_mean.normal_()
        self.bn.running_var.uniform_(0.5, 2.0)
        nn.init.normal_(self.bn.weight)
        nn.init.normal_(self.bn.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        return self.act(y + x if self.residual else y)


@pytest.mark.parametrize("act,residual", [(torch.relu, False), (torch.relu, True), (F.silu, False),
                                          (lambda t: F.hardtanh(t, 0.0, 6.0), False)])
def test_conv_bn_act_fuses_into_one_conv_kernel(act: Any, residual: bool) -> None:
    m = ConvBNAct(8, act, residual).eval()
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        got = torch.compile(m, backend="neuron")(x)
        want = m(x)
    close(got, want, "conv + bn + act")
    kernels = [k for g in B.compiled_graphs() for k in g["plan"].kernels]
    assert families(kernels).count("conv") == 1
    # everything after the conv is in its epilogue: the other kernels only fold the BatchNorm vectors ([C])
    assert all(k.family == "conv" or max(a.numel for a in k.outputs) <= 8 for k in kernels)
    conv = next(k for k in kernels if k.family == "conv")
    assert conv.evict[1] >= 0 and conv.evict[2] >= 0  # per-channel scale and shift at the eviction


def test_conv_bias_activation_scalar_epilogue() -> None:
    x, w, b = torch.randn(2, 4, 7, 7), torch.randn(6, 4, 3, 3), torch.randn(6)
    fn = lambda x, w, b: F.gelu(F.conv2d(x, w, b) * 0.5) - 1.0  # noqa: E731
    with torch.no_grad():
        got = torch.compile(fn, backend="neuron")(x, w, b)
    close(got, fn(x, w, b), "conv + bias + scale + gelu + sub")
    kernels = [k for g in B.compiled_graphs() for k in g["plan"].kernels]
    assert families(kernels).count("conv") == 1
    assert all(k.family == "conv" or max(a.numel for a in k.outputs) <= 6 for k in kernels)  # bias * 0.5 only


def test_conv_output_used_twice_is_not_fused() -> None:
    x, w = torch.randn(2, 4, 7, 7), torch.randn(6, 4, 3, 3)
    fn = lambda x, w: (lambda y: torch.relu(y) + y.sum())(F.conv2d(x, w))  # noqa: E731
    with torch.no_grad():
        got = torch.compile(fn, backend="neuron")(x, w)
    close(got, fn(x, w), "conv used twice")
    conv = next(k for g in B.compiled_graphs() for k in g["plan"].kernels if k.family == "conv")
    assert conv.evict[0] == "copy" and not conv.post


def test_rendered_conv_kernels_use_only_current_nki_api() -> None:
    checker = api_checker()
    x, w = torch.randn(2, 4, 9, 9, requires_grad=True), torch.randn(6, 2, 3, 3, requires_grad=True)
    torch.compile(lambda x, w: torch.relu(F.conv2d(x, w, stride=2, padding=1, groups=2)),
                  backend="neuron")(x, w).sum().backward()
    seen = set()
    for g in B.compiled_graphs():
        for (name, src), k in zip(g["sources"], g["plan"].kernels, strict=True):
            seen.add(k.family)
            assert checker.check_source_against_api(src) == [], name
    assert {"conv", "conv_wgrad"} <= seen


@pytest.mark.parametrize("cin,k,stride,padding,dilation", [(3, 7, 2, 3, 1), (2, 3, 2, 0, 2), (5, 5, 1, 2, 1)])
def test_few_input_channels_pack_taps_onto_partitions(cin: int, k: int, stride: int, padding: int,
                                                      dilation: int) -> None:
    """A stem-like conv (C_in x KW <= 128): taps are packed onto partitions (an SBUF im2col through a padded
    HBM scratch), so each matmul contracts over kernel rows x KW x C_in instead of C_in. The cost model chooses it
    when it is faster: at 41 x 37 by 10-60% here; below ~32 x 32 the scratch's extra DMA round trip costs more
    than the matmuls it saves (the scheduling model charges DMA latency and dependencies)."""
    x, w = torch.randn(2, cin, 41, 37), torch.randn(8, cin, k, k) / k
    kernels = check_grads(lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation), x, w)
    forward = next(kk for kk in kernels if kk.family == "conv")
    assert forward.tap_rows > 0


def test_float16_and_unbatched_inputs() -> None:
    x, w = torch.randn(2, 4, 9, 9).half(), torch.randn(6, 4, 3, 3).half() / 6
    with torch.no_grad():
        got = torch.compile(lambda x, w: F.conv2d(x, w, padding=1), backend="neuron")(x, w)
    torch.testing.assert_close(got.float(), F.conv2d(x, w, padding=1).float(), rtol=4e-3, atol=4e-3)
    torch._dynamo.reset()
    check_grads(lambda x, w: F.conv_transpose2d(x, w, stride=2), torch.randn(4, 5, 5), torch.randn(4, 3, 3, 3))


def test_weight_gradient_of_a_permuted_gradient_matches_eager() -> None:
    """The gradient reaching conv_weight_grad is a permuted view that needs a copy first (a depth-folded video
    layout): the copy kernel and the weight-gradient kernel are two kernels with their own indices (the second
    was once called with the copy's index and arguments)."""
    x, w = torch.randn(6, 4, 8, 8), torch.randn(5, 4, 3, 3)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, w, padding=1).reshape(2, 3, 5, 8, 8).permute(0, 2, 1, 3, 4)
        return y.relu()

    w_got, w_want = w.clone().requires_grad_(), w.clone().requires_grad_()
    got = torch.compile(fn, backend="neuron", dynamic=False)(x, w_got)
    want = fn(x, w_want)
    close(got, want, "forward")
    grad = torch.randn_like(want)
    got.backward(grad)
    want.backward(grad)
    close(w_got.grad, w_want.grad, "grad_weight")
