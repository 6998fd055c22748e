"""Mixture-of-experts routing (lowering/decomp_moe.py): histc, float sums/cumsums with an integer dtype, and the
grouped matmuls of Hugging Face's MoE layers, against eager."""

from __future__ import annotations

import math

import pytest
import torch

from neuron_compile.errors import UnsupportedOpError


def _compile(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


def _cause(exc: BaseException, kind: type) -> BaseException:
    while exc is not None and not isinstance(exc, kind):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None, f"no {kind.__name__} in the chain"
    return exc


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 13, generator=g) * 3
    x[0, :4] = torch.tensor([0.0, 3.0, -2.0, 2.0])  # exactly on edges (min, max, bin edges of the (5, -2, 2) case)
    x[1, 0] = float("nan")
    x[1, 1] = float("inf")
    return x


@pytest.mark.parametrize("bins, lo, hi", [(4, 0, 3), (5, -2, 2), (6, 0, 0), (10, -1.5, 0.7), (1, -10, 10)],
                         ids=["int_range", "edges", "data_range", "fractional", "one_bin"])
def test_histc_counts_exactly_like_eager(bins, lo, hi):
    x = _data()
    if hi == lo:  # the data's own range: no NaN / inf (eager refuses a non-finite range)
        x = torch.nan_to_num(x, nan=0.0, posinf=5.0)
    f = lambda t: torch.histc(t, bins=bins, min=lo, max=hi)  # noqa: E731
    got, want = _compile(f)(x), f(x)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want), (got, want)


def test_histc_of_a_single_value_widens_the_range_like_eager():
    x = torch.full((2, 3), 2.5)
    f = lambda t: torch.histc(t, bins=4)  # noqa: E731
    assert torch.equal(_compile(f)(x), f(x))


def test_histc_of_expert_ids_gives_tokens_per_expert():
    ids = torch.randint(0, 8, (64,), generator=torch.Generator().manual_seed(1)).float()
    f = lambda t: torch.histc(t, bins=8, min=0, max=7)  # noqa: E731
    got = _compile(f)(ids)
    assert torch.equal(got, f(ids))
    assert torch.equal(got, torch.bincount(ids.long(), minlength=8).float())


def test_histc_of_bf16_is_refused_by_name():
    x = torch.randn(16, dtype=torch.bfloat16)
    with pytest.raises(Exception) as info:
        _compile(lambda t: torch.histc(t, bins=4, min=-1, max=1))(x)
    assert "aten.histc" in str(_cause(info.value, UnsupportedOpError))


def test_float_sums_with_an_integer_dtype_truncate_first_like_eager():
    x = torch.tensor([[2.7, -2.7, 0.5, -0.5, 7.9], [1.2, -3.99, 3.99, 100.5, -0.01]])
    f = lambda t: (torch.cumsum(t, 1, dtype=torch.int32), t.sum(1, dtype=torch.int64), t.sum(dtype=torch.int32))  # noqa: E731
    got, want = _compile(f)(x), f(x)
    assert [g.dtype for g in got] == [w.dtype for w in want] == [torch.int32, torch.int64, torch.int32]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w), (g, w)


def _grouped_reference(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out, start = torch.zeros(a.shape[0], w.shape[2], dtype=a.dtype), 0
    for i, end in enumerate(offs.tolist()):
        out[start:end] = (a[start:end].float() @ w[i].float()).to(a.dtype)
        start = end
    return out


# offsets with an empty group, and rows past the last offset (torch leaves those unspecified)
OFFS = torch.tensor([3, 3, 8], dtype=torch.int32)


def test_grouped_mm_rows_by_expert_match_eager():
    g = torch.Generator().manual_seed(2)  # torch._grouped_mm takes bf16 operands only
    a, w = torch.randn(10, 16, generator=g).bfloat16(), torch.randn(3, 16, 8, generator=g).bfloat16()
    got = _compile(lambda a, w, o: torch._grouped_mm(a, w, offs=o))(a, w, OFFS)
    n = int(OFFS[-1])
    torch.testing.assert_close(got[:n], torch._grouped_mm(a, w, offs=OFFS)[:n], rtol=0, atol=0)
    torch.testing.assert_close(got[:n], _grouped_reference(a, w, OFFS)[:n], rtol=0, atol=0)
    assert torch.equal(got[n:], torch.zeros_like(got[n:]))


def test_grouped_mm_grouped_contraction_and_batched_forms_match_eager():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 16, generator=g).bfloat16(), torch.randn(16, 8, generator=g).bfloat16()
    offs = torch.tensor([8, 8, 16], dtype=torch.int32)
    got = _compile(lambda a, b, o: torch._grouped_mm(a, b, offs=o))(a, b, offs)
    assert got.shape == (3, 5, 8)
    torch.testing.assert_close(got, torch._grouped_mm(a, b, offs=offs), rtol=0, atol=0)
    x, y = torch.randn(3, 5, 16, generator=g).bfloat16(), torch.randn(3, 16, 8, generator=g).bfloat16()
    torch._dynamo.reset()
    torch.testing.assert_close(_compile(lambda x, y: torch._grouped_mm(x, y))(x, y), torch._grouped_mm(x, y))


def test_grouped_mm_gradients_match_eager():
    g = torch.Generator().manual_seed(4)
    a0, w0 = torch.randn(10, 16, generator=g).bfloat16(), torch.randn(3, 16, 8, generator=g).bfloat16()
    n = int(OFFS[-1])

    def loss(a, w):
        return (torch._grouped_mm(a, w, offs=OFFS)[:n].float() ** 2).sum()

    grads = []
    for fn in (loss, _compile(loss)):
        a, w = a0.clone().requires_grad_(), w0.clone().requires_grad_()
        fn(a, w).backward()
        grads.append((a.grad[:n].float(), w.grad.float()))
    (ga, gw), (ea, ew) = grads[1], grads[0]
    torch.testing.assert_close(ga, ea, rtol=2e-2, atol=2e-2 * float(ea.abs().max()))
    torch.testing.assert_close(gw, ew, rtol=2e-2, atol=2e-2 * float(ew.abs().max()))


def test_an_unused_experts_nan_weights_do_not_reach_other_rows():
    g = torch.Generator().manual_seed(5)
    a, w = torch.randn(8, 16, generator=g), torch.randn(3, 16, 8, generator=g)
    w[1] = float("nan")  # expert 1 gets no rows (OFFS: 3, 3, 8)
    got = _compile(lambda a, w, o: torch._grouped_mm(a.bfloat16(), w.bfloat16(), offs=o).float())(a, w, OFFS)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _grouped_reference(a.bfloat16(), w.bfloat16(), OFFS).float(), rtol=1e-2, atol=1e-2)


def test_transformers_grouped_mm_fallback_op_and_its_backward_match_eager():
    moe = pytest.importorskip("transformers.integrations.moe", reason="transformers is not installed")
    if not hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        pytest.skip("this transformers version has no grouped_mm_fallback custom op")
    del moe
    g = torch.Generator().manual_seed(6)
    a0, w0 = torch.randn(10, 16, generator=g), torch.randn(3, 16, 8, generator=g)

    def loss(a, w):
        y = torch.ops.transformers.grouped_mm_fallback(a, w, OFFS)
        return y, (y[: int(OFFS[-1])] * torch.linspace(-1, 1, 8)).pow(2).sum()

    results = []
    for fn in (loss, _compile(loss)):
        a, w = a0.clone().requires_grad_(), w0.clone().requires_grad_()
        y, total = fn(a, w)
        total.backward()
        results.append((y.detach(), a.grad, w.grad))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(want.abs().max())))
    assert math.isfinite(float(results[1][2].sum()))
