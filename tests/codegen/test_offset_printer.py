"""Offsets in kernel text come from sympy (``index_algebra.offset_text``) with the exact text of before.

``_reference_offset`` is the string builder ``codegen/render.py::_offset`` used before the index
algebra: constant first, terms in the order given, ``var * stride``, ``var`` for stride 1, stride-0
terms dropped, ``"0"`` when nothing is left. The printer must produce the same bytes on every input
the renderers can give it (distinct loop-variable names); the corpus render hashes
(``test_render_corpus.py``) check the same end to end.
"""

from __future__ import annotations

import logging
import random

import pytest
import sympy
from neuron_compile.codegen.render import _offset
from neuron_compile.lowering import index_algebra as ia

log = logging.getLogger(__name__)

NAMES = ("b", "h", "hg", "q0", "kc", "k0", "m0", "p0", "f0", "r0", "r1", "o0", "o1", "o2", "t")


def _reference_offset(base: int, terms: list[tuple[str, int]]) -> str:
    parts = [str(base)] if base else []
    parts += [f"{var} * {s}" if s != 1 else var for var, s in terms if s]
    return " + ".join(parts) or "0"


def _random_terms(rng: random.Random) -> tuple[int, list[tuple[str, int]]]:
    base = rng.choice((0, 0, 1, 7, 128, 300, 4096 * 4096, -5, 2**31 - 1))
    names = rng.sample(NAMES, rng.randint(0, 6))
    strides = (0, 0, 1, 1, 2, 3, 64, 128, 300, 16384, 1 << 40, -1, -128)
    return base, [(n, rng.choice(strides)) for n in names]


@pytest.mark.parametrize("seed", range(4))
def test_offset_text_is_byte_identical_to_the_string_builder(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        base, terms = _random_terms(rng)
        expected = _reference_offset(base, terms)
        assert ia.offset_text(base, tuple(terms)) == expected, (base, terms)
        assert _offset(base, terms) == expected, (base, terms)


@pytest.mark.parametrize(("base", "terms", "text"), [
    (128, [("p0", 300), ("f0", 1)], "128 + p0 * 300 + f0"),
    (0, [], "0"),
    (0, [("p0", 0), ("f0", 0)], "0"),
    (5, [("f0", 0)], "5"),
    (0, [("f0", 1), ("p0", 2)], "f0 + p0 * 2"),  # order as given, not sympy's
    (-3, [("o0", -4)], "-3 + o0 * -4"),
])
def test_offset_text_examples(base: int, terms: list[tuple[str, int]], text: str) -> None:
    assert _offset(base, terms) == text


def test_offset_text_prints_the_sympy_expression() -> None:
    expr = ia.offset_expr(128, (("p0", 300), ("f0", 1)))
    assert expr == 128 + 300 * sympy.Symbol("p0", integer=True) + sympy.Symbol("f0", integer=True)
    assert ia.print_offset(expr, ["p0", "f0"]) == "128 + p0 * 300 + f0"
    # A repeated variable is one term of the expression (the renderers never repeat one).
    assert ia.offset_text(0, (("p0", 2), ("f0", 1), ("p0", 3))) == "p0 * 5 + f0"
