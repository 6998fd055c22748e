"""Graph inputs and outputs keep torch's storage semantics (FSDP2 resizes parameter storage)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neuron_compile  # noqa: F401
from neuron_compile.host_memory import numpy_view, torch_copy


def test_compiled_graph_leaves_input_storage_resizable_and_returns_resizable_non_views() -> None:
    torch._dynamo.reset()
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8)
    out = torch.compile(lin, backend="neuron", dynamic=False)(x)
    torch.testing.assert_close(out, lin(x), rtol=1e-4, atol=1e-4)
    for t in (lin.weight, lin.bias, x):
        assert t.untyped_storage().resizable()  # Tensor.numpy() would have pinned it
    assert out.untyped_storage().resizable() and not out._is_view()
    # what FSDP2 does to an unsharded parameter between forward passes
    storage = lin.weight.untyped_storage()
    nbytes = storage.nbytes()
    storage.resize_(0)
    storage.resize_(nbytes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                                   torch.int8, torch.uint8, torch.bool])
def test_numpy_view_and_torch_copy_round_trip(dtype: torch.dtype) -> None:
    t = (torch.arange(24).reshape(4, 6) % 3).to(dtype)
    v = numpy_view(t)
    assert v.shape == (4, 6) and t.untyped_storage().resizable()
    back = torch_copy(np.ascontiguousarray(v))
    expect = t.to(torch.uint8) if dtype == torch.bool else t
    assert back.dtype == expect.dtype and torch.equal(back, expect)
    assert back.untyped_storage().resizable()
    strided = t.t()
    assert np.array_equal(np.asarray(numpy_view(strided), dtype=np.float64),
                          strided.to(torch.float64).numpy())
