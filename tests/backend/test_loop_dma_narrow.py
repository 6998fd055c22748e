"""Loop kernels keep bf16/fp16 tiles in their storage dtype (lowering/tileopt.py ``narrow_tiles``).

Loads of a bf16 argument land in bf16 tiles (no converting DMA), the last op before a bf16 store writes a
bf16 tile that is stored as is, and a round through bf16 is one cast (or nothing). Every value equals the
fp32-tile kernels bit for bit (engines widen exactly and round once, RNE, on the write); dead ops (results
no store reads) are gone from every kernel, matmul epilogues included.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from neuron_compile.codegen.render import render_kernel
from neuron_compile.lowering import tileopt
from neuron_compile.lowering.ir import LoopKernel

from neuron_compile import backend
from neuron_compile.config import config
from neuron_compile.instruction_stream import source_stream
from neuron_compile.nki_api.checker import check_source_against_api


@pytest.fixture(autouse=True)
def single_core() -> Iterator[None]:
    """These tests pin single-core row-group code (LNC=1); tests/backend/test_ops.py runs every op on both cores."""
    with config.patch(lnc=1):
        yield


def _layernorm(width: int) -> torch.nn.Module:
    m = torch.nn.LayerNorm(width).eval()
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-1, 1)
    return m.to(torch.bfloat16)


def _add_layernorm(width: int):
    ln = _layernorm(width)

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + y
        return h, ln(h)

    return fn


def _where_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x * y, y - 1.0) * 0.5


CASES = {
    "layernorm": (lambda: _layernorm(768), [(1024, 768)]),
    "add_layernorm": (lambda: _add_layernorm(768), [(2, 512, 768), (512, 768)]),
    "where_chain": (lambda: _where_chain, [(256, 200), (256, 200)]),
}


def _run(fn, inputs: list[torch.Tensor]) -> tuple[object, list]:
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(fn, backend="neuron", dynamic=False)(*inputs)
    return got, list(backend.compiled_graphs()[-1]["plan"].kernels)


def _flat(out: object) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("name", list(CASES))
def test_bf16_loop_kernels_have_no_converting_dma_and_equal_fp32_tiles(name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    make, shapes = CASES[name]
    fn = make()
    torch.manual_seed(0)
    inputs = [torch.randn(*s).to(torch.bfloat16) for s in shapes]
    got, kernels = _run(fn, inputs)
    loops = [k for k in kernels if isinstance(k, LoopKernel)]
    assert loops
    for k in loops:
        src = render_kernel(k)
        assert check_source_against_api(src) == []
        assert "_low = nl.ndarray" not in src, src  # no round trip through a bf16 copy
        stream = source_stream(src, k.name, [(a.numel, a.dtype) for a in k.inputs])
        dmas = [r for r in stream if r.engine == "dma"]
        assert dmas
        for r in dmas:
            assert len(set(r.dtypes)) == 1, (r, src)  # bf16 HBM <-> bf16 SBUF: no conversion
    with torch.no_grad():
        want = fn(*inputs)
    for g, w in zip(_flat(got), _flat(want), strict=True):
        assert g.dtype == w.dtype == torch.bfloat16
        # one bf16 rounding at the end, as eager; fused fp32 math may differ from eager by an ulp
        torch.testing.assert_close(g.float(), w.float(), rtol=1.6e-2, atol=1e-2)
    # Bit-identical to the same kernels with fp32 tiles (converting DMAs and bf16 round trips).
    monkeypatch.setattr(tileopt, "narrow_tiles", lambda ops, keep=frozenset(): list(ops))
    wide, kernels_fp32 = _run(fn, inputs)
    assert any("_low = nl.ndarray" in render_kernel(k) or "float32" in render_kernel(k) for k in kernels_fp32)
    for g, w in zip(_flat(got), _flat(wide), strict=True):
        assert torch.equal(g, w)


def test_layernorm_bf16_rows_load_and_store_bf16_tiles() -> None:
    _, kernels = _run(_layernorm(768), [torch.randn(1024, 768).to(torch.bfloat16)])
    (k,) = kernels
    src = render_kernel(k)
    assert "_rows = nl.ndarray((P, " in src
    ops = {op.out: op for op in k.ops}
    loads = [op for op in k.ops if op.opcode == "load"]
    assert loads and all(op.dtype == "bfloat16" for op in loads)
    (store,) = [op for op in k.ops if op.opcode == "store"]
    assert ops[store.args[0]].dtype == "bfloat16" and ops[store.args[0]].opcode == "tensor_tensor"
    assert not [op for op in k.ops if op.opcode in ("round", "cast")]


def test_round_of_fp32_value_read_in_fp32_is_one_cast() -> None:
    """x stays fp32 (read by a later fp32 op); round(x, bf16) becomes one cast into a bf16 tile."""
    ops = [
        tileopt.TileOp("v1", "load", "full", "float32", (), (("access", (0, 0, (1, 1))), ("src_dtype", "float32"))),
        tileopt.TileOp("v2", "tensor_scalar", "full", "float32", ("v1", 2.0), (("op0", "multiply"),)),
        tileopt.TileOp("v3", "round", "full", "float32", ("v2",), (("via", "bfloat16"),)),
        tileopt.TileOp("v4", "tensor_tensor", "full", "float32", ("v2", "v3"), (("op", "add"),)),
        tileopt.TileOp("v5", "store", "full", "float32", ("v4",), (("access", (0, 0, (1, 1))),
                                                                    ("dst_dtype", "float32"))),
    ]
    out = {op.out: op for op in tileopt.narrow_tiles(ops)}
    assert out["v2"].dtype == "float32"
    assert out["v3"].opcode == "cast" and out["v3"].dtype == "bfloat16"
    assert out["v4"].dtype == "float32"


def test_dead_ops_are_eliminated_in_every_kernel() -> None:
    """GPT block in bf16: the fp32 copy of the residual stream is read back from the bf16 buffer, so its
    round is dead in the matmul epilogue and must not be rendered (and no kernel keeps an unread op)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from models import GPT, GPTConfig

    cfg = GPTConfig(vocab=256, seq=128, d_model=128, n_heads=2, n_layers=1)
    torch.manual_seed(0)
    model = GPT(cfg).to(torch.bfloat16).eval()
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    got, kernels = _run(model, [idx])
    loops = [k for k in kernels if isinstance(k, LoopKernel)]
    assert any(k.family == "matmul" and "to_copy" in k.name for k in loops), [k.name for k in loops]
    for k in loops:
        read = {a for op in k.ops for a in op.args if isinstance(a, str)}
        assert all(op.opcode == "store" or op.out in read for op in k.ops), str(k)
    with torch.no_grad():
        want = model(idx)
    torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2)


def test_row_group_engines_split_per_row_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2 LayerNorm rows: an op's R rows may run on different engines (chosen by the cost model)."""
    from neuron_compile.codegen import render

    fn = _layernorm(768)
    torch.manual_seed(1)
    x = torch.randn(4096, 768).to(torch.bfloat16)
    got, kernels = _run(fn, [x])
    (k,) = kernels
    src = render_kernel(k)
    assert ")[q])" in src and "engine=(nisa.engine." in src, src
    assert check_source_against_api(src) == []
    init = render.LoopRenderer.__init__

    def no_split(self, k, rows=1, split_rows=False, store_rows=0):
        init(self, k, rows, False, store_rows)

    monkeypatch.setattr(render.LoopRenderer, "__init__", no_split)
    same, kernels1 = _run(fn, [x])
    assert ")[q])" not in render_kernel(kernels1[0])
    assert torch.equal(got, same)


def test_row_group_row_ops_run_once_per_group() -> None:
    """Row values of a group (mean, rstd) are computed by one instruction over the (P, R) tile."""
    _, kernels = _run(_layernorm(768), [torch.randn(4096, 768).to(torch.bfloat16)])
    src = render_kernel(kernels[0])
    recips = [line.strip() for line in src.splitlines() if "nisa.reciprocal(" in line]
    assert len(recips) == 1 and recips[0].startswith("nisa.reciprocal(dst=r") and "_rows, data=r" in recips[0], src
    sqrt = [line for line in src.splitlines() if "op=nl.sqrt" in line]
    assert len(sqrt) == 1 and "_rows, op=nl.sqrt, data=r" in sqrt[0]


@pytest.mark.parametrize("seq", [512, 1024])
def test_row_group_load_invariant_in_outer_loops_is_loaded_once_per_partition_tile(
        seq: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """x[b] + pos, then LayerNorm: the partition loop runs outside the batch loop and pos is loaded once. On a
    logical core of two (trn2's LNC=2) the launch grid splits the partition loop, the top one, when it has a trip per
    program (1024 rows: two groups of 4 x 128), else the batch loop inside it (GPT-2's embedding + LayerNorm ran on one
    core: 152 -> 84 us estimated)."""
    fn = _add_layernorm(768)
    torch.manual_seed(2)
    x, pos = torch.randn(4, seq, 768).to(torch.bfloat16), torch.randn(seq, 768).to(torch.bfloat16)
    with config.patch(target="trn2", lnc=2):
        got, kernels = _run(fn, [x, pos])
        (k,) = [k for k in kernels if isinstance(k, LoopKernel)]
        src = render_kernel(k)
    lines = [line.strip() for line in src.splitlines()]
    assert any(line.startswith("for p0 in range(") for line in lines), src
    p0 = next(i for i, line in enumerate(lines) if line.startswith("for p0 in range("))
    o0 = next(i for i, line in enumerate(lines) if line.startswith("for o0 in range("))
    assert "LAUNCH_GRID = 2" in src and ("nl.program_id(0)" in lines[p0 if seq == 1024 else o0]), src
    pos_loads = [i for i, line in enumerate(lines) if line.startswith("nisa.dma_copy(") and "src=in1." in line]
    assert p0 < o0 and len(pos_loads) == 1 and p0 < pos_loads[0] < o0, src
    # the group tiles each batch writes are allocated per batch (consecutive batches rotate buffers instead of
    # waiting for the previous batch's stores): only pos's tile is allocated outside the batch loop
    allocs = {line.split(" = ")[0]: i for i, line in enumerate(lines) if "_rows = nl.ndarray(" in line}
    pos_tile = lines[pos_loads[0]].split("dst=")[1].split(",")[0]
    assert allocs.pop(pos_tile) < o0 and allocs and min(allocs.values()) > o0, src
    with torch.no_grad():
        want = fn(x, pos)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w.float(), rtol=1.6e-2, atol=1e-2)
    from neuron_compile.codegen.render import LoopRenderer

    monkeypatch.setattr(LoopRenderer, "row_group_options", lambda self: [])
    single, kernels1 = _run(fn, [x, pos])
    assert "for q in range(" not in render_kernel([k for k in kernels1 if isinstance(k, LoopKernel)][0])
    for g, w in zip(got, single, strict=True):
        assert torch.equal(g, w)


def test_row_group_stores_fewer_rows_than_loads_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2 LayerNorm: R rows per load, stores of R/2 rows issued as soon as those rows are done, the same values as
    whole-group stores. (Forced here: the scheduling cost model no longer prefers more, smaller stores; the
    first-order model's dependency term, divided by the store count, did.)"""
    from neuron_compile.codegen import render

    fn = _layernorm(768)
    torch.manual_seed(3)
    x = torch.randn(4096, 768).to(torch.bfloat16)
    init = render.LoopRenderer.__init__

    def half_stores(self, k, rows=1, split_rows=False, store_rows=0):  # type: ignore[no-untyped-def]
        init(self, k, rows, split_rows, rows // 2 if rows > 1 else 0)

    monkeypatch.setattr(render.LoopRenderer, "__init__", half_stores)
    got, kernels = _run(fn, [x])
    src = render_kernel(kernels[0])
    assert "for q0 in range(0, " in src and "for q in range(q0, q0 + " in src, src
    store = [line.strip() for line in src.splitlines() if "nisa.dma_copy(dst=out0" in line]
    assert len(store) == 1 and "q0 * 768" in store[0] and "_rows[:, q0:q0 + " in store[0], store
    assert check_source_against_api(src) == []

    def whole_groups(self, k, rows=1, split_rows=False, store_rows=0):  # type: ignore[no-untyped-def]
        init(self, k, rows, split_rows, 0)

    monkeypatch.setattr(render.LoopRenderer, "__init__", whole_groups)
    same, kernels1 = _run(fn, [x])
    assert "for q0 in range(" not in render_kernel(kernels1[0])
    assert torch.equal(got, same)
