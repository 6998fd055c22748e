"""A LayerNorm over a matmul's whole output row runs in the matmul kernel's epilogue (lowering/partition.py
``_row_of_matmul``, codegen/render_matmul.py ``row_ops``): eager values, the same values as the separate
LayerNorm kernel (``config.fuse_matmul_norm=False``), and one kernel fewer."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from neuron_compile import backend
from neuron_compile.config import config


class Block(torch.nn.Module):
    """x + Linear(h), then LayerNorm of the sum (GPT-2's attention projection + residual + ln_2)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(k, n)
        self.ln = torch.nn.LayerNorm(n)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.proj(h)
        return x, self.ln(x)


def _run(model: torch.nn.Module, *inputs: torch.Tensor, fuse: bool) -> tuple[tuple[torch.Tensor, ...], dict]:
    torch._dynamo.reset()
    backend.reset()
    with config.patch(cache=False, target="trn2", fuse_matmul_norm=fuse), torch.no_grad():
        got = torch.compile(model, backend="neuron", dynamic=False)(*inputs)
    return got, backend.compiled_graphs()[-1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize(("batch", "rows", "k", "n"), [(2, 300, 96, 768), (2, 200, 64, 96), (1, 300, 96, 768)])
def test_layer_norm_after_residual_add_fuses_into_the_matmul(dtype: torch.dtype, batch: int, rows: int, k: int,
                                                             n: int) -> None:
    """A batch of one too: (M, N) viewed as (1, M, N) keeps the LayerNorm's reduced dim (partition._batch_of_one)."""
    torch.manual_seed(0)
    model = Block(k, n).to(dtype).eval()
    h, x = torch.randn(batch, rows // batch, k, dtype=dtype), torch.randn(batch, rows // batch, n, dtype=dtype)
    fused, g = _run(model, h, x, fuse=True)
    unfused, g0 = _run(model, h, x, fuse=False)
    with torch.no_grad():
        want = model(h, x)
    tol = {torch.bfloat16: {"rtol": 2e-2, "atol": 3e-2}, torch.float16: {"rtol": 4e-3, "atol": 4e-3}}.get(
        dtype, {"rtol": 1e-4, "atol": 1e-4})
    for a, b in zip(fused, want, strict=True):
        torch.testing.assert_close(a, b, **tol)
    # the same instructions on the same values as the separate LayerNorm kernel
    for a, b in zip(fused, unfused, strict=True):
        assert torch.equal(a, b), (a - b).abs().max()
    names = [name for name, _ in g["sources"]]
    assert len(names) == len([name for name, _ in g0["sources"]]) - 1, names
    (src,) = [s for name, s in g["sources"] if "mm" in name]
    # mean and variance from one VectorE statistics pass over the row (no reduce or square pass)
    assert "nisa.bn_stats(" in src and "nisa.bn_aggr(" in src and "op=nl.square" not in src
    assert not any(s for name, s in g["sources"] if "mm" not in name and "mean" in name), names


def test_wide_rows_and_other_reductions_keep_their_own_kernel() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 4096)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x @ w
        return y - y.mean(-1, keepdim=True)  # N = 4096 > MATMUL_ROW_MAX: the row is never whole in SBUF

    x = torch.randn(128, 64)
    got, g = _run(f, x, fuse=True)
    torch.testing.assert_close(got, f(x), rtol=1e-4, atol=1e-3)
    assert len(g["sources"]) == 2, [name for name, _ in g["sources"]]


def test_gpt2_layer_has_no_separate_layer_norm_after_the_residual_matmuls() -> None:
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "examples"))
    try:
        from models import GPT, GPTConfig
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=64, seq=128, d_model=96, n_heads=2, n_layers=1)
    model = GPT(cfg).to(torch.bfloat16).eval()
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    got, g = _run(model, idx, fuse=True)
    with torch.no_grad():
        want = model(idx)
    torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=1e-1)
    names = [name for name, _ in g["sources"]]
    mm = [i for i, name in enumerate(names) if re.search(r"_mm_add_(to_copy|clone)", name)]
    assert len(mm) == 2, names
    for i in mm:  # the kernel after a residual matmul is a matmul (the LayerNorm went into its epilogue)
        assert "mean" not in names[i + 1], names
    assert sum("mean" in name for name in names) == 1, names  # only ln_1 of the first layer (after the embedding)


def test_batched_softmax_rows_fuse_into_the_bmm() -> None:
    torch.manual_seed(1)
    a, b = torch.randn(3, 130, 40), torch.randn(3, 40, 200)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.softmax(a @ b, -1)

    got, g = _run(f, a, b, fuse=True)
    ref, g0 = _run(f, a, b, fuse=False)
    torch.testing.assert_close(got, f(a, b), rtol=1e-4, atol=1e-5)
    assert torch.equal(got, ref)
    assert len(g["sources"]) == len(g0["sources"]) - 1 == 1, [name for name, _ in g["sources"]]


def test_split_k_blocks_keep_the_unfused_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """K chunks summed in SBUF partials (Tiles.split): the row ops read the finished sums."""
    import neuron_compile.lowering.ops.matmul as mm

    every = mm.candidates
    monkeypatch.setattr(mm, "candidates", lambda k, t: [c for c in every(k, t) if c.split] or every(k, t))
    monkeypatch.setattr(mm, "_TUNED", {})
    torch.manual_seed(2)
    model = Block(2304, 96).to(torch.bfloat16).eval()
    h, x = torch.randn(1, 200, 2304, dtype=torch.bfloat16), torch.randn(1, 200, 96, dtype=torch.bfloat16)
    fused, g = _run(model, h, x, fuse=True)
    unfused, _ = _run(model, h, x, fuse=False)
    tiles = [op.attr("tiles") for k in g["plan"].kernels for op in k.ops if op.opcode == "matmul"]
    assert tiles and all(t[6] for t in tiles), tiles  # split blocks
    for a, b in zip(fused, unfused, strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        want = model(h, x)
    for a, b in zip(fused, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=6e-2)


@pytest.mark.parametrize(("rows", "n"), [(2100, 768), (1000, 300)])
def test_row_ops_pipelined_across_tiles_keep_every_value(rows: int, n: int) -> None:
    """Tile i's row statistics run before tile i - 1's normalisation (config.pipeline_row_ops): the same
    instructions on the same values, ragged last tiles and several row groups included, in less estimated time."""
    from neuron_compile.instruction_stream import kernel_time_ns

    torch.manual_seed(1)
    model = Block(96, n).to(torch.bfloat16).eval()
    h, x = torch.randn(2, rows // 2, 96, dtype=torch.bfloat16), torch.randn(2, rows // 2, n, dtype=torch.bfloat16)
    out, times = {}, {}
    for pipelined in (True, False):
        torch._dynamo.reset()
        backend.reset()
        with config.patch(cache=False, target="trn2", pipeline_row_ops=pipelined), torch.no_grad():
            out[pipelined] = torch.compile(model, backend="neuron", dynamic=False)(h, x)
            (src,) = [s for name, s in backend.compiled_graphs()[-1]["sources"] if "_mm" in name]
            assert ("pend = cur" in src) == pipelined, src
            (kernel,) = [k for k in backend.compiled_graphs()[-1]["plan"].kernels if "_mm" in k.name]
            times[pipelined] = kernel_time_ns(kernel, "trn2")
    for a, b in zip(out[True], out[False], strict=True):
        assert torch.equal(a, b), (a - b).abs().max()
    with torch.no_grad():
        want = model(h, x)
    for a, b in zip(out[True], want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=3e-2)
    assert times[True] < times[False], times
