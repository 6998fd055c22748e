"""torchvision's deform_conv2d (DCN v1 and v2) compiles as tensor math (lowering/decomp_deform.py).

Without torchvision (the torch 2.13 leg), the compiled decomposition is checked against an independent float64
reference built from ``F.grid_sample`` (bilinear, zeros outside, one call per kernel tap), gradients included; with
it (the torch 2.14 leg), ``torchvision.ops.deform_conv2d`` and ``DeformConv2d`` are compiled and checked against
eager, and a call torchvision would reject is refused by name with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from neuron_compile.lowering.decomp_deform import deform_conv2d

from neuron_compile.errors import UnsupportedOpError

try:
    import torchvision
    from torchvision.ops import DeformConv2d
except Exception:  # not installed, or PyPI's build beside a CPU torch
    torchvision = None

needs_torchvision = pytest.mark.skipif(torchvision is None, reason="torchvision is not importable here (the torch "
                                       "2.14 CI leg installs torchvision 0.29.1 and runs these)")

# (batch, channels, height, width, out channels, kernel, stride, padding, dilation, groups, offset groups, mask)
# Heights and widths are 2^n + 1, so that grid_sample's normalised coordinates are exact in the reference.
CASES = [(2, 4, 9, 5, 6, 3, 1, 1, 1, 1, 1, False), (1, 4, 9, 9, 4, 3, 2, 1, 1, 2, 2, True),
         (2, 6, 5, 9, 6, 3, 1, 2, 2, 3, 3, True), (2, 4, 5, 5, 2, 1, 1, 0, 1, 1, 2, False)]


def _inputs(case: tuple[Any, ...], seed: int, zero_offsets: bool = False) -> list[torch.Tensor]:
    batch, channels, height, width, out_channels, k, stride, pad, dil, groups, offset_groups, use_mask = case
    g = torch.Generator().manual_seed(seed)
    out_h = (height + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    out_w = (width + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    offset = torch.randn(batch, 2 * offset_groups * k * k, out_h, out_w, generator=g) * 2
    mask = torch.rand(batch, offset_groups * k * k, out_h, out_w, generator=g)
    return [torch.randn(batch, channels, height, width, generator=g),
            torch.randn(out_channels, channels // groups, k, k, generator=g) * 0.3,
            torch.zeros_like(offset) if zero_offsets else offset, mask if use_mask else torch.zeros(batch, 1),
            torch.randn(out_channels, generator=g)]


def _grid_sample_reference(x: torch.Tensor, weight: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor,
                           bias: torch.Tensor, case: tuple[Any, ...]) -> torch.Tensor:
    """Deformable convolution from its definition: every tap samples the map (grid_sample, zeros outside) at its
    displaced position, weighted by its mask, then a grouped 1x1 sum over (channel, tap)."""
    *_, out_channels, k, stride, pad, dil, groups, offset_groups, use_mask = case
    batch, channels, height, width = x.shape
    out_h, out_w = offset.shape[2:]
    per_group = channels // offset_groups
    oy = (torch.arange(out_h, dtype=x.dtype) * stride - pad)[:, None]
    ox = (torch.arange(out_w, dtype=x.dtype) * stride - pad)[None, :]
    taps = []
    for i in range(k):
        for j in range(k):
            t = i * k + j
            samples = []
            for grp in range(offset_groups):
                y = oy + i * dil + offset[:, grp * 2 * k * k + 2 * t]
                xx = ox + j * dil + offset[:, grp * 2 * k * k + 2 * t + 1]
                grid = torch.stack([2 * xx / (width - 1) - 1, 2 * y / (height - 1) - 1], -1)
                s = F.grid_sample(x[:, grp * per_group:(grp + 1) * per_group], grid, align_corners=True)
                if use_mask:
                    s = s * mask[:, grp * k * k + t][:, None]
                samples.append(s)
            taps.append(torch.cat(samples, 1))  # [B, C, oh, ow]
    cols = torch.stack(taps, 2)  # [B, C, K, oh, ow]
    cols = cols.reshape(batch, groups, channels // groups * k * k, out_h * out_w)
    w = weight.reshape(groups, out_channels // groups, -1)
    return torch.einsum("gok,bgkl->bgol", w, cols).reshape(batch, out_channels, out_h, out_w) + bias[:, None, None]


def _settings(case: tuple[Any, ...]) -> tuple[Any, ...]:
    *_, stride, pad, dil, groups, offset_groups, use_mask = case
    return stride, stride, pad, pad, dil, dil, groups, offset_groups, use_mask


def _values_and_grads(fn: Any, args: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    leaves = [a.to(dtype).requires_grad_(True) for a in args]
    out = fn(*leaves)
    probe = torch.linspace(-1, 1, out.numel(), dtype=dtype).reshape(out.shape)
    return out.detach(), torch.autograd.grad((out * probe).sum(), leaves, allow_unused=True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("zero_offsets", [False, True])
def test_compiled_decomposition_matches_a_grid_sample_reference(case: tuple[Any, ...], zero_offsets: bool) -> None:
    """Zero offsets put the first tap exactly on row and column -1 (padding 1): the offset gradient there is the
    one-sided slope into the map, as torchvision's (and grid_sample's) gradient has it."""
    args = _inputs(case, seed=len(CASES) * zero_offsets + CASES.index(case), zero_offsets=zero_offsets)
    compiled = torch.compile(lambda *a: deform_conv2d(*a, *_settings(case)), backend="neuron", dynamic=False)
    got, got_grads = _values_and_grads(compiled, args)
    want, want_grads = _values_and_grads(lambda *a: _grid_sample_reference(*a, case), args, torch.float64)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5)
    for name, g, w in zip(("input", "weight", "offset", "mask", "bias"), got_grads, want_grads, strict=True):
        if w is None:  # v1: the mask placeholder is unused
            assert g is None or not g.any(), name
            continue
        torch.testing.assert_close(g.double(), w, atol=5e-5, rtol=1e-4, msg=name)


def _torchvision_call(case: tuple[Any, ...]) -> Any:
    stride, _, pad, _, dil, _, _, _, use_mask = _settings(case)

    def f(x: torch.Tensor, weight: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor,
          bias: torch.Tensor) -> torch.Tensor:
        return torchvision.ops.deform_conv2d(x, offset, weight, bias, stride, pad, dil, mask if use_mask else None)

    return f


@needs_torchvision
@pytest.mark.parametrize("case", CASES)
def test_torchvision_deform_conv2d_matches_eager(case: tuple[Any, ...]) -> None:
    args, f = _inputs(case, seed=11), _torchvision_call(case)
    got, got_grads = _values_and_grads(torch.compile(f, backend="neuron", dynamic=False), args)
    want, want_grads = _values_and_grads(f, args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        if w is None:
            assert g is None or not g.any()
            continue
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


class _DeformBlock(torch.nn.Module):
    """A DCNv2 block as detectors use it: offsets and mask predicted by a zero-initialised conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.offsets = torch.nn.Conv2d(channels, 27, 3, padding=1)
        torch.nn.init.zeros_(self.offsets.weight)
        torch.nn.init.zeros_(self.offsets.bias)
        self.conv = DeformConv2d(channels, channels, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dy_dx_mask = self.offsets(x)
        offset, mask = dy_dx_mask[:, :18], dy_dx_mask[:, 18:].sigmoid()
        return torch.relu(self.norm(self.conv(x, offset, mask))) + x


@needs_torchvision
def test_a_dcn_block_trains_as_in_eager() -> None:
    """Two SGD steps of a DCNv2 block from its zero-offset initialisation: losses and every parameter match eager."""
    torch.manual_seed(0)
    eager = _DeformBlock(4)
    compiled_model = _DeformBlock(4)
    compiled_model.load_state_dict(eager.state_dict())
    step = torch.compile(lambda m, x: m(x).square().mean(), backend="neuron", dynamic=False)
    x = torch.randn(2, 4, 9, 9, generator=torch.Generator().manual_seed(1))
    for model, fn in ((eager, lambda m, x: m(x).square().mean()), (compiled_model, step)):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(2):
            opt.zero_grad()
            fn(model, x).backward()
            opt.step()
    for (name, a), b in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=name)


@needs_torchvision
def test_under_autocast_deform_conv2d_runs_in_float32_as_torchvision_does() -> None:
    case = CASES[1]
    args, f = _inputs(case, seed=3), _torchvision_call(case)

    def under_autocast(*a: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return f(*a)

    got = torch.compile(under_autocast, backend="neuron", dynamic=False)(*args)
    want = under_autocast(*args)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_torchvision
def test_a_call_torchvision_rejects_is_refused_with_the_reason() -> None:
    x, weight = torch.randn(1, 4, 6, 6), torch.randn(2, 4, 3, 3)
    offset = torch.randn(1, 18, 5, 5)  # padding 1 keeps the 6 x 6 map: offsets must be 6 x 6
    f = torch.compile(lambda x, o, w: torchvision.ops.deform_conv2d(x, o, w, padding=1), backend="neuron",
                      dynamic=False)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        f(x, offset, weight)
    assert isinstance(info.value.inner_exception, UnsupportedOpError)
    assert "torchvision.deform_conv2d.default" in str(info.value)
    assert "offset must be [1, 18, 6, 6], got [1, 18, 5, 5] (torchvision rejects this call too)" in str(info.value)
