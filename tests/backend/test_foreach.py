"""``torch._foreach_*`` ops (clip_grad_norm_, foreach optimizers) lower as one per-tensor op per list element
(lowering/decompositions.py ``_foreach_table``) and match eager element for element."""

from __future__ import annotations

import pytest
import torch

_G = torch.Generator().manual_seed(0)
A, B, C = ([torch.rand(3, 4, generator=_G) + 0.5, torch.rand(5, generator=_G) + 0.5] for _ in range(3))

CASES = {
    "exp": lambda: torch._foreach_exp(A),
    "sqrt": lambda: torch._foreach_sqrt(A),
    "sigmoid": lambda: torch._foreach_sigmoid(A),
    "sign": lambda: torch._foreach_sign(A),
    "add_scalar": lambda: torch._foreach_add(A, 2.0),
    "add_list_alpha": lambda: torch._foreach_add(A, B, alpha=-0.5),
    "add_scalarlist": lambda: torch._foreach_add(A, [1.0, 2.0]),
    "mul_0d_tensor": lambda: torch._foreach_mul(A, torch.tensor(1.7)),
    "div_list": lambda: torch._foreach_div(A, B),
    "maximum_scalar": lambda: torch._foreach_maximum(A, 0.9),
    "minimum_list": lambda: torch._foreach_minimum(A, B),
    "clamp_max_list": lambda: torch._foreach_clamp_max(A, B),
    "addcmul_value": lambda: torch._foreach_addcmul(A, B, C, value=0.3),
    "addcdiv_scalarlist": lambda: torch._foreach_addcdiv(A, B, C, [0.1, 0.2]),
    "lerp_list": lambda: torch._foreach_lerp(A, B, C),
    "norm_2": lambda: torch._foreach_norm(A),
    "norm_inf": lambda: torch._foreach_norm(A, float("inf")),
    "max": lambda: torch._foreach_max(A),
    "pow_list": lambda: torch._foreach_pow(A, B),
    "pow_scalar_base": lambda: torch._foreach_pow(0.9, A),
}


@pytest.mark.parametrize("name", list(CASES))
def test_foreach_op_matches_eager(name: str) -> None:
    fn = CASES[name]
    got = torch.compile(fn, backend="neuron", dynamic=False)()
    want = fn()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
