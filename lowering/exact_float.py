"""Correctly rounded float32 arithmetic as plain tensor math, for decompositions whose results hang on eager's
exact roundings (which bin an element falls in, which samples a box has).

A NeuronCore divides by multiplying with a reciprocal, an ulp or two off IEEE division, and has no fused
multiply-add to expose a product's rounding error. These helpers recover both from ordinary float32 operations:
Veltkamp's split cuts a value into two 12-bit halves whose products are exact, so Dekker's product gives ``a * b``
as a rounded product plus its exact error, and a quotient is corrected once by its exact residual. (The
kernel-level counterparts, on tiles, are in :mod:`neuron_compile.lowering.mathlib`.)
"""

from __future__ import annotations

import torch

Operand = torch.Tensor | int | float


def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Veltkamp's split of float32 ``x`` into ``hi + lo``, each of at most 12 significant bits."""
    c = x * 4097.0
    hi = c - (c - x)
    return hi, x - hi


def _split_operand(b: Operand, like: torch.Tensor) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    if isinstance(b, torch.Tensor):
        return split(b)
    if float(b).is_integer() and abs(b) < 4096:  # a small whole number already holds at most 12 bits
        return float(b), 0.0
    return split(torch.full((), float(b), dtype=like.dtype))


def two_product(a: torch.Tensor, b: Operand) -> tuple[torch.Tensor, torch.Tensor]:
    """``a * b`` as the rounded product ``p`` and its rounding error ``e``: ``a * b == p + e`` exactly (Dekker)."""
    p = a * b
    ah, al = split(a)
    bh, bl = _split_operand(b, a)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a + b`` as the rounded sum ``s`` and its rounding error ``e``: ``a + b == s + e`` exactly (Knuth)."""
    s = a + b
    v = s - a
    return s, (a - (s - v)) + (b - v)


def ieee_divide(a: torch.Tensor, b: Operand) -> torch.Tensor:
    """``a / b`` rounded as IEEE division rounds it (barring overflow in the split): the reciprocal's quotient
    corrected once by its exact residual ``a - q * b``. ``ceil(56 / 28)`` is 2; 56 times the reciprocal of 28
    is a hair above 2, whose ceil is 3."""
    q = a / b
    p, err = two_product(q, b)
    return q + ((a - p) - err) / b
