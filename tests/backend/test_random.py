"""Random ops draw what eager draws under the same seed; the ones whose draws depend on values are refused.

The runner draws each random buffer with torch's own CPU sampler on the default generator, in graph order
(lowering/ops/random.py). Dropout in training: eager's CPU dropout fills a noise tensor with ``bernoulli_(1 - p)``,
and the compiled graph draws the same noise, so masks, outputs and gradients equal eager's (bit for bit in
float32) wherever the random ops run in eager's order.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from cnn_helpers import unsupported
from torch import nn

from neuron_compile import backend as B


def _both(fn: Callable[..., Any], x: torch.Tensor, seed: int = 7) -> tuple[Any, Any]:
    """(eager, compiled): output and input gradient of ``fn(x)``, each run from ``torch.manual_seed(seed)``."""
    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    runs = []
    for f in (fn, compiled):
        leaf = x.detach().clone().requires_grad_(True)
        torch.manual_seed(seed)
        out = f(leaf)
        (grad,) = torch.autograd.grad(out.float().pow(2).sum(), leaf)
        runs.append((out.detach(), grad))
    return runs[0], runs[1]


def _seeded(fn: Callable[..., Any], *args: Any, seed: int = 5) -> tuple[Any, Any, Callable[..., Any]]:
    """(eager result, compiled result, the compiled function): each call from ``torch.manual_seed(seed)``."""
    compiled = torch.compile(fn, backend="neuron", dynamic=False)
    torch.manual_seed(seed)
    ref = fn(*args)
    torch.manual_seed(seed)
    return ref, compiled(*args), compiled


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("shape", [(6, 40), (2, 3, 5, 7), (1000,)])
def test_dropout_equals_eager_bit_for_bit(p: float, shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape)
    (ref, gref), (out, gout) = _both(lambda t: F.dropout(t, p, training=True), x)
    assert torch.equal(out, ref) and torch.equal(gout, gref)
    assert 0 < int((out == 0).sum()) < out.numel()  # some dropped, some kept: the comparison means something


def test_dropout_bfloat16_drops_eagers_elements() -> None:
    """bf16: the same mask; values within one bf16 rounding (the compiled kernel scales in fp32 in one step)."""
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    (ref, gref), (out, gout) = _both(lambda t: F.dropout(t, 0.3, training=True), x)
    assert torch.equal(out == 0, ref == 0)
    torch.testing.assert_close(out, ref, rtol=2**-7, atol=0)
    torch.testing.assert_close(gout, gref, rtol=2**-6, atol=0)


def test_several_dropouts_and_other_random_ops_keep_eagers_order() -> None:
    def f(t: torch.Tensor) -> torch.Tensor:
        a = F.dropout(t, 0.2, training=True)
        b = torch.rand_like(t)
        c = F.dropout(t * 2, 0.6, training=True)
        return a + b * c + F.dropout2d(t.view(2, 3, 4, 5), 0.5, training=True).view_as(t)

    (ref, gref), (out, gout) = _both(f, torch.randn(6, 20))
    assert torch.equal(out, ref) and torch.equal(gout, gref)


@pytest.mark.parametrize(("p", "shape"), [(0.0, (4, 5)), (1.0, (4, 5)), (0.5, (0, 5))])
def test_dropout_that_draws_nothing_leaves_the_generator_alone(p: float, shape: tuple[int, ...]) -> None:
    """p = 0, p = 1 and an empty input draw nothing in eager; the compiled graph neither, so the next draw agrees."""

    def f(t: torch.Tensor) -> torch.Tensor:
        return F.dropout(t, p, training=True).sum() + torch.rand(3).sum()

    (ref, gref), (out, gout) = _both(f, torch.randn(*shape))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)  # (a sum: rounding order) another draw: ~0.5 off
    torch.testing.assert_close(gout, gref, rtol=1e-6, atol=1e-6)


def test_a_training_step_with_dropout_equals_eager() -> None:
    """A small MLP with nn.Dropout, trained three SGD steps compiled and eagerly from the same seed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 4), nn.Dropout(0.1))
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="neuron", dynamic=False)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    for m, params in ((model, model.parameters()), (compiled, twin.parameters())):
        opt = torch.optim.SGD(params, lr=0.1)
        torch.manual_seed(11)
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(m(x), y).backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert any(b.kind == "random" for g in B.compiled_graphs() for b in g["plan"].buffers)


def test_hugging_face_bert_trains_with_its_dropout_as_eager() -> None:
    """BERT with its default dropout (hidden 0.1, attention 0.1 inside SDPA) and a padded attention mask."""
    transformers = pytest.importorskip("transformers", reason="the Hugging Face model needs transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=128, max_position_embeddings=64)
    assert config.hidden_dropout_prob > 0 and config.attention_probs_dropout_prob > 0
    model = transformers.BertModel(config).train()
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="neuron", dynamic=False)
    ids = torch.randint(0, 128, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    results = []
    for m, params in ((model, model), (compiled, twin)):
        torch.manual_seed(3)
        out = m(input_ids=ids, attention_mask=mask).last_hidden_state
        loss = out.pow(2).mean()
        grads = torch.autograd.grad(loss, list(params.encoder.parameters()))  # (the pooler is not in the loss)
        results.append((out.detach(), grads))
    (ref, gref), (out, gout) = results
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(gref, gout, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)


# -- samplers ---------------------------------------------------------------------------------------------------

SAMPLERS = {
    "geometric_": lambda x: torch.empty_like(x).geometric_(0.3) * x,
    "log_normal_": lambda x: torch.empty_like(x).log_normal_(0.5, 0.25) + x,
    "cauchy_": lambda x: torch.empty_like(x).cauchy_(1.0, 0.5) + x,
    "normal_float_float": lambda x: torch.normal(0.5, 2.0, size=x.shape) + x,
    "normal_tensor_tensor": lambda x: torch.normal(x, x[0].abs() + 0.1),  # broadcast std
    "normal_tensor_float": lambda x: torch.normal(x.t(), 0.5),  # a non-contiguous mean
    "normal_float_tensor": lambda x: torch.normal(0.5, x.abs() + 0.1),
    "randperm": lambda x: x[torch.randperm(x.shape[0])] + torch.randperm(3, dtype=torch.int32).sum(),
    "geometric_bf16": lambda x: torch.empty_like(x, dtype=torch.bfloat16).geometric_(0.7).float() * x,
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_draws_eagers_values(name: str) -> None:
    x = torch.randn(6, 11)
    ref, out, compiled = _seeded(SAMPLERS[name], x)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert not torch.equal(compiled(x), out)  # a fresh draw on every call


def test_normal_with_tensor_mean_and_std_trains() -> None:
    """torch.normal(mean, std) is differentiable in both (reparameterised): the gradients equal eager's."""
    mean, std = torch.randn(4, 5), torch.rand(4, 5) + 0.5
    grads = []
    for f in (torch.normal, torch.compile(torch.normal, backend="neuron", dynamic=False)):
        m, s = mean.clone().requires_grad_(True), std.clone().requires_grad_(True)
        torch.manual_seed(2)
        out = f(m, s)
        grads.append((out.detach(), *torch.autograd.grad(out.pow(2).sum(), (m, s))))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("fn", "op", "why"), [
    (lambda x: torch.poisson(x.abs()), "aten.poisson.default", "each sample's draws depend on its rate"),
    (lambda x: F.rrelu(x, training=True), "aten.rrelu_with_noise_functional.default",
     "training RReLU: eager draws a slope only for each negative element"),
    (lambda x: torch._standard_gamma(x.abs() + 1), "aten._standard_gamma.default",
     "each sample's draws depend on its shape parameter (rejection sampling)"),
    (lambda x: torch.binomial(torch.full_like(x, 5.0), x.sigmoid()), "aten.binomial.default",
     "each sample's draws depend on its count and probability"),
])
def test_value_dependent_samplers_are_refused_by_name(fn: Callable[..., Any], op: str, why: str) -> None:
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="neuron", dynamic=False)(torch.randn(4, 5))
    message = str(unsupported(info.value))
    assert f"- {op}(float32[4, 5]" in message
    assert f"{why}, so the host can't draw them ahead of the kernels as eager would; run this op eagerly" in message


def test_rrelu_outside_training_trains_through_its_mean_slope() -> None:
    """RReLU in eval mode draws nothing (eager's leaky_relu with slope (lower + upper) / 2), gradients included."""
    layer = torch.nn.RReLU(0.1, 0.3).eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    grads = []
    for f in (layer, torch.compile(layer, backend="neuron", dynamic=False)):
        leaf = x.clone().requires_grad_(True)
        out = f(leaf)
        grads.append((out.detach(), torch.autograd.grad(out.pow(2).sum(), leaf)[0]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a)


MULTINOMIAL = {
    "categorical": lambda x: torch.distributions.Categorical(logits=x).sample(),
    "one_sample_with_replacement": lambda x: torch.multinomial(x.softmax(-1), 1, replacement=True),
    "three_without_replacement": lambda x: torch.multinomial(x.softmax(-1), 3),
    "one_row": lambda x: torch.multinomial(x[0].exp(), 4),
    "bf16_one_sample": lambda x: torch.multinomial(x.softmax(-1).bfloat16(), 1),
    "zero_probabilities": lambda x: torch.multinomial(torch.relu(x) + 1e-3 * (torch.arange(7) == 0), 1),
    "five_with_replacement": lambda x: torch.multinomial(x.softmax(-1), 5, replacement=True),
    "with_replacement_zeros": lambda x: torch.multinomial(torch.relu(x) + 1e-3 * (torch.arange(7) == 0), 9, True),
    "with_replacement_one_row": lambda x: torch.multinomial(x[0].exp(), 50, replacement=True),
    "with_replacement_bf16": lambda x: torch.multinomial(x.softmax(-1).bfloat16(), 3, replacement=True),
}


@pytest.mark.parametrize("name", list(MULTINOMIAL))
def test_multinomial_draws_eagers_samples(name: str) -> None:
    """One sample, or samples without replacement: eager's Gumbel-max draw (exponential noise of the
    probabilities' shape), so 2000 rows' samples equal eager's, ties included (bf16 keys tie often)."""
    ref, out, _ = _seeded(MULTINOMIAL[name], torch.randn(2000, 7))
    assert out.dtype == torch.int64 and torch.equal(out, ref)


@pytest.mark.parametrize(("probs", "samples", "message"), [
    (torch.tensor([[0.5, -0.1, 0.2]]), 1, "probability tensor contains either `inf`, `nan` or element < 0"),
    (torch.tensor([[1.0, float("nan"), 1.0]]), 1, "probability tensor contains either `inf`, `nan` or element < 0"),
    (torch.tensor([[1.0, 2.0], [0.0, 0.0]]), 1, "invalid multinomial distribution (sum of probabilities <= 0)"),
    (torch.tensor([[0.5, -0.1, 0.2]]), 3, "invalid multinomial distribution (encountering probability entry < 0)"),
    (torch.tensor([[1.0, float("inf")]]), 3,
     "invalid multinomial distribution (encountering probability entry = infinity or NaN)"),
    (torch.tensor([[1.0, 2.0], [0.0, 0.0]]), 3, "invalid multinomial distribution (sum of probabilities <= 0)"),
])
def test_multinomial_checks_its_probabilities_as_eager(probs: torch.Tensor, samples: int, message: str) -> None:
    """One sample (the Gumbel-max path) and several with replacement (eager's other kernel, other messages)."""
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.multinomial(probs, samples, replacement=True)
    compiled = torch.compile(lambda p: torch.multinomial(p, samples, replacement=True), backend="neuron",
                             dynamic=False)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        compiled(probs)


def test_multinomial_samples_past_the_nonzero_probabilities_raise() -> None:
    """Eager takes the samples past a row's nonzero probabilities from tied zeros in its topk's own order: the
    compiled kernel raises there instead of returning another order."""
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3], [0.0, 0.4, 0.0, 0.0]])
    f = torch.compile(lambda p: torch.multinomial(p, 2), backend="neuron", dynamic=False)
    with pytest.raises(RuntimeError, match=re.escape("torch.multinomial without replacement: a row has fewer than 2 "
                                                     "categories of nonzero probability")):
        f(probs)
    probs[1, 3] = 0.1
    ref, out, _ = _seeded(lambda p: torch.multinomial(p, 2), probs)
    assert torch.equal(out, ref)


def test_multinomial_several_16_bit_samples_are_refused_by_name() -> None:
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: torch.multinomial(x.softmax(-1).half(), 2), backend="neuron", dynamic=False)(
            torch.randn(4, 5))
    assert ("- aten.multinomial.default(float16[4, 5], 2): several samples without replacement from torch.float16 "
            "probabilities: their keys tie often in 16 bits, and eager's topk orders ties its own way") in \
        str(unsupported(info.value))


LAYOUTS = {  # eager fills these in memory order (normal_ of a non-contiguous tensor: by another algorithm too)
    "dropout_transposed": lambda x: F.dropout(x.t() * 2, 0.3),
    "randn_like_transposed": lambda x: torch.randn_like(x.t()) + x.t(),
    "rand_like_transposed": lambda x: torch.rand_like(x.t()) * x.t(),
    "normal__transposed": lambda x: torch.empty_like(x.t()).normal_() + x.t(),
    "bernoulli__transposed": lambda x: torch.empty_like(x.t()).bernoulli_(0.4) + x.t(),
    "functional_bernoulli_transposed": lambda x: torch.bernoulli(x.t(), 0.3),  # a contiguous result
    "tensor_bernoulli_transposed": lambda x: x.t().bernoulli(0.3),
    "randint_like_transposed": lambda x: torch.randint_like(x.t(), 0, 9) + x.t(),
    "exponential__transposed": lambda x: torch.empty_like(x.t()).exponential_() * x.t(),
    "randn_like_channels_last": lambda x: torch.randn_like(x.view(1, 6, 5, 1).to(memory_format=torch.channels_last)),
    "dropout_channels_last": lambda x: F.dropout(x.view(1, 6, 5, 1).to(memory_format=torch.channels_last) * 2, 0.3),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_draws_follow_the_layout_eager_fills(name: str) -> None:
    ref, out, _ = _seeded(LAYOUTS[name], torch.randn(6, 5))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_transformer_encoder_layer_trains_with_dropout_as_eager() -> None:
    """nn.TransformerEncoderLayer in training: attention dropout inside SDPA, and dropout1 on the attention output,
    which batch_first MultiheadAttention returns transposed (eager draws its noise in that layout)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True).train()
    twin = copy.deepcopy(layer)
    compiled = torch.compile(twin, backend="neuron", dynamic=False)
    x = torch.randn(2, 6, 32)
    results = []
    for m, params in ((layer, layer), (compiled, twin)):
        torch.manual_seed(3)
        out = m(x)
        results.append((out.detach(), torch.autograd.grad(out.pow(2).mean(), list(params.parameters()))))
    (ref, gref), (out, gout) = results
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(gref, gout, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
