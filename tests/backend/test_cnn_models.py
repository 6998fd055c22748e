"""CNN and diffusion blocks end to end: a ResNet-18-style network and a small UNet block, strict mode.

Inference (eval, BatchNorm folded into the conv epilogues) and one SGD training step (BatchNorm in training
mode, running statistics updated) through ``torch.compile(backend="neuron")``, compared with the same step
in eager PyTorch: outputs, loss, every gradient and every updated parameter / buffer.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cnn_helpers import close

from neuron_compile import backend as B

log = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNetSmall(nn.Module):
    """ResNet-18's structure at toy width: 7x7/2 stem, BN, ReLU, 3x3/2 max pool, basic blocks (one downsampling
    with a 1x1 projection), adaptive average pool, linear head."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.layer1 = BasicBlock(width, width, 1)
        self.layer2 = BasicBlock(width, 2 * width, 2)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.stem(x))), 3, 2, 1)
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class ResBlock(nn.Module):
    """A diffusion-UNet residual block: GroupNorm, SiLU, conv, time-embedding add, GroupNorm, SiLU, conv, skip."""

    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(t))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class UNetSmall(nn.Module):
    """Down (strided conv), middle residual block, up (nearest upsample + conv, and a transposed conv), skip."""

    def __init__(self, c: int = 8, tdim: int = 16) -> None:
        super().__init__()
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.block1 = ResBlock(c, c, tdim)
        self.down = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.mid = ResBlock(2 * c, 2 * c, tdim)
        self.up_conv = nn.Conv2d(2 * c, c, 3, padding=1)
        self.up_t = nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1)
        self.block2 = ResBlock(2 * c, c, tdim)
        self.out = nn.Sequential(nn.GroupNorm(4, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h1 = self.block1(self.inp(x), t)
        m = self.mid(self.down(h1), t)
        up = self.up_conv(F.interpolate(m, scale_factor=2, mode="nearest")) + self.up_t(m)
        return self.out(self.block2(torch.cat([up, h1], 1), t))


def _randomize_bn(model: nn.Module) -> None:
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.normal_(0, 0.2)
            mod.running_var.uniform_(0.5, 2.0)
            nn.init.normal_(mod.weight, 1.0, 0.2)
            nn.init.normal_(mod.bias, 0.0, 0.2)


def _train_step(model: nn.Module, step: Callable[[nn.Module], torch.Tensor]) -> torch.Tensor:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    loss = step(model)
    loss.backward()
    opt.step()
    return loss.detach()


def _compare_training(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor],
                      compiled_loss_fn: Callable[[nn.Module], torch.Tensor]) -> None:
    eager = copy.deepcopy(model)
    got = _train_step(model, compiled_loss_fn)
    want = _train_step(eager, loss_fn)
    close(got, want, "loss")
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        close(p.grad, q.grad, f"grad of {name}")
        close(p.detach(), q.detach(), f"updated {name}")
    for (name, b), (_, c) in zip(model.named_buffers(), eager.named_buffers(), strict=True):
        if b.is_floating_point():
            close(b, c, f"buffer {name}")
        else:
            assert torch.equal(b, c), name


def test_resnet_inference_folds_batchnorm() -> None:
    torch.manual_seed(0)
    model = ResNetSmall()
    _randomize_bn(model)
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        got = torch.compile(model, backend="neuron", dynamic=False)(x)
        want = model(x)
    close(got, want, "resnet logits")
    kernels = [k for g in B.compiled_graphs() for k in g["plan"].kernels]
    convs = [k for k in kernels if k.family == "conv"]
    assert len(convs) == 6  # stem, 2 + 2 block convs, 1 projection: each with its BN (and ReLU) folded in
    assert all(k.evict[1] >= 0 for k in convs)  # BatchNorm scale applied at the PSUM eviction


def test_resnet_training_step() -> None:
    torch.manual_seed(0)
    model = ResNetSmall()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    compiled = torch.compile(model, backend="neuron", dynamic=False)

    def loss(m: nn.Module) -> torch.Tensor:
        return F.cross_entropy(m(x), y)

    _compare_training(model, loss, lambda m: F.cross_entropy(compiled(x), y))


def test_unet_block_inference_and_training_step() -> None:
    torch.manual_seed(0)
    model = UNetSmall()
    x, t, target = torch.randn(2, 3, 16, 16), torch.randn(2, 16), torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    with torch.no_grad():
        close(compiled(x, t), model(x, t), "unet forward")
    _compare_training(model, lambda m: F.mse_loss(m(x, t), target), lambda m: F.mse_loss(compiled(x, t), target))


def test_unet_bf16_autocast_forward() -> None:
    torch.manual_seed(0)
    model = UNetSmall()
    x, t = torch.randn(2, 3, 16, 16), torch.randn(2, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = torch.compile(model, backend="neuron", dynamic=False)(x, t)
        want = model(x, t)
    assert got.dtype == want.dtype
    # bf16 rounds every layer differently in a fused kernel than eager's per-op rounding: compare loosely
    torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2 * want.float().abs().max().item())
