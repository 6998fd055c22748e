"""Op-table tests of the ``neuron`` backend against eager PyTorch, plus fusion and rejection tests.

Every :class:`~tests.backend.op_table.OpCase` runs ``torch.compile(fn, backend="neuron",
dynamic=False)`` forward (an inference graph) and, for differentiable float cases, forward and
backward (training graphs), comparing outputs and input ``.grad`` with eager in float32,
bfloat16 and float16. bf16/fp16 results may differ from eager's per-op rounding (fused intermediates stay
fp32): an element outside the tolerance of eager passes only if it is no farther from a float64
reference than eager's own value is, plus the tolerance (Inductor's fp64-reference check).
"""

from __future__ import annotations

import logging
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import neuron_compile.backend
from neuron_compile.errors import UnsupportedOpError

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from op_table import CASES, OpCase, make_input  # noqa: E402

from neuron_compile.nki_api.checker import check_source_against_api  # noqa: E402

log = logging.getLogger(__name__)

FWD_PARAMS = [pytest.param(case, dtype, id=f"{case.name}-{str(dtype).replace('torch.', '')}")
              for case in CASES for dtype in case.dtypes]
BWD_PARAMS = [p for p in FWD_PARAMS if p.values[0].grad]


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    raise TypeError(f"unexpected output {type(out)}")


def _inputs(case: OpCase, dtype: torch.dtype, requires_grad: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    xs = [make_input(a, dtype, gen) for a in case.args]
    if requires_grad:
        xs = [x.detach().requires_grad_(x.is_floating_point()) for x in xs]  # non-contiguous leaves stay strided
    return xs


def _assert_close(got: torch.Tensor, want: torch.Tensor, case: OpCase, dtype: torch.dtype, what: str,
                  ref: torch.Tensor | None = None) -> None:
    assert got.shape == want.shape, f"{case.name} {what}: shape {tuple(got.shape)} != eager {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{case.name} {what}: dtype {got.dtype} != eager {want.dtype}"
    if not want.is_floating_point():
        assert torch.equal(got, want), f"{case.name} {what}: {got} != {want}"
        return
    atol, rtol = case.tol[dtype]
    g, w = got.double(), want.double()
    if ref is not None and dtype in (torch.bfloat16, torch.float16):
        # Off eager by more than the tolerance only where eager itself is as far from the fp64 truth.
        r = ref.double()
        no_worse = (g - r).abs() <= (w - r).abs() + atol + rtol * r.abs()
        g = torch.where(no_worse & ~torch.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True), w, g)
    torch.testing.assert_close(g.float(), w.float(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{case.name} {what} ({dtype}): {m}")


def _reference(case: OpCase, xs: list[torch.Tensor], cotangents: list[torch.Tensor] | None = None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """float64 outputs (and input grads for ``cotangents``) of ``case`` on the same (rounded) inputs."""
    leaves = [x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x for x in xs]
    with torch.enable_grad():
        outs = _flat(case.fn(*leaves))
        if cotangents is not None:
            pairs = [(o, c) for o, c in zip(outs, cotangents, strict=True) if o.requires_grad]
            torch.autograd.backward([o for o, _ in pairs], [c.double() for _, c in pairs])
    return [o.detach() for o in outs], [x.grad if x.is_floating_point() else None for x in leaves]


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="neuron", dynamic=False)


@pytest.mark.parametrize(("case", "dtype"), FWD_PARAMS)
def test_forward(case: OpCase, dtype: torch.dtype) -> None:
    xs = _inputs(case, dtype, requires_grad=False)
    want = _flat(case.fn(*xs))
    got = _flat(_compile(case.fn)(*xs))
    assert len(got) == len(want)
    refs = _reference(case, xs)[0] if dtype != torch.float32 else [None] * len(want)
    for i, (g, w, r) in enumerate(zip(got, want, refs, strict=True)):
        _assert_close(g, w, case, dtype, f"output {i}", r)
    graphs = neuron_compile.backend.compiled_graphs()
    assert graphs, "the neuron backend compiled nothing"
    for name, source in (src for g in graphs for src in g["sources"]):
        assert not check_source_against_api(source), (name, check_source_against_api(source), source)


@pytest.mark.parametrize(("case", "dtype"), BWD_PARAMS)
def test_backward(case: OpCase, dtype: torch.dtype) -> None:
    xs = _inputs(case, dtype, requires_grad=True)
    xs_eager = [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]
    want = _flat(case.fn(*xs_eager))
    got = _flat(_compile(case.fn)(*xs))
    gen = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(w.shape, generator=gen).to(w.dtype) for w in want]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _assert_close(g.detach(), w.detach(), case, dtype, f"output {i}")
    pairs = [(g, w, c) for g, w, c in zip(got, want, cotangents, strict=True) if w.requires_grad]
    assert pairs, f"{case.name}: no differentiable output"
    torch.autograd.backward([w for _, w, _ in pairs], [c for _, _, c in pairs])
    torch.autograd.backward([g for g, _, _ in pairs], [c for _, _, c in pairs])
    kinds = [g["kind"] for g in neuron_compile.backend.compiled_graphs()]
    assert "backward" in kinds, f"{case.name}: no backward graph was compiled by the neuron backend ({kinds})"
    ref_grads = _reference(case, xs_eager, cotangents)[1] if dtype != torch.float32 else [None] * len(xs)
    for i, (x, xe) in enumerate(zip(xs, xs_eager, strict=True)):
        if not x.requires_grad:
            continue
        assert (x.grad is None) == (xe.grad is None), f"{case.name}: grad of input {i} missing on one side"
        if xe.grad is not None:
            _assert_close(x.grad, xe.grad, case, dtype, f"grad of input {i}", ref_grads[i])


# -- fusion ---------------------------------------------------------------------------------------------

def _kernels_of(fn: Callable[..., Any], *xs: torch.Tensor) -> list[Any]:
    """Run ``fn`` compiled (inference), check it against eager, return the kernels of its only graph."""
    neuron_compile.backend.reset()
    with torch.no_grad():
        got = _compile(fn)(*xs)
        want = fn(*xs)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    graphs = neuron_compile.backend.compiled_graphs()
    assert len(graphs) == 1, [g["kind"] for g in graphs]
    return list(graphs[0]["plan"].kernels)


def test_fusion_elementwise_chain_is_one_kernel() -> None:
    x, y, z = torch.randn(2, 5, 129), torch.randn(129), torch.rand(5, 1) + 0.5
    kernels = _kernels_of(lambda x, y, z: (torch.sigmoid(x * 2 + y) - x.abs()).exp() / z - 1, x, y, z)
    assert len(kernels) == 1, "\n".join(map(str, kernels))
    assert kernels[0].family == "pointwise"


def test_fusion_softmax_is_one_kernel() -> None:
    kernels = _kernels_of(lambda x: torch.softmax(x, -1), torch.randn(3, 5, 300))
    assert len(kernels) == 1, "\n".join(map(str, kernels))
    assert kernels[0].family == "reduction"


def test_fusion_layer_norm_is_one_kernel() -> None:
    ln = torch.nn.LayerNorm(130)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    kernels = _kernels_of(ln, torch.randn(2, 3, 130))
    assert len(kernels) == 1, "\n".join(map(str, kernels))


def test_fusion_rms_norm_is_one_kernel() -> None:
    w = torch.rand(130) + 0.5
    kernels = _kernels_of(lambda x: F.rms_norm(x, (130,), w, eps=1e-6), torch.randn(2, 3, 130))
    assert len(kernels) == 1, "\n".join(map(str, kernels))


def test_fusion_linear_bias_gelu_is_one_kernel() -> None:
    lin = torch.nn.Linear(130, 70)
    kernels = _kernels_of(lambda x: F.gelu(lin(x)), torch.randn(5, 130))
    assert len(kernels) == 1, "\n".join(map(str, kernels))
    assert kernels[0].family == "matmul"
    ops = {op.opcode for op in kernels[0].ops}
    assert {"matmul", "activation"} <= ops, ops



@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_norms_with_an_epsilon_render_on_trn1(dtype: torch.dtype) -> None:
    """NC-v2 takes an activation's bias only as a (P, 1) tile: its memset must end its line (the template glued the
    next allocation onto it, so every LayerNorm/RMSNorm kernel on trn1 was invalid Python)."""
    from neuron_compile.config import config

    gen = torch.Generator().manual_seed(0)
    x, r = (torch.randn(130, 96, generator=gen).to(dtype) for _ in range(2))
    w = (torch.rand(96, generator=gen) + 0.5).to(dtype)
    lin = torch.nn.Linear(96, 96).to(dtype)
    ln = torch.nn.LayerNorm(96).to(dtype)
    fns = [ln, lambda x: F.rms_norm(x, (96,), w, eps=1e-6), lambda x, r: ln(r + lin(x))]  # the last: matmul epilogue
    for fn, xs in zip(fns, [(x,), (x,), (x, r)], strict=True):
        torch._dynamo.reset()
        neuron_compile.backend.reset()
        with config.patch(target="trn1"), torch.no_grad():
            got = _compile(fn)(*xs)
            want = fn(*xs)
        torch.testing.assert_close(got.float(), want.float(), atol=4e-3, rtol=4e-3)
        srcs = [src for g in neuron_compile.backend.compiled_graphs() for _, src in g["sources"]]
        assert any("_bias = nl.ndarray((P, 1)" in src for src in srcs), srcs


# -- rejection --------------------------------------------------------------------------------------------

def _unsupported_error(exc: BaseException) -> UnsupportedOpError:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, UnsupportedOpError):
            return seen
        seen = seen.__cause__ or seen.__context__
    raise AssertionError(f"no UnsupportedOpError in the chain of {type(exc).__name__}: {exc}")


def _reject(fn: Callable[..., Any], *xs: torch.Tensor) -> tuple[UnsupportedOpError, str]:
    with pytest.raises(Exception) as info:
        _compile(fn)(*xs)
    err = _unsupported_error(info.value)
    assert not neuron_compile.backend.compiled_graphs(), "nothing may be compiled for a rejected graph"
    return err, str(err)


def _line_of(fn: Callable[..., Any], offset: int = 1) -> str:
    return f"{Path(__file__).resolve()}:{fn.__code__.co_firstlineno + offset}"


def test_reject_eigh_names_op_shapes_and_line() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigh(x @ x.mT).eigenvectors * 2

    err, msg = _reject(fn, torch.randn(3, 130))
    assert ("aten._linalg_eigh.default(float32[3, 3]): its eigenvectors are read by the forward (returned or computed "
            "with)") in msg, msg
    assert "Run this one eagerly (outside the compiled region)" in msg, msg
    assert f"{_line_of(fn)}: return torch.linalg.eigh(x @ x.mT).eigenvectors * 2" in msg, msg
    assert len(err.unsupported) == 1 and "aten._linalg_eigh.default" in err.unsupported[0]
    assert "neuron-compile ops" in msg  # how to find out what is supported


def test_reject_fft_longer_than_the_dense_limit() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.fft.fft(x).abs()

    err, msg = _reject(fn, torch.randn(4, 4097))
    assert "aten._fft_r2c.default(float32[4, 4097]" in msg and "an FFT over 4097 points" in msg, msg
    assert _line_of(fn) in msg, msg


@torch.library.custom_op("neuron_compile_tests::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    """An op with no lowering rule (a library's custom kernel), forward and backward."""
    return x.sin()


@opaque.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("neuron_compile_tests::opaque_backward", mutates_args=())
def opaque_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return grad * x.cos()


@opaque_backward.register_fake
def _(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


opaque.register_autograd(lambda ctx, grad: opaque_backward(grad, ctx.saved_tensors[0]),
                         setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


def test_reject_lists_every_unsupported_op_in_one_message() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = opaque(x).relu()[:2]
        return torch.linalg.eigh(y.unsqueeze(1) * y.unsqueeze(0)).eigenvectors

    err, msg = _reject(fn, torch.randn(6))
    assert "2 unsupported op(s)" in msg, msg
    assert "neuron_compile_tests.opaque.default(float32[6])" in msg, msg
    assert f"{_line_of(fn)}: y = opaque(x).relu()[:2]" in msg, msg
    assert "aten._linalg_eigh.default(float32[2, 2]" in msg, msg
    assert f"{_line_of(fn, 2)}: return torch.linalg.eigh(y.unsqueeze(1) * y.unsqueeze(0)).eigenvectors" in msg, msg
    assert len(err.unsupported) == 2


@pytest.mark.parametrize(("fn", "op", "hint"), [
    (lambda x: (x[x > 0] * 2).sum(), "aten.index.Tensor(float32[6, 4], [bool[6, 4]])", "use integer indices"),
    (lambda x: torch.nonzero(x > 0).sum(), "aten.nonzero.default(bool[6, 4])", "use torch.nonzero_static(x, size=n)"),
    (lambda x: torch.masked_select(x, x > 0).sum(), "aten.masked_select.default", "use torch.where(mask, x, 0)"),
    (lambda x: torch.unique(x.round()).sum(), "aten._unique2.default", "a data-dependent shape"),
])
def test_reject_data_dependent_shape_names_the_op_not_its_size_checks(fn: Callable[..., Any], op: str,
                                                                      hint: str) -> None:
    """fullgraph=True hands Dynamo's data-dependent ops to the backend with the size bookkeeping around them
    (sym_size, comparisons, _assert_scalar): the refusal lists the op and sums the bookkeeping up in one line."""
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="neuron", dynamic=False, fullgraph=True)(torch.randn(6, 4))
    err = _unsupported_error(info.value)
    msg = str(err)
    assert "1 unsupported op(s)" in msg and op in msg and hint in msg, msg
    assert "_assert_scalar" not in msg and "sym_size" not in msg, msg
    assert err.unsupported[-1].startswith("and ") and "size computation(s) and check(s)" in err.unsupported[-1]


def test_reject_training_graph_names_backward_ops_at_first_call() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return opaque(x).sum()

    x = torch.randn(6, requires_grad=True)
    err, msg = _reject(fn, x)  # refused at the forward call, before any .backward()
    assert "training graph (forward + backward)" in msg, msg
    assert "neuron_compile_tests.opaque.default(float32[6])" in msg, msg
    assert "neuron_compile_tests.opaque_backward.default(" in msg, msg
    assert f"{_line_of(fn)}: return opaque(x).sum()" in msg, msg
    assert len(err.unsupported) == 2, err.unsupported
