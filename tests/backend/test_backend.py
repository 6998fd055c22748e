"""End-to-end behaviour of the `neuron` backend: entry points, options, static shapes, rejection, cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fresh_process import Started

import neuron_compile
from neuron_compile import backend as B
from neuron_compile.errors import ConfigError, DynamicShapeError, UnsupportedOpError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    B.reset()
    yield
    torch._dynamo.reset()


def _cause(exc: BaseException, kind: type) -> BaseException:
    while exc is not None and not isinstance(exc, kind):
        exc = exc.__cause__ or exc.__context__
    assert exc is not None, f"no {kind.__name__} in the exception chain"
    return exc


def _run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=300, cwd=REPO)


SET_DEFAULT = """
    import torch
    torch.compiler.set_default_backend("neuron")
    import neuron_compile.backend as B
    f = torch.compile(lambda x: x.exp().sum(-1))
    x = torch.randn(3, 4)
    assert torch.allclose(f(x), x.exp().sum(-1), atol=1e-5)
    assert len(B.compiled_graphs()) == 1
    print("ok")
"""
ORDERS = ("", "import neuron_compile\n", "IMPORT_AFTER")


def _registration_code(prefix: str) -> str:
    if prefix == "IMPORT_AFTER":
        return ENTRY_ONLY + "import neuron_compile\nprint(f(x).shape)\n"
    return prefix + ENTRY_ONLY

TORCH_LOGS = """
    import torch
    f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="neuron")
    f(torch.randn(4, 8))
"""

CACHE_HIT = """
    import torch, neuron_compile.backend as B
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.SiLU())
    with torch.no_grad():
        out = torch.compile(m, backend="neuron", dynamic=False)(torch.randn(4, 16))
    print("HIT" if all(g["cache_hit"] for g in B.compiled_graphs()) else "MISS", float(out.sum()))
"""


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Started]]:
    """This module's fresh-process scenarios, all started at once when the first of them is needed: on two
    cores they overlap each other and the in-process tests that run meanwhile (each is mostly torch's import)."""
    root = tmp_path_factory.mktemp("fresh")
    scenarios = {
        **{f"order:{prefix}": (_registration_code(prefix), {"NEURON_COMPILE_CACHE_DIR": str(root / f"c{i}")})
           for i, prefix in enumerate(ORDERS)},
        "set_default": (SET_DEFAULT, {"NEURON_COMPILE_CACHE_DIR": str(root / "set_default")}),
        "torch_logs": (TORCH_LOGS, {"TORCH_LOGS": "+neuron_compile", "NEURON_COMPILE_CACHE": "0"}),
        "cache_first": (CACHE_HIT, {"NEURON_COMPILE_CACHE_DIR": str(root / "shared")}),
    }
    runs = {name: Started(code, env, root / f"run{i}") for i, (name, (code, env)) in enumerate(scenarios.items())}
    yield runs
    for run in runs.values():
        run.stop()


ENTRY_ONLY = """
import torch
f = torch.compile(lambda x: torch.relu(x) * 3, backend="neuron", dynamic=False)
x = torch.randn(5, 7)
assert torch.allclose(f(x), torch.relu(x) * 3)
import sys; assert "neuron_compile" in sys.modules
print("ok")
"""


@pytest.mark.parametrize("prefix", ORDERS)
def test_backend_name_works_in_fresh_process_all_registration_orders(prefix, started):
    res = started[f"order:{prefix}"].result()
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ok" in res.stdout


def test_set_default_backend(started):
    res = started["set_default"].result()
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "ok"


def test_unknown_option_lists_valid_ones():
    f = torch.compile(lambda x: x + 1, backend="neuron", options={"tagret": "trn2"})
    with pytest.raises(Exception) as info:
        f(torch.randn(2))
    err = _cause(info.value, ConfigError)
    assert "unknown option(s) tagret" in str(err)
    assert "valid options:" in str(err) and "target" in str(err)


def test_three_batch_sizes_three_static_compiles():
    model = torch.nn.Linear(8, 4)
    f = torch.compile(model, backend="neuron", dynamic=False)
    with torch.no_grad():
        for batch in (3, 5, 8):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
    graphs = B.compiled_graphs()
    assert len(graphs) == 3
    shapes = sorted(g["plan"].inputs[-1].shape[0] for g in graphs if g["plan"].inputs)
    assert shapes == [3, 5, 8]


def test_default_dynamic_stays_static_per_shape():
    f = torch.compile(lambda x: (x * 2).sum(-1), backend="neuron")  # dynamic left at its default
    for batch in (3, 5, 8):
        x = torch.randn(batch, 6)
        torch.testing.assert_close(f(x), (x * 2).sum(-1))
    assert len(B.compiled_graphs()) == 3


def test_dynamic_true_is_refused():
    f = torch.compile(lambda x: x * 2, backend="neuron", dynamic=True)
    with pytest.raises(Exception) as info:
        f(torch.randn(3, 4))
    err = _cause(info.value, DynamicShapeError)
    msg = str(err)
    assert "dynamic=False" in msg and "pad or bucket" in msg and "symbolic dims" in msg


def test_mark_dynamic_is_refused():
    f = torch.compile(lambda x: x * 2, backend="neuron")
    x = torch.randn(3, 4)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception) as info:
        f(x)
    assert "mark_dynamic" in str(_cause(info.value, DynamicShapeError))


def _two_unsupported(x):
    y = torch.linalg.svd(x, full_matrices=False).U
    return torch.linalg.eigh(x[:, :4] @ x[:, :4].T).eigenvectors + y


def test_unsupported_ops_rejected_in_one_error_with_shapes_and_source_line():
    f = torch.compile(_two_unsupported, backend="neuron", dynamic=False)
    with pytest.raises(Exception) as info:
        f(torch.randn(4, 6))
    err = _cause(info.value, UnsupportedOpError)
    msg = str(err)
    assert "aten._linalg_svd" in msg and "aten._linalg_eigh" in msg
    assert "float32[4, 6]" in msg and "float32[4, 4]" in msg
    assert "test_backend.py" in msg and "torch.linalg.svd(x, full_matrices=False).U" in msg
    assert len(err.unsupported) == 2


def test_backward_only_ops_refused_at_first_call():
    # every forward op lowers; the refusal must still come at the first (forward) call if backward cannot.
    w = torch.randn(10, 4, requires_grad=True)

    def fn(i, o):  # EmbeddingBag's forward lowers; its frequency-scaled backward is refused
        return torch.nn.functional.embedding_bag(i, w, o, scale_grad_by_freq=True).sum()

    f = torch.compile(fn, backend="neuron", dynamic=False)
    with pytest.raises(Exception) as info:
        f(torch.tensor([1, 2, 2, 7]), torch.tensor([0, 2]))
    assert "training graph (forward + backward)" in str(_cause(info.value, UnsupportedOpError))


def test_mlp_training_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(), torch.nn.Linear(20, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(), torch.nn.Linear(20, 3))
    ref.load_state_dict(model.state_dict())
    f = torch.compile(model, backend="neuron", dynamic=False)
    x = torch.randn(9, 12)
    out = f(x)
    out.pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    torch.testing.assert_close(out, ref(x), atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    kinds = sorted(g["kind"] for g in B.compiled_graphs())
    assert kinds == ["backward", "forward"]


def test_per_region_compile_rest_eager():
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    expected = model(torch.ones(2, 6))
    model[1] = torch.compile(model[1], backend="neuron")
    with torch.no_grad():
        torch.testing.assert_close(model(torch.ones(2, 6)), expected.detach())
    assert len(B.compiled_graphs()) == 1


def test_graph_break_compiles_each_graph():
    def fn(x):
        y = torch.tanh(x) * 2
        torch._dynamo.graph_break()
        return y.sum(-1)

    f = torch.compile(fn, backend="neuron")
    x = torch.randn(3, 10)
    torch.testing.assert_close(f(x), fn(x))
    assert len(B.compiled_graphs()) == 2


def test_second_process_hits_the_cache(started):
    first = started["cache_first"].result()
    env = started["cache_first"].env
    assert first.returncode == 0, first.stderr[-1500:]
    assert first.stdout.split()[0] == "MISS"
    # The key hashes the package's own sources: while files are being edited (never in CI) a run can
    # legitimately miss, so allow a couple of tries for the sources to settle.
    for _ in range(3):
        second = _run(CACHE_HIT, env)
        assert second.returncode == 0, second.stderr[-1500:]
        if second.stdout.split()[0] == "HIT":
            break
    assert second.stdout.split()[0] == "HIT"
    assert first.stdout.split()[1] == second.stdout.split()[1]


def test_float64_runs_as_float32_with_warning():
    f = torch.compile(lambda x: x * 3 + 1, backend="neuron", dynamic=False)
    x = torch.randn(4, 5, dtype=torch.float64)
    with pytest.warns(UserWarning, match="float64 tensors run as float32"):
        out = f(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, x * 3 + 1, atol=1e-5, rtol=1e-5)


def test_float64_matmuls_run_as_float32_too():
    """A float64 model (linear layers, a batched matmul, an FFT's DFT products) runs as float32 like every other
    float64 op, rather than being refused at its first matmul."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return model(x), torch.bmm(y, y.transpose(1, 2)), torch.fft.rfft(x, dim=-1).abs()

    x, y = torch.randn(5, 6, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match="float64 tensors run as float32"):
        got = torch.compile(f, backend="neuron", dynamic=False)(x, y)
    for g, w in zip(got, f(x, y), strict=True):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_float64_histc_is_refused_naming_the_float32_route():
    """A float64 histogram counted in float32 could move a value beside a bin edge: refused, naming x.float()."""
    with pytest.raises(Exception, match=r"aten.histc.default\(float64\[20\], 10\): histc of float64 would count in "
                                        r"float32 here .* take the histogram of x.float\(\)"):
        torch.compile(lambda x: torch.histc(x, 10), backend="neuron", dynamic=False)(torch.randn(20, dtype=torch.float64))


def test_float64_input_beyond_float32_range_raises_instead_of_becoming_inf():
    """float64 runs as float32: an input value past float32's range would silently become inf, so it raises (as an
    int64 input past int32 does); infinities, NaN and values in range go through."""
    from neuron_compile.errors import InputRangeError

    f = torch.compile(lambda x: x * 0.5, backend="neuron", dynamic=False)
    with pytest.raises(InputRangeError, match=r"^the float64\[2\] input L\['x'\] of the compiled graph \(its input 0\) "
                       r"holds finite values beyond float32's range \(\|x\| > 3\.4e38\)"):
        f(torch.tensor([1.0, 1e300], dtype=torch.float64))
    edge = torch.tensor([3.0e38, float("inf"), -float("inf"), float("nan")], dtype=torch.float64)
    torch.testing.assert_close(f(edge), edge * 0.5, rtol=1e-6, atol=0, equal_nan=True)


def test_int64_input_beyond_int32_raises_naming_the_input_and_its_range():
    """int64 runs as int32 on a NeuronCore: an input value outside int32 (OpInfo's abs samples hold int64 extremes)
    raises before any kernel runs, naming the input and the values, instead of wrapping; int32's own extremes pass."""
    from neuron_compile.errors import InputRangeError

    f = torch.compile(lambda i, x: (x.abs(), i.abs() + x.shape[0]), backend="neuron", dynamic=False)
    small = torch.tensor([-3, 7], dtype=torch.int64)
    extremes = torch.tensor([[-16777217, -8589934599, -(2**63) + 1]], dtype=torch.int64)
    with pytest.raises(InputRangeError, match=r"^the int64\[1, 3\] input L\['x'\] of the compiled graph \(its input \d\) "
                       r"holds values outside int32 \(from -9223372036854775807 to -16777217\)"):
        f(small, extremes)
    edge = torch.tensor([[-(2**31) + 1, 2**31 - 1, 0]], dtype=torch.int64)
    got = f(small, edge)
    assert got[0].tolist() == edge.abs().tolist() and got[1].tolist() == [4, 8]


def test_a_meta_tensor_input_is_refused_naming_its_device():
    """A meta tensor has no values to compute: one error naming the input and the device, not a crash in the
    runner's host-memory view."""
    from torch._dynamo.exc import BackendCompilerFailed

    from neuron_compile.errors import InputDeviceError

    torch._dynamo.reset()
    f = torch.compile(lambda x, y: (x * 2, y + 1), backend="neuron", dynamic=False)
    with pytest.raises(BackendCompilerFailed) as info:
        f(torch.ones(3), torch.empty(2, 3, device="meta"))
    assert isinstance(info.value.inner_exception, InputDeviceError)
    assert "the float32[2, 3] input L['y'] of the compiled graph (its input 1) is on device 'meta'; compiled graphs take " \
           "CPU tensors" in str(info.value)
    assert torch.equal(f(torch.ones(3), torch.ones(2, 3))[1], torch.full((2, 3), 2.0))


def test_bfloat16_softmax_one_kernel():
    x = torch.randn(5, 300, dtype=torch.bfloat16)
    f = torch.compile(lambda t: F.softmax(t, dim=-1), backend="neuron", dynamic=False)
    torch.testing.assert_close(f(x), F.softmax(x, dim=-1), atol=1e-2, rtol=1e-2)
    assert [g["kernels"] for g in B.compiled_graphs()] == [1]
    assert neuron_compile.__version__


def test_torch_logs_shows_per_op_decisions(started):
    res = started["torch_logs"].result()
    assert res.returncode == 0, res.stderr[-2000:]
    assert "amax (aten.amax.default): fused into kernel group 0 [reduction]" in res.stderr
    assert "mul (aten.mul.Tensor): starts kernel group 0" in res.stderr
    assert "nisa.tensor_reduce(" in res.stderr  # the rendered kernel at DEBUG
    assert "neuron: inference graph" in res.stderr  # the INFO line per compiled graph


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_modes_compile_as_default_with_a_warning(mode, monkeypatch):
    """A model written for Inductor keeps its ``mode=``: the graph compiles as the default and says so once."""
    from neuron_compile import backend

    monkeypatch.setattr(backend, "_modes_warned", set())
    torch._dynamo.reset()
    f = torch.compile(lambda x: x.exp() + 1, backend="neuron", mode=mode)
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match=f"mode='{mode}'\\) compiles as mode='default'"):
        torch.testing.assert_close(f(x), x.exp() + 1)


def test_unknown_mode_is_refused_with_the_known_ones():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend="neuron", mode="fastest")
    with pytest.raises(Exception) as info:
        f(torch.randn(2))
    err = _cause(info.value, ConfigError)
    assert str(err) == ("torch.compile(backend='neuron', mode='fastest'): unknown mode; torch.compile's modes are "
                        "'default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs' (backend settings "
                        "go in options=...)")


def test_a_reduction_over_several_dims_beside_a_row_value_matches_eager():
    """A reduction kernel loops over its reduced dims outside the free one; those loops once took the names of the
    kernel's row values (``for r1 in range(10)`` shadowed the tile ``r1`` computed before it: an AttributeError in
    OpInfo's special.chebyshev_polynomial_w). tests/codegen/static_checks.py now refuses such a kernel."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 1, 5, generator=g)
    n = torch.randint(-2, 6, (10, 5), generator=g).float()
    f = torch.special.chebyshev_polynomial_w
    torch.testing.assert_close(torch.compile(f, backend="neuron", dynamic=False)(x, n), f(x, n), equal_nan=True)
