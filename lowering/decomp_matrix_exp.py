"""``torch.linalg.matrix_exp`` by scaling and squaring, as eager's ``mexp`` scales.

The 1-norm (largest column sum) picks ``s = max(0, ceil(log2(norm / theta)))`` with eager's threshold for a
degree-18 approximation (Al-Mohy & Higham's theta_18); ``A / 2^s`` (exact: a power of two) goes through the degree-18
Taylor polynomial in Horner form (18 matmuls), and the result is squared ``s`` times. ``s`` is data: the squarings
are unrolled to :data:`MAX_SQUARINGS` (enough for any finite float32 norm) and each one applies only where
``k < s``. Eager evaluates lower degrees for small norms; the values agree to rounding. Its backward (a
``matrix_exp`` of a 2n x 2n block matrix) compiles the same way.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from neuron_compile.lowering.decomp_linalg import _fits, linalg_problem
from neuron_compile.lowering.registry import register_declined

aten = torch.ops.aten
THETA_18 = {torch.float32: 3.010066362817634e00, torch.float64: 1.090863719290036e00}  # eager's mexp thresholds
# (a complex matrix takes its real type's: the norm is real)
DEGREE = 18
MAX_SQUARINGS = 130  # log2(float32 max / theta) < 128


def matrix_exp(a: torch.Tensor) -> Any:
    if not _fits(a) or a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        return NotImplemented
    n = a.shape[-1]
    if n == 0:
        return a.clone()
    norm = a.abs().sum(-2).amax(-1, keepdim=True).unsqueeze(-1)  # [..., 1, 1]
    real = norm.dtype
    s = torch.ceil(torch.log2(norm / THETA_18[real])).clamp(min=0)
    scaled = a * torch.exp2(-s)
    eye = torch.eye(n, dtype=a.dtype)
    x = eye + scaled / DEGREE
    for k in range(DEGREE - 1, 0, -1):  # I + A/1 (I + A/2 (... (I + A/18)))
        x = eye + (scaled @ x) * (1.0 / k)
    squarings = min(MAX_SQUARINGS, math.ceil(math.log2(torch.finfo(real).max / THETA_18[real])) + 1)
    for k in range(squarings):
        x = torch.where(k < s, x @ x, x)
    return x


MATRIX_EXP: dict[Any, Any] = {aten.linalg_matrix_exp.default: matrix_exp}
register_declined(linalg_problem, *MATRIX_EXP)
