"""CNN and diffusion blocks end to end: a ResNet-18-style network and a small UNet block, strict mode.

Inference (eval, BatchNorm folded into the conv epilogues) and one SGD training step (BatchNorm in training
mode, running statistics updated) through ``torch.compile(backend="neuron")``, compared with the same step
in eager PyTorch: outputs, loss, every gradient and every updated parameter / buffer.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cnn_helpers import close

from neuron_compile import backend as B

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from cnn_models import ResNetSmall, UNetSmall  # noqa: E402

log = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))


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


@pytest.mark.parametrize("target", ["trn1"])
def test_unet_on_other_targets(target: str) -> None:
    """The template kernels respect the oldest generation's rules too (NC-v2: bias tiles, fp32 PSUM matmuls)."""
    torch.manual_seed(0)
    model = UNetSmall()
    x, t = torch.randn(2, 3, 16, 16), torch.randn(2, 16)
    got = torch.compile(model, backend="neuron", dynamic=False, options={"target": target})(x, t)
    close(got, model(x, t), f"unet forward on {target}")
    got.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
