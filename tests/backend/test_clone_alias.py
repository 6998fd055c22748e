"""Layout clones that need no copy: the attention output layout and ``GraphLowering._alias_clone``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from neuron_compile import backend
from neuron_compile.config import config


def _compile(fn, *args: torch.Tensor) -> tuple[object, list[str]]:
    torch._dynamo.reset()
    with config.patch(cache=False), torch.no_grad():
        got = torch.compile(fn, backend="neuron", dynamic=False)(*args)
    return got, [k.name for k in backend.compiled_graphs()[-1]["plan"].kernels]


def _heads_attention_proj(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b, s, d = x.shape
    q, k, v = ((x * c).view(b, s, 4, d // 4).transpose(1, 2) for c in (1.0, 0.5, -1.0))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).reshape(b * s, d) @ w


def test_attention_heads_merge_reads_the_kernel_result_without_a_copy() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 48, 32), torch.randn(32, 24)
    got, names = _compile(_heads_attention_proj, x, w)
    with torch.no_grad():
        want = _heads_attention_proj(x, w)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert any("attention" in n for n in names), names
    assert not any("clone" in n or "copy" in n for n in names), names


def test_attention_result_returned_after_the_heads_merge_has_eager_values() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 40, 48)

    got, _ = _compile(f, q, k, v)
    torch.testing.assert_close(got, f(q, k, v), rtol=1e-4, atol=1e-4)


def test_clone_that_is_a_graph_output_stays_a_separate_buffer() -> None:
    x = torch.randn(8, 16)

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2.0
        return y, y.clone()

    (y, c), _ = _compile(f, x)
    torch.testing.assert_close(c, x * 2.0)
    y.add_(1.0)
    torch.testing.assert_close(c, x * 2.0)  # mutating one output must not change the other


def test_clone_of_a_non_contiguous_view_is_still_copied() -> None:
    x = torch.randn(6, 10)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x + 1.0).t().clone(memory_format=torch.contiguous_format).view(60) * 3.0

    got, names = _compile(f, x)
    torch.testing.assert_close(got, ((x + 1.0).t().contiguous().view(60)) * 3.0)
    assert len(names) >= 2, names


def _residual_norm(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x @ w + x
    return y, F.layer_norm(y.float(), (y.shape[-1],)).to(y.dtype)


def test_fp32_copy_of_a_bf16_result_is_read_back_from_the_bf16_buffer() -> None:
    torch.manual_seed(2)
    x, w = torch.randn(64, 96, dtype=torch.bfloat16), torch.randn(96, 96, dtype=torch.bfloat16) * 0.1
    with config.patch(fuse_matmul_norm=False):  # the LayerNorm in its own kernel reads y back (fused: no read)
        (y, z), _ = _compile(_residual_norm, x, w)
    plan = backend.compiled_graphs()[-1]["plan"]
    with torch.no_grad():
        ey, ez = _residual_norm(x, w)
    torch.testing.assert_close(y, ey, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(z, F.layer_norm(y.float(), (96,)).bfloat16(), rtol=2e-2, atol=2e-2)
    call = plan.calls[0]
    assert "mm" in plan.kernels[call.kernel].name, [k.name for k in plan.kernels]
    assert [plan.buffers[r].dtype for r in call.results] == ["bfloat16"]  # no fp32 copy stored


def test_fp32_copy_feeding_a_matmul_or_returned_is_still_stored() -> None:
    torch.manual_seed(3)
    x, w = torch.randn(32, 48, dtype=torch.bfloat16), torch.randn(48, 16)

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = (x * 2.0).float()
        return y @ w, (x + 1.0).float()

    (a, c), names = _compile(f, x, w)
    torch.testing.assert_close(a, (x * 2.0).float() @ w, rtol=1e-4, atol=1e-4)
    assert c.dtype == torch.float32
    torch.testing.assert_close(c, (x + 1.0).float())
