"""FP8 tensors: float8_e5m2 on every target, float8_e4m3fn on trn3 (NeuronCore-v4) only, against eager.

Casts to FP8 round as torch's do (RNE; float8_e4m3fn saturates at +-448, inf included; float8_e5m2 overflows to
inf), data movement keeps the bytes, ``mm`` of FP8 accumulates in fp32 and rounds once, and ``torch._scaled_mm``
(tensor-wise and row-wise scales) runs as one matmul kernel reading the FP8 operands directly.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from neuron_compile import compile_record, config
from neuron_compile.errors import SimulatorConstraintError, UnsupportedOpError

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
# (dtype, target): e4m3fn exists on trn3 only; e5m2 everywhere (trn2 is the default target)
TARGETS = [pytest.param(E5, "trn2", id="e5m2-trn2"), pytest.param(E4, "trn3", id="e4m3fn-trn3"),
           pytest.param(E5, "trn3", id="e5m2-trn3")]


def _run(fn, *args, target: str):
    torch._dynamo.reset()
    with config.patch(target=target):
        return torch.compile(fn, backend="neuron", dynamic=False)(*args)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-identical values (NaN payloads aside) and the same dtype and shape."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.float(), want.float()
    assert torch.equal(g.isnan(), w.isnan())
    torch.testing.assert_close(g.nan_to_num(0.0), w.nan_to_num(0.0), rtol=0, atol=0)


def _every_bf16() -> torch.Tensor:
    """Every finite and special bfloat16 value: every rounding case an fp8 cast of bf16 meets (ties included)."""
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(512, 128)


@pytest.mark.parametrize(("dtype", "target"), TARGETS)
def test_cast_of_every_bfloat16_value_matches_eager_bit_for_bit(dtype: torch.dtype, target: str) -> None:
    x = _every_bf16()
    _same(_run(lambda t: t.to(dtype), x, target=target), x.to(dtype))


@pytest.mark.parametrize(("dtype", "target"), TARGETS)
@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.int32])
def test_casts_saturate_overflow_and_round_subnormals_as_eager(dtype: torch.dtype, target: str,
                                                               src: torch.dtype) -> None:
    special = [0.0, -0.0, 1.0, 447.0, 448.0, 449.0, 463.9, 464.0, 500.0, 1e4, 57343.0, 61439.0, 61440.0, 1e6,
               float("inf"), -float("inf"), float("nan"), -1e4, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-17, 1e-30]
    x = torch.tensor(special) if src == torch.float32 else None
    if src == torch.float16:
        x = torch.tensor(special).clamp(-65504, 65504).nan_to_num(nan=float("nan")).to(src)
    if src == torch.int32:
        x = torch.arange(-70000, 70000, 13, dtype=torch.int32)
    assert x is not None
    _same(_run(lambda t: t.to(dtype), x, target=target), x.to(dtype))
    y = torch.randn(64, 96) * torch.exp(torch.randn(64, 96) * 6)  # magnitudes from 1e-8 to 1e8
    _same(_run(lambda t: (t * 1.5).to(dtype).to(torch.float32), y, target=target), (y * 1.5).to(dtype).float())


@pytest.mark.parametrize(("dtype", "target"), TARGETS)
def test_dequantized_weight_only_linear_matches_eager(dtype: torch.dtype, target: str) -> None:
    """The weight-only pattern: FP8 weights and per-channel scales, dequantized to bf16 inside the graph."""
    w = (torch.randn(96, 160) * 4).to(dtype)
    scale = torch.rand(96, 1, dtype=torch.bfloat16) + 0.5
    x = torch.randn(8, 160, dtype=torch.bfloat16)

    def f(w, scale, x):
        return torch.nn.functional.linear(x, w.to(torch.bfloat16) * scale)

    got = _run(f, w, scale, x, target=target)
    torch.testing.assert_close(got, f(w, scale, x))
    _same(_run(lambda w, s: w.float() * s, w, torch.tensor(0.37), target=target), w.float() * 0.37)


@pytest.mark.parametrize(("dtype", "target"), TARGETS)
def test_data_movement_keeps_the_bytes(dtype: torch.dtype, target: str) -> None:
    w = (torch.randn(32, 48) * 3).to(dtype)
    cases = [
        (lambda w: torch.cat([w, w[:5]]), (w,)),
        (lambda w: w.t().contiguous(), (w,)),
        (lambda w, i: w[i], (w, torch.tensor([3, 1, 31]))),
        (lambda w, c: torch.where(c, w, torch.zeros((), dtype=dtype)), (w, torch.rand(32, 48) > 0.5)),
        (lambda w: w.abs(), (w,)),
        (lambda w: w.view(torch.uint8).to(torch.int32), (w,)),
        (lambda u: u.view(dtype).float(), (torch.randint(0, 256, (8, 16), dtype=torch.uint8),)),
        (lambda w: w.float() * 2, (w.t(),)),  # non-contiguous input
        (lambda w: w.float() * 2, (torch.tensor(3.0).to(dtype),)),  # 0-d
        (lambda w: w.float() + 1, (torch.empty(0, 3).to(dtype),)),  # empty
        (lambda x: (x.to(dtype), x.to(dtype).float() + 1), (torch.empty(0, 3),)),  # an empty FP8 value no kernel makes
        (lambda w: (w.isnan(), w == w.flip(0), w.to(torch.int32), w.to(torch.bool)), (w,)),
    ]
    for fn, args in cases:
        got, want = _run(fn, *args, target=target), fn(*args)
        for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                        strict=True):
            _same(g, e)


def _integral(shape: tuple[int, ...], dtype: torch.dtype, high: int = 8) -> torch.Tensor:
    """FP8 integers: their products and sums are exact in fp32, so any summation order gives eager's value."""
    return torch.randint(-high, high + 1, shape).to(dtype)


@pytest.mark.parametrize(("dtype", "target"), TARGETS)
def test_fp8_matmul_accumulates_in_fp32_and_rounds_once_as_eager(dtype: torch.dtype, target: str) -> None:
    """Sums up to 16 * 16 * 200: past 448 (e4m3fn saturates) and across every FP8 rounding step."""
    a, b = _integral((130, 200), dtype, 16), _integral((200, 70), dtype, 16)
    _same(_run(torch.mm, a, b, target=target), torch.mm(a, b))
    # a shape whose bf16 operand A goes through DMA transposes: an FP8 one cannot (they convert no dtype)
    a, b = _integral((256, 256), dtype, 16), _integral((256, 512), dtype, 16)
    _same(_run(torch.mm, a, b, target=target), torch.mm(a, b))


def _scaled(a, b, sa, sb, bias, scale_result, out_dtype):
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=bias, scale_result=scale_result, out_dtype=out_dtype)


@pytest.mark.parametrize(("dtype", "target"), TARGETS)
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_scaled_mm_is_one_kernel_with_eagers_values(dtype: torch.dtype, target: str, scaling: str) -> None:
    """Integral operands and power-of-two scales keep every step exact: eager's values bit for bit, in every
    output dtype, with bias and scale_result (which only an FP8 output applies)."""
    m, k, n = 130, 256, 96
    a, b = _integral((m, k), dtype), _integral((n, k), dtype).t()
    if scaling == "tensor":
        sa, sb = torch.tensor(0.25), torch.tensor(2.0)
    else:
        sa = 2.0 ** torch.randint(-3, 3, (m, 1)).float()
        sb = 2.0 ** torch.randint(-3, 3, (1, n)).float()
    for out_dtype in (torch.float32, torch.bfloat16, dtype):
        bias = torch.randint(-4, 5, (n,)).to(torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float32)
        for args in ((a, b, sa, sb, None, None, out_dtype), (a, b, sa, sb, bias, torch.tensor(4.0), out_dtype)):
            compile_record.reset()
            _same(_run(_scaled, *args, target=target), _scaled(*args))
            assert compile_record.records()[-1].kernels == 1  # no cast kernels: the matmul reads the FP8 operands


@pytest.mark.parametrize(("dtype", "target"), TARGETS)
def test_scaled_mm_with_real_scales_is_as_close_to_float64_as_eager(dtype: torch.dtype, target: str) -> None:
    m, k, n = 64, 512, 48
    a, b = (torch.randn(m, k) * 3).to(dtype), (torch.randn(n, k) * 3).to(dtype).t()
    sa, sb = torch.rand(m, 1) + 0.3, torch.rand(1, n) + 0.3
    exact = (a.double() * sa.double()) @ (b.double() * sb.double())
    got = _run(_scaled, a, b, sa, sb, None, None, torch.float32, target=target)
    want = _scaled(a, b, sa, sb, None, None, torch.float32)
    err = ((got.double() - exact).abs() / (exact.abs() + 1)).max().item()
    assert err <= max(2 * ((want.double() - exact).abs() / (exact.abs() + 1)).max().item(), 1e-6)


def test_float8_e4m3fn_is_refused_on_trn2_with_what_to_do() -> None:
    advice = "float8_e4m3fn is a NeuronCore-v4 (trn3) dtype: the Neuron compiler rejects it for trn1/trn2 (NCC_EVRF051)"
    with pytest.raises(BackendCompilerFailed) as info:
        _run(lambda q: q.float() * 2, torch.ones(3).to(E4), target="trn2")
    assert isinstance(info.value.inner_exception, UnsupportedOpError)
    assert f"input arg0_1: dtype torch.float8_e4m3fn is not supported on trn2 ({advice}" in str(info.value)
    assert "compile for trn3 (neuron_compile.config.target = 'trn3'), keep the tensor as float8_e5m2" in str(info.value)
    with pytest.raises(BackendCompilerFailed) as info:
        _run(lambda t: (t * 2).to(E4), torch.ones(3), target="trn2")
    assert f"produces dtype torch.float8_e4m3fn, which trn2 cannot hold ({advice}" in str(info.value)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_other_fp8_formats_are_refused_with_what_to_convert_to(dtype: torch.dtype) -> None:
    with pytest.raises(BackendCompilerFailed) as info:
        _run(lambda q: q.float() * 2, torch.ones(3).to(dtype), target="trn3")
    name = str(dtype).replace("torch.", "")
    assert (f"dtype torch.{name} is not supported (NeuronCores store float8_e5m2 and (trn3) float8_e4m3fn, not this "
            "format: convert it to one of those, or dequantize it to bfloat16 outside the compiled region)"
            in str(info.value))


def test_simulator_rejects_float8_e4m3fn_tensors_before_neuroncore_v4() -> None:
    from neuron_compile.simulator import dtypes, targets
    from neuron_compile.simulator import language as nl

    with targets.use_target("trn2"), pytest.raises(SimulatorConstraintError, match="float8_e4m3fn is NeuronCore-v4"):
        nl.ndarray((4, 4), dtype=dtypes.float8_e4m3fn, buffer=nl.sbuf)
    with targets.use_target("trn3"):
        assert nl.ndarray((4, 4), dtype=dtypes.float8_e4m3fn, buffer=nl.sbuf).dtype == "float8_e4m3fn"
