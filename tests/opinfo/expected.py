"""Ops of PyTorch's OpInfo database that the neuron backend refuses, and why (``test_opinfo.py``).

The iterative linear-algebra decompositions (eigen- and singular vectors, general eigenvalues, LDL, lstsq, and what
is built on them) are refused as a family (``OUT_OF_SCOPE``, ``harness.ITERATIVE_LINALG``; those that do lower must
match eager); the direct methods (LU, solves, inverses, determinants, Cholesky) compile as unrolled eliminations
(lowering/decomp_linalg.py) and must match eager. Complex values
compile as real pairs (lowering/complex_pairs.py) and FFTs as dense DFT products (lowering/complex_fft.py), so
their ops must match eager like any other. Each other entry names one op (``name`` or ``name.variant``) and the
reason it is refused.
"""

from __future__ import annotations

OUT_OF_SCOPE = "iterative linear-algebra decompositions are refused by name (SVD, eig, QR, LDL)"


EXPECTED_REFUSED: dict[str, str] = {}  # none outside the family above, at present


def out_of_scope(name: str) -> bool:
    from harness import excluded

    return excluded(name) is not None


def expected_refusal(name: str, full: str) -> str | None:
    """Why ``full`` (``name`` or ``name.variant``) is refused, or None when it must match eager."""
    return EXPECTED_REFUSED.get(full) or EXPECTED_REFUSED.get(name)
