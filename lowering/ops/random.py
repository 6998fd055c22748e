"""Random ops: buffers the runner fills with torch's own CPU generator, in graph order, at every call.

Design: NeuronCore RNG instructions (``nisa.rng``/``rand2``/``dropout``) follow neither torch's generator
nor its seeding, so each random op of a graph becomes a plan-level 'random' buffer described by a
:class:`~neuron_compile.lowering.ir.RandomSpec` (the torch sampler and its parameters). Before the
kernels run, the runner draws every buffer with that sampler on the CPU default generator, in the
graph's order: results are deterministic under ``torch.manual_seed``, have exactly torch's
distribution, and equal eager's draws when nothing else consumes the generator in between. The
kernels read the buffers like inputs (dropout's noise scaling and multiply fuse as usual; dropout itself draws
eager's noise, see decomp_nn.native_dropout).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from neuron_compile.lowering.dtypes import storage_dtype
from neuron_compile.lowering.ir import BufferRef, RandomSpec
from neuron_compile.lowering.partition import node_shape
from neuron_compile.lowering.registry import register_declined, register_lowering
from neuron_compile.lowering.views import View, contiguous_strides, dense
from torch import fx

aten = torch.ops.aten

# op -> (sampler, positions of its float parameters in node.args, their defaults)
_SAMPLERS: dict[Any, tuple[str, tuple[int, ...], tuple[float, ...]]] = {
    aten.rand.default: ("uniform", (), (0.0, 1.0)),
    aten.rand_like.default: ("uniform", (), (0.0, 1.0)),
    aten.randn.default: ("normal", (), (0.0, 1.0)),
    aten.randn_like.default: ("normal", (), (0.0, 1.0)),
    aten.normal_functional.default: ("normal", (1, 2), (0.0, 1.0)),
    aten.uniform.default: ("uniform", (1, 2), (0.0, 1.0)),
    aten.bernoulli.p: ("bernoulli", (1,), (0.5,)),
    aten.exponential.default: ("exponential", (1,), (1.0,)),
    aten.geometric.default: ("geometric", (1,), (0.5,)),
    aten.log_normal.default: ("log_normal", (1, 2), (1.0, 2.0)),
    aten.cauchy.default: ("cauchy", (1, 2), (0.0, 1.0)),
    aten.normal.float_float: ("normal", (0, 1), (0.0, 1.0)),
    aten.randperm.default: ("randperm", (0,), (0.0,)),
    aten.randint.low: ("randint", (0, 1), (0.0, 0.0)),
    aten.randint.default: ("randint", (0,), (0.0,)),
    aten.randint_like.default: ("randint", (1,), (0.0,)),
    aten.randint_like.low_dtype: ("randint", (1, 2), (0.0, 0.0)),
}


def _check(node: fx.Node) -> str | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and storage_dtype(val.dtype) is None:
        return f"{node.target} of dtype {val.dtype} is not supported"
    if node.target in (aten.randint.low, aten.randint.default, aten.randint_like.default, aten.randint_like.low_dtype):
        lims = [a for a in node.args if isinstance(a, int) and not isinstance(a, bool)]
        if any(abs(v) > 2**31 - 1 for v in lims):
            return f"{node.target} with bounds beyond int32 is not supported (NeuronCores hold int32)"
    for k in ("generator",):
        if node.kwargs.get(k) is not None:
            return f"{node.target} with an explicit generator= is not supported; seed the default generator"
    return None


def _params(node: fx.Node) -> tuple[float, ...]:
    sampler, positions, defaults = _SAMPLERS[node.target]
    if sampler == "randint":
        ints = [a for a in node.args if isinstance(a, int) and not isinstance(a, bool)]
        if node.target == aten.randint.default:
            return (0.0, float(ints[0]))
        if node.target == aten.randint_like.default:
            return (0.0, float(node.args[1]))
        return (float(ints[0]), float(ints[1]))
    if sampler == "randperm":
        return (float(node.args[0]),)
    names = {aten.normal_functional.default: ("mean", "std"), aten.uniform.default: ("from", "to"),
             aten.bernoulli.p: ("p",), aten.exponential.default: ("lambd",), aten.geometric.default: ("p",),
             aten.log_normal.default: ("mean", "std"), aten.cauchy.default: ("median", "sigma"),
             aten.normal.float_float: ("mean", "std")}.get(node.target, ())
    out = list(defaults)
    for i, pos in enumerate(positions):
        if pos < len(node.args):
            out[i] = float(node.args[pos])
        elif i < len(names) and names[i] in node.kwargs:
            out[i] = float(node.kwargs[names[i]])
    return tuple(out)


@register_lowering(*_SAMPLERS, family="random", kind="copy", check=_check)
def lower_random(gl: Any, node: fx.Node) -> None:
    """rand/randn/randint(_like), randperm, normal_, uniform_, bernoulli_(p), exponential_, geometric_,
    log_normal_, cauchy_: torch's CPU sampler, drawn by the runner into a plan-level buffer at every call
    (deterministic under torch.manual_seed, and eager's own draws)."""
    val = node.meta["val"]
    shape = node_shape(node)
    numel = max(math.prod(shape), 1)
    # The layout eager fills, whose memory order is the draw order (and picks normal_'s algorithm): the tensor an
    # in-place sampler writes (functionalized: its first argument) or a *_like factory's empty_like; a factory's and
    # the functional torch.bernoulli(x, p)'s results are contiguous (as their values here are).
    filled = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], fx.Node) \
        and not _functional_bernoulli(node) else None
    layout = filled if isinstance(filled, torch.Tensor) and filled.shape == val.shape else val
    strides = tuple(int(st) for st in layout.stride())
    if not dense(shape, strides):
        strides = contiguous_strides(shape)
    sampler = _SAMPLERS[node.target][0]
    spec = RandomSpec(sampler, _params(node), numel, str(val.dtype).replace("torch.", ""), tuple(shape),
                      strides if strides != contiguous_strides(shape) else ())
    gl.randoms.append(spec)
    buf = gl._buffer(BufferRef("random", len(gl.randoms) - 1, 0, numel, storage_dtype(val.dtype) or "float32"))
    gl.views[node] = View(buf, shape, strides, 0, val.dtype)


def _functional_bernoulli(node: fx.Node) -> bool:
    """``torch.bernoulli(x, p)`` / ``x.bernoulli(p)`` (a new contiguous tensor), not ``t.bernoulli_(p)`` (filling
    ``t`` in its layout): the same functional op here, told apart by the call Dynamo recorded."""
    stack = node.meta.get("source_fn_stack") or []
    return node.target is aten.bernoulli.p and bool(stack) and stack[-1][1] in (torch.bernoulli, "bernoulli")


def draw(spec: RandomSpec) -> torch.Tensor:
    """One random buffer (flat, storage order), drawn as eager draws it: into a tensor of the layout eager fills
    (``spec.strides``), since the draw order, and for ``normal_`` the algorithm, follow the memory layout."""
    dtype = getattr(torch, spec.torch_dtype)
    if spec.sampler == "randperm":
        return torch.randperm(int(spec.params[0]), dtype=dtype)
    if spec.strides:
        out = torch.empty_strided(spec.shape, spec.strides, dtype=dtype)
        return _fill(out, spec).as_strided((spec.numel,), (1,))
    return _fill(torch.empty(spec.numel, dtype=dtype), spec)


def _fill(out: torch.Tensor, spec: RandomSpec) -> torch.Tensor:
    """``out`` filled in place by the sampler (torch.randint is ``random_(low, high)`` of a new tensor too)."""
    if spec.sampler == "randint":
        return out.random_(int(spec.params[0]), int(spec.params[1]))
    if spec.sampler == "uniform":
        return out.uniform_(*spec.params)
    if spec.sampler == "normal":
        return out.normal_(*spec.params)
    if spec.sampler == "bernoulli":
        return out.bernoulli_(spec.params[0])
    if spec.sampler == "exponential":
        return out.exponential_(spec.params[0])
    if spec.sampler == "geometric":
        return out.geometric_(spec.params[0])
    if spec.sampler == "log_normal":
        return out.log_normal_(*spec.params)
    if spec.sampler == "cauchy":
        return out.cauchy_(*spec.params)
    raise ValueError(f"unknown sampler {spec.sampler!r}")


# -- samplers whose draws depend on the values -----------------------------------------------------------------

_HALF = (torch.bfloat16, torch.float16)
_VALUE_DEPENDENT = {
    aten.poisson.default: "each sample's draws depend on its rate",
    aten.binomial.default: "each sample's draws depend on its count and probability",
    aten._standard_gamma.default: "each sample's draws depend on its shape parameter (rejection sampling)",
    aten._sample_dirichlet.default: "each sample's draws depend on its concentration (rejection sampling)",
    aten.rrelu_with_noise_functional.default: "training RReLU: eager draws a slope only for each negative element",
}


def _value_dependent(node: fx.Node) -> str:
    return (f"{_VALUE_DEPENDENT[node.target]}, so the host can't draw them ahead of the kernels as eager would; "
            "run this op eagerly (outside the compiled region)")


def _multinomial_declined(node: fx.Node) -> str:
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dtype in _HALF and val.dim() in (1, 2) and val.numel():
        return (f"several samples without replacement from {val.dtype} probabilities: their keys tie often in 16 "
                "bits, and eager's topk orders ties its own way; draw them from float32 probabilities (or run this "
                "op eagerly)")
    return ("compiled for non-empty 1-D or 2-D floating-point probabilities and at least one sample (eager rejects "
            "the rest); run this op eagerly to see eager's error")


register_declined(_value_dependent, *_VALUE_DEPENDENT)
register_declined(_multinomial_declined, aten.multinomial.default)


# -- decompositions into the samplers above (AOTAutograd's table: lowering.decompositions) -----------------------


def _normal_tensor_tensor(mean: torch.Tensor, std: torch.Tensor, *, generator: Any = None) -> torch.Tensor:
    """torch.normal(mean, std) as eager's CPU kernel computes it: standard normal noise, times std, plus mean."""
    shape = torch.broadcast_shapes(mean.shape, std.shape)
    return aten.normal_functional(mean.new_empty(shape), 0.0, 1.0) * std + mean


def _normal_tensor_float(mean: torch.Tensor, std: float = 1.0, *, generator: Any = None) -> torch.Tensor:
    """torch.normal(mean, std=float): noise drawn with that std, plus mean (eager's order)."""
    return aten.normal_functional(mean.new_empty(mean.shape), 0.0, std) + mean


def _normal_float_tensor(mean: float, std: torch.Tensor, *, generator: Any = None) -> torch.Tensor:
    """torch.normal(mean=float, std): standard normal noise, times std, plus mean (eager's order)."""
    return aten.normal_functional(std.new_empty(std.shape), 0.0, 1.0) * std + mean


def _multinomial(probs: torch.Tensor, num_samples: int, replacement: bool = False, *, generator: Any = None) -> Any:
    """torch.multinomial as eager's CPU kernel draws it, after its checks of the probabilities (on the device).

    One sample, or samples without replacement (Categorical's ``sample()``): ``argmax`` / ``topk`` of
    ``probs / q`` with ``q`` an ``exponential_(1)`` of ``probs``' shape and dtype (the Gumbel-max trick). Several
    samples with replacement: one float64 uniform per sample, row by row, placed in the row's normalised
    cumulative distribution (:func:`_with_replacement`). Declined (refused by name): several samples without
    replacement from 16-bit probabilities, whose keys tie often (eager's topk orders ties its own way)."""
    if probs.dim() not in (1, 2) or not probs.is_floating_point() or probs.numel() == 0 or num_samples <= 0:
        return NotImplemented  # eager's own errors: run it eagerly
    if replacement and num_samples > 1:
        return _with_replacement(probs, num_samples)
    if num_samples > 1 and probs.dtype in _HALF:
        return NotImplemented  # ties (refused by name)
    if num_samples > probs.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    finite = probs.abs() < float("inf")  # False for inf and NaN
    aten._assert_async.msg((finite & (probs >= 0)).all(), "probability tensor contains either `inf`, `nan` or "
                           "element < 0")
    aten._assert_async.msg((probs.sum(-1) != 0).all(), "invalid multinomial distribution (sum of probabilities <= 0)")
    if num_samples > 1:  # past the nonzero ones, eager's topk picks among tied zeros in its own order
        aten._assert_async.msg(((probs > 0).sum(-1) >= num_samples).all(), "torch.multinomial without replacement: "
                               f"a row has fewer than {num_samples} categories of nonzero probability, and eager fills "
                               "the rest with zero-probability categories in an order the compiled kernel can't "
                               "reproduce; draw fewer samples, or run this op eagerly")
    noise = aten.exponential(probs, 1.0)
    if probs.dtype in _HALF:  # eager rounds the quotients to that dtype, and argmax takes the first of a tie
        q = (probs.float() / noise.float()).to(probs.dtype).float()
    else:
        q = probs / noise
    if num_samples == 1:
        return q.argmax(-1, keepdim=True)
    return q.topk(num_samples).indices


def _with_replacement(probs: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Eager's kernel: per row, the running sum of the probabilities (float for 16-bit ones) divided by the total,
    the last entry taken as 1; per sample, a ``uniform_real_distribution<double>`` draw (what a float64
    ``uniform_`` draws, in the same order), and the sample is the first entry not below it."""
    rows = probs if probs.dim() == 2 else probs.unsqueeze(0)
    if rows.dtype in _HALF:
        rows = rows.float()
    aten._assert_async.msg(~((rows < 0) | (rows != rows)).any(),
                           "invalid multinomial distribution (encountering probability entry < 0)")
    aten._assert_async.msg(~(rows.abs() == float("inf")).any(),
                           "invalid multinomial distribution (encountering probability entry = infinity or NaN)")
    running = torch.cumsum(rows, -1)
    total = running[:, -1:]
    aten._assert_async.msg((total > 0).all(), "invalid multinomial distribution (sum of probabilities <= 0)")
    cdf = (running / total)[:, :-1]
    u = aten.uniform(torch.empty((rows.shape[0], num_samples), dtype=torch.float64), 0.0, 1.0)
    picks = (cdf.unsqueeze(1) < u.unsqueeze(-1)).sum(-1)
    return picks if probs.dim() == 2 else picks.squeeze(0)


def _rrelu_with_noise(x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125, upper: float = 1 / 3,
                      training: bool = False, generator: Any = None) -> Any:
    """RReLU outside training draws nothing: eager's leaky_relu with the mean slope, noise returned as it came."""
    if training:
        return NotImplemented  # declined above: eager's draws depend on the values
    return aten.leaky_relu(x, (lower + upper) / 2), noise.clone()


RANDOM_DECOMPOSITIONS = {
    aten.rrelu_with_noise_functional.default: _rrelu_with_noise,
    aten.normal.Tensor_Tensor: _normal_tensor_tensor,
    aten.normal.Tensor_float: _normal_tensor_float,
    aten.normal.float_Tensor: _normal_float_tensor,
    aten.multinomial.default: _multinomial,
}
