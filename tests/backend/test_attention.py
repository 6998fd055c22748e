"""Fused scaled-dot-product attention: pattern matching, one-kernel lowering, numerics and fallbacks.

Covers ``lowering/attention.py`` (matcher + graph rewrite), ``lowering/ops/attention.py`` (IR) and
``codegen/plan_attention.py`` + ``templates/attention_*.nki.j2`` (the kernels): eager-equal results for causal,
non-causal and additive-mask SDPA in fp32 and bf16 with ragged sequence lengths and several
online-softmax steps, the written-out ``softmax(q @ k^T / c) @ v`` form, exactly one kernel, the
ordinary decomposed path whenever the subgraph differs, the NKI API listing and the roofline count.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from neuron_compile.codegen.plan_attention import head_group, mask_rows_bytes
from neuron_compile.lowering.ir import AttentionKernel

import neuron_compile.backend
from neuron_compile.config import config
from neuron_compile.roofline import attention_flops, kernel_roofline
from neuron_compile.simulator import trace

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "codegen"))
from static_checks import check_kernel_rules  # noqa: E402

from neuron_compile.nki_api.checker import check_source_against_api  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def exact_kernels() -> Any:
    """These tests exercise the exact kernels (softmax with the row max) directly; the unshifted fast path that runs
    first when there is no additive mask, and its guard, are covered by ``test_attention_unshifted.py``."""
    with config.patch(attention_unshifted=False):
        yield


def _run(fn: Callable[..., Any], *inputs: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    with config.patch(target="trn2"):
        out = torch.compile(fn, backend="neuron", dynamic=False)(*inputs)
    return out, neuron_compile.backend.compiled_graphs()[-1]


def _families(stats: dict[str, Any]) -> list[str]:
    return [k.family for k in stats["plan"].kernels]


def _check(fn: Callable[..., Any], *inputs: torch.Tensor, fused: bool | None = True) -> dict[str, Any]:
    """fused: the plan is the one attention kernel (True), has none (False), or has one beside others (None)."""
    out, stats = _run(fn, *inputs)
    ref = fn(*inputs)
    refs, outs = (ref, out) if isinstance(ref, tuple) else ((ref,), (out,))
    for r, o in zip(refs, outs, strict=True):
        assert o.dtype == r.dtype and o.shape == r.shape
        tol = TOL[r.dtype] if r.dtype in TOL else 1e-4
        torch.testing.assert_close(o.float(), r.float(), atol=tol, rtol=tol, equal_nan=True)
    if fused:
        assert _families(stats) == ["attention"], stats["plan"]
    else:
        assert _families(stats).count("attention") == (0 if fused is False else 1), stats["plan"]
    return stats


def _qkv(b: int, h: int, sq: int, sk: int, d: int, dv: int | None = None, dtype: torch.dtype = torch.float32
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(sq * 131 + sk)
    mk = lambda s, e: torch.randn(b, h, s, e, generator=g).to(dtype)  # noqa: E731
    return mk(sq, d), mk(sk, d), mk(sk, dv or d)


def _sdpa(**kw: Any) -> Callable[..., torch.Tensor]:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(2, 3, 200, 200, 64), (1, 2, 130, 77, 40), (1, 1, 64, 300, 128)],
                         ids=["ragged", "sq>sk", "sq<sk"])
def test_sdpa_one_kernel_matches_eager(dtype: torch.dtype, causal: bool, shape: tuple[int, ...]) -> None:
    """fp16 included: the causal bias tile must stay finite in fp16 (-65504; -3e38 would be -inf there, and
    the identity matmul that adds it would make 0 x inf = NaN)."""
    q, k, v = _qkv(*shape, dtype=dtype)
    stats = _check(_sdpa(is_causal=causal), q, k, v)
    kern = stats["plan"].kernels[0]
    assert isinstance(kern, AttentionKernel) and kern.causal is causal and kern.mask is None
    assert math.isclose(kern.scale, shape[-1] ** -0.5, rel_tol=1e-6)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_several_online_softmax_steps(causal: bool) -> None:
    # fp32 steps are 1536 keys (three 512-key PSUM chunks): 1700 keys take two steps (running max/sum
    # rescaling); with a causal mask only the last query tiles need the second step. Ragged 128-tiles.
    q, k, v = _qkv(1, 1, 1700 if causal else 200, 1700, 128, 48)  # d = 128: the standard kernel
    stats = _check(_sdpa(is_causal=causal), q, k, v)
    assert stats["plan"].kernels[0].key_step == 1536


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_additive_mask(dtype: torch.dtype) -> None:
    q, k, v = _qkv(2, 2, 150, 150, 32, dtype=dtype)
    mask = torch.randn(150, 150, generator=torch.Generator().manual_seed(3)).to(dtype)
    stats = _check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)
    assert stats["plan"].kernels[0].mask is not None


def test_mask_with_fully_masked_rows_and_finfo_min() -> None:
    """-inf rows give 0 (SDPA's guard); finfo.min rows give the eager uniform softmax; broadcast over heads."""
    q, k, v = _qkv(2, 3, 140, 140, 16)
    mask = torch.zeros(2, 1, 140, 140)
    mask[:, :, 5, :] = -math.inf
    mask[:, :, 7, :100] = -math.inf
    mask[1, :, 9, :] = torch.finfo(torch.float32).min
    mask[0, :, :, 130:] = -math.inf
    _check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)


@pytest.mark.parametrize("kind", ["bool", "additive", "gqa_causal"])
def test_gradients_with_fully_masked_rows_match_eager(kind: str) -> None:
    """A padded query under a sliding window attends to nothing: eager's CPU kernel gives that row 0 probability,
    forward and backward, so its gradients are finite (the recomputed softmax's NaN must not leak into them)."""
    q, k, v = _qkv(2, 4, 12, 12, 16)
    if kind == "gqa_causal":
        k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    rows, cols = torch.arange(12).unsqueeze(1), torch.arange(12).unsqueeze(0)
    keep = ((rows - cols).abs() < 3) & (cols < 9) & (rows < 9)  # window 3 over 9 real tokens of 12
    keep = keep.expand(2, 1, 12, 12).clone()
    keep[0, :, 2] = False
    mask = keep if kind != "additive" else torch.where(keep, 0.0, -math.inf)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=kind == "gqa_causal")

    grads = []
    for fn in (f, torch.compile(f, backend="neuron", dynamic=False)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves, mask)
        grads.append((out.detach(), *torch.autograd.grad(out.square().sum(), leaves)))
    for want, got in zip(*grads, strict=True):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("case", ["causal", "mask", "gqa_bf16"])
def test_flash_cpu_op_called_directly_returns_eager_logsumexp(case: str) -> None:
    """``aten._scaled_dot_product_flash_attention_for_cpu`` returns (output, logsumexp); torch's own decomposition
    puts the attention matrix where the logsumexp goes. Both outputs match eager (fp32 logsumexp, 0 on a fully
    masked row). The output comes from the fused kernel either way; the logsumexp, when read, from kernels of its
    own."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q, k, v = _qkv(2, 4, 70, 90, 32, dtype=torch.bfloat16 if case == "gqa_bf16" else torch.float32)
    if case == "causal":
        _check(lambda q, k, v: op(q, k, v, is_causal=True), q, k, v, fused=None)
    elif case == "mask":
        mask = torch.randn(70, 90, generator=torch.Generator().manual_seed(5))
        mask[3] = -math.inf
        _check(lambda q, k, v, m: op(q, k, v, attn_mask=m, scale=0.3), q, k, v, mask, fused=None)
    else:
        k, v = k[:, :2].contiguous(), v[:, :2].contiguous()  # grouped heads: the math path's repeat is not fused
        _check(lambda q, k, v: op(q, k, v, is_causal=True), q, k, v, fused=False)
        return
    _check(lambda q, k, v: op(q, k, v)[0], q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
def test_mask_rows_load_once_per_query_tile_when_heads_share_the_mask(dtype: torch.dtype, per_head: bool) -> None:
    """A padding-style mask ([b, 1, sq, sk]: head stride 0) loads one DMA of all its keys per query tile, which every
    head of the group reads (the next tile's rows load meanwhile); a mask of its own per head (ALiBi, T5's bias) keeps
    one load per (head, query tile, key step). Both match eager: ragged query and key tiles, -inf and finfo.min
    entries, a fully masked row."""
    b, h, sq, sk = 2, 4, 300, 600
    q, k, v = _qkv(b, h, sq, sk, 64, dtype=dtype)
    g = torch.Generator().manual_seed(11)
    mask = torch.randn(b, h if per_head else 1, sq, sk, generator=g)
    mask[:, :, :, 550:] = -math.inf
    mask[1, :, 7, :] = -math.inf
    mask[0, :, 9, :] = torch.finfo(torch.float32).min
    mask = mask.to(dtype)
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    with config.patch(target="trn2"), trace() as t:
        out = torch.compile(fn, backend="neuron", dynamic=False)(q, k, v, mask)
    ref = fn(q, k, v, mask)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])
    kern = neuron_compile.backend.compiled_graphs()[-1]["plan"].kernels[0]
    assert isinstance(kern, AttentionKernel) and kern.mask is not None
    assert (mask_rows_bytes(kern) > 0) is not per_head
    loads = [r for r in t.records if r.instruction == "dma_copy" and r.buffers[0] == "sbuf" and "hbm" in r.buffers[1]]
    rows = [r for r in loads if r.shapes[0][-1] == sk]  # every key of a query tile (one step: sk <= key_step)
    assert len(rows) == len([r for r in loads if r.shapes[0][-1] not in (64, 4 * 64)])  # no other mask load
    if per_head:
        assert len(rows) == b * h * 3  # (batch, head, query tile)
    else:
        assert len(rows) == b * (h // head_group(kern, grid=2)) * 3  # (batch, group, query tile)


def test_written_out_causal_attention() -> None:
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v

    q, k, v = _qkv(2, 2, 160, 160, 32)
    stats = _check(attn, q, k, v)
    assert stats["plan"].kernels[0].causal


def _written(mask_fn: Callable[[int, int], torch.Tensor] | None = None, dim: int = -1, scale: float = 0.125,
             also_scores: bool = False) -> Callable[..., Any]:
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        s = (q @ k.transpose(-2, -1)) * scale
        if mask_fn is not None:
            s = s.masked_fill(mask_fn(q.shape[-2], k.shape[-2]), float("-inf"))
        p = torch.softmax(s, dim=dim)
        return (p @ v, s) if also_scores else p @ v
    return attn


@pytest.mark.parametrize("fn", [
    _written(also_scores=True),  # the scores are also a graph output
    _written(dim=-2),  # softmax over the query dim
    _written(scale=-0.5),  # negative scale: the row max is taken before scaling
    _written(lambda n, m: torch.ones(n, m, dtype=torch.bool).tril(-1)),  # strictly-upper kept: not causal
    _written(lambda n, m: torch.ones(n, m, dtype=torch.bool).triu(1).flip(0)),  # other constant mask
], ids=["scores_used", "dim_q", "neg_scale", "not_causal", "other_mask"])
def test_pattern_differs_falls_back(fn: Callable[..., Any]) -> None:
    q, k, v = _qkv(1, 2, 96, 96, 16)
    _check(fn, q, k, v, fused=False)


def test_head_dim_over_128_falls_back() -> None:
    q, k, v = _qkv(1, 1, 40, 40, 160)
    _check(_sdpa(), q, k, v, fused=False)


def test_fusion_disabled_uses_decomposition() -> None:
    q, k, v = _qkv(1, 1, 40, 40, 16)
    with config.patch(fuse=False):
        _check(_sdpa(is_causal=True), q, k, v, fused=False)


@pytest.mark.parametrize("kind", ["transposed", "causal", "mask"])
def test_kernel_source_uses_only_public_nki_api(kind: str) -> None:
    """The transposed-scores kernel (d = 32, no mask) and the standard one (d = 128 causal, or a mask)."""
    q, k, v = _qkv(1, 2, 130, 130, 32 if kind != "causal" else 128, dtype=torch.bfloat16)
    if kind != "mask":
        _, stats = _run(_sdpa(is_causal=True), q, k, v)
    else:
        m = torch.zeros(130, 130, dtype=torch.bfloat16)
        _, stats = _run(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m)
    (name, src), = stats["sources"]
    assert check_source_against_api(src) == [], src
    assert check_kernel_rules(src) == [], src  # statically bounded tiles: <= 128 partitions, one PSUM bank
    assert "nisa.nc_transpose" in src
    assert ("reduce_cmd=nisa.reduce_cmd.reset_reduce" in src) is (kind != "transposed")
    assert ("onehot" in src) is (kind == "transposed")  # K^T augmentation rows
    assert ("nisa.affine_select" in src) is (kind != "mask") and ("mask_t" in src) is (kind == "mask")


def test_roofline_counts_attention_math() -> None:
    q, k, v = _qkv(2, 3, 200, 200, 64, dtype=torch.bfloat16)
    _, stats = _run(_sdpa(is_causal=True), q, k, v)
    kern = stats["plan"].kernels[0]
    pairs = 2 * 3 * (200 * 201 // 2)  # needed (query, key) pairs: on/below the diagonal
    assert attention_flops(kern) == (4 * 64 * pairs, "bfloat16", 2 * pairs)
    roof = kernel_roofline(kern, "trn2")
    assert roof.min_bytes == 4 * (2 * 3 * 200 * 64 * 2)  # q, k, v read once, out written once (bf16)


def _heads_sdpa(h: int) -> Callable[..., torch.Tensor]:
    """GPT-style: q/k/v are head-split, transposed views of one [b, s, 3d] projection; output back to [b, s, d]."""
    def attn(qkv: torch.Tensor) -> torch.Tensor:
        b, s, d3 = qkv.shape
        d = d3 // 3
        q, k, v = (t.view(b, s, h, d // h).transpose(1, 2) for t in qkv.split(d, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
    return attn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_head_split_views_absorbed(dtype: torch.dtype) -> None:
    """The decomposition's casts, sqrt(scale) multiplies and layout clones of q/k/v become part of the one
    kernel: it reads the strided projection directly (scale folded) and writes the [b, s, h*d] layout."""
    qkv = torch.randn(2, 200, 3 * 96, generator=torch.Generator().manual_seed(5)).to(dtype)
    stats = _check(_heads_sdpa(3), qkv)
    kern = stats["plan"].kernels[0]
    assert math.isclose(kern.scale, 1 / math.sqrt(32), rel_tol=1e-6)
    assert kern.compute_dtype == ("bfloat16" if dtype == torch.bfloat16 else "float32")
    assert kern.q[2] == (200 * 288, 32, 288, 1) and kern.k[1] == kern.q[1] + 96 and kern.v[1] == kern.q[1] + 192
    if dtype == torch.bfloat16:  # the decomposition's own numerics: exact fp32 math on the upcast inputs
        out, _ = _run(_heads_sdpa(3), qkv)
        ref = _heads_sdpa(3)(qkv.float())
        torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


def test_one_instruction_per_step_reads_every_bank() -> None:
    """A key step's scores span several PSUM banks (one matmul each) and its transposed P another tile: one
    tensor_scalar_reduce (scale, row max), one exp and one eviction per step, not one per bank. 2300 keys = steps of
    1152 and 1148 keys (scores: 3 banks; P^T in bf16: 2), ragged 130 queries (two query tiles); values equal eager."""
    from neuron_compile.instruction_stream import kernel_stream

    q, k, v = _qkv(1, 1, 130, 2300, 128, 40, dtype=torch.bfloat16)  # d = 128: the standard kernel
    stats = _check(_sdpa(), q, k, v)
    (_, src), = stats["sources"]
    assert check_kernel_rules(src) == [], src
    kern = stats["plan"].kernels[0]
    with config.patch(attention_unshifted=False):
        recs = [(rec, n) for rec, n in kernel_stream(kern, target="trn2").items()]
    # per (query tile, step): the scores' max and move to SBUF, the exp, the transposed P's eviction ([128, 9, P])
    reduces = [(rec.shapes[1], n) for rec, n in recs if rec.instruction == "tensor_scalar_reduce"]
    exps = [(rec.shapes[1], n) for rec, n in recs if rec.instruction == "activation_reduce"]
    evictions = [(rec.shapes[1], n) for rec, n in recs if rec.instruction == "tensor_copy" and len(rec.shapes[1]) == 3]
    assert sorted(reduces) == sorted(exps) == [((2, 1148), 1), ((2, 1152), 1), ((128, 1148), 1), ((128, 1152), 1)]
    # 1148 keys: 8 full key tiles in one eviction, the ragged 124 in another
    assert sorted(evictions) == [((128, 8, 2), 1), ((128, 8, 128), 1), ((128, 9, 2), 1), ((128, 9, 128), 1)]


def test_head_group_moves_rows_of_several_heads_per_dma() -> None:
    """[b, s, h, d] views: one DMA per (batch, head group) loads each of q, k, v (the heads are adjacent, so
    each partition reads h * d contiguous elements per row) and one DMA per query tile stores every head's rows;
    a ragged last query tile is loaded with its own DMA. Values equal eager."""
    from neuron_compile.codegen.plan_attention import head_group

    from neuron_compile.instruction_stream import kernel_stream

    qkv = torch.randn(2, 200, 3 * 96, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    stats = _check(_heads_sdpa(6), qkv)
    kern = stats["plan"].kernels[0]
    group = head_group(kern)
    assert group == 6
    loads = stores = 0
    for rec, n in kernel_stream(kern).items():
        if rec.engine == "dma":
            if rec.buffers[0] in ("shared_hbm", "hbm"):
                stores += n
                assert rec.shapes[0][1:] == (group, 16)  # all heads' rows of one query tile
            elif rec.buffers[1] in ("private_hbm", "shared_hbm", "hbm"):
                loads += n
    assert loads == 2 * 3 * 2  # (batch) x (q, k, v) x (full tiles + ragged tile)
    assert stores == 2 * 2  # (batch) x (query tiles)


def test_head_group_respects_the_sbuf_budget() -> None:
    """Long sequences keep fewer heads resident: 16 heads of 2048 x 128 bf16 rows go 4 at a time."""
    from neuron_compile.codegen.plan_attention import GROUP_ROWS_BYTES, head_group
    from neuron_compile.lowering.ir import ArgSpec

    kern = AttentionKernel("k0_attention", "attention", (ArgSpec(1, "bfloat16"),) * 3, (ArgSpec(1, "bfloat16"),),
                           4, 16, 2048, 2048, 128, 128, 0.1, True, (0, 0, (0, 0, 128, 1)), (1, 0, (0, 0, 128, 1)),
                           (2, 0, (0, 0, 128, 1)), None, (0, 0, 128, 1), "bfloat16")
    assert head_group(kern) == 4
    assert head_group(kern) * 4 * (16 * 128 * 2) <= GROUP_ROWS_BYTES


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(2, 4, 700, 700, 64, 64), (1, 3, 130, 77, 32, 40), (1, 2, 77, 600, 96, 16)],
                         ids=["blocks", "sq>sk", "sq<sk"])
def test_transposed_scores_kernel_matches_eager(dtype: torch.dtype, causal: bool, shape: tuple[int, ...]) -> None:
    """Heads of 32/64/96 without a mask: S^T - max comes out of TensorE (augmented contraction rows), P^T is the
    exp's output and the row sums ride in a ones column of V: no transpose of P. Two 512-query blocks, ragged
    tiles, more queries than keys and the reverse."""
    from neuron_compile.codegen.plan_attention import transposed_group

    from neuron_compile.instruction_stream import kernel_stream

    b, h, sq, sk, d, dv = shape
    q, k, v = _qkv(b, h, sq, sk, d, dv, dtype=dtype)
    stats = _check(_sdpa(is_causal=causal), q, k, v)
    kern = stats["plan"].kernels[0]
    group = transposed_group(kern)
    assert group == h
    transposes = sum(n for rec, n in kernel_stream(kern).items() if rec.instruction == "nc_transpose")
    # only Q and K (4 row tiles per transpose bank) and one max tile per query tile and head group: no 128-key tiles
    # of P (one batch: its heads in groups split over the launch grid)
    from neuron_compile.codegen.plan_attention import exact_plan
    from neuron_compile.codegen.render import launch_grid

    groups = b * h // exact_plan(kern, launch_grid(kern))["group"]
    q_tiles, k_tiles = -(-sq // 128), -(-sk // 128)
    assert transposes == b * h * (q_tiles + k_tiles) + groups * q_tiles


def test_transposed_scores_are_stable_for_large_scores() -> None:
    """Scores of +-3000 (far beyond exp's range): the exact row max shifts them, so nothing overflows."""
    q, k, v = _qkv(1, 2, 200, 200, 64, dtype=torch.float32)
    _check(_sdpa(is_causal=True), q * 60.0, k * 60.0, v)


@pytest.mark.parametrize("kind", ["causal", "full", "mask"])
@pytest.mark.parametrize(("d", "gain"), [(40, 4.0), (96, 4.0), (128, 10.0), (64, 100.0), (64, 150.0)])
def test_fp16_large_scores_match_eager(d: int, gain: float, kind: str) -> None:
    """fp16 at fp16 tolerance (2e-3) with large scores (score std ~ gain^2): eager keeps the scale and the row max in
    fp32, and so must the kernel. Folding a non-power-of-two scale into the fp16 ``Q^T`` moved every score by ~|s| 2^-12
    (d = 40/96/128: errors 10-50x eager's); the transposed kernel's row max rounded to fp16 made
    ``exp(s - max) > 65504`` (inf/NaN rows once |max| >= 2^15, d = 64); and a causal bias of -65504 left masked keys
    with scores beyond 65504 above the visible ones (d = 64, gain 150)."""
    from neuron_compile.codegen.plan_attention import attention_plan

    q, k, v = _qkv(1, 2, 200, 200, d, dtype=torch.float16)
    q, k = (q.float() * gain).half(), (k.float() * gain).half()
    if kind == "mask":
        mask = torch.randn(200, 200, generator=torch.Generator().manual_seed(5)).half()
        stats = _check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask)
    else:
        stats = _check(_sdpa(is_causal=kind == "causal"), q, k, v)
    assert attention_plan(stats["plan"].kernels[0])["variant"] == "standard"
    (_, src), = stats["sources"]
    assert check_kernel_rules(src) == [], src
    assert check_source_against_api(src) == [], src
