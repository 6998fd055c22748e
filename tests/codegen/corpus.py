"""The code generator's test corpus: small graphs covering every kernel family the templates render.

Each :class:`CorpusEntry` is a function (or module call), a seeded input builder and eager-comparison
tolerances. Sizes are chosen to force tiling and ragged edges (130 rows > 128 partitions, K=300 > 128,
N=700 > 512). :func:`compile_entry` compiles one entry with ``backend="neuron"`` (cache off), runs it
on the simulator and returns every rendered kernel source with the result and eager reference;
``test_api_conformance.py`` and ``test_golden.py`` share those results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

import neuron_compile  # noqa: F401  (registers backend="neuron")
from neuron_compile.backend import compiled_graphs, reset
from neuron_compile.config import config
from neuron_compile.simulator.targets import use_target

log = logging.getLogger(__name__)

F32_TOL = (1e-4, 1e-4)
BF16_TOL = (3e-2, 3e-2)


@dataclass(frozen=True)
class CorpusEntry:
    name: str
    fn: Callable[..., Any]
    inputs: Callable[[torch.Generator], tuple[Any, ...]]
    tol: tuple[float, float] = F32_TOL
    backward: bool = False  # also compile and check the backward graph (grads of float inputs)


@dataclass
class CorpusResult:
    entry: CorpusEntry
    sources: dict[str, str]  # kernel name -> rendered NKI source (all graphs of the entry)
    got: Any
    expected: Any
    grads: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (compiled, eager)


def _randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def _pos(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=g) * 2 + 0.5


def _module(factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(0)
    return factory()


_LN = _module(lambda: torch.nn.LayerNorm(300))
_LINEAR = _module(lambda: torch.nn.Linear(300, 700))
_LINEAR_BF16 = _module(lambda: torch.nn.Linear(300, 200)).to(torch.bfloat16)
_EMB = _module(lambda: torch.nn.Embedding(1000, 300))
_RMS_W = _pos(torch.Generator().manual_seed(1), 300)


def _ew_chain(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    a = torch.relu(x * y + z)  # (4, 37, 300) * (300,) + (37, 1)
    b = torch.sigmoid(a) - torch.tanh(x) / (torch.exp(-a) + 1.5)
    return torch.where(x > z, b, torch.maximum(a, y).clamp(-0.5, 0.75))


def _ew_unary(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    r = torch.sqrt(p) + torch.rsqrt(p) + torch.log(p) + torch.reciprocal(p) + torch.pow(p, 1.7)
    r = r + torch.pow(p, x.tanh()) + torch.erf(x) + F.softplus(x) + torch.sin(x) * torch.cos(x)
    r = r + F.silu(x) + F.gelu(x, approximate="tanh") + F.gelu(x) + torch.abs(-x) + torch.minimum(x, p)
    return r.masked_fill(x < -1.0, 3.0)


def _ew_logic(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m = torch.logical_or(x > 0.3, torch.logical_and(y <= 0.1, ~(x == y)))
    return m, (m.to(torch.float32) * 2 + (x >= y).to(torch.int32)).to(torch.float32)


def _ew_sign_bits(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.signbit(x), torch.copysign(y, x - 0.5)  # the sign bit read through an int32 view of the tile


def _reduce_sum_mean(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.sum(dim=(0, 2)), x.mean(-1, keepdim=True), x.sum(1)


def _reduce_max_min(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.amax(-1), x.amin(dim=(0, 1), keepdim=True)


def _reduce_var_std(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.var(-1), x.std(0, keepdim=True, correction=0)


def _reduce_arg(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.argmax(-1), x.argmin(0)


def _reduce_prod_any_all(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x * 0.1 + 1).prod(-1), (x > 2.5).any(-1), (x > -3.0).all(0)


def _sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _sdpa_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _sdpa_plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


_CONV = _module(lambda: torch.nn.Conv2d(6, 12, 3, stride=2, padding=1, groups=2))
_DWCONV = _module(lambda: torch.nn.Conv1d(8, 8, 5, padding=4, dilation=2, groups=8))
_GN = _module(lambda: torch.nn.GroupNorm(4, 12))


def _conv_block(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(_CONV(x)).sum()


def _pool_resample(x: torch.Tensor) -> torch.Tensor:
    a = F.max_pool2d(x, 3, stride=2, padding=1) + F.avg_pool2d(x, 2)[..., :5, :5]
    b = F.adaptive_avg_pool2d(x, 3).mean() + F.interpolate(x, scale_factor=2, mode="nearest").sum()
    return a.sum() + b + F.interpolate(x, size=(13, 7), mode="bilinear", align_corners=False).sum()


def _index_put(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.clone()
    y[i, j] = v
    z = x.index_put((i,), v[:, None].expand(-1, x.shape[1]), accumulate=True)
    return y, z, x[x > 1.0].sum()


def _matmul_norm(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x @ w + r, (300,))


def _cat_split(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c = torch.cat([x, y * 2], dim=1)
    a, b = torch.split(c, [100, 230], dim=1)
    return torch.stack([a[:, :50], b[:, 7:57]], dim=0), c


CORPUS: tuple[CorpusEntry, ...] = (
    CorpusEntry("ew_chain_broadcast", _ew_chain,
                lambda g: (_randn(g, 4, 37, 300), _randn(g, 300), _randn(g, 37, 1))),
    CorpusEntry("ew_unary_mix", _ew_unary, lambda g: (_randn(g, 130, 300), _pos(g, 130, 300))),
    CorpusEntry("ew_logic_casts", _ew_logic, lambda g: (_randn(g, 130, 77), _randn(g, 130, 77))),
    CorpusEntry("ew_sign_bits", _ew_sign_bits, lambda g: (_randn(g, 130, 77), _randn(g, 130, 77))),
    CorpusEntry("reduce_sum_mean", _reduce_sum_mean, lambda g: (_randn(g, 3, 130, 300),)),
    CorpusEntry("reduce_max_min", _reduce_max_min, lambda g: (_randn(g, 3, 130, 700),)),
    CorpusEntry("reduce_var_std", _reduce_var_std, lambda g: (_randn(g, 130, 300),)),
    CorpusEntry("reduce_argmax_argmin", _reduce_arg,
                lambda g: (torch.randperm(130 * 300, generator=g).reshape(130, 300).float(),)),
    CorpusEntry("reduce_prod_any_all", _reduce_prod_any_all, lambda g: (_randn(g, 130, 300),)),
    CorpusEntry("cumsum", lambda x: torch.cumsum(x, -1), lambda g: (_randn(g, 130, 700),)),
    CorpusEntry("softmax", lambda x: torch.softmax(x, -1), lambda g: (_randn(g, 4, 130, 300),)),
    CorpusEntry("log_softmax_wide", lambda x: torch.log_softmax(x, -1), lambda g: (_randn(g, 130, 5000),)),
    CorpusEntry("layer_norm", lambda x: _LN(x), lambda g: (_randn(g, 2, 130, 300),)),
    CorpusEntry("rms_norm", lambda x: F.rms_norm(x, (300,), _RMS_W, eps=1e-6), lambda g: (_randn(g, 130, 300),)),
    CorpusEntry("mm_ragged", torch.mm, lambda g: (_randn(g, 130, 300), _randn(g, 300, 700))),
    CorpusEntry("bmm_ragged", torch.bmm, lambda g: (_randn(g, 3, 130, 300), _randn(g, 3, 300, 70))),
    CorpusEntry("matmul_broadcast", torch.matmul, lambda g: (_randn(g, 2, 1, 130, 40), _randn(g, 3, 40, 20))),
    CorpusEntry("linear_gelu", lambda x: F.gelu(_LINEAR(x)), lambda g: (_randn(g, 130, 300),)),
    CorpusEntry("addmm_baddbmm", lambda b, x, y, z: (torch.addmm(b, x, y, beta=0.5, alpha=2.0),
                                                      torch.baddbmm(z, x.expand(2, 130, 300), y.expand(2, 300, 70))),
                lambda g: (_randn(g, 70), _randn(g, 130, 300), _randn(g, 300, 70), _randn(g, 2, 130, 70))),
    CorpusEntry("permute_transpose", lambda x: (x.permute(2, 0, 1).contiguous() + 1, x.transpose(0, 1) * 2),
                lambda g: (_randn(g, 130, 37, 300),)),
    CorpusEntry("transpose_matmul", lambda x, y: x.t() @ y, lambda g: (_randn(g, 300, 130), _randn(g, 300, 90))),
    CorpusEntry("cat_split_stack", _cat_split, lambda g: (_randn(g, 130, 200), _randn(g, 130, 130))),
    CorpusEntry("embedding", lambda i: _EMB(i), lambda g: (torch.randint(0, 1000, (4, 130), generator=g),)),
    CorpusEntry("embedding_backward", lambda w, i: (F.embedding(i, w) ** 2).sum(),
                lambda g: (_randn(g, 1000, 300), torch.randint(0, 1000, (4, 130), generator=g)), backward=True),
    CorpusEntry("cross_entropy", lambda x, t: F.cross_entropy(x, t),
                lambda g: (_randn(g, 130, 1000), torch.randint(0, 1000, (130,), generator=g))),
    CorpusEntry("sdpa_causal", _sdpa_causal,
                lambda g: (_randn(g, 2, 4, 130, 32), _randn(g, 2, 4, 130, 32), _randn(g, 2, 4, 130, 32))),
    CorpusEntry("bf16_chain", lambda x, y: F.gelu(x * y + 1).to(torch.float32),
                lambda g: (_randn(g, 130, 300, dtype=torch.bfloat16), _randn(g, 300, dtype=torch.bfloat16)),
                tol=BF16_TOL),
    CorpusEntry("bf16_linear_softmax", lambda x: torch.softmax(_LINEAR_BF16(x), -1),
                lambda g: (_randn(g, 130, 300, dtype=torch.bfloat16),), tol=BF16_TOL),
    CorpusEntry("mlp_backward", lambda x, w: F.gelu(x @ w).sum(-1).mean(),
                lambda g: (_randn(g, 130, 300), _randn(g, 300, 70) * 0.1), backward=True),
    CorpusEntry("sort_topk_median", lambda x: (*torch.sort(x, dim=-1, stable=True), *torch.topk(x, 5, 0),
                                               *torch.median(x, 1)),
                lambda g: (torch.randperm(130 * 300, generator=g).reshape(130, 300).float(),)),
    CorpusEntry("searchsorted_bucketize", lambda s, v: (torch.searchsorted(s, v), torch.bucketize(v, s[0], right=True)),
                lambda g: (torch.sort(_randn(g, 130, 40), -1).values, _randn(g, 130, 300))),
    CorpusEntry("gather_scatter_lines", lambda x, i, s: (torch.gather(x, 1, i), x.scatter_reduce(1, i, s, "amax"),
                                                         x.scatter_add(1, i, s)),
                lambda g: (_randn(g, 130, 300), torch.randint(0, 300, (130, 20), generator=g), _randn(g, 130, 20))),
    CorpusEntry("cumulative", lambda x, i: (*torch.cummax(x, -1), torch.logcumsumexp(x, -1), torch.cumsum(i, -1),
                                            torch.cumprod(x * 0.01 + 1, 0)),
                lambda g: (_randn(g, 130, 700), torch.randint(-1000, 1000, (130, 700), generator=g))),
    CorpusEntry("sdpa_masked", _sdpa_masked,
                lambda g: (_randn(g, 2, 3, 130, 48), _randn(g, 2, 3, 70, 48), _randn(g, 2, 3, 70, 48),
                           _randn(g, 2, 1, 130, 70))),
    CorpusEntry("sdpa_plain", _sdpa_plain,
                lambda g: (_randn(g, 2, 4, 130, 64), _randn(g, 2, 4, 130, 64), _randn(g, 2, 4, 130, 64))),
    CorpusEntry("conv2d_relu_backward", _conv_block, lambda g: (_randn(g, 2, 6, 11, 9),), backward=True),
    CorpusEntry("depthwise_conv1d_group_norm", lambda x: F.silu(_GN(torch.cat([_DWCONV(x)] * 2, 1)[:, :12])),
                lambda g: (_randn(g, 2, 8, 40),)),
    CorpusEntry("pool_resample_backward", _pool_resample, lambda g: (_randn(g, 2, 3, 10, 10),), backward=True),
    CorpusEntry("index_put_mask", _index_put,
                lambda g: (_randn(g, 130, 40), torch.randint(0, 130, (50,), generator=g),
                           torch.randint(0, 40, (50,), generator=g), _randn(g, 50))),
    CorpusEntry("matmul_layer_norm", _matmul_norm, lambda g: (_randn(g, 130, 200), _randn(g, 200, 300) * 0.1,
                                                              _randn(g, 130, 300))),
    CorpusEntry("one_hot_assert", lambda i: F.one_hot(i, 300).float() * 2,
                lambda g: (torch.randint(0, 300, (130,), generator=g),)),
)

BY_NAME = {e.name: e for e in CORPUS}


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def compile_entry(entry: CorpusEntry) -> CorpusResult:
    """Compile ``entry`` with backend="neuron" (no persistent cache), run it, collect kernel sources."""
    torch._dynamo.reset()
    reset()
    g = torch.Generator().manual_seed(0)
    args = entry.inputs(g)
    compiled = torch.compile(entry.fn, backend="neuron", dynamic=False)
    grads: list[tuple[torch.Tensor, torch.Tensor]] = []
    # The simulator enforces the configured target's limits (trn2: matmul N <= 512), not its own default.
    with config.patch(cache=False), use_target(config.target):
        if entry.backward:
            leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
            ref_leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
            got = compiled(*leaves)
            got.backward()
            expected = entry.fn(*ref_leaves)
            expected.backward()
            grads = [(a.grad, b.grad) for a, b in zip(leaves, ref_leaves, strict=True) if a.grad is not None]
        else:
            with torch.no_grad():
                got = compiled(*args)
                expected = entry.fn(*args)
    sources: dict[str, str] = {}
    for graph in compiled_graphs():
        for name, src in graph["sources"]:
            key = name if name not in sources else f"{graph['kind']}:{name}"
            sources[key] = src
    torch._dynamo.reset()
    return CorpusResult(entry, sources, _as_list(got), _as_list(expected), grads)
