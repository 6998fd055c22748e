"""aten.as_strided (``lowering/ops/movement.py::lower_as_strided``) reads a window of its input's *storage*, laid out
as eager lays the input out (its value's strides and storage offset). A compiled graph holds its own buffers: a
dense input as it is, a non-dense one (a column block) contiguously, a kernel's result densely even where eager's
is permuted. The window is mapped into that layout, checked against eager; a window reaching storage the input
does not cover is refused by name. AOTAutograd emits these views for ``split``/``chunk`` of sliced inputs, and for
views of complex values (``lowering/complex_more.py``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

from neuron_compile.errors import UnsupportedOpError

BASE = torch.arange(48.0).reshape(6, 8) * 0.25 - 5


def _compile(fn: Callable[..., object]) -> Callable[..., object]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


CASES: dict[str, tuple[Callable[..., object], torch.Tensor]] = {
    # split / chunk / unbind of inputs that don't start their storage or aren't dense
    "split_of_a_column_block": (lambda x: [t * 1 for t in x.split(2, dim=0)], BASE[1:, 2:6]),
    "chunk_of_a_row_block": (lambda x: [t + 1 for t in x.chunk(3, dim=1)], BASE[2:5]),
    "split_of_a_transposed_block": (lambda x: [t * 2 for t in x.t().split(3, dim=-1)], BASE[1:5, 1:]),
    "unbind_of_a_strided_input": (lambda x: [t - 1 for t in x.unbind(0)], BASE[::2, 1::3]),
    # as_strided itself, on a sliced input and on a result eager lays out transposed (x.t() * 2 keeps x.t()'s strides)
    "window_of_a_slice": (lambda x: torch.as_strided(x, (2, 3), (8, 1), x.storage_offset() + 9) * 1, BASE[1:, 1:]),
    "window_across_rows_of_a_dense_input": (lambda x: torch.as_strided(x, (3, 5), (4, 1), 2) * 1,
                                            BASE[:3].clone()),
    "window_of_a_transposed_result": (lambda x: torch.as_strided(x.t() * 2, (2, 3), (1, 4), 1) + 0,
                                      BASE[:, :4].clone()),
    "window_carrying_across_a_transposed_result": (lambda x: torch.as_strided(x.t() * 2, (3, 2), (1, 6), 7) + 0,
                                                   BASE[:, :4].clone()),
    "rows_of_a_transposed_result": (lambda x: torch.as_strided(x.t() * 2, (2, 6), (6, 1), 2) + 0,
                                    BASE[:5, :4].clone()),
    "empty_window": (lambda x: torch.as_strided(x, (0, 3), (8, 1), x.storage_offset()) * 1, BASE[1:, 1:]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_as_strided_views_equal_eager(name: str) -> None:
    fn, x = CASES[name]
    want = fn(x)
    got = _compile(fn)(x)
    for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want], strict=True):
        assert g.shape == w.shape and torch.equal(g, w)


def test_a_window_past_the_input_is_refused_naming_it() -> None:
    """Eager reads the base tensor's memory beyond the slice it was given; the compiled graph has only the slice."""
    x = BASE[:2]  # a contiguous slice of a 6 x 8 storage
    with pytest.raises(BackendCompilerFailed) as info:
        _compile(lambda x: torch.as_strided(x, (3, 8), (8, 1), 0) * 1)(x)
    assert isinstance(info.value.inner_exception, UnsupportedOpError)
    assert ("aten.as_strided.default(float32[2, 8], [3, 8], [8, 1], 0): as_strided(size=[3, 8], stride=[8, 1], "
            "storage_offset=0) reads storage outside its input's elements (shape (2, 8), strides (8, 1), storage "
            "offset 0), which a compiled graph does not have; .clone() the base tensor first") in str(info.value)
