"""torchvision's roi_align (the R-CNN box and mask heads) compiles as tensor math (lowering/decomp_roi.py).

Without torchvision (the torch 2.13 leg: PyPI's torchvision does not load beside the CPU wheel), the compiled
decomposition is checked against a per-sample loop written from torchvision's documented kernel; with it (the
torch 2.14 leg installs torchvision 0.29.1), ``torchvision.ops.roi_align`` itself is compiled and checked against
eager, gradients included, for fixed and adaptive sampling grids.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from neuron_compile.lowering import decomp_roi
from neuron_compile.lowering.decomp_roi import roi_align
from neuron_compile.lowering.exact_float import ieee_divide

try:
    import torchvision
    from torchvision.ops import MultiScaleRoIAlign
except Exception:  # not installed, or PyPI's build beside a CPU torch ('operator torchvision::nms does not exist')
    torchvision = None

needs_torchvision = pytest.mark.skipif(torchvision is None, reason="torchvision is not importable here (the torch "
                                       "2.14 CI leg installs torchvision 0.29.1 and runs these)")

BOXES = torch.tensor([[0, 1.0, 1.0, 5.0, 6.0],  # inside the map
                      [1, 2.0, 0.5, 11.0, 9.5],  # reaching the last row and column
                      [0, -3.0, -2.0, 4.0, 3.0],  # starting outside (samples in [-1, 0) clamp to the border)
                      [1, 8.0, 7.0, 30.0, 25.0],  # ending far outside (samples beyond the map read 0)
                      [0, 3.0, 3.0, 3.2, 3.1],  # thinner than a pixel
                      [1, -20.0, -20.0, -15.0, -15.0]])  # wholly outside


def _features(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, 10, 12, generator=torch.Generator().manual_seed(seed))


def _bilinear(plane: torch.Tensor, y: float, x: float) -> torch.Tensor:
    height, width = plane.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return torch.zeros(plane.shape[0], dtype=torch.float64)
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= height - 1:
        y0 = y1 = height - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= width - 1:
        x0 = x1 = width - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    return hy * hx * plane[:, y0, x0] + hy * lx * plane[:, y0, x1] + ly * hx * plane[:, y1, x0] + ly * lx * plane[:, y1, x1]


def _reference(x: torch.Tensor, rois: torch.Tensor, scale: float, ph: int, pw: int, grid: int,
               aligned: bool) -> torch.Tensor:
    """One sample at a time, in float64, as torchvision documents its kernel (``grid <= 0``: ceil(size / bins)
    samples per bin along each axis)."""
    x = x.double()
    out = torch.zeros(rois.shape[0], x.shape[1], ph, pw, dtype=torch.float64)
    shift = 0.5 if aligned else 0.0
    for k, (b, x1, y1, x2, y2) in enumerate(rois.double().tolist()):
        x1, y1, x2, y2 = (v * scale - shift for v in (x1, y1, x2, y2))
        w, h = x2 - x1, y2 - y1
        if not aligned:
            w, h = max(w, 1.0), max(h, 1.0)
        gy, gx = (grid, grid) if grid > 0 else (math.ceil(h / ph), math.ceil(w / pw))
        for i in range(ph):
            for j in range(pw):
                acc = torch.zeros(x.shape[1], dtype=torch.float64)
                for iy in range(gy):
                    for ix in range(gx):
                        yy = y1 + i * h / ph + (iy + 0.5) * (h / ph) / gy
                        xx = x1 + j * w / pw + (ix + 0.5) * (w / pw) / gx
                        acc += _bilinear(x[int(b)], yy, xx)
                out[k, :, i, j] = acc / max(gy * gx, 1)
    return out


@pytest.mark.parametrize("grid", [1, 2, 3, 0])
@pytest.mark.parametrize("aligned", [False, True])
def test_compiled_roi_align_matches_the_documented_kernel(grid: int, aligned: bool) -> None:
    x = _features()
    f = torch.compile(lambda x, r: roi_align(x, r, 0.5 if grid == 2 else 1.0, 3, 4, grid, aligned), backend="neuron",
                      dynamic=False)
    want = _reference(x, BOXES, 0.5 if grid == 2 else 1.0, 3, 4, grid, aligned)
    torch.testing.assert_close(f(x, BOXES).double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grid", [2, -1])
def test_roi_align_gradient_is_the_scatter_of_its_bilinear_weights(grid: int) -> None:
    """d(sum of out * g)/dx at one pixel is the sum of the weights with which every sample read it, times g."""
    x, grad_out = _features(1), torch.randn(6, 3, 3, 4, generator=torch.Generator().manual_seed(2))
    leaf = x.clone().requires_grad_(True)
    out = torch.compile(lambda x, r: roi_align(x, r, 1.0, 3, 4, grid, True), backend="neuron", dynamic=False)(
        leaf, BOXES)
    (got,) = torch.autograd.grad(out, leaf, grad_out)
    probe = x.double().clone().requires_grad_(True)  # the loop reference is linear in x: its gradient is exact
    (want,) = torch.autograd.grad(_reference(probe, BOXES, 1.0, 3, 4, grid, True), probe, grad_out.double())
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("route", ["one image", "gathered images", "weights spread over the batch"])
def test_adaptive_grid_routes_match_the_documented_kernel(route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The adaptive grid reads each box's image by one of three routes (one image; a gathered copy per box, as
    for Mask R-CNN's mask targets, one box per mask; row weights spread over the batch when copies would be
    large): each gives the documented kernel's values and gradients."""
    x, boxes = _features(3), BOXES
    if route == "one image":
        x, boxes = x[:1], torch.cat([torch.zeros(6, 1), BOXES[:, 1:]], 1)
    elif route == "gathered images":  # one mask per box, the mask-target pattern
        x = torch.randn(6, 1, 10, 12, generator=torch.Generator().manual_seed(5))
        boxes = torch.cat([torch.arange(6.0)[:, None], BOXES[:, 1:]], 1)
    else:
        monkeypatch.setattr(decomp_roi, "_GATHER_LIMIT", 0)  # 6 box copies of 2 images: spread
    leaf = x.clone().requires_grad_(True)
    out = torch.compile(lambda x, r: roi_align(x, r, 1.0, 3, 4, -1, True), backend="neuron", dynamic=False)(
        leaf, boxes)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    (got,) = torch.autograd.grad(out, leaf, grad_out)
    probe = x.double().clone().requires_grad_(True)
    want = _reference(probe, boxes, 1.0, 3, 4, -1, True)
    torch.testing.assert_close(out.detach().double(), want.detach(), atol=1e-5, rtol=1e-5)
    (want_grad,) = torch.autograd.grad(want, probe, grad_out.double())
    torch.testing.assert_close(got.double(), want_grad, atol=1e-5, rtol=1e-5)


def test_no_boxes_gives_an_empty_result() -> None:
    x = _features()
    got = torch.compile(lambda x, r: roi_align(x, r, 1.0, 2, 2, 2, False), backend="neuron", dynamic=False)(
        x, BOXES[:0])
    assert got.shape == (0, 3, 2, 2)


def _compiled_and_eager(fn: Any, *args: torch.Tensor) -> tuple[Any, Any]:
    results = []
    for f in (fn, torch.compile(fn, backend="neuron", dynamic=False)):
        leaves = [a.clone().requires_grad_(a.is_floating_point() and a.dim() == 4) for a in args]
        out = f(*leaves)
        grads = torch.autograd.grad(out.square().sum(), [a for a in leaves if a.requires_grad])
        results.append((out.detach(), grads))
    return results[1], results[0]


@needs_torchvision
@pytest.mark.parametrize(("scale", "grid", "aligned"), [(1.0, 2, False), (0.5, 2, True), (0.25, 1, True),
                                                        (1.0, 3, False)])
def test_torchvision_roi_align_matches_eager(scale: float, grid: int, aligned: bool) -> None:
    def f(x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        return torchvision.ops.roi_align(x, rois, (3, 4), scale, grid, aligned)

    got, want = _compiled_and_eager(f, _features(3), BOXES)
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)


@needs_torchvision
def test_multi_scale_roi_align_of_a_feature_pyramid_matches_eager() -> None:
    """Faster/Mask R-CNN's box head: boxes pooled from the FPN level their size picks (sampling_ratio 2)."""
    pool = MultiScaleRoIAlign(["p2", "p3"], 7, 2)
    g = torch.Generator().manual_seed(4)
    feats = {"p2": torch.randn(1, 4, 32, 40, generator=g), "p3": torch.randn(1, 4, 16, 20, generator=g)}
    boxes = [torch.tensor([[4.0, 6.0, 60.0, 50.0], [10.0, 12.0, 150.0, 120.0], [0.0, 0.0, 159.0, 127.0]])]
    sizes = [(128, 160)]

    def f(p2: torch.Tensor, p3: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return pool({"p2": p2, "p3": p3}, [b], sizes)

    got, want = _compiled_and_eager(f, feats["p2"], feats["p3"], boxes[0])
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@needs_torchvision
@pytest.mark.parametrize("seed", range(6))
def test_random_boxes_match_eager_to_the_sample(seed: int) -> None:
    """Integer boxes put samples exactly on the map's far edge and make box sizes exact multiples of the bins
    (56 / 28): which samples count there follows eager's IEEE quotients, so both grids match eager everywhere."""
    g = torch.Generator().manual_seed(seed)
    height, width = ((10, 12), (16, 16), (40, 50))[seed % 3]
    corner = torch.randint(-8, max(height, width), (12, 2), generator=g).float()
    size = torch.randint(0, 3 * max(height, width) // 2, (12, 2), generator=g).float()
    boxes = torch.cat([torch.randint(0, 2, (12, 1), generator=g).float(), corner, corner + size], 1)
    grid, aligned, scale, out = (-1, 0, 2)[seed % 3], seed % 2 == 0, (1.0, 0.5)[seed % 2], ((7, 7), (14, 14))[seed % 2]

    def f(x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        return torchvision.ops.roi_align(x, rois, out, scale, grid, aligned)

    got, want = _compiled_and_eager(f, torch.randn(2, 3, height, width, generator=g), boxes)
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got[1], want[1], atol=2e-5, rtol=1e-4)


def test_ieee_quotients_from_a_reciprocal() -> None:
    """The decomposition's division rounds as IEEE division does, bit for bit, though compiled as a reciprocal."""
    g = torch.Generator().manual_seed(7)
    a = torch.cat([torch.randint(0, 2000, (4000,), generator=g).float(), torch.rand(4000, generator=g) * 300])
    b = torch.cat([torch.randint(1, 60, (4000,), generator=g).float(), torch.rand(4000, generator=g) * 30 + 0.5])
    got = torch.compile(ieee_divide, backend="neuron", dynamic=False)(a, b)
    assert torch.equal(got, a / b)
    ints = torch.compile(lambda a: ieee_divide(a, 28), backend="neuron", dynamic=False)(a)
    assert torch.equal(ints, a / 28)


@needs_torchvision
@pytest.mark.parametrize("grid", [2, -1])
def test_under_autocast_roi_align_runs_in_float32_as_torchvision_does(grid: int) -> None:
    """torchvision's autocast rule runs roi_align in float32 and casts back: the decomposition's gathers and
    matmuls must not drop to bfloat16 inside a mixed-precision region."""
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(3, 3, 1, 1, generator=g)

    def f(x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torchvision.ops.roi_align(torch.nn.functional.conv2d(x, weight), rois, (7, 7), 1.0, grid, True)

    one_image = BOXES * torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0])
    got, want = _compiled_and_eager(f, torch.randn(1, 3, 16, 16, generator=g), one_image)
    assert got[0].dtype == want[0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-2, rtol=1.6e-2)
