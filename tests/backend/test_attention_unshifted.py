"""Attention with the unshifted softmax (``codegen/templates/attention_unshifted.nki.j2``) and its on-chip guard.

Without an additive mask, attention first runs ``P = exp(s)`` with no row max, keys on partitions (no
transpose of P), and checks every row: ``2^-100 <= l <= 2^120`` and a finite output. If a row fails,
the exact kernel reruns inside the same NKI kernel (``nl.while_loop`` on a register loaded from the
flag). These tests compare against eager PyTorch for the fast path (causal/full, fp32/bf16, ragged,
sq != sk, head dims 16..128) and for each way the guard can trip (overflowing exp, underflowing rows,
an output that overflows in PSUM), and check which path ran from the simulator's instruction trace.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import neuron_compile.backend
from neuron_compile.config import config
from neuron_compile.simulator import trace

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "codegen"))
from static_checks import check_kernel_rules  # noqa: E402

from neuron_compile.nki_api.checker import check_source_against_api  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def single_core() -> Iterator[None]:
    """These tests pin LNC=1 (one program, one trace); the kernel on both cores of an LNC=2 logical core, its
    programs agreeing on the rerun, is tested in test_attention_two_core.py. Every kernel of two units or more checks
    its first unit on its own here, however short its pass (attention_check_first_flops=0)."""
    with config.patch(lnc=1, attention_check_first_flops=0):
        yield


def _qkv(b: int, h: int, sq: int, sk: int, d: int, dv: int | None = None, dtype: torch.dtype = torch.float32,
         seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + sq * 131 + sk)
    mk = lambda s, e: torch.randn(b, h, s, e, generator=g).to(dtype)  # noqa: E731
    return mk(sq, d), mk(sk, d), mk(sk, dv or d)


def _sdpa(**kw: Any) -> Callable[..., torch.Tensor]:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


def _run_traced(fn: Callable[..., Any], *inputs: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any], Any]:
    with config.patch(target="trn2"), trace() as t:
        out = torch.compile(fn, backend="neuron", dynamic=False)(*inputs)
    return out, neuron_compile.backend.compiled_graphs()[-1], t


def _check(fn: Callable[..., Any], *inputs: torch.Tensor, reran: bool, tol: float | None = None) -> dict[str, Any]:
    """Compile, compare with eager, and assert whether the exact kernel reran (the guard tripped)."""
    out, stats, t = _run_traced(fn, *inputs)
    ref = fn(*inputs)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    tol = tol or TOL[ref.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    assert [k.family for k in stats["plan"].kernels] == ["attention"], stats["plan"]
    (_, src), = stats["sources"]
    assert "nl.while_loop(rerun, exact_softmax)" in src
    first_checked = "nl.while_loop(go_on, rest_of_pass)" in src  # the first unit's own check (plan: check_first)
    assert t.count("register_load") == (2 if first_checked else 1)
    assert _exact_ran(t) is reran
    if first_checked and not reran:
        assert _rest_ran(t)
    return stats


def _rest_ran(t: Any) -> bool:
    """Whether the rest of the unshifted pass ran after its first unit's check: TensorE work between the first
    unit's ``register_load`` and the rerun's."""
    loads = [i for i, r in enumerate(t.records) if r.instruction == "register_load"]
    return any(r.instruction == "nc_matmul" for r in t.records[loads[0] + 1:loads[1]])


def _exact_ran(t: Any) -> bool:
    """Whether an exact kernel ran: in a guarded kernel, any engine instruction after the guard's ``register_load``
    (the ``nl.while_loop`` body runs only when the check failed); without a guard the exact kernel is all there is.
    Both exact kernels take a row max off the scores in PSUM, which the unshifted pass never does."""
    loads = [i for i, r in enumerate(t.records) if r.instruction == "register_load"]
    after = t.records[loads[-1] + 1:] if loads else t.records
    return any(r.instruction in ("tensor_reduce", "tensor_scalar_reduce") and r.buffers[1] == "psum" for r in after)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(2, 4, 700, 700, 64, 64), (1, 3, 130, 77, 32, 40), (1, 2, 77, 600, 96, 16),
                                   (1, 2, 600, 600, 128, 128), (1, 1, 200, 1100, 16, 16)],
                         ids=["blocks", "sq>sk", "sq<sk", "d128", "d16"])
def test_unshifted_matches_eager(dtype: torch.dtype, causal: bool, shape: tuple[int, ...]) -> None:
    """Moderate scores: the unshifted pass alone gives eager's values (two 512-query blocks, ragged tiles, more
    queries than keys and the reverse, d = 128 with three query tiles per output PSUM bank)."""
    b, h, sq, sk, d, dv = shape
    _check(_sdpa(is_causal=causal), *_qkv(b, h, sq, sk, d, dv, dtype=dtype), reran=False)


@pytest.mark.parametrize("dma_t", [True, False], ids=["dma-transpose", "pe-transpose"])
def test_no_transpose_of_p(dma_t: bool) -> None:
    """Nothing transposes the probabilities. Two head groups of two heads: the first transposes its loaded Q and K
    rows on TensorE (8 bf16 row tiles per PSUM bank), the second's Q^T and K^T arrive transposed by the DMA engines
    (one nisa.dma_transpose each, loaded while the first group computes), or with ``attention_dma_transpose=False``
    TensorE transposes every group's rows."""
    from neuron_compile.instruction_stream import kernel_stream

    q, k, v = _qkv(2, 2, 1024, 1024, 128, dtype=torch.bfloat16)
    with config.patch(attention_dma_transpose=dma_t):
        stats = _check(_sdpa(is_causal=True), q, k, v, reran=False)
        counts = kernel_stream(stats["plan"].kernels[0])
    transposes = sum(n for rec, n in counts.items() if rec.instruction == "nc_transpose")
    dma_transposes = sum(n for rec, n in counts.items() if rec.instruction == "dma_transpose")
    assert (transposes, dma_transposes) == ((2 * (8 + 8), 2) if dma_t else (2 * 2 * (8 + 8), 0))
    exps = sum(n for rec, n in counts.items() if rec.instruction == "activation")
    # one per (head, 512-query block, step), plus the first group's K^T evictions on ScalarE. With TensorE's
    # transposes a step is one PSUM bank: every full key tile its own, the diagonal tiles of 512, 384, 256 and 128
    # queries in three (the last two share a bank). With the DMA's, TensorE needs no bank for the next group's
    # transposes and a step is two banks (one exp reads both): full tiles in pairs, the diagonal ones as 512 | 384
    # and 256 + 128 (no tile straddles a bank)
    assert exps == 2 * 2 * ((2 + (2 + 2)) if dma_t else (3 + (4 + 3))) + 2 * 1


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(2, 2, 208, 208, 128), (2, 6, 720, 1040, 96), (3, 2, 1040, 400, 128)],
                         ids=["208", "sq<sk", "sq>sk"])
def test_dma_transposed_q_and_k_match_eager(causal: bool, shape: tuple[int, ...]) -> None:
    """bf16 heads of 128, row counts a multiple of 16 (ragged 128-row tiles included), several head groups: every
    group after the first gets Q^T and K^T from HBM through nisa.dma_transpose (HW-DGE, [16, heads, rows / 16, d] ->
    [d, heads, rows / 16, 16]); eager's values, and the source passes the public-API and hardware-rule checks."""
    from neuron_compile.codegen.plan_attention import plan

    b, h, sq, sk, dv = shape
    stats = _check(_sdpa(is_causal=causal), *_qkv(b, h, sq, sk, 128, dv, dtype=torch.bfloat16), reran=False)
    (_, src), = stats["sources"]
    p = plan(stats["plan"].kernels[0])
    assert p["dma_t"] and p["group"] < b * h
    # the fast path's Q^T and K^T loads, and the exact rerun's (the standard kernel at heads of 128 loads them alike)
    assert p["exact"]["variant"] == "standard" and p["exact"]["dma_t"]
    bodies = 2 if p["check_first"] else 1  # the pass's unit body: the first unit's and the rest's
    assert src.count("nisa.dma_transpose(") == 2 * bodies + 2
    assert check_source_against_api(src) == [], src
    assert check_kernel_rules(src) == [], src


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "masked"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_exact_kernel_with_dma_transposed_q_and_k_matches_eager(masked: bool, dtype: torch.dtype) -> None:
    """The standard (exact) kernel alone, heads of 128 in 2-byte dtypes over several head groups: every group after
    the first gets Q^T and K^T by nisa.dma_transpose, and the whole softmax scale (not a power of two) is applied in
    fp32 by the exp (unmasked: folded into the last row-max combine; masked: at the PSUM read). Eager's values, with
    an additive mask too, and the source passes the public-API and hardware-rule checks."""
    from neuron_compile.codegen.plan_attention import plan

    b, h, s = 3, 2, 208
    q, k, v = _qkv(b, h, s, s, 128, dtype=dtype)
    if masked:
        g = torch.Generator().manual_seed(7)
        mask = torch.where(torch.rand(b, 1, s, s, generator=g) < 0.2, float("-inf"), 0.0).to(dtype)
        mask[..., 0] = 0.0
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
    else:
        fn = _sdpa(is_causal=True)
    with config.patch(attention_unshifted=False):
        out, stats, _ = _run_traced(fn, q, k, v)
        p = plan(stats["plan"].kernels[0])
    ref = fn(q, k, v)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert p["variant"] == "standard" and p["dma_t"] and p["group"] < b * h and p["q_scale"] == 1.0
    (_, src), = stats["sources"]
    assert src.count("nisa.dma_transpose(") == 2
    assert check_source_against_api(src) == [], src
    assert check_kernel_rules(src) == [], src


def test_dma_transposed_overflow_reruns_exactly() -> None:
    """The DMA-transposed path's guard: scores of several hundred overflow exp, the first unit's check fails, the
    rest of the pass is skipped and the exact kernel runs; its output is bit-identical to the exact kernel's alone."""
    q, k, v = _qkv(3, 2, 208, 208, 128, dtype=torch.bfloat16)
    q, k = q * 12.0, k * 12.0
    fn = _sdpa(is_causal=True)
    out, stats, t = _run_traced(fn, q, k, v)
    from neuron_compile.codegen.plan_attention import plan

    assert plan(stats["plan"].kernels[0])["dma_t"]
    assert _exact_ran(t) and t.count("register_load") == 2 and not _rest_ran(t)
    torch._dynamo.reset()
    with config.patch(attention_unshifted=False):
        exact, _, t_exact = _run_traced(fn, q, k, v)
    assert torch.equal(out, exact) and torch.isfinite(out).all()
    # the Q^T, K^T of group 2, prefetched during the first unit (group 3's never load: the rest is skipped)
    assert t.count("dma_transpose") == 2 + t_exact.count("dma_transpose")


@pytest.mark.parametrize(("dtype", "rows", "d", "b", "target"),
                         [(torch.float32, 208, 128, 3, "trn2"), (torch.bfloat16, 200, 128, 3, "trn2"),
                          (torch.bfloat16, 208, 128, 3, "trn1"), (torch.bfloat16, 208, 64, 3, "trn2"),
                          (torch.bfloat16, 208, 128, 1, "trn2")],
                         ids=["fp32", "rows%16", "trn1", "d64", "one-group"])
def test_pe_transposes_where_dma_cannot_or_should_not(dtype: torch.dtype, rows: int, d: int, b: int,
                                                      target: str) -> None:
    """The HW-DGE transpose moves 2-byte elements in groups of 16 rows on NC-v3+, over d partitions (fewer than 128
    leave DMA engines idle) and pays off only hidden behind a previous group: fp32, row counts that are not a multiple
    of 16, trn1, heads of 64 and a single head group keep TensorE's transposes (and eager's values)."""
    q, k, v = _qkv(b, 2, rows, rows, d, dtype=dtype)
    fn = _sdpa(is_causal=True)
    with config.patch(target=target), trace() as t:
        out = torch.compile(fn, backend="neuron", dynamic=False)(q, k, v)
    torch.testing.assert_close(out.float(), fn(q, k, v).float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert t.count("nc_transpose") > 0 and t.count("dma_transpose") == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
def test_overflowing_scores_rerun_exactly(dtype: torch.dtype, d: int) -> None:
    """Scores of several hundred: exp overflows (l = inf), the guard trips and the exact kernel (with the row max)
    reruns; the output is bit-identical to the exact kernel's alone (``attention_unshifted=False``). In fp32 it is
    also eager's (at 1e-3: the rounding of scores this large carries through exp). In bf16 no two implementations
    agree at such scores (a 2^-9 rounding of q moves a score of 500 by 1), so only the identity is checked there."""
    q, k, v = _qkv(1, 2, 200, 200, d, dtype=dtype)
    q, k = q * 12.0, k * 12.0
    fn = _sdpa(is_causal=True)
    out, _, t = _run_traced(fn, q, k, v)
    assert _exact_ran(t) and t.count("register_load") == 1
    torch._dynamo.reset()
    with config.patch(attention_unshifted=False):
        exact, _, _ = _run_traced(fn, q, k, v)
    assert torch.equal(out, exact) and torch.isfinite(out).all()
    if dtype == torch.float32:
        torch.testing.assert_close(out, fn(q, k, v), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(("hot", "rest"), [(0, False), (1, True)], ids=["first-unit", "later-unit"])
def test_first_unit_is_checked_on_its_own(hot: int, rest: bool) -> None:
    """Two batches, one head group each: the first unit (batch 0) is checked before the rest of the pass runs.
    Scores of several hundred in batch 0: its check fails, the rest of the pass is skipped (no TensorE work between
    the two checks) and the exact kernel runs at once; in batch 1 only: the first check passes, the rest runs, its
    check fails and the exact kernel reruns. Eager's values either way."""
    q, k, v = _qkv(2, 2, 200, 200, 64)
    q[hot], k[hot] = q[hot] * 12.0, k[hot] * 12.0
    fn = _sdpa(is_causal=True)
    out, stats, t = _run_traced(fn, q, k, v)
    (_, src), = stats["sources"]
    assert "nl.while_loop(first_bad, skip_rest)" in src and "nl.while_loop(go_on, rest_of_pass)" in src
    assert t.count("register_load") == 2 and _exact_ran(t) and _rest_ran(t) is rest
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, fn(q, k, v), atol=1e-3, rtol=1e-3)


def test_first_unit_check_needs_a_second_unit_a_long_pass_and_the_knob() -> None:
    """One unit (one batch, one head group) has nothing to skip: a single check. Two units whose pass is shorter than
    attention_check_first_flops (by default 2^34: its drain would cost more than it saves) keep one check, as does
    attention_check_first=False for any shape; the default threshold admits 4 x 16 x 2048 x 128 causal on two
    cores, not GPT-2 small's attention."""
    from neuron_compile.codegen.plan_attention import plan
    from neuron_compile.lowering.ir import AttentionKernel

    from neuron_compile.backend import build_artifacts
    from neuron_compile.capture import aten_graphs

    q, k, v = _qkv(1, 2, 200, 200, 64)
    _, stats, t = _run_traced(_sdpa(is_causal=True), q, k, v)
    assert "rest_of_pass" not in stats["sources"][0][1] and t.count("register_load") == 1
    q, k, v = _qkv(2, 2, 200, 200, 64)
    for knobs in ({"attention_check_first": False}, {"attention_check_first_flops": 1 << 34}):
        torch._dynamo.reset()
        with config.patch(**knobs):
            out, stats, t = _run_traced(_sdpa(is_causal=True), q, k, v)
        assert "rest_of_pass" not in stats["sources"][0][1] and t.count("register_load") == 1
        torch.testing.assert_close(out, _sdpa(is_causal=True)(q, k, v), atol=TOL[q.dtype], rtol=TOL[q.dtype])
    with config.patch(attention_check_first_flops=1 << 34, target="trn2", lnc=2):
        for (h, s, d), first in (((16, 2048, 128), True), ((12, 1024, 64), False)):
            qkv = [torch.empty(4, h, s, d, dtype=torch.bfloat16) for _ in range(3)]
            (gm, ins), = aten_graphs(_sdpa(is_causal=True), *qkv, execute=False)
            (kern,) = build_artifacts(gm, ins)[2].kernels
            assert isinstance(kern, AttentionKernel) and plan(kern, 2)["check_first"] is first


def test_underflowing_row_reruns_exactly() -> None:
    """One row whose every score is about -500: exp(s) is 0 for all keys (l = 0); eager gives the uniform average
    of v there. Only that row fails, and the whole output is recomputed."""
    q, k, v = _qkv(1, 1, 150, 150, 64)
    k[:, :, :, :] = k[:, :, :1, :]  # every key equal: every score of a row is the same
    q[0, 0, 140] = -500.0 * 8.0 * k[0, 0, 0] / k[0, 0, 0].square().sum()  # q . k / sqrt(64) = -500
    _check(_sdpa(), q, k, v, reran=True)


@pytest.mark.parametrize(("score", "reran"), [(-60.0, False), (75.0, False), (95.0, True), (-90.0, True)])
def test_guard_window(score: float, reran: bool) -> None:
    """Every score of row 70 equal to ``score`` (150 equal keys): l = 150 e^score passes in [2^-100, 2^120]
    (-60, 75) and fails outside (95 overflows l past 2^120, -90 underflows below 2^-100); eager's values either way."""
    q, k, v = _qkv(1, 1, 150, 150, 64)
    k[:, :, :, :] = k[:, :, :1, :]
    q[0, 0, 70] = score * 8.0 * k[0, 0, 0] / k[0, 0, 0].square().sum()  # q . k / sqrt(64) = score
    _check(_sdpa(), q, k, v, reran=reran)


def test_output_overflow_in_psum_reruns_exactly() -> None:
    """exp(s) around e^5 times values of 3e36 overflow fp32 while accumulating O (l itself is fine): the output's row
    sum is inf or NaN, the guard trips, and the exact kernel (probabilities <= 1) gives eager's finite values."""
    q, k, v = _qkv(1, 1, 64, 64, 32)
    k = q.clone()
    q = q * (5.0 * 32 ** 0.5 / q.square().sum(-1, keepdim=True))  # the diagonal score is 5; others are smaller
    v = v.abs() * 3e36
    out, _, t = _run_traced(_sdpa(), q, k, v)
    ref = _sdpa()(q, k, v)
    assert torch.isfinite(ref).all()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=0.0)
    assert _exact_ran(t)


def test_knob_off_renders_the_exact_kernel_only() -> None:
    q, k, v = _qkv(1, 2, 130, 130, 64, dtype=torch.bfloat16)
    with config.patch(attention_unshifted=False):
        out, stats, t = _run_traced(_sdpa(is_causal=True), q, k, v)
    (_, src), = stats["sources"]
    assert "while_loop" not in src and "register_load" not in src and t.count("register_load") == 0
    torch.testing.assert_close(out.float(), _sdpa(is_causal=True)(q, k, v).float(), atol=2e-2, rtol=2e-2)


def test_fp16_keeps_the_exact_kernel() -> None:
    """fp16 probabilities can't hold exp(s) unshifted (normal range 2^-14..65504): the exact kernel only."""
    q, k, v = _qkv(1, 2, 130, 130, 64, dtype=torch.float16)
    out, stats, t = _run_traced(_sdpa(is_causal=True), q, k, v)
    (_, src), = stats["sources"]
    assert "while_loop" not in src and t.count("register_load") == 0 and _exact_ran(t)
    torch.testing.assert_close(out.float(), _sdpa(is_causal=True)(q.float(), k.float(), v.float()), atol=2e-3,
                               rtol=2e-3)


def test_additive_mask_keeps_the_exact_kernel() -> None:
    q, k, v = _qkv(1, 2, 100, 100, 32)
    m = torch.randn(100, 100, generator=torch.Generator().manual_seed(1))
    _, stats, _ = _run_traced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m)
    (_, src), = stats["sources"]
    assert "while_loop" not in src and "mask_t" in src


@pytest.mark.parametrize("d", [32, 128])
def test_kernel_source_uses_only_public_nki_api(d: int) -> None:
    """The unshifted kernel and its fallback (transposed-scores for d = 32, standard for 128) in one source."""
    q, k, v = _qkv(1, 2, 130, 130, d, dtype=torch.bfloat16)
    _, stats, _ = _run_traced(_sdpa(is_causal=True), q, k, v)
    (_, src), = stats["sources"]
    assert check_source_against_api(src) == [], src
    assert check_kernel_rules(src) == [], src
    assert ("onehot" in src) is (d == 32)  # the fallback: transposed-scores kernel for heads of 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_head_split_views(dtype: torch.dtype) -> None:
    """GPT-style q/k/v: head-split, transposed views of one [b, s, 3d] projection, output back to [b, s, d]: the
    kernel reads the strided projection and writes the [b, s, h*d] layout, several heads per DMA."""
    def attn(qkv: torch.Tensor) -> torch.Tensor:
        b, s, d3 = qkv.shape
        d = d3 // 3
        q, k, v = (t.view(b, s, 6, d // 6).transpose(1, 2) for t in qkv.split(d, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)

    qkv = torch.randn(2, 600, 3 * 384, generator=torch.Generator().manual_seed(9)).to(dtype)
    _check(attn, qkv, reran=False, tol=2e-2 if dtype == torch.bfloat16 else 1e-4)


def test_explain_names_the_variant_and_its_fallback() -> None:
    import neuron_compile

    q, k, v = _qkv(1, 4, 300, 300, 64)
    report = neuron_compile.explain(_sdpa(is_causal=True), q, k, v)
    (kern,) = report.graphs[0].kernels
    assert kern.tiles == {"variant": "unshifted", "head_group": 4, "query_block": 512,
                          "fallback": "variant=transposed-scores head_group=4"}
    assert "variant=unshifted head_group=4" in str(report)
    with config.patch(attention_unshifted=False):
        torch._dynamo.reset()
        (kern,) = neuron_compile.explain(_sdpa(is_causal=True), q, k, v).graphs[0].kernels
    assert kern.tiles == {"variant": "transposed-scores", "head_group": 4}


def test_explain_reports_the_tripped_and_the_worst_case() -> None:
    """explain prices a guarded kernel when every check trips and, with the first unit checked on its own, when only
    the final check does (the whole pass, then the exact kernel): that one is the larger, and both are in the text
    and the JSON. Without the earlier check there is no separate worst case."""
    import neuron_compile

    q, k, v = _qkv(2, 2, 300, 300, 64)
    report = neuron_compile.explain(_sdpa(is_causal=True), q, k, v)
    (kern,) = report.graphs[0].kernels
    assert kern.tripped is not None and kern.worst is not None
    assert kern.worst.time_ns > kern.tripped.time_ns and kern.worst.time_ns > kern.estimate.time_ns
    assert "if every runtime guard trips" in str(report) and "if only the final one does" in str(report)
    assert kern.to_json()["worst_ns"] == kern.worst.time_ns
    torch._dynamo.reset()
    with config.patch(attention_check_first=False):
        (kern,) = neuron_compile.explain(_sdpa(is_causal=True), q, k, v).graphs[0].kernels
    assert kern.tripped is not None and kern.worst is None and kern.to_json()["worst_ns"] is None


def test_tripped_stream_is_the_fast_pass_plus_the_exact_kernel() -> None:
    """``kernel_stream(loaded_flag=1)`` follows the branch taken: its records are exactly the unshifted pass's plus the
    exact kernel's (rendered alone with ``attention_unshifted=False``), besides the sequencer's register work. The
    rerun starts after the register load (every engine drained), so its segment's time adds to the pass's."""
    from neuron_compile.costmodel import REGISTER_LOAD_NS, estimate, first_order, total
    from neuron_compile.instruction_stream import kernel_segments, kernel_stream

    q, k, v = _qkv(1, 2, 300, 300, 128, dtype=torch.bfloat16)
    _, stats, _ = _run_traced(_sdpa(is_causal=True), q, k, v)
    kern = stats["plan"].kernels[0]
    fast, tripped = kernel_stream(kern), kernel_stream(kern, loaded_flag=1)
    with config.patch(attention_unshifted=False):
        exact = kernel_stream(kern)
    for rec in set(fast) | set(tripped) | set(exact):
        if rec.engine != "sequencer":
            assert tripped[rec] == fast[rec] + exact[rec], rec
    first, rerun = kernel_segments(kern, loaded_flag=1)
    assert first == fast and sum(rerun.values()) == sum(exact.values()) + 1  # + the body's register_alloc(0)
    seq = total([first_order(first), first_order(rerun)])
    assert seq.time_ns == pytest.approx(first_order(fast).time_ns + first_order(exact).time_ns)
    assert first_order(fast).dependency_ns >= REGISTER_LOAD_NS
    assert estimate(fast).time_ns >= REGISTER_LOAD_NS  # the scheduler drains every queue before the branch


def test_tripped_stream_skips_the_rest_of_the_pass() -> None:
    """With the first unit checked on its own, ``loaded_flag=1`` (every check fails) costs the first unit of the pass
    and the exact kernel: of two equal units' score and P V matmuls, half, plus the exact kernel's; its estimate is
    below the fast pass and the exact kernel back to back. ``loaded_flag=(0, 1)`` (only the final check fails) costs
    both whole."""
    from neuron_compile.costmodel import estimate
    from neuron_compile.instruction_stream import kernel_stream

    q, k, v = _qkv(2, 2, 300, 300, 128)
    _, stats, _ = _run_traced(_sdpa(is_causal=True), q, k, v)
    kern = stats["plan"].kernels[0]
    assert "rest_of_pass" in stats["sources"][0][1]
    fast, tripped = kernel_stream(kern), kernel_stream(kern, loaded_flag=1)
    with config.patch(attention_unshifted=False):
        exact = kernel_stream(kern)
    mm = lambda s: sum(n for r, n in s.items() if r.instruction == "nc_matmul")  # noqa: E731
    assert mm(fast) % 2 == 0 and mm(tripped) == mm(fast) // 2 + mm(exact)
    assert estimate(tripped).time_ns < estimate(fast).time_ns + estimate(exact).time_ns
    # the first check passes, the final one fails (one flag per register_load): the whole pass, then the exact kernel
    worst = kernel_stream(kern, loaded_flag=(0, 1))
    assert mm(worst) == mm(fast) + mm(exact)
    assert estimate(worst).time_ns > estimate(tripped).time_ns


@pytest.mark.parametrize("target", ["trn1", "trn3"])
@pytest.mark.parametrize("scale", [1.0, 12.0], ids=["fast", "rerun"])
def test_other_targets(target: str, scale: float) -> None:
    """NC-v2 and NC-v4 run the same kernel (fast path and rerun): eager's values in fp32."""
    q, k, v = _qkv(1, 2, 300, 300, 128)
    fn = _sdpa(is_causal=True)
    with config.patch(target=target), trace() as t:
        out = torch.compile(fn, backend="neuron", dynamic=False)(q * scale, k * scale, v)
    assert _exact_ran(t) is (scale > 1.0)
    torch.testing.assert_close(out, fn(q * scale, k * scale, v), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("unshifted", [True, False], ids=["unshifted", "exact"])
@pytest.mark.parametrize(("d", "gain", "b"), [(128, 3.0, 1), (128, 10.0, 1), (64, 3.0, 1), (96, 4.0, 1), (40, 4.0, 1),
                                              (128, 10.0, 3), (128, 3.0, 3)])
def test_bf16_scores_as_precise_as_eager(d: int, gain: float, b: int, unshifted: bool) -> None:
    """bf16 with scores of tens: only the scale's power of two is folded into the bf16 ``Q^T``, the rest is applied
    in fp32 at the exp, so the output is as close to fp32 as eager bf16's (a bf16-rounded ``scale * q`` moved each
    score by ~|s| 2^-9: 4x eager's error at d = 128, gain 3). Every kernel variant: unshifted (three batches of 208
    rows, d = 128: later groups' Q^T by DMA transpose, the whole scale at the exp), transposed, standard."""
    q, k, v = _qkv(b, 2, 208 if b > 1 else 200, 208 if b > 1 else 200, d, dtype=torch.float32, seed=5)
    q, k, v = (q * gain).bfloat16(), (k * gain).bfloat16(), v.bfloat16()
    fn = _sdpa(is_causal=True)
    with config.patch(attention_unshifted=unshifted):
        out, _, _ = _run_traced(fn, q, k, v)
    ref = fn(q.float(), k.float(), v.float())
    eager_err = (fn(q, k, v).float() - ref).abs().max().item()
    assert (out.float() - ref).abs().max().item() <= 1.25 * eager_err + 1e-3


@pytest.mark.parametrize("unshifted", [True, False], ids=["unshifted", "exact"])
@pytest.mark.parametrize("gain", [100.0, 150.0])
def test_bf16_huge_scores_stay_finite(gain: float, unshifted: bool) -> None:
    """bf16, d = 64, scores beyond 2^15: the transposed-scores kernel (alone, or as the unshifted kernel's rerun) shifts
    by its row max as two bf16 parts (hi, lo); the max rounded to one bf16 value was off by up to |max| 2^-9 and
    made exp overflow (NaN rows). Eager bf16's precision either way."""
    q, k, v = _qkv(1, 2, 200, 200, 64, dtype=torch.float32, seed=5)
    q, k, v = (q * gain).bfloat16(), (k * gain).bfloat16(), v.bfloat16()
    fn = _sdpa(is_causal=True)
    with config.patch(attention_unshifted=unshifted):
        out, _, t = _run_traced(fn, q, k, v)
    assert _exact_ran(t)
    ref = fn(q.float(), k.float(), v.float())
    eager_err = (fn(q, k, v).float() - ref).abs().max().item()
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() <= 1.25 * eager_err + 1e-3


@pytest.mark.parametrize("step_banks", [1, 2])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(("sq", "sk"), [(2048, 2048), (700, 700), (130, 77), (77, 600), (1040, 400), (200, 1100)])
def test_score_steps_cover_every_tile_once_within_banks(sq: int, sk: int, causal: bool, step_banks: int) -> None:
    """The steps of every query block hold each key tile the block sees exactly once (a dropped tile is a wrong
    result), a step's tiles share their key count, no tile crosses a PSUM bank, an exp reads its columns without a
    gap (every bank but a step's last is full), and the block's first entry covers every query tile (it starts the
    [O | l] accumulations). Two-bank steps keep the causal diagonal's exps even: 512 | 256 and 384 + 128."""
    from neuron_compile.codegen.plan_attention import BANK_KEYS, PMAX, QUERY_BLOCK, score_steps
    from neuron_compile.lowering.ir import AttentionKernel

    k = AttentionKernel("k", "attention", (), (), 1, 1, sq, sk, 64, 64, 0.125, causal, (0, 0, (0, 0, 64, 1)),
                        (1, 0, (0, 0, 64, 1)), (2, 0, (0, 0, 64, 1)), None, (0, 0, 64, 1), "bfloat16")
    order, lead = score_steps(k, step_banks)
    assert len(order) == len(lead) == -(-sq // QUERY_BLOCK)
    for bi, steps in enumerate(order):
        qb = bi * QUERY_BLOCK
        nb = min(QUERY_BLOCK, sq - qb)
        seen = sorted(e[0] for step in steps for e in step)
        assert seen == list(range(-(-(min(sk, qb + nb) if causal else sk) // PMAX)))
        assert steps[0][0][3] == nb and steps[0][0][4] == qb
        for step in steps:
            assert len({e[2] for e in step}) == 1
            cols = sorted((e[1], e[1] + e[3]) for e in step)
            assert cols[-1][1] <= step_banks * BANK_KEYS
            for lo, hi in cols:
                assert lo // BANK_KEYS == (hi - 1) // BANK_KEYS
            for (_, hi), (lo, _) in zip(cols, cols[1:], strict=False):
                assert lo == hi
            for e in step:
                j, _, kn, nw, qs = e
                assert kn == min(PMAX, sk - j * PMAX) and qs == (max(qb, j * PMAX) if causal else qb)
                assert nw == qb + nb - qs
    if causal and step_banks == 2 and sq == sk == 2048:
        diag = [sorted(e[3] for e in step) for step in order[1] if step[0][0] * PMAX >= QUERY_BLOCK]
        assert diag == [[256, 512], [128, 384]]


@pytest.mark.parametrize(("d", "dv", "dtype", "dma_t", "two"),
                         [(64, 64, torch.bfloat16, False, True), (64, 64, torch.float32, False, True),
                          (128, 128, torch.bfloat16, True, True), (128, 128, torch.float32, False, False),
                          (96, 127, torch.float32, False, True), (96, 128, torch.float32, False, False)])
def test_score_ring_fits_psum_beside_the_outputs(d: int, dv: int, dtype: torch.dtype, dma_t: bool, two: bool) -> None:
    """The score ring takes two-bank slots (one exp per 1024 scores: half the ScalarE instructions and their fixed
    cost) whenever they fit the eight PSUM banks beside two units' [O | l] accumulators and, when Q^T and K^T come by
    TensorE transposes, their bank: at dv <= 127 (one output bank per unit) even with TensorE transposes; at
    dv = 128 only with Q^T and K^T by DMA."""
    from neuron_compile.codegen.plan_attention import PSUM_BANK_BYTES, QUERY_BLOCK, plan

    from neuron_compile.backend import build_artifacts
    from neuron_compile.capture import aten_graphs

    q, k = (torch.empty(2, 4, 1024, d, dtype=dtype) for _ in range(2))
    v = torch.empty(2, 4, 1024, dv, dtype=dtype)
    with config.patch(target="trn2"):
        (gm, ins), = aten_graphs(_sdpa(is_causal=True), q, k, v, execute=False)
        (kern,) = build_artifacts(gm, ins)[2].kernels
        p = plan(kern)
    assert p["variant"] == "unshifted" and p["dma_t"] is dma_t
    assert (p["step_banks"], p["score_ring"]) == ((2, 2) if two else (1, 3))
    out_banks = 2 * -(-(QUERY_BLOCK // 128) // p["bank_tiles"])
    assert p["bank_tiles"] * 4 * (dv + 1) <= PSUM_BANK_BYTES
    assert p["step_banks"] * p["score_ring"] + out_banks + (0 if dma_t else 1) <= 8
