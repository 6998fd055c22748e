"""Small CNN and diffusion models: a ResNet-18-style classifier and a UNet block with GroupNorm, SiLU, a time
embedding, a strided conv, nearest upsampling and a transposed conv. Used by tests/backend/test_cnn_models.py and
benchmarks/cnn_compile.py; random init, no downloads."""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

log = logging.getLogger(__name__)


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
