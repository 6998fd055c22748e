"""Backward ops lowered as the traced vjp of their forward's decomposition (lowering/decomp_vjp.py).

grid_sampler_2d/3d_backward (spatial transformers, deformable attention, volumetric warps) in every interpolation
and padding mode, and replication padding's backward with cropping (negative) pads, compared with eager's analytic
backwards; the 3-D forward (lowering/decomp_grid3d.py) too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cnn_helpers import check_grads


def _grid(n: int, h: int, w: int, seed: int) -> torch.Tensor:
    """Sample points inside and outside [-1, 1] (exercising every padding mode), with some exactly on pixels."""
    g = torch.rand(n, h, w, 2, generator=torch.Generator().manual_seed(seed)) * 2.6 - 1.3
    g[0, 0, 0] = torch.tensor([0.0, 0.0])
    g[0, 0, 1] = torch.tensor([-1.0, 1.0])
    return g


CASES = [("bilinear", p, a) for p in ("zeros", "border", "reflection") for a in (False, True)] + [
    ("bicubic", "zeros", True), ("bicubic", "border", False), ("bicubic", "reflection", True),
    ("nearest", "border", True), ("nearest", "reflection", False)]


@pytest.mark.parametrize("mode,padding,align", CASES)
def test_grid_sample_gradients_match_eager(mode: str, padding: str, align: bool) -> None:
    x = torch.randn(2, 3, 6, 7, generator=torch.Generator().manual_seed(1))
    check_grads(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
                x, _grid(2, 5, 4, 2))


def test_spatial_transformer_training_step() -> None:
    """affine_grid + grid_sample with a learned affine map: the gradient reaches the localisation weights."""
    theta_net = torch.nn.Linear(3 * 8 * 8, 6)
    torch.nn.init.zeros_(theta_net.weight)
    with torch.no_grad():
        theta_net.bias.copy_(torch.tensor([0.9, 0.1, 0.05, -0.1, 1.1, 0.0]))

    def stn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        theta = F.linear(x.flatten(1), w, b).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)

    check_grads(stn, torch.randn(2, 3, 8, 8), theta_net.weight.detach() + 0.01, theta_net.bias.detach())


def test_grid_sample_gradient_of_the_grid_only() -> None:
    """The input needs no gradient (output_mask [False, True]): only the grid's is computed."""
    x = torch.randn(1, 2, 5, 5)
    grid = _grid(1, 3, 3, 4).requires_grad_()
    out = torch.compile(lambda g: F.grid_sample(x, g, align_corners=True), backend="neuron", dynamic=False)(grid)
    go = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, grid, go)
    g2 = grid.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(F.grid_sample(x, g2, align_corners=True), g2, go)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("pad", [(-1, 2), (2, -1, -2, 1), (1, -1, 0, 2, -1, 1)])
def test_replication_pad_with_cropping_pads_backward(pad: tuple[int, ...]) -> None:
    x = torch.randn(2, 3, *[5] * (len(pad) // 2))
    check_grads(lambda t: F.pad(t, pad, mode="replicate") * 2, x)


def _grid3d(n: int, d: int, h: int, w: int, seed: int) -> torch.Tensor:
    g = torch.rand(n, d, h, w, 3, generator=torch.Generator().manual_seed(seed)) * 2.6 - 1.3
    g[0, 0, 0, 0] = torch.tensor([1.0, -1.0, 0.0])  # corner pixels exactly (align_corners=True)
    return g


@pytest.mark.parametrize("mode,padding,align", [("bilinear", p, a) for p in ("zeros", "border", "reflection")
                                                for a in (False, True)] + [("nearest", "zeros", False),
                                                                           ("nearest", "reflection", True)])
def test_grid_sample_3d_forward_and_backward_match_eager(mode: str, padding: str, align: bool) -> None:
    """5-D grid_sample (lowering/decomp_grid3d.py: one row gather of all eight corners) and its backward (the vjp
    of that decomposition, the grid's gradient cut where eager clips)."""
    x = torch.randn(2, 3, 4, 5, 6, generator=torch.Generator().manual_seed(5))
    check_grads(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
                x, _grid3d(2, 3, 2, 4, 6))


def test_grid_sample_3d_half_precision_and_empty() -> None:
    """bf16 is computed in fp32 and rounded once (eager rounds every weight to bf16: up to 15% off here)."""
    x, g = torch.randn(1, 2, 3, 4, 5).to(torch.bfloat16), _grid3d(1, 2, 2, 2, 7).to(torch.bfloat16)
    f = torch.compile(lambda x, g: F.grid_sample(x, g, align_corners=False), backend="neuron", dynamic=False)
    got = f(x, g)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.grid_sample(x.float(), g.float(), align_corners=False).to(torch.bfloat16))
    empty = torch.zeros(1, 2, 3, 0, 3)  # no output points
    assert f(torch.randn(1, 2, 3, 4, 5), empty).shape == (1, 2, 2, 3, 0)
