"""Golden NKI files: the exact current render of a few representative kernels.

Each golden file ``golden/<entry>.<kernel>.nki.py`` holds the source rendered for one kernel of a
corpus entry (``corpus.py``). A template or lowering change that alters the text fails here with a
diff; when the change is intended, regenerate with ``pytest tests/codegen --update-golden`` (or
``NEURON_COMPILE_UPDATE_GOLDEN=1 pytest tests/codegen/test_golden.py``) and review the diff in git.
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

import pytest

log = logging.getLogger(__name__)

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
REGENERATE = ("pytest tests/codegen --update-golden  (or NEURON_COMPILE_UPDATE_GOLDEN=1 pytest "
              "tests/codegen/test_golden.py)")

# (corpus entry, kernel name): what each golden file pins down.
GOLDEN = [
    ("bf16_chain", "k0_mul_add_gelu"),  # fused elementwise chain: bf16 loads, broadcast operand, GELU
    ("softmax", "k0_amax_sub_exp"),  # a row reduction kernel: max, exp, sum, normalize in one kernel
    ("layer_norm", "k0_mean_sub_mul"),  # LayerNorm: mean/var phases and the affine epilogue in one kernel
    ("linear_gelu", "k0_mm_add_gelu"),  # Linear + bias + GELU, M=130 K=300 N=700 (ragged tiles)
    ("embedding", "k1_embedding"),  # indirect-DMA row gather (k0 checks the indices are in range)
]


def golden_path(entry: str, kernel: str) -> Path:
    return GOLDEN_DIR / f"{entry}.{kernel}.nki.py"


@pytest.mark.parametrize(("entry", "kernel"), GOLDEN, ids=[e for e, _ in GOLDEN])
def test_render_matches_golden(entry: str, kernel: str, corpus_results, update_golden: bool) -> None:
    sources = corpus_results.get(entry).sources
    assert kernel in sources, f"{entry}: kernel {kernel} not rendered (got {sorted(sources)}); " \
        f"if the kernel was renamed on purpose, update GOLDEN in {Path(__file__).name} and run {REGENERATE}"
    source = sources[kernel]
    path = golden_path(entry, kernel)
    if update_golden:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(source)
        log.warning("regenerated %s", path)
    assert path.is_file(), f"golden file {path} is missing; create it with: {REGENERATE}"
    expected = path.read_text()
    if source != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), source.splitlines(True),
                                            f"golden/{path.name}", "current render", n=2))
        pytest.fail(f"rendered kernel {kernel} of {entry} differs from golden/{path.name}:\n{diff[:4000]}\n"
                    f"If the change is intended, regenerate with: {REGENERATE}", pytrace=False)


def test_golden_dir_has_no_stale_files() -> None:
    expected = {golden_path(e, k).name for e, k in GOLDEN}
    present = {p.name for p in GOLDEN_DIR.glob("*.nki.py")}
    assert present <= expected, f"stale golden files (not in GOLDEN): {sorted(present - expected)}"
