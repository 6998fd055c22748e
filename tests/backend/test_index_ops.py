"""Index, gather/scatter, scan, cross-entropy, dropout and attention lowerings against eager PyTorch.

Forward and backward through ``torch.compile(backend="neuron")`` on the bundled simulator: embedding
and index_select (gather kernels, row scatter-add backward with duplicate indices, ragged row counts,
vocab > 128, rows > 512), gather/scatter along a dim (cross_entropy training), cumsum along any dim,
training dropout (seeded determinism, keep rate, scaling) and scaled_dot_product_attention (causal,
additive and boolean masks). Rendered kernels are checked against the NKI API list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from neuron_compile import backend as B
from neuron_compile.errors import UnsupportedOpError
from neuron_compile.nki_api.checker import check_source_against_api

log = logging.getLogger(__name__)


TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert got.dtype == want.dtype, what
    assert got.shape == want.shape, what
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def check(fn: Callable[..., Any], *args: torch.Tensor, dtype: torch.dtype = torch.float32,
          backward: bool = True) -> None:
    """Compare outputs (and input grads for a random upstream grad) with eager."""
    mine = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    got, want = _compile(fn)(*mine), fn(*ref)
    _close(got, want, dtype, "forward")
    if backward:
        g = torch.randn(want.shape, generator=torch.Generator().manual_seed(3)).to(want.dtype)
        got.backward(g)
        want.backward(g)
        for i, (a, b) in enumerate(zip(mine, ref, strict=True)):
            if b.requires_grad:
                _close(a.grad, b.grad, dtype, f"grad of input {i}")


def _leaf(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).requires_grad_()


def _families() -> set[str]:
    return {k.family for g in B.compiled_graphs() for k in g["plan"].kernels}


# -- embedding / index_select ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_embedding_duplicates_ragged_large_vocab_wide_rows(dtype):
    weight = _leaf(300, 600, dtype=dtype)  # vocab > 128, rows > 512 (two PSUM-bank chunks)
    idx = torch.randint(0, 300, (3, 61), generator=torch.Generator().manual_seed(1))  # 183 rows: ragged
    idx[0, :10] = 7  # duplicates must accumulate in the backward
    idx[2, -1] = 299
    check(lambda w, i: F.embedding(i, w), weight, idx, dtype=dtype)
    assert {"gather", "index_put"} <= _families()


def test_embedding_groups_index_loads_and_stores():
    """4096 + 40 rows: the indices of 32 row tiles arrive in one DMA and their rows leave in one store per
    row chunk; the ragged 40-row tail gets its own; values equal eager (a forward-only graph)."""
    from neuron_compile.instruction_stream import kernel_stream

    weight = torch.randn(1000, 96, generator=torch.Generator().manual_seed(2))
    idx = torch.randint(0, 1000, (4136,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = torch.compile(lambda w, i: F.embedding(i, w), backend="neuron", dynamic=False)(weight, idx)
    torch.testing.assert_close(out, F.embedding(idx, weight), rtol=0, atol=0)
    plan = B.compiled_graphs()[-1]["plan"]
    assert len(plan.kernels) == 2 and len(plan.checks) == 1  # the bounds check of the indices, then the gather
    kern = plan.kernels[-1]
    counts = {"index": 0, "gather": 0, "store": 0}
    for rec, n in kernel_stream(kern).items():
        if rec.engine == "dma":
            kind = "store" if rec.buffers[0] == "shared_hbm" else "index" if rec.dtypes[0] == "int32" else "gather"
            counts[kind] += n
    assert counts == {"index": 2, "gather": 33, "store": 2}


def test_embedding_padding_idx_gets_no_gradient():
    weight = _leaf(50, 16)
    idx = torch.tensor([[0, 3, 3, 0, 49]])
    check(lambda w, i: F.embedding(i, w, padding_idx=0), weight, idx)


def test_index_select_dim1_and_transposed_table():
    idx = torch.tensor([5, 0, 5, 699, 3] * 27)  # 135 indices with duplicates
    check(lambda w, i: w.index_select(1, i), _leaf(20, 700), idx)
    check(lambda w, i: w.t().index_select(0, i) * 2, _leaf(9, 140), torch.tensor([139, 0, 7, 7]))


def test_advanced_index_one_tensor_wraps_negative_indices():
    idx = torch.tensor([[0, -1, 4], [-5, 2, 2]])
    check(lambda x, i: x[i] * 2, _leaf(5, 7), idx)
    check(lambda x, i: x[:, i], _leaf(3, 5, 4), idx)


def test_embedding_scale_grad_by_freq():
    check(lambda w, i: F.embedding(i, w, scale_grad_by_freq=True), _leaf(40, 8), torch.tensor([[1, 1, 3, 39, 1]]))


# -- gather / cross_entropy -----------------------------------------------------------------------------


def test_gather_last_dim_and_its_scatter_add_backward():
    idx = torch.randint(0, 300, (37, 1), generator=torch.Generator().manual_seed(2))
    check(lambda x, i: torch.gather(x, 1, i) * 3, _leaf(37, 300), idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cross_entropy_training_step_matches_eager(dtype):
    torch.manual_seed(0)
    x = torch.randn(150, 64).to(dtype)
    target = torch.randint(0, 200, (150,))
    target[::7] = -100  # ignore_index
    lin_mine = torch.nn.Linear(64, 200).to(dtype)
    lin_ref = torch.nn.Linear(64, 200).to(dtype)
    lin_ref.load_state_dict(lin_mine.state_dict())
    step = _compile(lambda m, x, t: F.cross_entropy(m(x), t))
    losses = []
    for model, fn in ((lin_mine, step), (lin_ref, lambda m, x, t: F.cross_entropy(m(x), t))):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        run = []
        for _ in range(2):
            opt.zero_grad()
            loss = fn(model, x, target)
            loss.backward()
            opt.step()
            run.append(loss.detach())
        losses.append((run, model.weight.detach().clone()))
    (mine, w_mine), (ref, w_ref) = losses
    for a, b in zip(mine, ref, strict=True):
        _close(a, b, dtype, "loss")
    _close(w_mine, w_ref, dtype, "weights after two SGD steps")


# -- cumsum ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_any_dim(dim):
    check(lambda x: torch.cumsum(x, dim) + 1, _leaf(130, 5, 600), dtype=torch.float32)
    assert "scan" in _families()


def test_cumsum_bf16_long_free_dim():
    check(lambda x: torch.cumsum(x, -1), _leaf(3, 1100, dtype=torch.bfloat16) * 0.1, dtype=torch.bfloat16,
          backward=False)


# -- dropout --------------------------------------------------------------------------------------------


def test_dropout_train_is_seeded_and_follows_torch_distribution():
    p = 0.1
    f = _compile(lambda x: F.dropout(x, p, training=True))
    x = torch.randn(200, 300, requires_grad=True)
    torch.manual_seed(1234)
    a = f(x)
    torch.manual_seed(1234)
    b = f(x)
    c = f(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    keep = a != 0
    assert abs(keep.float().mean().item() - (1 - p)) < 0.01  # 60000 draws: std 0.0012
    torch.testing.assert_close(a[keep], x.detach()[keep] / (1 - p))
    # The mask is eager's own: the same seed reproduces it with eager dropout (tests/backend/test_dropout.py).
    torch.manual_seed(1234)
    assert torch.equal(keep, F.dropout(x.detach(), p, training=True) != 0)
    a.backward(torch.ones_like(a))
    torch.testing.assert_close(x.grad, keep.float() / (1 - p))


def test_dropout_eval_is_identity_without_random_buffers():
    x = torch.randn(8, 16)
    out = _compile(lambda x: F.dropout(x, 0.5, training=False) * 2)(x)
    torch.testing.assert_close(out, x * 2)
    assert all(b.kind != "random" for g in B.compiled_graphs() for b in g["plan"].buffers)


# -- attention ------------------------------------------------------------------------------------------


def test_sdpa_causal():
    q, k, v = _leaf(2, 3, 70, 16, seed=1), _leaf(2, 3, 70, 16, seed=2), _leaf(2, 3, 70, 16, seed=3)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


@pytest.mark.parametrize("mask_kind", ["additive", "bool"])
def test_sdpa_masks(mask_kind):
    q, k, v = _leaf(2, 2, 9, 8, seed=1), _leaf(2, 2, 12, 8, seed=2), _leaf(2, 2, 12, 8, seed=3)
    if mask_kind == "additive":
        mask = torch.randn(9, 12)
    else:
        mask = torch.rand(9, 12, generator=torch.Generator().manual_seed(4)) > 0.3
        mask[:, 0] = True  # no fully masked row
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)


# -- rejection and rendered source ----------------------------------------------------------------------


def _cause(exc: BaseException) -> UnsupportedOpError:
    while exc is not None and not isinstance(exc, UnsupportedOpError):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None, "no UnsupportedOpError in the exception chain"
    return exc


def test_index_put_without_accumulate_last_write_wins_like_eager():
    def f(x, i, v):
        return torch.ops.aten.index_put.default(x, [i], v, False)

    x, i, v = torch.zeros(10, 4), torch.tensor([1, 7, 1]), torch.arange(12.0).view(3, 4)
    torch.testing.assert_close(_compile(f)(x, i, v), f(x, i, v), rtol=0, atol=0)


def test_gather_with_several_indices_per_row():
    x, i = torch.randn(4, 10), torch.tensor([[0, 9, 3], [1, 1, 1], [5, 0, 2], [9, 8, 7]])
    torch.testing.assert_close(_compile(lambda x, i: torch.gather(x, 1, i))(x, i), torch.gather(x, 1, i),
                               rtol=0, atol=0)


def test_gather_of_a_1d_self_lowers():
    x, i = torch.randn(4, 10), torch.tensor([[0, 9, 9], [1, 2, 3], [5, 5, 0], [7, 8, 9]])
    got = _compile(lambda x, i: torch.gather(x[0], 0, i[1]))(x, i)
    assert torch.equal(got, torch.gather(x[0], 0, i[1]))


def test_rendered_index_kernels_use_only_current_nki_api():
    weight = _leaf(130, 20)
    idx = torch.tensor([1, 129, 1])
    f = _compile(lambda w, i, x: (F.embedding(i, w).sum() + torch.cumsum(x, 0).sum()))
    f(weight, idx, torch.randn(5, 3)).backward()
    seen = set()
    for g in B.compiled_graphs():
        for (name, src), k in zip(g["sources"], g["plan"].kernels, strict=True):
            if k.family in ("gather", "index_put", "scan"):
                seen.add(k.family)
                assert check_source_against_api(src) == [], name
    assert seen == {"gather", "index_put", "scan"}


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_with_no_index_entries_writes_nothing(accumulate: bool) -> None:
    """A zero-length index (an empty matrix's diagonal_scatter in svd's backward, a batch with no selected rows):
    the result is the input (tracing crashed on a max over zero writers before)."""
    def f(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return x.index_put((i, j), torch.ones(0), accumulate=accumulate) * 2

    x, i = torch.randn(4, 3), torch.zeros(0, dtype=torch.long)
    got = torch.compile(f, backend="neuron", dynamic=False)(x, i, i)
    torch.testing.assert_close(got, f(x, i, i))
    empty = torch.compile(lambda v: torch.diagonal_scatter(torch.zeros(0, 0), v), backend="neuron", dynamic=False)
    assert empty(torch.ones(0)).shape == (0, 0)


@pytest.mark.parametrize("train", [False, True])
def test_embedding_max_norm_renormalizes_the_weight_in_place(train: bool) -> None:
    """``nn.Embedding(max_norm=...)`` scales the looked-up rows whose norm exceeds max_norm, in the weight itself
    (eager's in-place embedding_renorm_): the outputs, the updated weight and its gradient match eager."""
    torch.manual_seed(0)
    eager = torch.nn.Embedding(50, 8, max_norm=1.0, norm_type=1.5)
    ours = torch.nn.Embedding(50, 8, max_norm=1.0, norm_type=1.5)
    ours.load_state_dict(eager.state_dict())
    idx = torch.tensor([[1, 4, 4, 9], [0, 49, 3, 1]])
    before = eager.weight.detach().clone()
    compiled = torch.compile(ours, backend="neuron", dynamic=False)
    with torch.set_grad_enabled(train):
        want, got = eager(idx), compiled(idx)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(ours.weight.detach(), eager.weight.detach())
    changed = (eager.weight.detach() != before).any(1)
    assert changed.any() and set(changed.nonzero().flatten().tolist()) <= set(idx.flatten().tolist())
    if train:
        want.square().sum().backward()
        got.square().sum().backward()
        torch.testing.assert_close(ours.weight.grad, eager.weight.grad)


@pytest.mark.parametrize("size,fill", [(5, -1), (2, 7), (70, -2), (0, -1)])
def test_nonzero_static_matches_eager(size: int, fill: int) -> None:
    """The first ``size`` nonzero coordinates in row-major order, then ``fill`` rows (bool, float, 3-D, 0-d and
    empty inputs)."""
    gen = torch.Generator().manual_seed(0)
    for x in (torch.tensor([[0, 1.0, 0], [2, 0, 3]]), torch.randn(3, 4, 5, generator=gen) > 0.3, torch.tensor(3.0),
              torch.zeros(2, 0)):
        torch._dynamo.reset()
        fn = lambda t: torch.nonzero_static(t, size=size, fill_value=fill)  # noqa: E731
        got, want = torch.compile(fn, backend="neuron", dynamic=False)(x), fn(x)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_multi_index_with_0d_indices_gives_a_0d_result() -> None:
    """``aten.index.Tensor(x, [i, j])`` with 0-d index tensors (what a vmapped flex_attention mask function
    traces for ``padding[b, kv]``) is one element, shape ``[]``; index_put writes that one element."""
    x, i, j, v = torch.randn(4, 5), torch.tensor(2), torch.tensor(-1), torch.tensor(7.0)

    def fn(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.ops.aten.index.Tensor(x, [i, j]) * 2, torch.ops.aten.index_put.default(x, [i, j], v, True)

    got, want = _compile(fn)(x, i, j, v), fn(x, i, j, v)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)
