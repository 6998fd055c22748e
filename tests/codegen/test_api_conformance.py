"""Every kernel the code generator renders for the corpus uses only current NKI 0.6 API and fits the hardware.

For each corpus entry (``corpus.py``): every rendered kernel parses, passes
``neuron_compile.nki_api.checker.check_source_against_api`` (names and keywords of NKI 0.6, not removed, not deprecated)
and ``static_checks.check_kernel_rules`` (outputs in ``nl.shared_hbm``, ``dst=`` on ``nisa`` calls,
partition dim <= 128, PSUM bank, matmul K/M <= 128 and N <= 512); the compiled results (and gradients)
match eager PyTorch. The corpus runs under the configured target's simulator limits, so the same tile
rules are also enforced dynamically; negative tests prove both the static checks and the simulator
reject kernels that break them.
"""

from __future__ import annotations

import ast
import logging
import re

import numpy as np
import pytest
import torch
from corpus import CORPUS
from static_checks import check_kernel_rules

from neuron_compile import simulator
from neuron_compile.errors import SimulatorConstraintError
from neuron_compile.nki_api.checker import check_source_against_api
from neuron_compile.simulator.targets import use_target

log = logging.getLogger(__name__)

NAMES = [e.name for e in CORPUS]


@pytest.mark.parametrize("name", NAMES)
def test_kernels_parse_and_use_current_api(name: str, corpus_results) -> None:
    result = corpus_results.get(name)
    assert result.sources, f"{name}: no kernels were rendered"
    problems = {}
    for kernel, source in result.sources.items():
        ast.parse(source, filename=f"{kernel}.py")
        found = check_source_against_api(source)
        if found:
            problems[kernel] = found
    assert not problems, f"{name}: NKI API problems: {problems}"


@pytest.mark.parametrize("name", NAMES)
def test_kernels_respect_hardware_rules(name: str, corpus_results) -> None:
    result = corpus_results.get(name)
    problems = {k: p for k, src in result.sources.items() if (p := check_kernel_rules(src))}
    assert not problems, f"{name}: kernel rule violations: {problems}"


@pytest.mark.parametrize("name", NAMES)
def test_numerics_match_eager(name: str, corpus_results) -> None:
    result = corpus_results.get(name)
    atol, rtol = result.entry.tol
    assert len(result.got) == len(result.expected)
    pairs = list(zip(result.got, result.expected, strict=True)) + result.grads
    for i, (got, exp) in enumerate(pairs):
        assert got.dtype == exp.dtype and got.shape == exp.shape, f"{name}[{i}]: {got.dtype}{tuple(got.shape)} " \
            f"vs eager {exp.dtype}{tuple(exp.shape)}"
        if exp.is_floating_point():
            torch.testing.assert_close(got, exp, atol=atol, rtol=rtol, msg=lambda m, i=i: f"{name}[{i}]: {m}")
        else:
            assert torch.equal(got, exp), f"{name}[{i}]: integer/bool result differs from eager"
    if result.entry.backward:
        assert result.grads, f"{name}: no gradients were produced"


def test_corpus_covers_every_kernel_family(corpus_results) -> None:
    families = set()
    for name in NAMES:
        for source in corpus_results.get(name).sources.values():
            doc = re.search(r'"""(\w+) kernel', source)
            assert doc, f"{name}: kernel docstring does not name its family:\n{source[:400]}"
            families.add(doc.group(1))
    assert families >= {"pointwise", "reduction", "matmul", "copy", "gather", "scan", "index_put"}, families


def test_linear_gelu_is_one_tiled_matmul_kernel(corpus_single_core) -> None:
    """M=130, K=300, N=700: row tiles of 128, K tiles of 128, PSUM tiles of 512 columns, one kernel.

    x [M, K] and W [N, K] both have K innermost: both are transposed on TensorE (nc_transpose into
    PSUM), never by an element-strided DMA (no access pattern with a unit partition stride).
    """
    sources = corpus_single_core.get("linear_gelu").sources
    assert list(sources) == ["k0_mm_add_gelu"]
    src = sources["k0_mm_add_gelu"]
    for loop in (r"for i in range\([^)]*, 128\):", r"for j in range\(0, BN, 512\):", r"for kt in range\(0, \w+, 128\):"):
        assert re.search(loop, src), loop  # row tiles of 128, PSUM tiles of 512 columns, K tiles of 128
    assert src.count("nisa.nc_transpose(dst=") == 2
    assert ".ap(pattern=[[1, " not in src
    assert "nl.psum" in src and "nisa.nc_matmul(dst=" in src and "op=nl.gelu" in src


@pytest.mark.parametrize(("name", "kernels"), [
    ("softmax", ["k0_amax_sub_exp"]), ("log_softmax_wide", ["k0_amax_sub_exp"]), ("layer_norm", ["k0_mean_sub_mul"]),
    ("rms_norm", ["k0_pow_mean_add"]), ("bf16_chain", ["k0_mul_add_gelu"]), ("mm_ragged", ["k0_mm"]),
    ("embedding", ["k0_ge_lt_logical_and", "k1_embedding"]), ("cumsum", ["k0_cumsum"]),
])
def test_fused_families_render_one_kernel(name: str, kernels: list[str], corpus_results) -> None:
    """Softmax, norms, an elementwise chain, a matmul, a gather and a scan are each exactly one kernel (the
    gather after the bounds check of its indices)."""
    assert list(corpus_results.get(name).sources) == kernels


# Negative tests: the checks must be able to fail --------------------------------------------------------

_GOOD = '''\
import nki
import nki.language as nl
import nki.isa as nisa


@nki.jit
def k(in0, in1):
    out0 = nl.ndarray((1000,), dtype=nl.float32, buffer=nl.shared_hbm)
    for p0 in range(0, 300, 128):
        P = min(128, 300 - p0)
        F = min(512, 1000)
        acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
        a = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=in0.ap(pattern=[[1, P], [1, P]], offset=0))
        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=acc)
        nisa.dma_copy(dst=out0.ap(pattern=[[F, P], [1, F]], offset=0), src=t)
    return out0
'''


def test_static_rules_accept_the_reference_kernel() -> None:
    assert check_kernel_rules(_GOOD) == []
    assert check_source_against_api(_GOOD) == []


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("buffer=nl.shared_hbm", "buffer=nl.sbuf", "output out0 must be allocated in nl.shared_hbm"),
    ("P = min(128, 300 - p0)", "P = min(256, 300 - p0)", "partition dim not statically <= 128"),
    ("P = min(128, 300 - p0)", "P = 300 - p0", "tile acc(?, 512) in nl.psum: partition dim not statically"),
    ("F = min(512, 1000)", "F = min(1024, 1000)", "nc_matmul dst=acc(128, 1000): free bytes per partition not "
     "statically <= one 2048 B PSUM bank"),
    ("        acc = nl.ndarray((P, F)", "        big = nl.ndarray((P, 9 * F), dtype=nl.float32, buffer=nl.psum)\n"
     "        acc = nl.ndarray((P, F)", "PSUM tile big(128, 4608) float32: free bytes per partition not statically <= "
     "PSUM's 16384 B"),
    ("nisa.tensor_copy(dst=t, src=acc)", "nisa.tensor_copy(t, src=acc)", "nisa.tensor_copy must pass its destination as dst="),
    ("b = nl.ndarray((P, F)", "b = nl.ndarray((P, 2 * F)", "nc_matmul moving=b(128, 1024): needs K <= 128 and free size"),
    ("stationary=a", "stationary=in0", "nc_matmul stationary= is not a tile allocated in this kernel"),
    ("stationary=a", "stationary=a[0:P, 0:2 * P]", "nc_matmul stationary=a(128, 256): needs K <= 128"),
    ("stationary=a", "stationary=a[0:P, 3:3 + 2 * P]", "nc_matmul stationary=a(128, 256): needs K <= 128"),
    ("moving=b)", "moving=b[0:P, 0:(2 * F - 1) * 2 + 1:2])", "nc_matmul moving=b(128, 1024): needs K <= 128"),
    ("        nisa.tensor_copy(dst=t, src=acc)\n", "        nisa.tensor_copy(dst=t, src=acc)\n        del acc\n",
     "del statement"),
    ("out0.ap(pattern=[[F, P], [1, F]], offset=0)", "out0.ap(pattern=[[F, P], [1, F]], offset=0, vector_offset=b)",
     ".ap(vector_offset=...) indirect pair stride F is not the flat argument's row stride 1"),
    ("    return out0\n", "    r = nisa.register_alloc(1)\n\n    def body(reg):\n        return nisa.register_alloc(0)\n\n"
     "    nl.while_loop(r, body)\n    return out0\n", "nl.while_loop body body must return its own register 'reg'"),
    # NKI's Python subset: no identity tests, dicts keyed by string literals only
    ("    return out0\n", "    x = None\n    if x is not None:\n        x = 1\n    return out0\n",
     "'is' / 'is not' comparison"),
    ("    return out0\n", "    d = {}\n    d[3] = 1\n    return out0\n", "dict d indexed by a non-string key"),
    ("    return out0\n", "    d = {}\n    d.pop(3, None)\n    return out0\n", "dict d.pop with a non-string key"),
    ("    return out0\n", "    d = {}\n    y = 3 in d\n    return out0\n", "dict membership test with a non-string key"),
    ("    return out0\n", "    d = {1: 2}\n    return out0\n", "dict literal with a non-string key"),
])
def test_static_rules_reject_violations(old: str, new: str, expected: str) -> None:
    assert old in _GOOD
    problems = check_kernel_rules(_GOOD.replace(old, new))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("nisa.tensor_copy(", "nisa.tensor_copy_fancy(", "nki.isa.tensor_copy_fancy: not a public name of NKI 0.6"),
    ("nisa.tensor_copy(dst=t, src=acc)", "nisa.tensor_copy(dst=t, src=acc, shape=3)",
     "keyword shape= is not a parameter"),
    ("buffer=nl.psum", "buffer=nl.psum_fancy", "nki.language.psum_fancy: not a public name of NKI 0.6"),
])
def test_api_check_rejects_unknown_names(old: str, new: str, expected: str) -> None:
    problems = check_source_against_api(_GOOD.replace(old, new))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("edits", "expected"), [
    ({"stationary=a_blk[0:KK, kt // 128, i:i + P]": "stationary=a_blk[0:KK, kt // 128, i:i + 2 * P]"},
     "free size <= 128 (gemm_stationary_fmax on trn2)"),
    ({"range(0, BN, 512)": "range(0, BN, 1024)", "min(512, BN - j)": "min(1024, BN - j)",
      "(128, 512), dtype=nl.float32, buffer=nl.psum": "(128, 1024), dtype=nl.float32, buffer=nl.psum"},
     "free size <= 512 (gemm_moving_fmax on trn2)"),
    ({"a_blk = nl.ndarray((128,": "a_blk = nl.ndarray((256,"}, "partition dim <= 128"),
])
def test_simulator_enforces_tile_limits_on_a_rendered_kernel(edits: dict[str, str], expected: str,
                                                             corpus_single_core) -> None:
    """Re-tile the rendered ragged matmul past a limit: the trn2 simulator refuses it, static rules flag it."""
    src = corpus_single_core.get("mm_ragged").sources["k0_mm"]
    rng = np.random.default_rng(0)
    args = (rng.standard_normal(130 * 300, dtype=np.float32), rng.standard_normal(300 * 700, dtype=np.float32))

    def run(text: str) -> np.ndarray:
        kernel = simulator.load_kernel_source(text, filename="<k0_mm>")["k0_mm"]
        with use_target("trn2"):
            return simulator.simulate(kernel)(*args)

    ok = run(src)
    a, b = args[0].reshape(130, 300), args[1].reshape(300, 700)
    np.testing.assert_allclose(np.asarray(ok).reshape(130, 700), a @ b, atol=1e-3, rtol=1e-4)
    # A blocks at least 256 rows wide and N blocks at least 1024 columns (whatever blocks the autotuner chose), so a
    # 2 * P stationary or a 1024-column moving slice is a tile past the limit, not out of bounds
    bad = re.sub(r"a_blk = nl.ndarray\(\(128, (\d+), (\d+)\)",
                 lambda m: f"a_blk = nl.ndarray((128, {m[1]}, {max(int(m[2]), 256)})", src)
    bad = re.sub(r"b_blk = nl.ndarray\(\(128, (\d+), (\d+)\)",
                 lambda m: f"b_blk = nl.ndarray((128, {m[1]}, {max(int(m[2]), 1024)})", bad)
    bad = re.sub(r"for n0 in range\(0, 700, \d+\):\n(\s+)BN = min\(\d+, 700 - n0\)",
                 lambda m: f"for n0 in range(0, 700, 1024):\n{m[1]}BN = min(1024, 700 - n0)", bad)
    for old, new in edits.items():
        assert old in bad, old
        bad = bad.replace(old, new)
    with pytest.raises(SimulatorConstraintError, match=re.escape(expected)):
        run(bad)
    assert check_kernel_rules(bad), "static rules missed a tile past the hardware limit"
