"""torch.fft through the backend (lowering/complex_fft.py: dense DFT products on real pairs): every transform
family, norm mode, ``n`` / ``s`` / ``dim`` argument and complex or real input against eager, forward and gradients;
``torch.complex`` / ``torch.polar`` with broadcasting and gradients; transforms past the dense limit are refused
with their reason."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from neuron_compile.lowering.complex_fft import MAX_LENGTH

from neuron_compile.errors import UnsupportedOpError


def _compile(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _real(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def _cplx(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.complex64, generator=_gen(seed))


CASES = [
    ("fft", lambda t: torch.fft.fft(t), lambda: _real(3, 8)),
    ("fft_complex", lambda t: torch.fft.fft(t, dim=0), lambda: _cplx(5, 3)),
    ("ifft_n_forward", lambda t: torch.fft.ifft(t, n=10, norm="forward"), lambda: _cplx(2, 7)),
    ("rfft_odd", lambda t: torch.fft.rfft(t), lambda: _real(4, 9)),
    ("rfft_ortho", lambda t: torch.fft.rfft(t, norm="ortho"), lambda: _real(2, 3, 12)),
    ("irfft_even", lambda t: torch.fft.irfft(t), lambda: _cplx(3, 5)),
    ("irfft_odd_n", lambda t: torch.fft.irfft(t, n=9), lambda: _cplx(3, 5)),
    ("hfft", lambda t: torch.fft.hfft(t), lambda: _cplx(6)),
    ("ihfft", lambda t: torch.fft.ihfft(t), lambda: _real(2, 10)),
    ("fft2", lambda t: torch.fft.fft2(t), lambda: _real(2, 4, 6)),
    ("ifftn_dims", lambda t: torch.fft.ifftn(t, dim=(0, 2)), lambda: _cplx(3, 2, 5)),
    ("rfftn_s", lambda t: torch.fft.rfftn(t, s=(4, 6)), lambda: _real(2, 5, 7)),
    ("irfft2", lambda t: torch.fft.irfft2(t, s=(4, 6)), lambda: _cplx(2, 4, 4)),
    ("ihfft2", lambda t: torch.fft.ihfft2(t), lambda: _real(3, 4, 6)),
    ("spectrum_power", lambda t: torch.fft.rfft(t * torch.hann_window(16)).abs() ** 2, lambda: _real(4, 16)),
]


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_fft_matches_eager(name: str, fn: Callable[..., torch.Tensor], make: Callable[[], torch.Tensor]) -> None:
    x = make()
    got, want = _compile(fn)(x), fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name,fn,make", CASES[::2], ids=[c[0] for c in CASES[::2]])
def test_fft_gradients_match_eager(name: str, fn: Callable[..., torch.Tensor], make: Callable[[], torch.Tensor]
                                   ) -> None:
    grads = []
    for f in (_compile(fn), fn):
        x = make().requires_grad_(True)
        out = _as_real(f(x))
        (out * torch.randn(out.shape, generator=_gen(7))).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=2e-5)


def test_complex_and_polar_broadcast_and_differentiate_like_eager() -> None:
    def f(re: torch.Tensor, im: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        z = torch.complex(re, im) * torch.polar(r, im)  # [5, 3] with [3] and a 0-d radius
        return torch.view_as_real(z * 2j)

    results = []
    for g in (_compile(f), f):
        re, im = _real(5, 3, seed=1).requires_grad_(True), _real(3, seed=2).requires_grad_(True)
        r = torch.tensor(1.5, requires_grad=True)
        out = g(re, im, r)
        out.mul(torch.randn(out.shape, generator=_gen(3))).sum().backward()
        results.append((out.detach(), re.grad, im.grad, r.grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_fft_longer_than_the_dense_limit_is_refused_with_its_reason() -> None:
    with pytest.raises(Exception) as info:
        _compile(lambda t: torch.fft.rfft(t).abs())(_real(2, MAX_LENGTH * 2))
    exc = info.value
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None
    assert f"aten._fft_r2c.default(float32[2, {MAX_LENGTH * 2}]" in str(exc)
    assert f"an FFT over {MAX_LENGTH * 2} points" in str(exc) and "compute longer ones eagerly" in str(exc)
