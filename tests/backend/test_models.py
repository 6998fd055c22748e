"""Whole-model tests against eager: MLP, a transformer block, a tiny GPT (forward, backward, optimizer step)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from neuron_compile import backend as B

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from models import GPT, MLP, Block, GPTConfig, ManualCausalSelfAttention  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    B.reset()


def _train_step_matches(model: torch.nn.Module, make_loss, steps: int = 2, atol: float = 1e-5, rtol: float = 1e-4):
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for _ in range(steps):
        loss = make_loss(compiled)
        ref_loss = make_loss(ref)
        torch.testing.assert_close(loss, ref_loss, atol=atol, rtol=rtol)
        loss.backward()
        ref_loss.backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=rtol)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    kinds = {g["kind"] for g in B.compiled_graphs()}
    assert kinds == {"forward", "backward"}


def test_mlp_forward_backward_step():
    torch.manual_seed(0)
    x, y = torch.randn(33, 96), torch.randn(33, 10)
    _train_step_matches(MLP(96, 200, 10), lambda m: torch.nn.functional.mse_loss(m(x), y))


@pytest.mark.parametrize("attention", [ManualCausalSelfAttention, None], ids=["manual", "sdpa"])
def test_transformer_block_forward_backward(attention):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=50, seq=24, d_model=48, n_heads=3, n_layers=1)
    block = Block(cfg, attention) if attention else Block(cfg)
    x = torch.randn(2, 24, 48)
    _train_step_matches(block, lambda m: m(x).pow(2).mean(), steps=1)


def test_tiny_gpt_training_step_matches_eager():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=96, seq=20, d_model=32, n_heads=2, n_layers=2)
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    target = torch.randint(0, cfg.vocab, (2, cfg.seq))

    def loss(m):
        return torch.nn.functional.cross_entropy(m(idx).flatten(0, 1), target.flatten())

    _train_step_matches(GPT(cfg), loss, steps=2)


def test_gpt_bf16_inference():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=96, seq=20, d_model=32, n_heads=2, n_layers=2)
    model = GPT(cfg).to(torch.bfloat16).eval()
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    with torch.no_grad():
        got = torch.compile(model, backend="neuron", dynamic=False)(idx)
        want = model(idx)
    assert got.dtype == torch.bfloat16
    # fused kernels keep fp32 intermediates where eager rounds each op to bf16: compare at bf16 tolerance
    torch.testing.assert_close(got.float(), want.float(), atol=6e-2, rtol=5e-2)


def _optimizer_steps_match(make_opt, clip: float | None = None, steps: int = 3) -> None:
    """zero_grad, forward, backward (optionally ``clip_grad_norm_``) and ``opt.step()`` in one compiled function, as
    users wrap a training step, against the same step eagerly: losses each step and the parameters after the last
    within a few fp32 ulps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    ref = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters()), make_opt(ref.parameters())

    def step(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        o.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        o.step()
        return loss

    compiled = torch.compile(step, backend="neuron", dynamic=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        torch.testing.assert_close(compiled(model, opt, x, y), step(ref, ref_opt, x, y), atol=1e-5, rtol=1e-5)
    for p, r in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, r, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("opt_cls", "kwargs"), [
    (torch.optim.AdamW, {"weight_decay": 0.1}),
    (torch.optim.AdamW, {"amsgrad": True}),
    (torch.optim.Adam, {"maximize": True}),
    (torch.optim.NAdam, {}),
    (torch.optim.RAdam, {}),
    (torch.optim.Adamax, {}),
    (torch.optim.Adagrad, {}),
    (torch.optim.RMSprop, {"momentum": 0.9}),
    (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
], ids=["adamw", "adamw_amsgrad", "adam_maximize", "nadam", "radam", "adamax", "adagrad", "rmsprop", "sgd_nesterov"])
def test_whole_training_step_with_the_optimizer_compiles_and_matches_eager(opt_cls, kwargs) -> None:
    """The optimizers' update rules reach the backend as prims.fma (addcmul / addcdiv / lerp), which lowers as a
    multiply and an add."""
    _optimizer_steps_match(lambda params: opt_cls(params, lr=1e-2, **kwargs))


@pytest.mark.parametrize(("opt_cls", "kwargs"), [
    (torch.optim.AdamW, {}), (torch.optim.Adam, {"amsgrad": True}), (torch.optim.NAdam, {}),
    (torch.optim.SGD, {"momentum": 0.9}),
], ids=["adamw", "adam_amsgrad", "nadam", "sgd_momentum"])
def test_foreach_optimizer_step_with_grad_clipping_matches_eager(opt_cls, kwargs) -> None:
    """``foreach=True`` optimizers and ``clip_grad_norm_`` inside the compiled step: their ``_foreach_*`` ops
    (``_foreach_norm``, ``_foreach_mul`` by a 0-d tensor, ``_foreach_pow`` of a number, ...) lower per tensor."""
    _optimizer_steps_match(lambda params: opt_cls(params, lr=1e-2, foreach=True, **kwargs), clip=0.5)
