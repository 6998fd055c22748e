"""Collectives in a compiled graph, in this process on a one-rank gloo group: scheduling and refusals."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.collective_runner import cut
from neuron_compile.errors import UnsupportedOpError

log = logging.getLogger(__name__)


def _two_collectives(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = fc.all_reduce(x @ w, "sum", dist.group.WORLD)
    b = torch.tanh(x).sum(0)  # needs no collective
    c = fc.all_gather_single(x.exp(), 0, dist.group.WORLD)
    return a * 2 + b, c.sum()


def test_collectives_are_issued_early_and_waited_for_late(single_rank_group: None) -> None:
    gm = make_fx(_two_collectives)(torch.randn(4, 8), torch.randn(8, 8))
    # graph order: mm, all_reduce, wait, tanh, sum, exp, all_gather, wait_1, mul, add, sum_2
    steps = [(s.kind, [n.name for n in s.nodes]) for s in cut(gm)]
    assert steps == [
        ("compute", ["mm"]),
        ("issue", ["all_reduce"]),
        ("compute", ["tanh", "sum_1", "exp"]),  # runs while the all_reduce is in flight
        ("issue", ["all_gather_into_tensor"]),  # issued before the first wait
        ("wait", ["wait_tensor"]),
        ("compute", ["mul", "add"]),
        ("wait", ["wait_tensor_1"]),
        ("compute", ["sum_2"]),
    ]


def test_compiled_collectives_run_on_one_rank(single_rank_group: None) -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    got = torch.compile(_two_collectives, backend="neuron")(x, w)
    for g, e in zip(got, _two_collectives(x, w), strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException:
    e: BaseException | None = exc
    while e is not None and not isinstance(e, kind):
        e = getattr(e, "inner_exception", None) or e.__cause__
    assert e is not None, f"no {kind.__name__} in the chain of {exc!r}"
    return e


def test_collective_on_an_unsupported_dtype_is_refused_by_name(single_rank_group: None) -> None:
    f = torch.compile(lambda x: fc.all_reduce(x, "sum", dist.group.WORLD), backend="neuron")
    with pytest.raises(Exception) as info:
        f(torch.ones(4, dtype=torch.complex64))
    msg = str(_cause(info.value, UnsupportedOpError))
    assert "_c10d_functional.all_reduce.default(complex64[4], 'sum', '0'): a collective on dtype torch.complex64 " \
           "cannot be lowered (compiled collectives move float32, bfloat16" in msg
    assert "cast before communicating" in msg
