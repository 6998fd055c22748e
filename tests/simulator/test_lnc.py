"""LNC2 launches whose programs synchronise (nisa.sendrecv, nisa.core_barrier) run as two threads (simulator/lnc.py):
exchanges, barriers over shared HBM, the errors for programs that don't meet, the trace in program order, and the
sequential path for kernels that never synchronise."""

from __future__ import annotations

import logging
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from neuron_compile.errors import SimulatorConstraintError, SimulatorError
from neuron_compile.simulator import lnc, nisa, nki, nl, simulate, trace

log = logging.getLogger(__name__)

F32 = np.float32


def _exchange(a):
    """Program r loads row block r of ``a``, swaps it with its peer, and stores what it received at block r."""
    rank = nl.program_id(0)
    t = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
    got = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[rank])
    nisa.sendrecv(src=t, dst=got, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
    out = nl.ndarray((2, 4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[rank], src=got)
    return out


@pytest.mark.parametrize("dtype", [F32, ml_dtypes.bfloat16])
def test_two_programs_exchange_tiles(dtype: type) -> None:
    a = np.arange(64, dtype=F32).reshape(2, 4, 8).astype(dtype)
    out = simulate(nki.jit(_exchange)[2])(a)
    assert out.dtype == a.dtype
    np.testing.assert_array_equal(out[0], a[1])
    np.testing.assert_array_equal(out[1], a[0])


def test_programs_run_as_threads_only_when_they_synchronise() -> None:
    seen: list[str] = []

    def plain(a):
        seen.append(threading.current_thread().name)
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t)
        return out

    simulate(nki.jit(plain)[2])(np.ones((4, 8), F32))
    assert seen == [threading.current_thread().name] * 2
    assert not lnc.synchronises(plain) and lnc.synchronises(_exchange)


def test_barrier_makes_the_peers_writes_visible() -> None:
    """Each program writes its half of a shared_hbm tensor, waits at the barrier, then reads the peer's half: run
    one after the other, program 0 would read unwritten memory (NaN)."""
    def halves(a):
        rank = nl.program_id(0)
        buf = nl.ndarray((2, 4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[rank])
        nisa.dma_copy(dst=buf[rank], src=t)
        nisa.core_barrier(data=buf, cores=(0, 1))
        peer = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=peer, src=buf[1 - rank])
        out = nl.ndarray((2, 4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[rank], src=peer)
        return out

    a = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(F32)
    out = simulate(nki.jit(halves)[2])(a)
    np.testing.assert_array_equal(out, a[::-1])


def test_a_program_that_skips_the_barrier_is_reported() -> None:
    def lopsided(a):
        buf = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(data=buf, cores=(0, 1))
        return buf

    with pytest.raises(SimulatorError, match=r"program 0 of the LNC2 launch waits at its synchronising instruction "
                                             r"#1 .* but program 1 finished after only 0: both cores must execute"):
        simulate(nki.jit(lopsided)[2])(np.zeros((4, 8), F32))


def test_a_peer_stuck_elsewhere_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that is alive but never arrives: the bounded wait reports it instead of hanging."""
    monkeypatch.setattr(lnc, "WAIT_S", 0.3)

    def stuck(a):
        buf = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        if nl.program_id(0) == 1:
            time.sleep(1.0)
        nisa.core_barrier(data=buf, cores=(0, 1))
        return buf

    t0 = time.monotonic()
    with pytest.raises(SimulatorError, match=r"program 0 of the LNC2 launch waited 0.3 s at its synchronising "
                                             r"instruction #1 for program 1, which is still running"):
        simulate(nki.jit(stuck)[2])(np.zeros((4, 8), F32))
    assert time.monotonic() - t0 < 5.0


def test_barrier_meeting_a_sendrecv_is_an_error() -> None:
    def mismatched(a):
        rank = nl.program_id(0)
        buf = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        if rank == 0:
            nisa.core_barrier(data=buf, cores=(0, 1))
        else:
            nisa.sendrecv(src=t, dst=t, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        return buf

    with pytest.raises(SimulatorError, match=r"instruction #1 of program \d is a (core_barrier|sendrecv) but #1 of "
                                             r"program \d is a (sendrecv|core_barrier)"):
        simulate(nki.jit(mismatched)[2])(np.zeros((4, 8), F32))


def test_an_error_in_one_program_is_raised_not_its_peers_report() -> None:
    def failing(a):
        rank = nl.program_id(0)
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        if rank == 1:
            nisa.tensor_tensor(dst=t, data1=t, data2=nl.ndarray((3, 8), dtype=nl.float32, buffer=nl.sbuf),
                               op=nl.add)
        nisa.sendrecv(src=t, dst=t, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
        return a

    with pytest.raises(SimulatorConstraintError, match="tensor_tensor"):
        simulate(nki.jit(failing)[2])(np.zeros((4, 8), F32))


def test_sendrecv_names_the_peer() -> None:
    def to_self(a):
        rank = nl.program_id(0)
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.sendrecv(src=t, dst=t, send_to_rank=rank, recv_from_rank=rank, pipe_id=0)
        return a

    with pytest.raises(SimulatorConstraintError, match=r"the peer core \(1\) for both on program 0"):
        simulate(nki.jit(to_self)[2])(np.zeros((4, 8), F32))


def test_trace_lists_program_0_then_program_1() -> None:
    """The threads record into their own lists; the trace gets them in program order, as the sequential path."""
    a = np.zeros((2, 4, 8), F32)
    with trace() as t:
        simulate(nki.jit(_exchange)[2])(a)
    assert [r.instruction for r in t.records] == ["dma_copy", "sendrecv", "dma_copy"] * 2
    (send,) = {r for r in t.records if r.instruction == "sendrecv"}
    assert (send.engine, send.partitions, send.free_size, send.buffers) == ("dma", 4, 8, ("sbuf", "sbuf"))
    assert [name for name, _ in t.by_kernel()] == ["_exchange"]
