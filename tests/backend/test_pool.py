"""Pooling, resampling (interpolate / upsample / adaptive average pooling) and group_norm against eager PyTorch.

Forward and backward through ``torch.compile(backend="neuron")`` on the simulator: max pooling (padding,
stride, dilation, ceil_mode, return_indices, ties, NaN and -inf inputs, 1-D), average pooling
(count_include_pad, divisor_override, ceil_mode, 1-D), adaptive max and average pooling (1-D/2-D, non-divisible
sizes), interpolate in every separable mode (nearest, nearest-exact, (bi)linear with align_corners both ways,
bicubic; size or scale_factor; antialiased bilinear/bicubic), group_norm, bf16 autocast, 3-D average pooling (one trivial dim, or
two 2-D passes; LocalResponseNorm and lp_pool3d use it), replication padding
(its backward sums the edge gradients). 3-D max pooling: ``test_conv3d.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import cnn_helpers as H
import pytest
import torch
import torch.nn.functional as F

from neuron_compile import backend as B

log = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))


def kernels() -> list[Any]:
    return [k for g in B.compiled_graphs() for k in g["plan"].kernels]


MAX_POOL = [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=2, stride=2, ceil_mode=True),
    dict(kernel_size=3, stride=1, padding=1, dilation=2),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0)),
    dict(kernel_size=3, stride=3, ceil_mode=True, padding=1),
]


@pytest.mark.parametrize("kw", MAX_POOL, ids=[f"max_{i}" for i in range(len(MAX_POOL))])
def test_max_pool2d(kw: dict[str, Any]) -> None:
    ks = H.check_grads(lambda x: F.max_pool2d(x, **kw), torch.randn(2, 3, 11, 10))
    assert sorted(k.mode for k in ks if k.family == "pool") == ["max", "max_backward"]  # no index kernel


def test_max_pool_ties_pick_the_first_maximum() -> None:
    x = torch.randint(0, 3, (2, 3, 9, 9)).float()
    H.check_grads(lambda x: F.max_pool2d(x, 3, 1, 1), x)


def test_max_pool_indices_nan_and_neg_inf_match_eager() -> None:
    x = torch.randn(2, 2, 7, 8)
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 4, 4] = float("nan")
    x[1, 1] = float("-inf")
    x[1, 1, 3, 3] = 2.0
    fn = lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)  # noqa: E731
    got_v, got_i = torch.compile(fn, backend="neuron")(x)
    want_v, want_i = fn(x)
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_v, want_v, equal_nan=True)
    xg, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    torch.compile(lambda x: F.max_pool2d(x, 3, 2, 1), backend="neuron")(xg).sum().backward()
    F.max_pool2d(xr, 3, 2, 1).sum().backward()
    assert torch.equal(xg.grad, xr.grad)


def test_max_pool1d_and_indices() -> None:
    H.check_grads(lambda x: F.max_pool1d(x, 3, 2, 1), torch.randn(2, 5, 17))
    x = torch.randn(2, 5, 17)
    torch._dynamo.reset()
    got = torch.compile(lambda x: F.max_pool1d(x, 4, 3, return_indices=True)[1], backend="neuron")(x)
    assert torch.equal(got, F.max_pool1d(x, 4, 3, return_indices=True)[1])


AVG_POOL = [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, divisor_override=3),
    dict(kernel_size=(2, 3), stride=(1, 2)),
]


@pytest.mark.parametrize("kw", AVG_POOL, ids=[f"avg_{i}" for i in range(len(AVG_POOL))])
def test_avg_pool2d(kw: dict[str, Any]) -> None:
    H.check_grads(lambda x: F.avg_pool2d(x, **kw), torch.randn(2, 3, 11, 10))


def test_avg_pool1d() -> None:
    H.check_grads(lambda x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True), torch.randn(2, 5, 17))


@pytest.mark.parametrize("size", [(4, 3), (1, 1), (5, 10), (11, 7)])
def test_adaptive_avg_pool2d(size: tuple[int, int]) -> None:
    H.check_grads(lambda x: F.adaptive_avg_pool2d(x, size), torch.randn(2, 3, 11, 10))


def test_adaptive_avg_pool1d() -> None:
    H.check_grads(lambda x: F.adaptive_avg_pool1d(x, 5), torch.randn(2, 3, 17))


INTERP = [
    dict(scale_factor=2, mode="nearest"),
    dict(size=(13, 7), mode="nearest"),
    dict(scale_factor=0.5, mode="nearest"),
    dict(size=(13, 7), mode="nearest-exact"),
    dict(size=(13, 7), mode="bilinear"),
    dict(scale_factor=2, mode="bilinear", align_corners=True),
    dict(scale_factor=1.5, mode="bilinear"),
    dict(size=(5, 4), mode="bilinear", align_corners=False),
    dict(size=(13, 7), mode="bicubic"),
    dict(scale_factor=(2, 3), mode="nearest", recompute_scale_factor=True),
]


@pytest.mark.parametrize("kw", INTERP, ids=[f"interp_{i}" for i in range(len(INTERP))])
def test_interpolate(kw: dict[str, Any]) -> None:
    ks = H.check_grads(lambda x: F.interpolate(x, **kw), torch.randn(2, 3, 9, 11))
    assert [k.family for k in ks] == ["resample", "resample"]  # forward and backward, one kernel each


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_interpolate_1d(mode: str) -> None:
    H.check_grads(lambda x: F.interpolate(x, scale_factor=3, mode=mode), torch.randn(2, 3, 17))


def test_upsample_module_and_large_plane() -> None:
    up = torch.nn.Upsample(scale_factor=2, mode="bilinear")
    ks = H.check_grads(up, torch.randn(1, 4, 64, 64))
    fwd = next(k for k in ks if k.family == "resample")
    assert len(fwd.runs_w) == 6 and len(fwd.stages) > 1  # a 2x bilinear map is 6 strided runs; rows staged


def test_bf16_autocast_pool_and_resample() -> None:
    w = torch.randn(4, 4, 1, 1)
    H.check_grads(lambda x, w: F.interpolate(F.max_pool2d(F.conv2d(x, w), 3, 2, 1), scale_factor=2), torch.randn(
        2, 4, 9, 9), w, dtype=torch.bfloat16, autocast=True)


@pytest.mark.parametrize("groups,shape", [(4, (2, 8, 5, 7)), (1, (3, 6, 4, 4)), (8, (2, 8, 3, 3)), (2, (2, 6, 11))])
def test_group_norm(groups: int, shape: tuple[int, ...]) -> None:
    c = shape[1]
    H.check_grads(lambda x, w, b: F.group_norm(x, groups, w, b), torch.randn(*shape), torch.randn(c), torch.randn(c))
    fwd = B.compiled_graphs()[0]["plan"].kernels
    assert len(fwd) == 1  # statistics, normalization and affine in one reduction kernel


KERNEL_LONGER_THAN_INPUT = [
    (F.avg_pool2d, dict(kernel_size=320, ceil_mode=True)),  # EfficientNet's final pool over 7 x 7
    (F.avg_pool2d, dict(kernel_size=9, stride=4, padding=1, ceil_mode=True)),
    (F.avg_pool2d, dict(kernel_size=(10, 3), stride=(8, 2), padding=1, ceil_mode=True, count_include_pad=False)),
    (F.max_pool2d, dict(kernel_size=64, ceil_mode=True)),
]


@pytest.mark.parametrize("fn,kw", KERNEL_LONGER_THAN_INPUT, ids=lambda v: str(v) if isinstance(v, dict) else v.__name__)
def test_pool_kernel_longer_than_the_padded_input(fn: Callable[..., torch.Tensor], kw: dict[str, Any]) -> None:
    """Windows cut at the padded input's end: the kernel is cut to the taps that reach it (it once did not fit SBUF)."""
    H.check_grads(lambda x: fn(x, **kw), torch.randn(2, 8, 7, 7))


ANTIALIAS = [
    dict(size=(7, 5), mode="bilinear"),
    dict(size=(31, 40), mode="bilinear"),
    dict(size=(9, 6), mode="bicubic", align_corners=True),
    dict(scale_factor=0.37, mode="bilinear"),
    dict(scale_factor=(0.5, 1.7), mode="bicubic"),
    dict(size=(20, 1), mode="bilinear"),  # one column, the height unchanged
]


@pytest.mark.parametrize("kw", ANTIALIAS, ids=str)
def test_antialiased_interpolate_matches_eager(kw: dict[str, Any]) -> None:
    """torchvision-style ``antialias=True`` resizing: eager's own separable weights, forward and backward."""
    H.check_grads(lambda x: F.interpolate(x, antialias=True, **kw), torch.randn(2, 3, 20, 17))


def test_antialiased_resize_to_one_column_is_refused_by_name() -> None:
    """torch 2.13's CPU kernel repeats the first output row when the width goes to 1 and the height changes."""
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: F.interpolate(x, size=(7, 1), mode="bilinear", antialias=True),
                      backend="neuron")(torch.randn(2, 3, 20, 4))
    msg = str(H.unsupported(info.value))
    assert "aten._upsample_bilinear2d_aa.default(float32[2, 3, 20, 4], [7, 1], False)" in msg, msg
    assert "eager's CPU kernel repeats the first output row there" in msg, msg


def test_group_norm_bf16_autocast() -> None:
    x, w, b = torch.randn(2, 8, 5, 7), torch.randn(8), torch.randn(8)
    H.check_grads(lambda x, w, b: F.group_norm(x, 4, w, b), x, w, b, dtype=torch.bfloat16, autocast=True)


AVG_POOL3D_TRIVIAL_DIM = [
    dict(kernel_size=(2, 1, 1), stride=1),  # LocalResponseNorm's window over channels
    dict(kernel_size=(1, 3, 2), stride=(1, 2, 1), padding=(0, 1, 0), ceil_mode=True),
    dict(kernel_size=(3, 1, 2), stride=(2, 1, 2), count_include_pad=False, padding=(1, 0, 1)),
    dict(kernel_size=(2, 2, 1), stride=(1, 1, 1), divisor_override=3),
]


@pytest.mark.parametrize("kw", AVG_POOL3D_TRIVIAL_DIM, ids=[f"avg3d_{i}" for i in range(len(AVG_POOL3D_TRIVIAL_DIM))])
def test_avg_pool3d_with_a_trivial_dim_runs_as_2d(kw: dict[str, Any]) -> None:
    ks = H.check_grads(lambda x: F.avg_pool3d(x, **kw), torch.randn(2, 3, 6, 7, 5))
    assert sorted(k.mode for k in ks if k.family == "pool") == ["avg", "avg_backward"]


def test_avg_pool3d_unbatched_with_a_trivial_dim() -> None:
    H.check_grads(lambda x: F.avg_pool3d(x, (2, 1, 1), 1), torch.randn(3, 6, 7, 5))


@pytest.mark.parametrize("shape", [(2, 5, 7), (2, 5, 7, 6), (1, 5, 4, 7, 3)], ids=["1d", "2d", "3d"])
def test_local_response_norm_forward_and_grads_match_eager(shape: tuple[int, ...]) -> None:
    H.check_grads(lambda x: F.local_response_norm(x, 2, alpha=1e-2, beta=0.75, k=1.5), torch.randn(*shape))


AVG_POOL3D = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2, 2), stride=(2, 1, 2), padding=(1, 1, 0), ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3, 2), stride=2, padding=1, divisor_override=5),
]


@pytest.mark.parametrize("kw", AVG_POOL3D, ids=[f"avg3d_sep_{i}" for i in range(len(AVG_POOL3D))])
def test_avg_pool3d_runs_as_two_2d_passes(kw: dict[str, Any]) -> None:
    H.check_grads(lambda x: F.avg_pool3d(x, **kw), torch.randn(2, 3, 7, 6, 5))


def test_lp_pool3d_forward_and_grads_match_eager() -> None:
    H.check_grads(lambda x: F.lp_pool3d(x, 2.0, 2, 2), torch.randn(1, 2, 5, 6, 4))


def test_rendered_pool_kernels_use_only_current_nki_api() -> None:
    checker = H.api_checker()
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    f = lambda x: (F.max_pool2d(x, 3, 2, 1).sum() + F.avg_pool2d(x, 2).sum()  # noqa: E731
                   + F.interpolate(x, scale_factor=2, mode="bilinear").sum()
                   + F.max_pool2d(x, 2, return_indices=True)[1].float().sum())
    torch.compile(f, backend="neuron")(x).backward()
    seen = set()
    for g in B.compiled_graphs():
        for (name, src), k in zip(g["sources"], g["plan"].kernels, strict=True):
            seen.add(getattr(k, "mode", k.family))
            assert checker.check_source_against_api(src) == [], name
    assert {"max", "max_index", "avg", "max_backward", "avg_backward", "resample"} <= seen


@pytest.mark.parametrize("fn", [lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: F.avg_pool2d(x, 3, 2, 1),
                                lambda x: F.interpolate(x, scale_factor=2), lambda x: F.adaptive_avg_pool2d(x, 3),
                                lambda x: F.group_norm(x, 3)],
                         ids=["max", "avg", "interpolate", "adaptive", "group_norm"])
def test_empty_batch(fn: Any) -> None:
    x = torch.randn(0, 3, 9, 9)
    got = torch.compile(fn, backend="neuron")(x)
    assert got.shape == fn(x).shape


@pytest.mark.parametrize("fn", [lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: F.avg_pool2d(x, 2),
                                lambda x: F.adaptive_avg_pool2d(x, 4)], ids=["max", "avg", "adaptive"])
def test_unbatched_and_channels_last(fn: Any) -> None:
    H.check_grads(fn, torch.randn(3, 9, 10))
    torch._dynamo.reset()
    H.check_grads(fn, torch.randn(2, 3, 9, 10).to(memory_format=torch.channels_last))


def test_adaptive_max_pool_divisible_sizes_use_the_pool_kernels() -> None:
    ks = H.check_grads(lambda x: F.adaptive_max_pool2d(x, (4, 5)), torch.randn(2, 3, 8, 10))
    assert sorted(k.mode for k in ks if k.family == "pool") == ["max", "max_backward"]
    torch._dynamo.reset()
    x = torch.randn(2, 3, 8, 10)
    got = torch.compile(lambda x: F.adaptive_max_pool1d(x[:, :, 0], 5, return_indices=True)[1], backend="neuron")(x)
    assert torch.equal(got, F.adaptive_max_pool1d(x[:, :, 0], 5, return_indices=True)[1])


@pytest.mark.parametrize("shape, out", [((2, 3, 7, 7), (3, 3)), ((1, 2, 10, 9), (4, 5)), ((3, 8, 8), (3, 5)),
                                        ((2, 5, 9), (4,)), ((1, 2, 6, 5), (6, 2))],
                         ids=["7to3", "10x9to4x5", "unbatched", "1d", "upsampling_rows"])
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_adaptive_max_pool_any_output_size(shape: tuple[int, ...], out: tuple[int, ...], ties: bool) -> None:
    """Overlapping windows of different lengths: values, indices (first maximum on ties) and gradients."""
    torch.manual_seed(0)
    x = torch.randint(0, 3, shape).float() if ties else torch.randn(shape)
    pool = F.adaptive_max_pool1d if len(out) == 1 else F.adaptive_max_pool2d
    H.check_grads(lambda t: pool(t, out), x)
    torch._dynamo.reset()
    got = torch.compile(lambda t: pool(t, out, return_indices=True)[1], backend="neuron", dynamic=False)(x)
    assert torch.equal(got, pool(x, out, return_indices=True)[1])


@pytest.mark.parametrize("shape,pad", [((2, 3, 5), (2, 1)), ((2, 3, 4, 6), (1, 2, 0, 3)), ((2, 3, 1, 2), (2, 1, 3, 1)),
                                       ((1, 2, 3, 4, 2), (1, 1, 2, 0, 1, 2)), ((3, 4, 5), (0, 2, 1, 1))],
                         ids=["1d", "2d", "2d_size1_size2", "3d", "unbatched_2d"])
def test_replication_pad_forward_and_grads_match_eager(shape: tuple[int, ...], pad: tuple[int, ...]) -> None:
    H.check_grads(lambda x: F.pad(x, pad, mode="replicate"), torch.randn(*shape))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolate_weights_are_the_aten_kernels_not_the_python_decomposition(mode: str) -> None:
    """The resampling weights come from eager's ATen kernel even though the backend builds them under AOTAutograd's
    Python dispatcher, whose Python decompositions of upsample_bilinear2d / bicubic round the source position to
    an fp32 ulp: output row 200 of 345 -> 270 rows (source 255.69, ulp 2^-16) had a weight off by 1.5e-5."""
    x = torch.randn(1, 2, 345, 4) * 9

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=(270, 4), mode=mode, align_corners=False)

    got = torch.compile(f, backend="neuron", dynamic=False)(x)
    torch.testing.assert_close(got, f(x), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_uint8_images_resize_in_nearest_modes(mode: str) -> None:
    """A uint8 image resizes in nearest modes bit for bit (each output one input pixel)."""
    x = torch.randint(0, 256, (2, 3, 17, 23), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.interpolate(x, size=(9, 40), mode=mode), F.interpolate(x, scale_factor=0.5, mode=mode)

    for got, want in zip(torch.compile(f, backend="neuron", dynamic=False)(x), f(x), strict=True):
        assert got.dtype == torch.uint8 and torch.equal(got, want)


@pytest.mark.parametrize("channels,size,out,mode,antialias,align_corners", [
    (3, (17, 23), (9, 40), "bilinear", False, False), (3, (17, 23), (30, 11), "bicubic", False, False),
    (4, (33, 20), (12, 7), "bilinear", True, False), (1, (33, 20), (12, 50), "bicubic", True, False),
    (5, (9, 12), (20, 5), "bilinear", False, True), (3, (300, 257), (64, 48), "bilinear", True, False),
    (3, (12, 12), (12, 30), "bicubic", False, False),
], ids=["bilinear", "bicubic", "bilinear_aa", "bicubic_aa_upscale", "align_corners_5ch", "aa_big_downscale",
        "width_only"])
def test_uint8_images_resize_bit_for_bit(channels: int, size: tuple[int, int], out: tuple[int, int], mode: str,
                                         antialias: bool, align_corners: bool) -> None:
    """eager's uint8 bilinear / bicubic (fixed-point weights, a rounding and saturation per pass, width first),
    bit for bit: one off from rounding the float result in places, bicubic more (its overshoot saturates between
    passes)."""
    x = torch.randint(0, 256, (2, channels, *size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=out, mode=mode, antialias=antialias, align_corners=align_corners)

    got, want = torch.compile(f, backend="neuron", dynamic=False)(x), f(x)
    assert got.dtype == torch.uint8 and torch.equal(got, want)
    assert not torch.equal(want, F.interpolate(x.float(), size=out, mode=mode, antialias=antialias,
                                               align_corners=align_corners).round().clamp(0, 255).to(torch.uint8))


def test_uint8_resize_where_eager_s_kernels_disagree_is_refused() -> None:
    """More than 4 channels to an output width of 1 while the height changes: eager's fallback kernel gives other
    values than its 1-4 channel kernel there, so the compiler refuses it, naming the fix."""
    x = torch.randint(0, 256, (1, 5, 8, 8), dtype=torch.uint8)
    with pytest.raises(Exception, match=r"uint8 resampling of more than 4 channels to an output width of 1 while the "
                                        r"height changes.*resample the height first, then the width"):
        torch.compile(lambda x: F.interpolate(x, size=(5, 1), mode="bilinear"), backend="neuron", dynamic=False)(x)
