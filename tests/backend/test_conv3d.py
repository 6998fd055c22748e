"""3-D convolutions and max pooling (lowering/decomp_conv3d.py) against eager PyTorch.

Forward and backward through ``torch.compile(backend="neuron")`` on the simulator: conv3d over a geometry grid
(stride, padding incl. 'same', dilation, groups, bias, 1x1x1, the patchify convolution of video transformers),
conv_transpose3d (output_padding, dilation, groups), bf16 autocast; max_pool3d's values *and indices* equal to
eager's (padding, dilation, ceil_mode, ties, NaN and -inf inputs, unbatched) and its gradient; adaptive max
pooling (divisible and not); and a small 3-D CNN's training step.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cnn_helpers import check_grads, families

CONV3D = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(2, 1, 3), padding=(1, 2, 0), dilation=(2, 1, 1)),
    dict(padding="same", dilation=(1, 2, 1)),
    dict(groups=2, stride=(1, 2, 2), padding=(0, 1, 1)),
]


@pytest.mark.parametrize("kw", CONV3D, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_conv3d_matches_eager_forward_and_backward(kw: dict[str, Any]) -> None:
    groups = kw.get("groups", 1)
    x, w, b = torch.randn(2, 4, 5, 6, 7), torch.randn(6, 4 // groups, 3, 3, 2), torch.randn(6)
    kernels = check_grads(lambda x, w, b: F.conv3d(x, w, b, **kw), x, w, b)
    assert "conv" in families(kernels)


def test_conv3d_pointwise_and_patchify() -> None:
    """A 1x1x1 convolution (channel mixing) and the tubelet embedding of VideoMAE / Qwen2-VL (kernel = stride)."""
    check_grads(lambda x, w: F.conv3d(x, w), torch.randn(2, 5, 3, 4, 6), torch.randn(7, 5, 1, 1, 1))
    check_grads(lambda x, w, b: F.conv3d(x, w, b, stride=(2, 4, 4)).flatten(2).transpose(1, 2),
                torch.randn(2, 3, 4, 8, 12), torch.randn(16, 3, 2, 4, 4), torch.randn(16))


CONV_T3D = [
    dict(),
    dict(stride=2, padding=1, output_padding=1),
    dict(stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 0), dilation=(1, 2, 1)),
    dict(stride=(3, 2, 1), padding=(0, 1, 1), dilation=(2, 1, 2), groups=2),
]


@pytest.mark.parametrize("kw", CONV_T3D, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_conv_transpose3d_matches_eager_forward_and_backward(kw: dict[str, Any]) -> None:
    groups = kw.get("groups", 1)
    x, w, b = torch.randn(2, 4, 3, 4, 5), torch.randn(4, 6 // groups, 3, 2, 3), torch.randn(6)
    check_grads(lambda x, w, b: F.conv_transpose3d(x, w, b, **kw), x, w, b)


def test_conv3d_bf16_autocast() -> None:
    x, w, b = torch.randn(2, 4, 4, 6, 6), torch.randn(8, 4, 3, 3, 3) / 6, torch.randn(8)
    check_grads(lambda x, w, b: F.conv3d(x, w, b, padding=1), x, w, b, dtype=torch.bfloat16, autocast=True)


MAX_POOL3D = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3, 2), stride=(2, 1, 3), padding=(1, 1, 0), dilation=(2, 1, 1), ceil_mode=True),
    dict(kernel_size=(3, 1, 1), stride=1, padding=(1, 0, 0)),  # a temporal-only window
    dict(kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1), ceil_mode=True),
]


def _pool_inputs() -> dict[str, torch.Tensor]:
    x = torch.randn(2, 3, 6, 7, 8)
    special = x.clone()
    special[0, 0, 1, 2, 3] = float("nan")
    special[1, 1, 2:4, 2, 2] = float("nan")  # two NaNs in one window: eager picks the last in scan order
    special[0, 2] = float("-inf")  # windows of -inf only: the first position inside the input
    ties = torch.randint(-2, 3, x.shape).float()  # many equal maxima (and zeros after a ReLU)
    return {"random": x, "nan_inf": special, "ties": ties}


@pytest.mark.parametrize("kw", MAX_POOL3D, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_max_pool3d_values_and_indices_equal_eager(kw: dict[str, Any]) -> None:
    fn = torch.compile(lambda x: F.max_pool3d(x, return_indices=True, **kw), backend="neuron", dynamic=False)
    for name, x in _pool_inputs().items():
        got, want = fn(x), F.max_pool3d(x, return_indices=True, **kw)
        torch.testing.assert_close(got[0], want[0], equal_nan=True, rtol=0, atol=0, msg=name)
        assert torch.equal(got[1], want[1]), name


@pytest.mark.parametrize("kw", MAX_POOL3D[:3], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_max_pool3d_gradient_goes_to_eagers_argmax(kw: dict[str, Any]) -> None:
    inputs = _pool_inputs()
    check_grads(lambda x: F.max_pool3d(x, **kw), inputs["random"])
    check_grads(lambda x: F.max_pool3d(x.relu(), **kw), inputs["ties"])  # ties: exactly eager's positions


def test_max_pool3d_unbatched() -> None:
    x = torch.randn(3, 5, 6, 7)
    got = torch.compile(lambda x: F.max_pool3d(x, 2, return_indices=True), backend="neuron")(x)
    want = F.max_pool3d(x, 2, return_indices=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check_grads(lambda x: F.max_pool3d(x, 3, 2, 1), x)


@pytest.mark.parametrize("size", [(3, 4, 3), (6, 7, 8), (1, 1, 1), (4, 3, 5)])
def test_adaptive_max_pool3d_equals_eager(size: tuple[int, int, int]) -> None:
    fn = torch.compile(lambda x: F.adaptive_max_pool3d(x, size, return_indices=True), backend="neuron",
                       dynamic=False)
    for name, x in _pool_inputs().items():
        got, want = fn(x), F.adaptive_max_pool3d(x, size, return_indices=True)
        torch.testing.assert_close(got[0], want[0], equal_nan=True, rtol=0, atol=0, msg=name)
        assert torch.equal(got[1], want[1]), name
    check_grads(lambda x: F.adaptive_max_pool3d(x.relu(), size), _pool_inputs()["ties"])


class Video3dNet(nn.Module):
    """A small 3-D CNN of the R3D / 3-D U-Net kind: conv + BatchNorm + ReLU, max pool, a strided conv, a
    transposed conv back up, global average pool and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1, bias=False), nn.BatchNorm3d(8), nn.ReLU())
        self.pool = nn.MaxPool3d((1, 2, 2))
        self.down = nn.Conv3d(8, 16, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose3d(16, 8, 2, stride=2)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(self.stem(x))
        h = self.up(F.relu(self.down(h))) + h
        return self.head(F.adaptive_avg_pool3d(h, 1).flatten(1))


def test_video_cnn_training_step_matches_eager() -> None:
    torch.manual_seed(0)
    model = Video3dNet()
    ref = Video3dNet()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 4, 8, 8)
    got = torch.compile(model, backend="neuron", dynamic=False)(x)
    want = ref(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
    torch.testing.assert_close(model.stem[1].running_mean, ref.stem[1].running_mean)
