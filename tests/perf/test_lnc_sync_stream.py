"""Cross-core synchronisation in the cost model: nisa.sendrecv (a small DMA to the peer core) and nisa.core_barrier
(a cross-core semaphore round on its engine), recorded as the simulator traces them, and the two programs of a
launch coupled at every such instruction (a program can't pass it before its peer gets there)."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest

from neuron_compile import costmodel as cm
from neuron_compile.instruction_stream import source_stream
from neuron_compile.simulator import load_kernel_source, simulate, trace

log = logging.getLogger(__name__)

# Program r loads row block r, program 1 first does `extra` more VectorE passes, then the two swap their tiles and
# store what they received; with `barrier`, a core_barrier on the output follows the stores.
SRC = '''
import nki
import nki.isa as nisa
import nki.language as nl

LAUNCH_GRID = 2


@nki.jit
def k(in0):
    rank = nl.program_id(0)
    t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=in0.ap([[512, 128], [1, 512]], offset=rank * 65536))
    for i in range({extra} * rank):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=1.0)
    got = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.sendrecv(src=t, dst=got, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
    out0 = nl.ndarray((2, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out0[rank], src=got)
{barrier}    return out0
'''
BARRIER = "    nisa.core_barrier(data=out0, cores=(0, 1))\n"


def _source(extra: int, barrier: bool = False) -> str:
    return SRC.format(extra=extra, barrier=BARRIER if barrier else "")


@pytest.mark.parametrize("barrier", [False, True])
def test_stream_equals_the_threaded_trace(barrier: bool) -> None:
    src = _source(3, barrier)
    x = np.random.default_rng(0).standard_normal(2 * 128 * 512).astype(np.float32)
    with trace() as t:
        out = simulate(load_kernel_source(src, "<sync>")["k"][2])(x)
    np.testing.assert_array_equal(out.reshape(2, -1), x.reshape(2, -1)[::-1])
    stream = source_stream(src, "k", [(x.size, "float32")], target="trn2")
    assert Counter(t.records) == stream
    assert len(stream.schedules) == 2 and [len(s.sync_ns) for s in stream.schedules] == [1 + barrier] * 2


def test_the_faster_program_waits_for_its_peer() -> None:
    """Program 1 works 40 VectorE passes longer before the exchange: program 0 finishes no earlier than program 1
    reaches the sendrecv, and the kernel's estimate is never below the uncoupled one."""
    stream = source_stream(_source(40), "k", [(2 * 128 * 512, "float32")], target="trn2")
    p0, p1 = stream.schedules
    assert p1.sync_ns[0] > p0.sync_ns[0] + 10_000  # the uncoupled arrival times, recorded as scheduled
    assert p0.makespan_ns >= p1.sync_ns[0]
    alone = source_stream(_source(0), "k", [(2 * 128 * 512, "float32")], target="trn2")
    assert cm.estimate(stream).time_ns > cm.estimate(alone).time_ns


def test_barrier_costs_a_cross_core_semaphore_round() -> None:
    with_b = source_stream(_source(0, True), "k", [(2 * 128 * 512, "float32")], target="trn2")
    without = source_stream(_source(0), "k", [(2 * 128 * 512, "float32")], target="trn2")
    assert cm.CORE_BARRIER_NS == cm.DMA_START_LATENCY_NS
    (barrier,) = [r for r in with_b if r.instruction == "core_barrier"]
    assert barrier.engine == "gpsimd"
    # the barrier waits for the store it follows (it reads the shared tensor) and then holds GpSimd for its round
    assert cm.estimate(with_b).time_ns >= cm.estimate(without).time_ns + cm.CORE_BARRIER_NS - 1
    assert cm.first_order(with_b).engine_ns["gpsimd"] == pytest.approx(2 * cm.CORE_BARRIER_NS)
