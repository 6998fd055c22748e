"""Fewer kernels, identical values: filled constants don't split a chain, independent ops join the latest kernel,
tensor literals are read in place and their in-range indices need no device check (lowering/partition.py,
graph_passes.drop_value_copies, graph_checks._provably_in_range)."""

from __future__ import annotations

import pytest
import torch

from neuron_compile import backend
from neuron_compile.config import config
from neuron_compile.errors import IndexOutOfRangeError


def _compiled(fn, *args):
    torch._dynamo.reset()
    with config.patch(cache=False):
        got = torch.compile(fn, backend="neuron", dynamic=False)(*args)
    return got, [k.name for k in backend.compiled_graphs()[-1]["plan"].kernels]


def test_zeros_like_inside_a_chain_keeps_one_kernel() -> None:
    def f(x):
        y = x.exp() - 1
        z = torch.where(y > 0, y, torch.zeros_like(y)) * 2  # zeros_like(y) reads y's shape, not its value
        return torch.where(z < 1, torch.ones_like(z), z).sqrt()

    x = torch.randn(6, 40)
    got, kernels = _compiled(f, x)
    torch.testing.assert_close(got, f(x), rtol=1e-6, atol=1e-6)
    assert len(kernels) == 1, kernels


def test_independent_ops_after_a_kernel_join_the_latest_one() -> None:
    def f(a, b):
        c = a @ b  # a matmul kernel
        d = c.t()  # read transposed: not fusable into the matmul's epilogue, so a new kernel starts
        e = torch.where(d > 0, d, c)
        g = (c.t() * 3).exp() + c.diagonal().unsqueeze(0)  # reads only the stored c: joins e's kernel
        return e * g

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    got, kernels = _compiled(f, a, b)
    torch.testing.assert_close(got, f(a, b), rtol=1e-5, atol=1e-5)
    assert len(kernels) == 2, kernels


def test_a_tensor_literal_index_is_read_in_place_without_a_check() -> None:
    def f(x):
        return x.index_select(1, torch.tensor([3, 0, 2, 2])) * 2

    x = torch.randn(5, 4)
    got, kernels = _compiled(f, x)
    assert torch.equal(got, f(x))
    assert kernels == ["k0_index_select", "k1_mul"], kernels  # no copy of the literal, no range check


def test_a_tensor_literal_index_out_of_range_still_raises() -> None:
    def f(x):
        return x.index_select(1, torch.tensor([1, 4])) * 2

    x = torch.randn(5, 4)
    with pytest.raises((IndexError, RuntimeError)):  # eager: "INDICES element is out of DATA bounds"
        f(x)
    torch._dynamo.reset()
    with config.patch(cache=False), pytest.raises(IndexOutOfRangeError, match=r"outside \[0, 4\)"):
        torch.compile(f, backend="neuron", dynamic=False)(x)


@pytest.mark.parametrize(("n", "dtype"), [(8, torch.float32), (5, torch.float32)])
def test_a_jacobi_round_is_one_kernel_and_two_matmuls(n: int, dtype: torch.dtype) -> None:
    from neuron_compile.lowering.decomp_spectral import _rounds, sweeps

    a = torch.randn(n, n, dtype=dtype, generator=torch.Generator().manual_seed(n))
    a = a + a.mH
    got, kernels = _compiled(torch.linalg.eigvalsh, a)
    torch.testing.assert_close(got, torch.linalg.eigvalsh(a), rtol=1e-4, atol=1e-4)
    rounds = sweeps(n) * len(_rounds(n))
    assert len(kernels) <= 3 * rounds + 16, (len(kernels), rounds)  # (a round took 11 kernels)


def test_mask_indices_built_from_aranges_need_no_checks_or_wraps() -> None:
    """Hugging Face's padding mask: ``mask[batch_idx, kv_idx]`` with both index tensors aranges (broadcast). Their
    bounds checks hold on every call and their negative-index wraps never apply: neither is computed."""
    def f(mask, x):
        b = torch.arange(mask.shape[0])[:, None]
        kv = torch.arange(mask.shape[1])[None, :] + 0
        return torch.where(mask.bool()[b, kv], x, 0.0)

    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    x = torch.randn(2, 5)
    got, kernels = _compiled(f, mask, x)
    assert torch.equal(got, f(mask, x))
    ops = {op for k in kernels for op in k.split("_")[1:]}
    assert not ops & {"ge", "lt", "all", "any"}, kernels  # (the one where is f's own)


def test_an_arange_index_out_of_range_keeps_its_check() -> None:
    def f(x):
        return x[torch.arange(5)[:, None], torch.arange(3)[None, :] + 1] * 2  # rows 0..4 of a 4-row x

    x = torch.randn(4, 4)
    with pytest.raises(IndexError):
        f(x)
    torch._dynamo.reset()
    with config.patch(cache=False), pytest.raises(IndexOutOfRangeError, match=r"outside \[-4, 4\)"):
        torch.compile(f, backend="neuron", dynamic=False)(x)


def test_int_range_and_truth_follow_shifts_scales_views_and_decided_wheres() -> None:
    from neuron_compile.lowering.value_ranges import int_range, truth
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(n):
        i = torch.arange(2, 9).view(7, 1).expand(7, 3)
        j = torch.where(i < 0, i + 9, i) * 3 - 4  # the wrap never applies: [2, 8] * 3 - 4 = [2, 20]
        return (j >= 2).all(), (j < 20).all(), n + j, j > 25

    gm = make_fx(f)(torch.zeros(7, 3, dtype=torch.int64))
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert truth(out[0]) is True
    assert truth(out[1]) is None  # 20 is reached
    assert int_range(out[2]) is None  # n is an input: unknown
    assert int_range(out[2].args[1]) == (2, 20)
    assert truth(out[3]) is False


def test_int_range_follows_a_shared_subexpression_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_compile.lowering import value_ranges
    from torch.fx.experimental.proxy_tensor import make_fx

    def f():
        x = torch.arange(8)
        for _ in range(24):
            x = x + x  # each add reads one node twice: followed without a memo, 2^24 visits
        return x >= 0

    gm = make_fx(f)()
    calls = []
    inner = value_ranges._range
    monkeypatch.setattr(value_ranges, "_range", lambda *a: calls.append(a[0]) or inner(*a))
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert value_ranges.int_range(out.args[0]) == (0, 7 * 2**24)
    assert value_ranges.truth(out) is True
    assert len(calls) <= 2 * 26, len(calls)
