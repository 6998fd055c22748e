"""LayerNorm's statistics pass: a resident row's mean and variance from ``bn_stats``/``bn_aggr`` (one VectorE pass)
instead of a reduce, a centring pass and a square-and-sum pass (codegen/loop_schedule.use_moments), and row-group
DMAs on separate queues (loads from ScalarE's, stores from SyncE's).

The rewrite is checked on the tile program (what it matches, what it refuses) and end to end on the simulator
against eager PyTorch and a float64 reference, including rows far from zero mean (the statistics are of the row
shifted by its first element, so the variance keeps its precision) and widths that are not a multiple of the 512
elements one ``bn_stats`` reads.
"""

from __future__ import annotations

import pytest
import torch
from neuron_compile.codegen import loop_schedule as ls
from neuron_compile.lowering.ir import TileOp

from neuron_compile import backend
from neuron_compile.config import config
from neuron_compile.nki_api.checker import check_source_against_api


def _op(out: str, opcode: str, args: tuple, kind: str = "full", phase: int = 0, **attrs: object) -> TileOp:
    return TileOp(out, opcode, kind, "float32", args, tuple(sorted(attrs.items())), phase)


def _layernorm_program(scale: float = 1.0 / 64, square_readers: int = 1) -> list[TileOp]:
    """The tile program the lowering records for LayerNorm over 64 elements (after the peephole rewrites)."""
    prog = [
        _op("x", "load", ()),
        _op("s", "reduce", ("x",), kind="row", op="add", negate=False),
        _op("nm", "tensor_scalar", ("s", scale, -1.0), kind="row", phase=1, op0="multiply", op1="multiply",
            reverse0=False),
        _op("c", "tensor_scalar", ("x", "nm"), phase=1, op0="add", reverse0=False),
        _op("sq", "activation", ("c", 1.0, 0.0), phase=1, func="square"),
        _op("q", "reduce", ("sq",), kind="row", phase=1, op="add", negate=False),
        _op("rstd", "activation", ("q", 1.0 / 64, 1e-5), kind="row", phase=2, func="rsqrt"),
        _op("y", "tensor_scalar", ("c", "rstd"), phase=2, op0="multiply", reverse0=False),
        _op("out", "store", ("y",), phase=2),
    ]
    if square_readers > 1:
        prog.insert(-1, _op("sq2", "store", ("sq",), phase=2))
    return prog


def test_mean_and_variance_become_one_statistics_pass() -> None:
    out = ls.use_moments(_layernorm_program(), 64)
    assert out is not None
    by = {op.out: op for op in out}
    assert by["s"].opcode == "reduce" and by["s"].attr("op") == "moments"
    assert by["s"].attr("var") == "q" and by["s"].attr("count") == 64
    assert by["q"].opcode == "moments_var" and by["q"].args == ("s",) and by["q"].kind == "row"
    assert "sq" not in by and "c" not in by  # no square pass; the centring folds into the normalisation
    # bn_aggr's mean and variance are read as they are: no count x mean, no negated mean, no count x variance
    assert by["s"].attr("as_mean") is True and by["s"].attr("as_var") is True and "nm" not in by
    y = by["y"]
    assert y.args == ("x", "s", "rstd") and y.attr("op0") == "subtract" and y.attr("op1") == "multiply"
    assert by["rstd"].args == ("q", 1.0, 1e-5)  # the variance itself (it read count x variance scaled by 1 / 64)
    assert ls.reduction_tiles([by["s"]], views=True) == []  # both are views of the bn_aggr tile
    assert ls.reduction_tiles([by["s"]]) == [{"out": "s", "dtype": "float32"}, {"out": "q", "dtype": "float32"}]


def test_variance_read_at_any_literal_scale() -> None:
    # the lowering keeps sqrt's input in range: sqrt(q / (64 * 2^20) + eps / 2^20) * 2^10; the variance is read at
    # the scale times the count, so no count x variance instruction precedes the sqrt
    prog = _layernorm_program()
    prog[6] = _op("rstd", "activation", ("q", 1.0 / (64 * 2.0**20), 1e-5 / 2.0**20), kind="row", phase=2,
                  func="sqrt")
    by = {op.out: op for op in ls.use_moments(prog, 64)}
    assert by["s"].attr("as_var") is True
    assert by["rstd"].args == ("q", 1.0 / 2.0**20, 1e-5 / 2.0**20)


def test_sums_stay_sums_where_something_else_reads_them() -> None:
    prog = _layernorm_program()
    prog.insert(-1, _op("nm2", "store", ("nm",), phase=2))  # the negated mean is an output too
    prog.insert(-1, _op("q2", "store", ("q",), phase=2))  # and so is the sum of squares
    by = {op.out: op for op in ls.use_moments(prog, 64)}
    assert not by["s"].attr("as_mean") and not by["s"].attr("as_var")
    assert by["nm"].args == ("s", 1.0 / 64, -1.0) and by["rstd"].args == ("q", 1.0 / 64, 1e-5)
    assert ls.reduction_tiles([by["s"]]) == [{"out": "s", "dtype": "float32"}, {"out": "q", "dtype": "float32"}]


def test_centring_folded_into_the_square_is_matched_too() -> None:
    # the matmul epilogue's and var's form: square(x + nm) with the negated mean as the activation's bias
    prog = _layernorm_program()
    prog[3:5] = [_op("sq", "activation", ("x", 1.0, "nm"), phase=1, func="square")]
    prog[-2] = _op("y", "tensor_scalar", ("x", "nm", "rstd"), phase=2, op0="add", op1="multiply", reverse0=False,
                   reverse1=False)
    out = ls.use_moments(prog, 64)
    assert out is not None
    by = {op.out: op for op in out}
    assert by["s"].attr("op") == "moments" and by["q"].opcode == "moments_var" and "sq" not in by
    assert by["y"].args == ("x", "s", "rstd") and by["y"].attr("op0") == "subtract"  # already folded: x - mean


def test_statistics_pass_refuses_what_it_cannot_reproduce() -> None:
    # the centring is not by the row's mean (the factor is not -1 / count)
    assert ls.use_moments(_layernorm_program(scale=1.0 / 32), 64) is None
    # the square is read elsewhere too: it must be computed anyway
    assert ls.use_moments(_layernorm_program(square_readers=2), 64) is None
    # the count the kernel reduces over is not the one the mean divides by
    assert ls.use_moments(_layernorm_program(), 128) is None
    # a negated reduction is not a sum
    prog = _layernorm_program()
    prog[1] = _op("s", "reduce", ("x",), kind="row", op="add", negate=True)
    assert ls.use_moments(prog, 64) is None


def _compile(fn, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(fn, backend="neuron", dynamic=False)(x)
    return got, [s for _, s in backend.compiled_graphs()[-1]["sources"]]


@pytest.mark.parametrize(("rows", "width"), [(1024, 700), (200, 1536), (256, 96)],
                         ids=["row_groups_ragged_chunk", "one_row_three_chunks", "narrow"])
def test_layernorm_statistics_match_eager_far_from_zero_mean(rows: int, width: int) -> None:
    torch.manual_seed(0)
    m = torch.nn.LayerNorm(width).eval()
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-1, 1)
    x = torch.randn(rows, width) * 3.0 + 1000.0  # |mean| >> std: a sum-of-squares shortcut would lose every digit
    got, sources = _compile(m, x)
    (src,) = sources
    assert "nisa.bn_stats(" in src and "nisa.bn_aggr(" in src and "tensor_reduce" not in src, src
    assert check_source_against_api(src) == []
    with torch.no_grad():
        ref64 = torch.nn.functional.layer_norm(x.double(), (width,), m.weight.double(), m.bias.double(), m.eps)
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
    assert (got.double() - ref64).abs().max() < 1e-4


@pytest.mark.parametrize("width", [8, 64, 1000])
@pytest.mark.parametrize("offset", [10.0, 1e3, 1e4])
def test_variance_keeps_its_precision_far_from_zero_mean(width: int, offset: float) -> None:
    """torch.var over a resident row runs as bn_stats/bn_aggr; their fp32 record means lose the spread to ulps of
    the mean (1e4 + randn: 7e-4 relative before the shift by the row's first element; eager: 6e-8)."""
    torch.manual_seed(0)
    x = offset + torch.randn(64, width)

    def var(t: torch.Tensor) -> torch.Tensor:
        return torch.var(t, 1, correction=0)

    got, sources = _compile(var, x)
    (src,) = sources
    assert "nisa.bn_stats(" in src and check_source_against_api(src) == []
    ref = var(x.double())
    assert ((got.double() - ref).abs() / ref).max() < 5e-7  # eager: 6e-8; two fp32 roundings of the shift and mean


def test_variance_of_rows_with_inf_nan_and_huge_values_matches_eager() -> None:
    x = torch.randn(5, 700)
    x[0, 0] = float("inf")  # the shift itself
    x[1, 5] = float("inf")
    x[2, 0] = float("nan")
    x[3, 0] = 3e38  # the squares overflow: inf, not the nan of an overflowed sum in the statistics
    got, _ = _compile(lambda t: torch.var(t, 1), x)
    torch.testing.assert_close(got, torch.var(x, 1), equal_nan=True)


def test_streamed_rows_keep_their_reductions() -> None:
    m = torch.nn.LayerNorm(700).eval()
    x = torch.randn(256, 700)
    with config.patch(row_resident_bytes=2 * 1024):  # rows stream in chunks: no whole row for bn_stats
        got, sources = _compile(m, x)
    (src,) = sources
    assert "bn_stats" not in src and ("tensor_reduce" in src or "reduce_res" in src)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), rtol=2e-5, atol=2e-5)


def test_row_group_loads_and_stores_take_separate_dma_queues() -> None:
    m = torch.nn.LayerNorm(768).eval()
    x = torch.randn(2048, 768)
    with config.patch(lnc=1):
        got, sources = _compile(m, x)
    (src,) = sources
    assert "_rows = nl.ndarray((P, " in src, src  # row groups
    loads = [line for line in src.splitlines() if "dma_copy(dst=v1_rows" in line]
    stores = [line for line in src.splitlines() if "dma_copy(dst=out0" in line]
    assert loads and stores
    assert all(line.endswith("engine=nisa.engine.scalar)") for line in loads)
    assert all(line.endswith("engine=nisa.engine.sync)") for line in stores)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), rtol=2e-5, atol=2e-5)
